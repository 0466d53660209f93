"""What ``submit --after`` waits for: a job Slurm knows, or the current job of a run or a sweep."""

from pathlib import Path

from air_hpc.digits import ascii_int
from air_hpc.errors import UserError
from air_hpc.ops.runs import resolve_run
from air_hpc.ops.sweeps import find_sweep
from air_hpc.ownership.owner import read_owner
from air_hpc.records.submissions import latest_submission
from air_hpc.slurm.client import SlurmClient


def is_job_id(text: str) -> bool:
    """``1234`` or an array task ``1234_5``."""
    head, _, task = text.partition("_")
    return ascii_int(head) is not None and (not task or ascii_int(task) is not None)


def after_job_id(target: str, client: SlurmClient) -> str:
    """The job ``--after`` waits for; a job Slurm does not know, or a run without one, exits 2 naming it."""
    if is_job_id(target) and not Path(target).exists():
        if client.job_status(target) is None:
            raise UserError(f"--after {target}: no such job (neither squeue nor sacct knows it)")
        return target
    sweep = find_sweep(target)
    if sweep is not None:
        if not sweep.job_ids:
            raise UserError(f"--after {target}: the sweep has no Slurm array (its executor is {sweep.executor})")
        return sweep.job_ids[-1]
    run = resolve_run(target)
    owner = read_owner(run)
    job_id = owner.chain[-1] if owner is not None and owner.chain else latest_submission(run).job_id
    if latest_submission(run).executor == "local":
        raise UserError(f"--after {target}: that run's job is a local one, which Slurm cannot wait for")
    if client.job_status(job_id) is None:
        raise UserError(f"--after {target}: its job {job_id} is unknown to Slurm (neither squeue nor sacct knows it)")
    return job_id
