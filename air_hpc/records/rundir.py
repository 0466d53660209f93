"""The run directory: where each file of a run lives (the names are in ``records.names``).

Everything that reads or writes a run's files (submit, the trainer, resilience,
status/logs/report) goes through :class:`RunDir`, so the layout lives here only::

    <run.root>/<run.name>/
      job.json           resolved JobConfig (written by submit; read by the job)
      job.sbatch         rendered batch script
      submissions.jsonl  one line per submission/requeue: job id, time, executor
      metrics.jsonl      one JSON object per training step (written by the last PP stage, DP rank 0)
      events.jsonl       signal / checkpoint / requeue / resume / hang / health events
      bad_nodes.txt      nodes found hung or unhealthy, one per line
      hostfile           the placement's rank order for the submitit executor (written at submit; the
                         batch script's is per start: heartbeat/<generation>/hostfile)
      logs/              per-rank logs (rank-<R>.log) and the batch script's output
      heartbeat/         one directory per start (``records.generation``): its rank order, per-rank heartbeats,
                         the ranks' "armed-<rank>", the batch shell's "stop_requested", the ranks' "exit_code"
      checkpoints/       step_0000123/ directories and the `latest` pointer
      owner.json         the one job that may write here (taken at submit, checked by every rank)
      .owner.lock        flock held while the owner is checked and replaced
      tensorboard/       TensorBoard event files (observe.tensorboard)
      phase_times.json   the setup, load, step and save times seen so far (the learned hang limits)
"""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from air_hpc.records import names
from air_hpc.records.files import atomic_write

if TYPE_CHECKING:
    from air_hpc.config.models import JobConfig


@dataclass(frozen=True)
class RunDir:
    path: Path

    @classmethod
    def of(cls, job: "JobConfig") -> "RunDir":
        return cls(job.run.dir)

    @property
    def job_json(self) -> Path:
        return self.path / names.JOB_JSON

    @property
    def sbatch(self) -> Path:
        return self.path / names.SBATCH

    @property
    def submissions(self) -> Path:
        return self.path / names.SUBMISSIONS

    @property
    def metrics(self) -> Path:
        return self.path / names.METRICS

    @property
    def events(self) -> Path:
        return self.path / names.EVENTS

    @property
    def bad_nodes(self) -> Path:
        return self.path / names.BAD_NODES

    @property
    def logs(self) -> Path:
        return self.path / names.LOGS

    @property
    def heartbeat(self) -> Path:
        return self.path / names.HEARTBEAT

    @property
    def checkpoints(self) -> Path:
        return self.path / names.CHECKPOINTS

    @property
    def owner(self) -> Path:
        return self.path / names.OWNER

    @property
    def owner_lock(self) -> Path:
        return self.path / names.OWNER_LOCK

    @property
    def tensorboard(self) -> Path:
        return self.path / names.TENSORBOARD

    @property
    def phase_times(self) -> Path:
        return self.path / names.PHASE_TIMES

    @property
    def hostfile(self) -> Path:
        return self.path / names.HOSTFILE

    def rank_log(self, rank: int) -> Path:
        return self.logs / names.RANK_LOG.format(rank=rank)

    def batch_logs(self, job_id: str) -> tuple[Path, Path]:
        """The batch script's stdout and stderr files of one job."""
        return (
            self.logs / names.BATCH_STDOUT.replace("%j", job_id),
            self.logs / names.BATCH_STDERR.replace("%j", job_id),
        )

    def write_job(self, job: "JobConfig") -> None:
        atomic_write(self.job_json, job.model_dump_json(indent=2) + "\n")

    def read_job(self) -> "JobConfig":
        # pydantic (~4x the rest of records/) only here: the batch shell's helper and the signal path import records/.
        from air_hpc.config.load import validate_json

        return validate_json(self.job_json)
