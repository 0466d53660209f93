"""Import megatron-core for training without paying for ``torch.compile`` at import time.

Evidence: megatron-core 0.16.1's ``megatron/core/jit.py`` sets ``jit_fuser = torch.compile``
and its fusion modules (``fused_bias_geglu``, ``fused_bias_gelu``, ...) decorate functions with
it when imported. ``torch.compile(fn)`` imports TorchDynamo and Inductor on the spot: about
2.5 s of each rank's ~4 s ``import megatron.core``, paid on every start of every rank even
when no fused function ever runs (the CPU ranks turn the fusions off).

:func:`import_megatron` imports megatron-core while ``torch.compile`` is a lazy stand-in:
each decorated function is compiled by the real ``torch.compile`` on its first call, which is
what ``torch.compile`` does anyway (it compiles on the first call, not when applied); only
the import moves to the first use. ``tests/unit/test_megatron_compat.py`` fails when a
future megatron-core no longer shows the evidence.
"""

import contextlib
import functools
import importlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

#: Where megatron-core binds ``torch.compile`` at import, and the text that shows it.
EVIDENCE_MODULE = "megatron.core.jit"
EVIDENCE = "jit_fuser = torch.compile"

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
    import torch

    real = torch.compile
    torch.compile = lazy_compile(real)
    try:
        yield
    finally:
        torch.compile = real


def import_megatron(modules: tuple[str, ...] = TRAINING_MODULES) -> None:
    """Import the megatron-core modules training uses, deferring their ``torch.compile`` work."""
    with compile_deferred():
        for name in modules:
            importlib.import_module(name)
    log.debug("imported %d megatron-core modules", len(modules))
