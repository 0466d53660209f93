"""The run directory: one place that names every file a run writes.

Everything that reads or writes a run's files (submit, the trainer, resilience,
status/logs/report) goes through :class:`RunDir`, so the layout lives here only::

    <run.root>/<run.name>/
      job.json           resolved JobConfig (written by submit; read by the job)
      job.sbatch         rendered batch script
      submissions.jsonl  one line per submission/requeue: job id, time, executor
      metrics.jsonl      one JSON object per training step (written by the last PP stage, DP rank 0)
      events.jsonl       signal / checkpoint / requeue / resume / hang / health events
      bad_nodes.txt      nodes found hung or unhealthy, one per line
      logs/              per-rank logs (rank-<R>.log) and the batch script's output
      heartbeat/         per-rank heartbeat files, per start (<job id>-<restart>/): also the ranks'
                         "armed-<rank>" (stop handler installed) and the batch shell's "stop_requested"
      checkpoints/       step_0000123/ directories and the `latest` pointer
      owner.json         the one job that may write here (taken at submit, checked by every rank)
      .owner.lock        flock held while the owner is checked and replaced
      tensorboard/       TensorBoard event files (observe.tensorboard)
"""

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from air_hpc.config.load import validate_json
from air_hpc.config.models import JobConfig

log = logging.getLogger(__name__)

#: In a start's heartbeat directory: a rank touches ``armed-<rank>`` once its stop handler is
#: installed; the batch shell forwards a stop signal only when every rank is armed, and touches
#: ``stop_requested`` first so that a rank arming later still sees the stop.
ARMED_FILE_PREFIX = "armed-"
STOP_REQUESTED_FILE = "stop_requested"


@dataclass(frozen=True)
class RunDir:
    path: Path

    @classmethod
    def of(cls, job: JobConfig) -> "RunDir":
        return cls(job.run.dir)

    @property
    def job_json(self) -> Path:
        return self.path / "job.json"

    @property
    def sbatch(self) -> Path:
        return self.path / "job.sbatch"

    @property
    def submissions(self) -> Path:
        return self.path / "submissions.jsonl"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def events(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def bad_nodes(self) -> Path:
        return self.path / "bad_nodes.txt"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def heartbeat(self) -> Path:
        return self.path / "heartbeat"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def owner(self) -> Path:
        return self.path / "owner.json"

    @property
    def owner_lock(self) -> Path:
        return self.path / ".owner.lock"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank-{rank}.log"

    def write_job(self, job: JobConfig) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self.job_json.write_text(job.model_dump_json(indent=2) + "\n")

    def read_job(self) -> JobConfig:
        return validate_json(self.job_json)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON-lines run file; a line torn by a killed writer is skipped with a warning."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            log.warning("%s:%d: skipping a line that is not JSON (torn write?)", path, number)
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows
