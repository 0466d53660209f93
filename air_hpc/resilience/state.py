"""What a checkpoint holds, in Megatron-core's ``dist_checkpointing`` (``torch_dist``) format.

- model chunks and optimizer state as sharded tensors: each rank writes its own
  shards, and a different TP/PP/DP layout can load them (resharding);
- per-rank RNG state (python, numpy, torch CPU, torch CUDA, Megatron's RNG
  tracker) as one row of a ``[world_size, n]`` uint8 tensor holding JSON, keyed
  by global rank. Restored only when the layout is unchanged; otherwise it is
  re-derived from the step and :class:`Loaded` says so;
- progress (step, and the :class:`TrainingState`'s ``progress`` counters as ``extra``),
  the LR scheduler state and the layout in ``air_hpc_state.json``, written by rank 0.

Nothing of ours is pickled, and :func:`load` checks every pickle the library
would read with a restricted loader first (:mod:`air_hpc.resilience.safe_load`).

This is the one adapter of Megatron's ``dist_checkpointing``: :class:`DistCheckpoint` is what
the checkpointer drives, with the layout passed in (never read from ``parallel_state``); the
patches it needs live in :mod:`air_hpc.backend.megatron_compat`. Megatron modules are imported
where used: a rank imports megatron-core once, through ``megatron_compat.import_megatron``
(without it each rank start pays ~2.5 s of ``torch.compile`` set-up).
"""

import base64
import contextlib
import json
import logging
import queue
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from air_hpc.backend import collectives, megatron_compat
from air_hpc.config.layout import ParallelLayout
from air_hpc.errors import CheckpointError
from air_hpc.records.files import atomic_write
from air_hpc.resilience.safe_load import check_checkpoint
from air_hpc.resilience.training_state import ModelChunk, TrainingState

log = logging.getLogger(__name__)

STATE_FILE = "air_hpc_state.json"
STATE_FORMAT = 1
RNG_KEY = "air_hpc.rng_state"


@dataclass(frozen=True)
class Loaded:
    """What :func:`load` restored besides the tensors."""

    step: int
    extra: dict[str, Any]
    saved_layout: ParallelLayout
    layout_changed: bool
    rng_restored: bool


def sharded_state_dict(training: TrainingState, rng_row: Any | None, *, is_loading: bool) -> dict[str, Any]:
    """Model and optimizer as Megatron sharded state, plus this rank's RNG row when given."""
    state: dict[str, Any] = {}
    for key, chunk in _model_keys(training.model_chunks):
        state[key] = chunk.sharded_state_dict()
    state["optimizer"] = training.optimizer.sharded_state_dict(state, is_loading=is_loading)
    if rng_row is not None:
        state[RNG_KEY] = rng_row
    return state


def _model_keys(model_chunks: Sequence[ModelChunk]) -> list[tuple[str, ModelChunk]]:
    """``model`` (or ``model0``, ``model1``, ... with virtual stages) -> the chunk inside its DDP wrapper.

    Unwrapping keeps the checkpoint's tensor names free of wrapper prefixes, so a checkpoint
    does not depend on DDP (or on the bf16 wrapper, which adds none).
    """
    from megatron.core.distributed import DistributedDataParallel

    inner = [c.module if isinstance(c, DistributedDataParallel) else c for c in model_chunks]
    if len(inner) == 1:
        return [("model", inner[0])]
    return [(f"model{i}", chunk) for i, chunk in enumerate(inner)]


# -- RNG as data -------------------------------------------------------------------------------
def _b64(tensor: Any) -> str:
    return base64.b64encode(tensor.cpu().numpy().tobytes()).decode()


def _unb64(text: str) -> Any:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def capture_rng() -> dict[str, Any]:
    """This rank's generator states as JSON-able data."""
    from megatron.core import tensor_parallel

    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
        "torch": _b64(torch.get_rng_state()),
        "cuda": _b64(torch.cuda.get_rng_state()) if torch.cuda.is_available() and torch.cuda.is_initialized() else None,
        "tracker": {name: _b64(s) for name, s in tensor_parallel.get_cuda_rng_tracker().get_states().items()},
    }
    return state


