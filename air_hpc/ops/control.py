"""Job control on a run: its state, its log files, cancelling it.

A run is followed through its latest submission: Slurm jobs (our script or
submitit's) through the Slurm client, local jobs through the run's own records
and the controller process they identify (:mod:`air_hpc.ownership.local_job`).
"""

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from air_hpc.errors import AccountingUnreachableError, SlurmError, SlurmUnreachableError, UserError
from air_hpc.health.badnodes import read_bad_nodes
from air_hpc.observe.live import LiveView, change_key, last_event, live_panel, plain_line
from air_hpc.observe.progress import RunProgress, run_progress
from air_hpc.observe.records import RunRecords, last_crash, load_records, stop_reason
from air_hpc.ops.states import trained_every_step
from air_hpc.ops.waiting import poll_until
from air_hpc.ownership.attempts import reconcile
from air_hpc.ownership.clusters import run_client
from air_hpc.ownership.local_job import CANCEL_GRACE_S, cancel_local, local_job_status
from air_hpc.ownership.owner import read_owner
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import SubmissionRecord, latest_submission, record_cancel
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.jobs import JobState, JobStatus, merge_status
from air_hpc.slurm.reasons import with_reason

if TYPE_CHECKING:
    from rich.console import Console


@dataclass(frozen=True)
class RunStatus:
    run_dir: RunDir
    submission: SubmissionRecord
    job: JobStatus
    progress: RunProgress | None
    bad_nodes: tuple[str, ...]
    stopped_because: str | None = None
    """Why the run stopped on its own instead of requeueing (a crash loop), from its events."""
    last_crash: str | None = None
    """The rank and exception of the run's last crashed start (``rank_failed`` event), if any."""
    queued_links: tuple[str, ...] = ()
    """``submit --chain``: the links after the current job that Slurm still holds (the run goes on in them)."""

    @property
    def ended(self) -> bool:
        """The run's job ended and no link of its chain is left to continue it."""
        return self.job.state.terminal and not self.queued_links

    @property
    def restarts(self) -> int:
        """The larger of Slurm's count and the starts the batch script recorded (either may lag)."""
        return max(self.job.restarts, self.submission.starts - 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir.path),
            "executor": self.submission.executor,
            "cluster": self.submission.cluster,
            **self.job.to_json(),
            "restarts": self.restarts,
            "progress": self.progress.to_json() if self.progress else None,
            "bad_nodes": list(self.bad_nodes),
            "stopped_because": self.stopped_because,
            "last_crash": self.last_crash,
            "queued_links": list(self.queued_links),
        }


def find_job(job_id: str, client: SlurmClient) -> tuple[JobStatus | None, str | None]:
    """A bare job id's status and the cluster that holds it: the default cluster first, then every cluster
    slurmdbd's accounting finds it on (``sacct -M all``, then ``squeue``/``sacct -M`` there). (None, None): no one."""
    found = client.job_status(job_id)
    if found is not None:
        return found, client.cluster_name
    try:
        elsewhere = [c for c in client.clusters_of_job(job_id) if c != client.cluster_name]
    except SlurmError:
        return None, None
    for cluster in elsewhere:
        try:
            found = client.on_cluster(cluster).job_status(job_id)
        except SlurmError:
            continue
        if found is not None:
            return found, cluster
    return None, None


def run_status(run_dir: RunDir, client: SlurmClient) -> RunStatus:
    reconcile(run_dir, client)
    client = run_client(run_dir, client)
    record = latest_submission(run_dir)
    records = load_records(run_dir)
    local = record.executor == "local"
    job = local_job_status(run_dir, record) if local else _slurm_job(run_dir, record, records, client)
    progress = run_progress(records, time.time())
    links = () if local else tuple(_queued_links(run_dir, record, client))
    return RunStatus(
        run_dir,
        record,
        job,
        progress,
        read_bad_nodes(run_dir.bad_nodes),
        stop_reason(records),
        last_crash(records),
        links,
    )


