"""Megatron's local core attention through PyTorch's fused scaled-dot-product attention.

Without Transformer Engine, Megatron's local spec materialises the [b, heads, s, s] score matrix
and an fp32 softmax for every layer: on an H200 gpt-1.3b (bf16, s=2048) then reached 24% MFU
(scripts/bench/gpu.sh). `torch.nn.functional.scaled_dot_product_attention` picks a flash or
memory-efficient kernel for the same causal attention. Cases the fused call does not cover
(an explicit mask, sliding windows, softmax offsets, layer-number scaling) keep Megatron's path.
"""

from contextlib import nullcontext
from typing import Any

import torch
from megatron.core import tensor_parallel
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType


class SdpaAttention(DotProductAttention):
    """DotProductAttention whose causal, unmasked case runs in one fused kernel."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        if not self._fused_applies(attention_mask, attn_mask_type, attention_bias, packed_seq_params):
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params)
        # [s, b, heads, hn] -> [b, heads, s, hn]; grouped keys and values are repeated per query head.
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        dropout_p = self.attention_dropout.p if self.training else 0.0
        # Megatron drops attention probabilities under the model-parallel RNG unless sequence-parallel.
        forked = dropout_p and not self.config.sequence_parallel
        with tensor_parallel.get_cuda_rng_tracker().fork() if forked else nullcontext():
            context = torch.nn.functional.scaled_dot_product_attention(
                q,
                k,
                v,
                dropout_p=dropout_p,
                is_causal=True,
                scale=self.softmax_scale,
                enable_gqa=k.size(1) != q.size(1),
            )
        # [b, heads, s, hn] -> [s, b, heads * hn]
        return context.permute(2, 0, 1, 3).reshape(context.size(2), context.size(0), self.hidden_size_per_partition)

    def _fused_applies(self, mask: Any, mask_type: Any, bias: Any, packed: Any) -> bool:
        kind = mask_type if mask_type is not None else self.attn_mask_type
        return (
            kind == AttnMaskType.causal
            and mask is None
            and bias is None
            and packed is None
            and self.softmax_offset is None
            and self.scale_mask_softmax.window_size is None
            and self.scale_mask_softmax.scale is None
        )
