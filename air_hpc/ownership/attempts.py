"""Submit attempts: recorded before ``sbatch`` runs, settled by asking Slurm, so a lost answer never orphans a job.

``sbatch`` can time out after the controller accepted the job. Each attempt is
written to submissions.jsonl first with a unique token that goes to Slurm as
``--comment``; when the answer is lost, any later command (``status``,
``cancel``, the next ``submit``) asks Slurm for that token and records what it
finds: the job id, or that the attempt never reached the queue. Until an
attempt is settled, ``submit`` refuses to submit the run again, whatever the
executor. A job found this way becomes the run's owner (:mod:`air_hpc.ownership.owner`),
so its ranks pass the fence and the owner check refuses the next submit while it runs.
"""

import getpass
import logging
import time
import uuid
from collections.abc import Mapping

from air_hpc.errors import SlurmError, SlurmUnreachableError
from air_hpc.ownership.clusters import cluster_client
from air_hpc.ownership.owner import NotOwnerError, Owner, adopt, fence
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import (
    Attempt,
    pending_attempts,
    record_attempt,
    record_not_submitted,
    record_submission,
    submissions,
)
from air_hpc.slurm.client import NotRun, SlurmClient

log = logging.getLogger(__name__)

#: An attempt Slurm does not know yet may still be in the controller's hands this long after it was made.
SETTLE_GRACE_S = 60.0


def _when(time_s: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time_s))


def settle(run_dir: RunDir, client: SlurmClient, now_s: float | None = None) -> list[Owner]:
    """Record the outcome of every pending attempt; return the jobs found; raise when one cannot be told yet."""
    pending = pending_attempts(run_dir)
    found: list[Owner] = []
    if not pending:
        return found
    known = {record.job_id for record in submissions(run_dir)}
    user = getpass.getuser()
    for attempt in pending:
        asker = cluster_client(run_dir, client, attempt.cluster)
        try:
            job_id = asker.find_submitted(attempt.token, user, attempt.time_s, run_dir.path, known)
        except SlurmUnreachableError as exc:
            raise SlurmUnreachableError(
                f"{run_dir.path}: the submit of {_when(attempt.time_s)} may have queued a job "
                f"(comment {attempt.token}), and Slurm cannot be asked now: {exc}"
            ) from None
        if job_id is not None:
            log.warning("the submit of %s did queue job %s; recorded it", _when(attempt.time_s), job_id)
            record_submission(
                run_dir, job_id, attempt.executor, now_s=attempt.time_s, token=attempt.token, cluster=attempt.cluster
            )
            known.add(job_id)
            found.append(Owner(job_id, attempt.executor, attempt.time_s))
            continue
        wait_s = attempt.time_s + SETTLE_GRACE_S - (now_s or time.time())
        if wait_s > 0:
            raise SlurmError(
                f"{run_dir.path}: the submit of {_when(attempt.time_s)} is not in Slurm's queue yet but may still "
                f"reach it; ask again in {wait_s:.0f} s"
            )
        record_not_submitted(run_dir, attempt.token)
    return found


def reconcile(run_dir: RunDir, client: SlurmClient) -> None:
    """Settle pending attempts under the run's owner lock; a job found becomes the owner (``status``, ``cancel``)."""
    if pending_attempts(run_dir):
        adopt(run_dir, lambda: settle(run_dir, client))


def fence_settled(run_dir: RunDir, environ: Mapping[str, str], client: SlurmClient | None = None) -> None:
    """The owner fence for a rank (:func:`~air_hpc.ownership.owner.fence`), settling pending attempts if it refuses.

    A job whose submit lost sbatch's answer is not the owner until someone settles that
    attempt; its ranks settle it themselves (one ``squeue``, under the lock) instead of
    exiting as strangers to their own run.
    """
    try:
        fence(run_dir, environ)
    except NotOwnerError:
        if not pending_attempts(run_dir):
            raise
        reconcile(run_dir, client or SlurmClient())
        fence(run_dir, environ)


def recorded_jobs(run_dir: RunDir, client: SlurmClient) -> list[Owner]:
    """The jobs the run's records know that may be newer than its owner file (what ``submit`` checks first).

    The attempts settled now, and the latest submission (a submit killed between
    recording its job and claiming the run leaves only that record).
    """
    found = settle(run_dir, client)
    latest = [Owner(r.job_id, r.executor, r.time_s, r.pid_started_s) for r in submissions(run_dir)[-1:]]
    return [*found, *latest]


def sbatch_recorded(client: SlurmClient, run_dir: RunDir, job_name: str) -> str:
    """Submit the run's script once: record the attempt, sbatch it, record its job id.

    Earlier attempts are settled before, under the owner lock (:func:`recorded_jobs`).
    """
    attempt = Attempt(f"air-hpc-{uuid.uuid4().hex}", job_name, "slurm", time.time(), client.cluster_name)
    record_attempt(run_dir, attempt)
    try:
        job_id = client.sbatch(run_dir.sbatch, [f"--comment={attempt.token}"])
    except NotRun:
        record_not_submitted(run_dir, attempt.token)
        raise
    except SlurmUnreachableError as exc:
        raise SlurmUnreachableError(
            f"{exc}; the attempt is recorded (comment {attempt.token}): `air-hpc status {run_dir.path}` "
            "finds the job once the controller answers, and submitting again waits until then"
        ) from None
    except SlurmError:
        record_not_submitted(run_dir, attempt.token)
        raise
    record_submission(run_dir, job_id, "slurm", token=attempt.token, cluster=client.cluster_name)
    return job_id
