"""Per-step metrics (``metrics.jsonl``) and per-rank log files.

Losses are written with ``json``'s float repr, which round-trips exactly, so two
runs (or a run and its resumed twin) compare bit for bit.
"""

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from air_hpc.config.models import ModelConfig

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

    def to_json(self) -> str:
        record = asdict(self)
        if self.mfu is None:
            del record["mfu"]
        return json.dumps(record)


def read_metrics(path: Path) -> list[dict[str, float]]:
    """Every record of a ``metrics.jsonl``, in order."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class MetricsWriter:
    """Appends one line per step and flushes it, so a killed run keeps every finished step."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] = path.open("a", encoding="utf-8")

    def write(self, metrics: StepMetrics) -> None:
        self._fh.write(metrics.to_json() + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


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


class RankFormatter(logging.Formatter):
    """Puts the time, rank, level and logger on every line, continuation lines of a record included."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def format(self, record: logging.LogRecord) -> str:
        header = f"{self.formatTime(record)} rank={self.rank} {record.levelname} {record.name}: "
        return "\n".join(header + line for line in super().format(record).splitlines() or [""])


def setup_rank_logging(log_file: Path, rank: int, level: int = logging.INFO) -> logging.Handler:
    """Send this process's log records to ``log_file`` with the rank on every line."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_file, encoding="utf-8")
    handler.setFormatter(RankFormatter(rank))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    return handler
