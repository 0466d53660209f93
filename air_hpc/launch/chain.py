"""Runs that wait for other jobs (``submit --after``) and runs longer than one job may last (``submit --chain N``).

``--after RUN_OR_JOB[:ok|any|notok]`` becomes ``--dependency=afterok:JOBID`` (``afterany``,
``afternotok``): a job id must be one Slurm knows, a run or a sweep stands for its current job (a
chain: its last link; a sweep: its array). ``--chain N`` submits the run's script N times with
``--dependency=singleton``: Slurm starts one link at a time (same job name and user), each resumes
from the last checkpoint and stops within its time limit through the trainer's deadline; each link
takes over the run's ownership as it starts (:func:`air_hpc.ownership.owner.advance_chain`). When
the run completes, the links left are cancelled before they get an allocation
(:mod:`air_hpc.runtime.batch`).
"""

import logging
from dataclasses import dataclass
from pathlib import Path

from air_hpc.config.models import JobConfig
from air_hpc.errors import ConfigError, SlurmError, UserError
from air_hpc.slurm.client import SlurmClient

log = logging.getLogger(__name__)

#: ``--after X:KIND`` -> Slurm's dependency type.
AFTER_KINDS = {"ok": "afterok", "any": "afterany", "notok": "afternotok"}


@dataclass(frozen=True)
class After:
    target: str
    kind: str
    """afterok, afterany or afternotok."""


def parse_after(text: str) -> After:
    """``RUN_OR_JOB[:ok|any|notok]`` (``ok`` when no kind is given)."""
    target, sep, kind = text.rpartition(":")
    if not sep or kind not in AFTER_KINDS:
        if sep and not Path(text).exists():
            raise UserError(f"--after {text!r}: unknown kind {kind!r}; use RUN_OR_JOB[:ok|any|notok]")
        target, kind = text, "ok"
    if not target:
        raise UserError(f"--after {text!r}: expected RUN_OR_JOB[:ok|any|notok]")
    return After(target, AFTER_KINDS[kind])


def dependency(after: str | None, chain: int) -> str | None:
    """The ``--dependency`` value: the wait for another job, and ``singleton`` for a chain (both must hold)."""
    parts = [after] if after else []
    if chain > 1:
        parts.append("singleton")
    return ",".join(parts) or None


def check_chain(job: JobConfig, executor: str, chain: int) -> None:
    if chain < 1:
        raise UserError(f"--chain {chain}: at least 1 (one job; 2 or more make a chain)")
    if chain > 1 and executor != "slurm":
        raise ConfigError(
            f"--chain: links are our batch script's (--dependency=singleton); use --executor slurm, not {executor}"
        )


def chain_note(job: JobConfig, client: SlurmClient) -> str | None:
    """A warning when the job's partition has no time limit: one job can run to the end, no chain is needed."""
    try:
        partitions = client.partitions()
    except SlurmError as exc:
        log.info("partition limits not read for --chain: %s", exc)
        return None
    wanted = job.cluster.partition
    part = next((p for p in partitions if (p.name == wanted if wanted else p.default)), None)
    if part is None or part.max_time_min is not None:
        return None
    return (
        f"partition {part.name} has no time limit: one job with resources.time_limit_min long enough needs no chain "
        "(the chain is submitted anyway)"
    )
