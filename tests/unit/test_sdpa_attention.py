"""The fused core attention computes what Megatron's DotProductAttention computes."""

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from air_hpc.backend.megatron_compat import cpu_patched
from air_hpc.backend.sdpa_attention import SdpaAttention


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    from megatron.core import parallel_state, tensor_parallel

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    try:
        with cpu_patched():
            tensor_parallel.model_parallel_cuda_manual_seed(1)
            yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def _pair(heads: int, groups: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=1,
        hidden_size=16 * heads,
        num_attention_heads=heads,
        num_query_groups=groups,
        use_cpu_initialization=True,
        masked_softmax_fusion=False,
        attention_dropout=0.0,
    )
    args = {"config": config, "layer_number": 1, "attn_mask_type": AttnMaskType.causal, "attention_type": "self"}
    return SdpaAttention(**args), DotProductAttention(**args)


@pytest.mark.parametrize(("heads", "groups"), [(4, 4), (4, 2)])
def test_matches_megatron_attention_and_its_gradients(one_rank: None, heads: int, groups: int) -> None:
    fused, reference = _pair(heads, groups)
    seq, batch, dim = 12, 3, 16
    generator = torch.Generator().manual_seed(7)
    q = torch.randn(seq, batch, heads, dim, generator=generator, requires_grad=True)
    k = torch.randn(seq, batch, groups, dim, generator=generator, requires_grad=True)
    v = torch.randn(seq, batch, groups, dim, generator=generator, requires_grad=True)
    causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)

    out = fused(q, k, v, None)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    expected = reference(q, k, v, causal)
    expected_grads = torch.autograd.grad(expected.sum(), (q, k, v))

    assert out.shape == (seq, batch, heads * dim)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_an_explicit_mask_keeps_megatrons_path(one_rank: None) -> None:
    fused, reference = _pair(2, 2)
    q, k, v = (torch.randn(8, 2, 2, 16) for _ in range(3))
    padding = torch.zeros(8, 8, dtype=torch.bool)
    padding[:, 5:] = True
    torch.testing.assert_close(fused(q, k, v, padding), reference(q, k, v, padding))