def restore_rng(state: dict[str, Any]) -> None:
    from megatron.core import tensor_parallel

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_unb64(state["torch"]))
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(_unb64(state["cuda"]))
    tracker = tensor_parallel.get_cuda_rng_tracker()
    tracker.set_states({name: _unb64(s) for name, s in state["tracker"].items()})


def reseed_all(value: int) -> None:
    """Default re-derivation after a layout change: every generator from ``value`` (+ Megatron's offsets)."""
    from megatron.core import tensor_parallel

    tensor_parallel.model_parallel_cuda_manual_seed(value)
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)


def _rng_row(rank: int, world: int, length: int | None = None) -> tuple[Any, int]:
    """This rank's RNG JSON as row ``rank`` of a ``[world, length]`` uint8 ShardedTensor.

    All ranks must agree on ``length`` (the global shape): the longest row, found with one
    MAX all-reduce when saving; read from the state file when loading.
    """
    from megatron.core.dist_checkpointing import ShardedTensor

    payload = json.dumps(capture_rng()).encode()
    if length is None:
        length = collectives.max_int(len(payload))
    data = torch.full((1, length), ord(" "), dtype=torch.uint8)
    data[0, : len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    row = ShardedTensor.from_rank_offsets(RNG_KEY, data, (0, rank, world), replica_id=0)
    return row, length


# -- save / load -------------------------------------------------------------------------------
def write_state_file(directory: Path, step: int, layout: ParallelLayout, training: TrainingState, rng_len: int) -> None:
    """Rank 0: progress, scheduler and layout as JSON (fsynced by the store's commit)."""
    scheduler = training.scheduler
    doc = {
        "format": STATE_FORMAT,
        "step": step,
        "layout": {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "vpp": layout.vpp},
        "rng_row_bytes": rng_len,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "extra": dict(training.progress),
    }
    atomic_write(directory / STATE_FILE, json.dumps(doc, indent=1) + "\n", durable=False)


def read_state_file(directory: Path) -> dict[str, Any]:
    path = directory / STATE_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path}: missing (not an air-hpc checkpoint)") from exc
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not JSON ({exc})") from exc
    if doc.get("format") != STATE_FORMAT:
        raise CheckpointError(f"{path}: format {doc.get('format')!r}, expected {STATE_FORMAT}")
    return dict(doc)


def prepare_save(
    directory: Path, step: int, training: TrainingState, *, layout: ParallelLayout, validate: bool = True
) -> Any:
    """Plan a save of this rank's state into ``directory`` (all ranks); returns Megatron's AsyncRequest.

    ``validate``: let Megatron check that every shard is saved exactly once (one all-gather of
    the shard metadata). The structure of a run's state does not change between its saves, so
    the checkpointer validates the first save of each process only.

    The request's ``async_fn`` writes the shards (run it here for a sync save, or in a
    forked process for an async one); its finalize functions are collectives.
    Rank 0 has already written ``common.pt`` and the JSON state file when this returns.
    """
    from megatron.core import dist_checkpointing

    rank, world = dist.get_rank(), dist.get_world_size()
    row, rng_len = _rng_row(rank, world)
    state = sharded_state_dict(training, row, is_loading=False)
    request = dist_checkpointing.save(
        state, str(directory), async_sharded_save=True, validate_access_integrity=validate
    )
    if rank == 0:
        write_state_file(directory, step, layout, training, rng_len)
    return request


def save(directory: Path, training: TrainingState, *, step: int, layout: ParallelLayout) -> None:
    """Synchronous save of all ranks' state into ``directory`` (collective; returns when written)."""
    request = prepare_save(directory, step, training, layout=layout)
    run_request(request)
    finalize_request(request)


def shard_files(request: Any) -> list[Path]:
    """The files this rank's ``async_fn`` writes (one per write bucket)."""
    if request.async_fn is None:
        return []
    return [Path(bucket[0]) for bucket in request.async_fn_args[1]]


def staged(request: Any) -> Any:
    """``request`` with its GPU tensors copied to host memory now, ready for a forked writer.

    The copy (Megatron's ``preload_fn``) must happen in the rank: a forked child cannot use
    the parent's CUDA context. A request with nothing to stage is returned as it is.
    """
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncRequest

    if request.async_fn is None or request.preload_fn is None:
        return request
    args = list(request.async_fn_args)
    args[1] = request.preload_fn()
    return AsyncRequest(request.async_fn, tuple(args), request.finalize_fns, request.async_fn_kwargs)


