"""One start's directory, ``<run>/heartbeat/<generation>/``: where its ranks beat, arm, and leave their verdict.

The generation (``<job id>-<restart count>``) keeps the files of one start of
the job apart from those of the previous start (and of any other job). The
directory holds the start's rank order (``hostfile``, when placement pins one;
the supervisor rewrites it when a spare takes a node's ranks), each rank's
heartbeat (``health.heartbeat``), the stop protocol's ``armed-<rank>`` and
``stop_requested`` files (``resilience.signals``), the pre-flight reports
(``health.preflight``) and the verdict file: when ranks exit because of a hang
or a failed pre-flight check, ``srun`` kills the others and reports *their*
signal (143), not ours; the batch script therefore reads the exit code the
ranks agreed on from ``<generation>/exit_code``.
"""

from collections.abc import Mapping
from pathlib import Path

from air_hpc.exitcodes import ExitCode
from air_hpc.records.files import create_new
from air_hpc.records.names import BEAT_PREFIX, BEAT_SUFFIX, EXIT_CODE_FILE, HOSTFILE
from air_hpc.records.rundir import RunDir
from air_hpc.slurm.env import SlurmEnv

#: Set by the in-job supervisor: which of its step starts this is (a restart inside one job start).
STEP_ATTEMPT_ENV = "AIR_HPC_STEP_ATTEMPT"


def generation(environ: Mapping[str, str]) -> str:
    """``<job id>-<restart count>``: the same on every rank of one start, new on each requeue.

    The batch script computes the same name in bash (``$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}``).
    Under the in-job supervisor each step start adds ``.<attempt>``, so a restart's
    heartbeats and verdict never mix with those of the step before it.
    """
    slurm = SlurmEnv.from_environ(environ)
    job_id = slurm.job_id or environ.get("SUBMITIT_LOCAL_JOB_ID") or "local"
    name = f"{job_id}-{slurm.restart_count}"
    attempt = environ.get(STEP_ATTEMPT_ENV)
    return f"{name}.{attempt}" if attempt else name


def generation_dir(run_dir: RunDir, name: str) -> Path:
    return run_dir.heartbeat / name


def start_hostfile(directory: Path) -> Path:
    """The rank order ``srun`` follows in this start (``SLURM_HOSTFILE``): per start, so no other job rewrites it."""
    return directory / HOSTFILE


def beat_path(directory: Path, rank: int) -> Path:
    return directory / f"{BEAT_PREFIX}{rank:05d}{BEAT_SUFFIX}"


def write_exit_code(directory: Path, code: ExitCode) -> bool:
    """Tell the batch script why this start's ranks exited; True for the first writer, who records the cause."""
    return create_new(directory / EXIT_CODE_FILE, f"{int(code)}\n".encode(), durable=True)


def read_exit_code(directory: Path) -> int | None:
    try:
        return int((directory / EXIT_CODE_FILE).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
