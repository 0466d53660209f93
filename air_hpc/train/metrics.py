"""Per-step metrics (``metrics.jsonl``, read by ``records.metrics``) and per-rank log files.

Losses are written with ``json``'s float repr, which round-trips exactly, so two
runs (or a run and its resumed twin) compare bit for bit.
"""

import json
import logging
import time
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from io import TextIOWrapper
from pathlib import Path
from typing import IO

from air_hpc.config.models import ModelConfig
from air_hpc.records.files import atomic_write, open_append, refuse_link
from air_hpc.records.metrics import step_of

#: Dense bf16 peak of one accelerator, by a substring of ``torch.cuda.get_device_name()``.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2.5e15),
    ("B200", 2.25e15),
    ("H200", 989e12),
    ("H100", 989e12),
    ("A100", 312e12),
    ("MI300X", 1307e12),
)


@dataclass(frozen=True)
class StepMetrics:
    step: int
    loss: float
    lr: float
    grad_norm: float
    tokens_per_s: float
    step_time_s: float
    mfu: float | None = None
    time: float = field(default_factory=time.time)
    """When the step finished (wall clock): the x axis of ``air-hpc plot`` and the basis of goodput."""
    resumed_from: int | None = None
    """On the first step after a resume: the checkpoint's step."""
    rng_restored: bool | None = None
    """On the first step after a resume: False when the layout changed and the RNG was re-derived."""

    def to_json(self) -> str:
        return json.dumps({key: value for key, value in asdict(self).items() if value is not None})


class MetricsWriter:
    """Appends one line per step and flushes it, so a killed run keeps every finished step.

    A resumed run first drops the records after its checkpoint's step (a crash
    between checkpoints trained them once already; they are trained again), so
    the file always reads like one uninterrupted run.
    """

    def __init__(self, path: Path, keep_through_step: int = 0) -> None:
        refuse_link(path)  # the resume below reads the file: never one a link points at
        if path.is_file():
            _truncate_after(path, keep_through_step)
        self._fh: IO[str] = open_append(path)

    def write(self, metrics: StepMetrics) -> None:
        self._fh.write(metrics.to_json() + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def _truncate_after(path: Path, step: int) -> None:
    lines = path.read_bytes().splitlines(keepends=True)  # bytes: a line that is not UTF-8 is dropped, not fatal
    steps = [step_of(line) for line in lines]
    kept = [line for line, number in zip(lines, steps, strict=True) if number is not None and number <= step]
    if len(kept) == len(lines):
        return
    atomic_write(path, b"".join(kept))


def flops_per_token(model: ModelConfig) -> float:
    """Training FLOPs per token: 6 x parameters in matmuls plus attention scores (Megatron/PaLM accounting)."""
    h, layers, s = model.hidden_size, model.num_layers, model.seq_len
    ffn = model.ffn_hidden_size or 4 * h
    per_layer = 4 * h * h + 2 * h * ffn
    matmul_params = layers * per_layer + h * model.vocab_size
    return 6.0 * matmul_params + 12.0 * layers * h * s


def peak_flops(device_name: str) -> float | None:
    for key, flops in PEAK_BF16_FLOPS:
        if key in device_name:
            return flops
    return None


def model_flops_utilization(tokens_per_s: float, per_token: float, peak_per_device: float, devices: int) -> float:
    return tokens_per_s * per_token / (peak_per_device * devices)


def step_line(
    step: int, total: int, loss: float | None, lr: float, grad_norm: float, seconds: float, loader_s: float
) -> str:
    """The per-step log line; ``loss`` None on ranks that do not hold it (only the last pipeline stage does)."""
    shown = f" loss {loss:.6f}" if loss is not None else ""
    timing = f"{seconds:.3f} s (loader {loader_s * 1e3:.1f} ms)"
    return f"step {step}/{total}{shown} lr {lr:.3g} grad_norm {grad_norm:.4f} {timing}"


#: Warnings every rank prints alike when Megatron is imported without Transformer Engine or Apex.
SAME_ON_EVERY_RANK = (r"Transformer Engine (and Apex )?(is|are) not installed", r"Apex is not installed")
#: Set (by ``air-hpc -v``, or by hand in the job's environment) to keep every import-time warning on every rank.
VERBOSE_ENV = "AIR_HPC_VERBOSE"


def warn_once_per_job(rank: int, restart: int, on_cpu: bool = False, environ: Mapping[str, str] | None = None) -> None:
    """Quiet Megatron's import-time warnings about missing Transformer Engine / Apex; call before Megatron's import.

    On CPU hardware they do not apply (both are CUDA libraries): silenced on every rank. On GPUs they are
    kept to rank 0 of the first start, not repeated by every rank at every start. ``AIR_HPC_VERBOSE`` set in
    ``environ`` (the job's) keeps them all.
    """
    if (environ or {}).get(VERBOSE_ENV) or (rank == 0 and restart == 0 and not on_cpu):
        return
    for pattern in SAME_ON_EVERY_RANK:
        warnings.filterwarnings("ignore", message=pattern, category=UserWarning)


class RankFormatter(logging.Formatter):
    """Puts the time, rank, level and logger on every line, continuation lines of a record included."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def format(self, record: logging.LogRecord) -> str:
        header = f"{self.formatTime(record)} rank={self.rank} {record.levelname} {record.name}: "
        return "\n".join(header + line for line in super().format(record).splitlines() or [""])


class _RankLogHandler(logging.FileHandler):
    """A rank's log file, opened without following a link (``records.files``)."""

    def _open(self) -> TextIOWrapper:
        return open_append(Path(self.baseFilename))


def setup_rank_logging(log_file: Path, rank: int, level: int = logging.INFO) -> logging.Handler:
    """Send this process's log records to ``log_file`` with the rank on every line."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    handler = _RankLogHandler(log_file, encoding="utf-8")
    handler.setFormatter(RankFormatter(rank))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    return handler