def drain(results: "queue.Queue[Any]") -> None:
    """Drop results a failed save left behind, so the next finalize reads its own."""
    with contextlib.suppress(queue.Empty):
        while True:
            results.get_nowait()


def run_request(request: Any, stage_to_host: bool = False, results: Any = None) -> None:
    """Write this rank's shards now, in this process; ``results`` replaces the request's results queue."""
    args = list(request.async_fn_args)
    if stage_to_host and request.preload_fn is not None:
        args[1] = request.preload_fn()
    if results is not None and len(args) == 3:
        args[2] = results
    if request.async_fn is not None:
        request.async_fn(*args, **request.async_fn_kwargs)


def finalize_request(request: Any) -> None:
    """Collective: gather the write results, rank 0 writes ``.metadata`` and ``metadata.json``."""
    dist.barrier()
    with megatron_compat.finalize_on_cpu():
        for fn in request.finalize_fns:
            fn()


def load(
    directory: Path,
    training: TrainingState,
    *,
    layout: ParallelLayout,
    reseed: Callable[[int], None] | None = None,
) -> Loaded:
    """Load ``directory`` into this rank's model, optimizer and scheduler (collective; progress is returned).

    With the same layout every rank gets its RNG state back (bit-exact resume). With a
    different one the shards are resharded and the RNG is re-derived with
    ``reseed(step)`` (default :func:`reseed_all`).
    """
    from megatron.core import dist_checkpointing

    doc = read_state_file(directory)
    saved = ParallelLayout(**doc["layout"])
    same = saved == layout
    check_checkpoint(directory)
    rank, world = dist.get_rank(), dist.get_world_size()
    row = _rng_row(rank, world, int(doc["rng_row_bytes"]))[0] if same else None
    state = sharded_state_dict(training, row, is_loading=True)
    loaded = dist_checkpointing.load(state, str(directory))
    for key, chunk in _model_keys(training.model_chunks):
        chunk.load_state_dict(loaded[key])
    training.optimizer.load_state_dict(loaded["optimizer"])
    if training.scheduler is not None and doc["scheduler"] is not None:
        training.scheduler.load_state_dict(doc["scheduler"])
    step = int(doc["step"])
    if same:
        payload = loaded[RNG_KEY].reshape(-1).numpy().tobytes()
        restore_rng(json.loads(payload))
    else:
        log.warning("layout changed from %s to %s: resharded; RNG re-derived from step %d", saved, layout, step)
        (reseed or reseed_all)(step)
    return Loaded(step=step, extra=dict(doc["extra"]), saved_layout=saved, layout_changed=not same, rng_restored=same)


class DistCheckpoint:
    """The checkpoint format as the :class:`~air_hpc.resilience.checkpointer.Checkpointer` drives it.

    Binds the layout (the caller's, never read from Megatron's globals) to the functions
    above, so the checkpointer holds one object it can be given a fake of in unit tests.
    """

    def __init__(self, layout: ParallelLayout) -> None:
        self.layout = layout

    def plan(self, directory: Path, step: int, training: TrainingState, validate: bool) -> Any:
        return prepare_save(directory, step, training, layout=self.layout, validate=validate)

    def stage(self, request: Any) -> Any:
        return staged(request)

    def writes(self, request: Any) -> bool:
        return request.async_fn is not None

    def write(self, request: Any, stage_to_host: bool, results: Any) -> None:
        run_request(request, stage_to_host=stage_to_host, results=results)

    def shard_files(self, request: Any) -> list[Path]:
        return shard_files(request)

    def results_queue(self) -> "queue.Queue[Any]":
        return megatron_compat.results_queue()

    def finalize(self, request: Any) -> None:
        finalize_request(request)

    def check(self, directory: Path) -> None:
        check_checkpoint(directory)

    def load(self, directory: Path, training: TrainingState, reseed: Callable[[int], None] | None) -> Loaded:
        return load(directory, training, layout=self.layout, reseed=reseed)
