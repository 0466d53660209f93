"""What Slurm tells a batch script and its tasks through ``SLURM_*``: read in one place, once.

:meth:`SlurmEnv.from_environ` takes any mapping (``os.environ``, a dict in a test, another process's
environment), so callers never spell a variable name or parse its value themselves. An unset
variable is ``None`` (or empty); a count or id that is set but not a number is a :class:`ConfigError`
naming the variable, as a job's environment is input like any other.
"""

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from air_hpc.digits import ascii_int
from air_hpc.errors import ConfigError
from air_hpc.slurm import hostlist

log = logging.getLogger(__name__)

JOB_ID = "SLURM_JOB_ID"
#: An array task's array job and index: records name the task ``ARRAY_INDEX``, as squeue, sacct and scancel do.
ARRAY_JOB_ID = "SLURM_ARRAY_JOB_ID"
ARRAY_TASK_ID = "SLURM_ARRAY_TASK_ID"
RESTART_COUNT = "SLURM_RESTART_COUNT"
PROCID = "SLURM_PROCID"
NTASKS = "SLURM_NTASKS"
LOCALID = "SLURM_LOCALID"
STEP_ID = "SLURM_STEP_ID"
#: The allocation's nodes; ``SLURM_NODELIST`` is the older name, read when the newer is unset.
JOB_NODELIST = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
NODENAME = "SLURMD_NODENAME"
#: One host per rank for ``srun --distribution=arbitrary``.
HOSTFILE = "SLURM_HOSTFILE"
#: Epoch seconds; set from Slurm 23.02.
JOB_START_TIME = "SLURM_JOB_START_TIME"
JOB_END_TIME = "SLURM_JOB_END_TIME"


@dataclass(frozen=True)
class SlurmEnv:
    """The ``SLURM_*`` variables air-hpc uses, typed; ``None`` or empty where unset."""

    job_id: str | None = None
    """``SLURM_JOB_ID`` as text: it is compared with the ids in run records."""
    restart_count: int = 0
    """``SLURM_RESTART_COUNT``: requeues of this job so far (unset on the first start)."""
    procid: int | None = None
    """``SLURM_PROCID``: this task's global rank."""
    ntasks: int | None = None
    """``SLURM_NTASKS``: tasks in the step (the world size)."""
    localid: int | None = None
    """``SLURM_LOCALID``: this task's rank on its node."""
    step_id: int | None = None
    """``SLURM_STEP_ID`` of a job step (``srun``); None in the batch script (26.05 sets it there to ``-5``)."""
    nodelist: tuple[str, ...] = ()
    """The allocation's nodes, expanded, in Slurm's order."""
    nodename: str | None = None
    """``SLURMD_NODENAME``: the node this task runs on."""
    hostfile: Path | None = None
    """``SLURM_HOSTFILE``."""
    job_start_time_s: float | None = None
    """``SLURM_JOB_START_TIME``; ``None`` also when it is not positive epoch seconds (logged)."""
    job_end_time_s: float | None = None
    """``SLURM_JOB_END_TIME``; as the start time."""
    array_job_id: int | None = None
    """``SLURM_ARRAY_JOB_ID``: the array this job is a task of (a sweep's element)."""
    array_task_id: int | None = None
    """``SLURM_ARRAY_TASK_ID``: the task's index in its array."""

    @property
    def run_job_id(self) -> str | None:
        """The job as a run's records name it: ``ARRAY_INDEX`` for an array task (known at submit, stable across
        requeues, and what every Slurm command takes), else ``SLURM_JOB_ID``."""
        if self.array_job_id is not None and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "SlurmEnv":
        nodelist_var = next((v for v in JOB_NODELIST if environ.get(v)), None)
        nodelist = environ[nodelist_var] if nodelist_var else ""
        hostfile = environ.get(HOSTFILE)
        return cls(
            job_id=environ.get(JOB_ID) or None,
            restart_count=_count(environ, RESTART_COUNT) or 0,
            procid=_count(environ, PROCID),
            ntasks=_count(environ, NTASKS),
            localid=_count(environ, LOCALID),
            step_id=_step_id(environ),
            nodelist=tuple(hostlist.expand(nodelist, f"${nodelist_var}")) if nodelist_var else (),
            nodename=environ.get(NODENAME) or None,
            hostfile=Path(hostfile) if hostfile else None,
            job_start_time_s=epoch_seconds(environ, JOB_START_TIME),
            job_end_time_s=epoch_seconds(environ, JOB_END_TIME),
            array_job_id=_count(environ, ARRAY_JOB_ID),
            array_task_id=_count(environ, ARRAY_TASK_ID),
        )


def _count(environ: Mapping[str, str], var: str) -> int | None:
    text = environ.get(var)
    if text is None or not text.strip():
        return None
    value = ascii_int(text)
    if value is None:
        raise ConfigError(f"${var}={text!r}: expected a whole number, as Slurm sets it")
    return value


#: Step ids above this are Slurm's special steps (slurm.h: batch script 0xfffffffb, extern 0xfffffffc, ...)
MAX_NORMAL_STEP_ID = 0xFFFFFFF0


def _step_id(environ: Mapping[str, str]) -> int | None:
    """A job step's id; None outside one (26.05 sets ``SLURM_STEP_ID=-5``, the batch step, in the batch shell)."""
    text = environ.get(STEP_ID, "").strip()
    if text.startswith("-") and ascii_int(text[1:]) is not None:
        signed = -int(text[1:])
        value: int | None = signed & 0xFFFFFFFF if signed >= -(1 << 31) else None
    else:
        value = _count(environ, STEP_ID)
    if value is None and text:
        raise ConfigError(f"${STEP_ID}={text!r}: expected a whole number, as Slurm sets it")
    return None if value is None or value > MAX_NORMAL_STEP_ID else value


def epoch_seconds(environ: Mapping[str, str], var: str) -> float | None:
    """Positive epoch seconds in ``var``; ``None`` when unset or not a time (logged: the caller has a fallback)."""
    text = environ.get(var, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        log.warning("ignoring %s=%r: not epoch seconds", var, text)
        return None
    return value if value > 0 else None
