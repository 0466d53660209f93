"""Every patch air-hpc applies to megatron-core 0.16.1, each with the source text that makes it necessary.

One module, so a newcomer (or a megatron-core upgrade) finds them all in one place, and one
evidence mechanism: each patch names the text in Megatron's source it works around, and a unit
test fails when a future megatron-core drops that text (the patch became unnecessary) or when
the patched code stops working (``tests/unit/test_cpu_compat.py``,
``tests/unit/test_train_startup.py``, ``tests/unit/test_resilience_safe_load.py``).

- **Import without** ``torch.compile``: megatron-core's ``megatron/core/jit.py`` sets
  ``jit_fuser = torch.compile`` and its fusion modules (``fused_bias_geglu``, ...) decorate
  functions with it when imported. ``torch.compile(fn)`` imports TorchDynamo and Inductor on the
  spot: about 2.5 s of each rank's ~4 s ``import megatron.core``, paid on every start of every
  rank even when no fused function ever runs (the CPU ranks turn the fusions off).
  :func:`import_megatron` imports megatron-core while ``torch.compile`` is a lazy stand-in: each
  decorated function is compiled by the real ``torch.compile`` on its first call, which is what
  ``torch.compile`` does anyway; only the import moves to the first use.
- **Import without TensorBoard**: ``megatron/core/timers.py`` imports TensorBoard's
  ``SummaryWriter`` (TensorBoard, protobuf, ~90 modules, ~0.07 CPU s per rank) inside a
  ``try``/``except ImportError``, for Megatron's own timer logging, which air-hpc never calls.
  :func:`import_megatron` hides the module while megatron-core loads (``SummaryWriter`` is then
  None there) and unhides it after: ``observe.tensorboard`` imports it as before.
- **CPU ranks** (:func:`cpu_patched`, tests, CI, the demo): Megatron assumes CUDA in a handful
  of places even when ``use_cpu_initialization`` is set: literal ``device="cuda"`` in the
  schedules, the causal mask, the optimizer and grad clipping; ``torch.cuda.current_device()``/
  ``synchronize()`` in the p2p communication and the grad buffers; the RNG tracker reads and
  writes the CUDA generator; grad clipping asserts ``torch.cuda.FloatTensor``. Module-level
  ``torch`` is swapped for :class:`CpuTorch`, a thin view of torch that maps CUDA devices to the
  CPU: targeted, unlike a global ``TorchFunctionMode`` (measured ~1.45x slower), and limited to
  the listed modules. GPU ranks never apply these.
- **dist_checkpointing**: the save finalize needs a CUDA device (:func:`finalize_on_cpu`), and
  the writers report through a Manager process that a preemption signal kills
  (:func:`results_queue`).
"""

import contextlib
import functools
import importlib
import logging
import queue
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

log = logging.getLogger(__name__)

# -- import ------------------------------------------------------------------------------------
#: Where megatron-core binds ``torch.compile`` at import, and the text that shows it.
EVIDENCE_MODULE = "megatron.core.jit"
EVIDENCE = "jit_fuser = torch.compile"

#: The module megatron-core imports for its timers only, and the text that shows it may be absent.
UNUSED_MODULE = "torch.utils.tensorboard"
UNUSED_EVIDENCE_MODULE = "megatron.core.timers"
UNUSED_EVIDENCE = (
    "try:\n    from torch.utils.tensorboard import SummaryWriter\nexcept ImportError:\n    SummaryWriter = None"
)

#: What training imports from megatron-core: all of it at once, before the clock's ``imports`` mark.
TRAINING_MODULES: tuple[str, ...] = (
    "megatron.core",
    "megatron.core.parallel_state",
    "megatron.core.tensor_parallel",
    "megatron.core.models.gpt",
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.distributed",
    "megatron.core.optimizer",
    "megatron.core.optimizer_param_scheduler",
    "megatron.core.pipeline_parallel",
    "megatron.core.transformer.transformer_config",
    "megatron.core.transformer.module",
    "megatron.core.dist_checkpointing",
)