def _slurm_job(run_dir: RunDir, record: SubmissionRecord, records: RunRecords, client: SlurmClient) -> JobStatus:
    """Slurm's view of the job; where Slurm cannot tell (accounting down or forgotten), the run's own records.

    A run whose records show every step trained is COMPLETED even with the controller down; a
    job the queue no longer lists while slurmdbd is down is UNKNOWN, saying which daemon is.
    """
    try:
        found = client.job_status(record.job_id)
        why = "neither squeue nor sacct knows it"
    except AccountingUnreachableError as exc:
        found, why = None, f"squeue no longer lists it and {exc}"
    except SlurmUnreachableError:
        if not trained_every_step(records):
            raise
        found, why = None, "Slurm controller unreachable"
    if found is not None:
        return found
    if trained_every_step(records):
        reason = f"every step trained, from the run's records ({why})"
        return JobStatus(record.job_id, JobState.COMPLETED, 0, "", run_dir.path.name, 0, "records", reason)
    if why.startswith("squeue"):
        return JobStatus(record.job_id, JobState.UNKNOWN, 0, "", run_dir.path.name, 0, "squeue", why)
    raise UserError(f"job {record.job_id} of run {run_dir.path}: {why}, and its records do not show it finished")


@dataclass(frozen=True)
class LogSource:
    """One file holding a run's output, and the ``srun --label`` prefix that picks one rank's lines from it."""

    path: Path
    rank_prefix: str | None = None

    def select(self, lines: list[str]) -> list[str]:
        if self.rank_prefix is None:
            return lines
        return [line for line in lines if line.lstrip().startswith(self.rank_prefix)]


def log_sources(run_dir: RunDir, record: SubmissionRecord, rank: int | None = None) -> list[LogSource]:
    """The files holding a run's output (existing or not yet written), most useful first.

    ``rank``: the trainer's own log of that rank, then what the executor
    captured of its stdout/stderr (our batch log's ``N: `` lines, or
    submitit's per-task files); else the batch script's (or task 0's) output.
    """
    if record.executor == "slurm":
        batch = run_dir.batch_logs(record.job_id)
        if rank is None:
            return [LogSource(path) for path in batch]
        return [LogSource(run_dir.rank_log(rank)), *(LogSource(path, f"{rank}: ") for path in batch)]
    folder = run_dir.path / "submitit"
    task = rank if rank is not None else 0
    captured = [LogSource(folder / f"{record.job_id}_{task}_log.{kind}") for kind in ("out", "err")]
    return captured if rank is None else [LogSource(run_dir.rank_log(rank)), *captured]


def check_rank(run_dir: RunDir, rank: int | None) -> None:
    """A ``--rank`` beyond the run's world size is a mistake, not an empty log."""
    if rank is None or not run_dir.job_json.is_file():
        return
    world = run_dir.read_job().resources.world_size
    if rank >= world:
        raise UserError(f"--rank {rank}: run {run_dir.path.name} has {world} ranks (0-{world - 1})")


@dataclass(frozen=True)
class CancelOutcome:
    """What ``cancel`` actually did: whether it stopped a job, and the state the job was in when it looked."""

    record: SubmissionRecord
    cancelled: bool
    """True only when a job that was still queued or running was told to stop."""
    state: str | None
    """The job's state when cancel looked (a job that had ended: its end state); None when no one could say."""
    why_unknown: str = ""
    """Why the state is not known (accounting did not answer), for the message."""
    detail: str = ""
    """What was ended (a local job: processes stopped, and those killed after ignoring the stop)."""

    def to_json(self, run_dir: RunDir) -> dict[str, Any]:
        return {
            "run_dir": str(run_dir.path),
            "job_id": self.record.job_id,
            "executor": self.record.executor,
            "cluster": self.record.cluster,
            "cancelled": self.cancelled,
            "state": self.state,
            "detail": self.detail,
        }

    def message(self) -> str:
        where = f" on cluster {self.record.cluster}" if self.record.cluster else ""
        job = f"job {self.record.job_id} ({self.record.executor}){where}"
        ended = f": {self.detail}" if self.detail else ""
        if self.cancelled:
            return f"cancelled {job}, which was {self.state}{ended}"
        if self.detail:
            return f"could not end {job}{ended}"
        if self.state is None:
            return f"{job} is no longer queued or running ({self.why_unknown}); nothing to cancel"
        return f"{job} had already ended: {self.state}; nothing to cancel"


