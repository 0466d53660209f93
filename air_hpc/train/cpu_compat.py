"""Make megatron-core 0.16.1 run on CPU ranks with gloo (tests, CI, the demo).

Megatron assumes CUDA in a handful of places even when ``use_cpu_initialization``
is set: literal ``device="cuda"`` in the schedules, the causal mask, the optimizer
and grad clipping; ``torch.cuda.current_device()``/``synchronize()`` in the p2p
communication and the grad buffers; the RNG tracker reads and writes the CUDA
generator; grad clipping asserts ``torch.cuda.FloatTensor``. (Megatron's checkpoint
results queue, a Manager process on every device, is replaced by the resilience code.)

Each workaround is a :class:`Patch` that replaces one attribute of one Megatron
module and names the source text that makes it necessary, so
``tests/unit/test_cpu_compat.py`` fails when a future megatron-core drops that
text (the patch became unnecessary) or when the patched code stops working.
Module-level ``torch`` is swapped for :class:`CpuTorch`, a thin view of torch
that maps CUDA devices to the CPU: targeted, unlike a global
``TorchFunctionMode`` (measured ~1.45x slower), and limited to the listed modules.

Used only when the job's device is CPU; GPU ranks never import this module.
"""

import contextlib
import importlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

log = logging.getLogger(__name__)

_FACTORIES = frozenset({"empty", "zeros", "ones", "full", "tensor", "arange", "rand", "randn"})


def _cpu_device(device: Any) -> Any:
    if device is None:
        return None
    if isinstance(device, int) or torch.device(device).type == "cuda":
        return torch.device("cpu")
    return device


def _no_op(*_args: Any, **_kwargs: Any) -> None:
    return None


class CpuTorch:
    """``torch`` as seen by a patched Megatron module: CUDA devices and the CUDA generator become the CPU's."""

    def __init__(self) -> None:
        self.cuda = SimpleNamespace(
            current_device=lambda: torch.device("cpu"),
            synchronize=_no_op,
            empty_cache=_no_op,
            is_available=lambda: False,
            get_rng_state=torch.get_rng_state,
            set_rng_state=torch.set_rng_state,
            manual_seed=torch.manual_seed,
        )

    def __getattr__(self, name: str) -> Any:
        attr = getattr(torch, name)
        if name not in _FACTORIES:
            return attr

        def factory(*args: Any, **kwargs: Any) -> Any:
            if "device" in kwargs:
                kwargs["device"] = _cpu_device(kwargs["device"])
            kwargs.pop("pin_memory", None)
            return attr(*args, **kwargs)

        return factory


def _get_rng_state_cpu(device: Any = None, clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
    return torch.get_rng_state()


def _set_rng_state_cpu(new_state: torch.Tensor, device: Any = -1, graph_safe: bool = False) -> None:
    torch.set_rng_state(new_state)


def _clip_grad_by_total_norm_cpu(
    parameters: Any, max_norm: float, total_norm: float, use_decoupled_grad: bool = False
) -> None:
    """Megatron's ``clip_grad_by_total_norm_fp32`` without its ``torch.cuda.FloatTensor`` assertion."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    attr = "decoupled_grad" if use_decoupled_grad else "grad"
    grads = [getattr(p, attr).detach() for p in parameters if getattr(p, attr, None) is not None]
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0 and grads:
        torch._foreach_mul_(grads, clip_coeff)


@dataclass(frozen=True)
class Patch:
    """Replace ``module.attribute`` because ``evidence`` appears in ``evidence_module``'s source."""

    name: str
    module: str
    attribute: str
    evidence_module: str
    evidence: str
    replacement: Callable[[], Any]


_CPU_TORCH = CpuTorch()


def _torch_view(name: str, module: str, evidence: str) -> Patch:
    return Patch(name, module, "torch", module, evidence, lambda: _CPU_TORCH)


PATCHES: tuple[Patch, ...] = (
    _torch_view("schedules", "megatron.core.pipeline_parallel.schedules", 'device="cuda"'),
    _torch_view("p2p", "megatron.core.pipeline_parallel.p2p_communication", "torch.cuda.synchronize()"),
    _torch_view("causal_mask", "megatron.core.transformer.utils", 'device="cuda"'),
    _torch_view("grad_buffer", "megatron.core.distributed.param_and_grad_buffer", "torch.cuda.current_device()"),
    _torch_view("memory_buffer", "megatron.core.utils", "device=torch.cuda.current_device()"),
    _torch_view("optimizer", "megatron.core.optimizer.optimizer", "device='cuda'"),
    _torch_view("clip_grads", "megatron.core.optimizer.clip_grads", "device='cuda'"),
    _torch_view("rng_tracker", "megatron.core.tensor_parallel.random", "torch.cuda.get_rng_state()"),
    Patch(
        "rng_get",
        "megatron.core.tensor_parallel.random",
        "_get_cuda_rng_state",
        "megatron.core.tensor_parallel.random",
        "torch.cuda.random.get_rng_state(device=device)",
        lambda: _get_rng_state_cpu,
    ),
    Patch(
        "rng_set",
        "megatron.core.tensor_parallel.random",
        "_set_cuda_rng_state",
        "megatron.core.tensor_parallel.random",
        "torch.cuda.default_generators[idx]",
        lambda: _set_rng_state_cpu,
    ),
    Patch(
        "clip_assert",
        "megatron.core.optimizer.optimizer",
        "clip_grad_by_total_norm_fp32",
        "megatron.core.optimizer.clip_grads",
        "assert param.grad.type() == 'torch.cuda.FloatTensor'",
        lambda: _clip_grad_by_total_norm_cpu,
    ),
)


@contextlib.contextmanager
def patched(skip: frozenset[str] = frozenset()) -> Iterator[None]:
    """Apply every patch except those named in ``skip``; restore the originals on exit."""
    with contextlib.ExitStack() as stack:
        for patch in PATCHES:
            if patch.name in skip:
                continue
            module = importlib.import_module(patch.module)
            original = getattr(module, patch.attribute)
            setattr(module, patch.attribute, patch.replacement())
            stack.callback(setattr, module, patch.attribute, original)
        log.debug("cpu compatibility: %d patches applied", len(PATCHES) - len(skip))
        yield


def start_checkpoint_queue() -> None:
    """Point dist_checkpointing's results queue at an in-process queue (no Manager server process).

    The :class:`~air_hpc.resilience.checkpointer.Checkpointer` does this itself; this name
    remains for rank harnesses that call it before building one (see
    :func:`air_hpc.resilience.state.results_queue` for why there is no Manager).
    """
    from air_hpc.resilience.state import results_queue

    results_queue()