def lazy_compile(compile_fn: Callable[..., Any]) -> Callable[..., Any]:
    """A ``torch.compile`` that defers ``compile_fn(fn)`` to ``fn``'s first call.

    Only the bare decorator form (``@torch.compile`` or ``torch.compile(fn)``) is deferred;
    a call with options goes to ``compile_fn`` at once, as before.
    """

    def compile_later(model: Any = None, **options: Any) -> Any:
        if model is None or options or not callable(model):
            return compile_fn(model, **options) if model is not None else compile_fn(**options)
        compiled: list[Callable[..., Any]] = []

        @functools.wraps(model)
        def first_call_compiles(*args: Any, **kwargs: Any) -> Any:
            if not compiled:
                compiled.append(compile_fn(model))
            return compiled[0](*args, **kwargs)

        return first_call_compiles

    return compile_later


@contextlib.contextmanager
def compile_deferred() -> Iterator[None]:
    """``torch.compile`` is :func:`lazy_compile` inside the block; the real one is restored after it."""
    real = torch.compile
    torch.compile = lazy_compile(real)
    try:
        yield
    finally:
        torch.compile = real


@contextlib.contextmanager
def hidden(module: str) -> Iterator[None]:
    """``import module`` raises ImportError inside the block, unless it was imported already."""
    if module in sys.modules:
        yield
        return
    sys.modules[module] = None  # type: ignore[assignment]  # the import system's "not importable" mark
    try:
        yield
    finally:
        if sys.modules.get(module, ...) is None:
            del sys.modules[module]


def import_megatron(modules: tuple[str, ...] = TRAINING_MODULES) -> None:
    """Import the megatron-core modules training uses, deferring their ``torch.compile`` work, without TensorBoard."""
    with compile_deferred(), hidden(UNUSED_MODULE):
        for name in modules:
            importlib.import_module(name)
    log.debug("imported %d megatron-core modules", len(modules))


# -- CPU ranks ----------------------------------------------------------------------------------
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


CPU_PATCHES: tuple[Patch, ...] = (
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
def applied(patches: Sequence[Patch], skip: frozenset[str] = frozenset()) -> Iterator[None]:
    """Apply ``patches`` except those named in ``skip``; restore the originals on exit."""
    with contextlib.ExitStack() as stack:
        for patch in patches:
            if patch.name in skip:
                continue
            module = importlib.import_module(patch.module)
            original = getattr(module, patch.attribute)
            setattr(module, patch.attribute, patch.replacement())
            stack.callback(setattr, module, patch.attribute, original)
        log.debug("megatron compatibility: %d patches applied", len(patches) - len(skip))
        yield


def cpu_patched(skip: frozenset[str] = frozenset()) -> contextlib.AbstractContextManager[None]:
    """Everything megatron-core needs to train on CPU ranks with gloo, except the patches named in ``skip``."""
    return applied(CPU_PATCHES, skip)


# -- dist_checkpointing -----------------------------------------------------------------------
#: The text in Megatron's save finalize that needs a CUDA device; the unit test fails when it goes away.
FINALIZE_CUDA_EVIDENCE = "device=torch.cuda.current_device()"

#: Megatron's save finalize puts its failure flag on ``torch.cuda.current_device()``.
FINALIZE_ON_CPU = _torch_view(
    "finalize", "megatron.core.dist_checkpointing.strategies.state_dict_saver", FINALIZE_CUDA_EVIDENCE
)


@contextlib.contextmanager
def finalize_on_cpu() -> Iterator[None]:
    """Without CUDA (gloo ranks), Megatron's save finalize sees a ``torch`` whose current device is the CPU."""
    if torch.cuda.is_available():
        yield
        return
    with applied([FINALIZE_ON_CPU]):
        yield


#: What Megatron's writer does that :func:`results_queue` replaces; its unit test fails when it changes.
RESULTS_QUEUE_EVIDENCE = 'ctx = mp.get_context("spawn")\n        _results_queue = ctx.Manager().Queue()'


def results_queue() -> "queue.Queue[Any]":
    """Make Megatron's writers report to an in-process queue instead of a Manager process.

    Megatron hands the write results from its writer processes to the finalize step through
    a module-global ``multiprocessing.Manager().Queue()``: a server process started with spawn
    (which re-imports ``__main__``) and, being part of the job step, killed by the preemption
    signal that Slurm sends to every process of the step, so the save that follows fails. Our
    writers run in this process (sync) or return their results through a pipe (async), so a
    plain queue read by this process is all that finalize needs. Left in place for the process.
    """
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if not isinstance(filesystem_async._results_queue, queue.Queue):
        filesystem_async._results_queue = queue.Queue()
    return filesystem_async._results_queue