def cancel_run(run_dir: RunDir, client: SlurmClient) -> CancelOutcome:
    """Stop the run's current job if it is still queued or running; an ended job is left alone and said so."""
    reconcile(run_dir, client)
    client = run_client(run_dir, client)
    record = latest_submission(run_dir)
    if record.executor == "local":
        before = local_job_status(run_dir, record).state
        ended = cancel_local(record)
        if ended is None:
            return CancelOutcome(record, False, str(before))
        record_cancel(run_dir, record.job_id)
        return CancelOutcome(record, not ended.survivors, str(before), detail=ended.describe(CANCEL_GRACE_S))
    links = _queued_links(run_dir, record, client)
    for link in links:  # the chain's next links first, so none starts in the moment between
        client.scancel(link)
    live = [r for r in client.squeue([record.job_id]) if r.job_id == record.job_id]
    if not live or live[0].state.terminal:
        outcome = _ended(record, client, live[0].state if live else None)
        return replace(outcome, cancelled=bool(links), detail=_links_note(links) or outcome.detail)
    client.scancel(record.job_id)
    return CancelOutcome(record, True, str(live[0].state), detail=_links_note(links))


def _queued_links(run_dir: RunDir, record: SubmissionRecord, client: SlurmClient) -> list[str]:
    """``submit --chain``: the links after the run's current job that Slurm still holds."""
    owner = read_owner(run_dir)
    later = [] if owner is None or not owner.chain else [j for j in owner.later_links() if j != record.job_id]
    if not later:
        return []
    return [r.job_id for r in client.squeue(later) if not r.state.terminal]


def _links_note(links: list[str]) -> str:
    return f"also cancelled the chain's queued link(s) {', '.join(links)}" if links else ""


def _ended(record: SubmissionRecord, client: SlurmClient, queued: JobState | None) -> CancelOutcome:
    """A Slurm job the controller no longer runs: its end state from the queue, else from accounting."""
    if queued is not None:
        return CancelOutcome(record, False, str(queued))
    try:
        found = merge_status(record.job_id, [], client.sacct([record.job_id]))
    except SlurmError as exc:
        return CancelOutcome(record, False, None, f"its end state is unknown: {exc}")
    if found is None:
        return CancelOutcome(record, False, None, "neither squeue nor sacct knows it")
    return CancelOutcome(record, False, str(found.state))


def live_view(status: RunStatus, now_s: float) -> LiveView:
    return LiveView(
        run=status.run_dir.path.name,
        job_id=status.job.job_id,
        state=with_reason(str(status.job.state), status.job.reason),
        restarts=max(status.restarts, status.progress.restarts if status.progress else 0),
        progress=status.progress,
        last_event=last_event(load_records(status.run_dir), now_s),
    )


def watch_run(
    poll: Callable[[], RunStatus],
    console: "Console",
    *,
    timeout_s: float,
    poll_s: float = 2.0,
) -> RunStatus:
    """Show a run until its job ends: a live panel on a terminal, else a plain line whenever something changed.

    ``poll`` reads the run's status (``run_status`` bound to a run and a client);
    :class:`~air_hpc.errors.WaitTimeoutError` once ``timeout_s`` passes first.
    """
    from rich.live import Live

    statuses = poll_until(
        poll,
        lambda status: status.ended,
        timeout_s=timeout_s,
        poll_s=poll_s,
        what=lambda status: f"job {status.job.job_id} of run {status.run_dir.path.name} is {status.job.state}",
    )
    first = status = next(statuses)
    if console.is_terminal:
        with Live(live_panel(live_view(first, time.time())), console=console, auto_refresh=False) as live:
            for status in statuses:
                live.update(live_panel(live_view(status, time.time())), refresh=True)
        return status
    shown: tuple[object, ...] | None = None
    for status in itertools.chain([first], statuses):
        view = live_view(status, time.time())
        if change_key(view) != shown:
            console.print(plain_line(view), soft_wrap=True, highlight=False, markup=False)
            shown = change_key(view)
    return status
