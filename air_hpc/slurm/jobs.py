"""Job state: pure parsers of squeue / sacct / scontrol / sbatch text into typed values.

The client asks for the exact formats defined here (``SQUEUE_FORMAT``,
``SACCT_FIELDS``), so parsing never depends on a user's SQUEUE_FORMAT or
column widths. The job name is always the last field: it is the only one that
may contain the separator, so it takes whatever is left of the line.
"""

import datetime
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from air_hpc.digits import DIGITS, ascii_int
from air_hpc.errors import SlurmError
from air_hpc.slurm.reasons import plain_reason
from air_hpc.slurm.version import SlurmVersion


class JobState(StrEnum):
    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    SUSPENDED = "SUSPENDED"
    REQUEUED = "REQUEUED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    RESIZING = "RESIZING"
    SIGNALING = "SIGNALING"
    STAGE_OUT = "STAGE_OUT"
    STOPPED = "STOPPED"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    REVOKED = "REVOKED"
    UNKNOWN = "UNKNOWN"

    @property
    def terminal(self) -> bool:
        """No further change is coming from Slurm (a requeued job comes back as PENDING instead)."""
        return self in _TERMINAL

    @property
    def succeeded(self) -> bool:
        return self is JobState.COMPLETED


_TERMINAL = frozenset(
    {
        JobState.COMPLETED,
        JobState.CANCELLED,
        JobState.FAILED,
        JobState.TIMEOUT,
        JobState.NODE_FAIL,
        JobState.PREEMPTED,
        JobState.OUT_OF_MEMORY,
        JobState.BOOT_FAIL,
        JobState.DEADLINE,
        JobState.REVOKED,
    }
)
_STATE_ALIASES = {
    "CD": "COMPLETED",
    "CA": "CANCELLED",
    "F": "FAILED",
    "R": "RUNNING",
    "PD": "PENDING",
    "OOM": "OUT_OF_MEMORY",
}


def parse_state(text: str) -> JobState:
    """``CANCELLED by 0``, ``RUNNING``, ``PD``: the first word; states a newer Slurm adds are UNKNOWN."""
    word = text.strip().split(" ", 1)[0].rstrip("+").upper()
    word = _STATE_ALIASES.get(word, word)
    try:
        return JobState(word)
    except ValueError:
        return JobState.UNKNOWN


@dataclass(frozen=True)
class JobRecord:
    """One line of squeue or sacct output about a job allocation."""

    job_id: str
    state: JobState
    nodes: int
    nodelist: str
    name: str
    reason: str = ""
    elapsed: str = ""
    time_limit: str = ""
    exit_code: int | None = None
    exit_signal: int | None = None


@dataclass(frozen=True)
class JobStatus:
    """What ``air-hpc status`` shows about one job, merged from the controller and accounting."""

    job_id: str
    state: JobState
    nodes: int
    nodelist: str
    name: str
    restarts: int
    source: str
    reason: str = ""
    elapsed: str = ""
    exit_code: int | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "state": str(self.state),
            "terminal": self.state.terminal,
            "nodes": self.nodes,
            "nodelist": self.nodelist,
            "name": self.name,
            "restarts": self.restarts,
            "source": self.source,
            "reason": self.reason,
            "reason_text": plain_reason(self.reason),
            "elapsed": self.elapsed,
            "exit_code": self.exit_code,
        }


#: squeue --format: job id, state, node count, nodes, reason, elapsed, limit, then the name.
SQUEUE_FORMAT = "%i|%T|%D|%N|%r|%M|%l|%j"
#: sacct --format with --parsable2 (``|``-separated, no trailing separator); the name last.
SACCT_FIELDS = ("JobID", "State", "ExitCode", "NNodes", "NodeList", "Elapsed", "Timelimit", "JobName")


def _split(line: str, fields: int, where: str) -> list[str]:
    parts = line.split("|", fields - 1)
    if len(parts) != fields:
        raise SlurmError(f"{where}: expected {fields} '|'-separated fields, got {line!r}")
    return parts


def _int(text: str, default: int = 0) -> int:
    value = ascii_int(text)
    return default if value is None else value


def parse_squeue(text: str) -> list[JobRecord]:
    records = []
    for line in text.splitlines():
        if not line.strip():
            continue
        job_id, state, nodes, nodelist, reason, elapsed, limit, name = _split(line, 8, "squeue")
        records.append(
            JobRecord(
                job_id=job_id.strip(),
                state=parse_state(state),
                nodes=_int(nodes),
                nodelist=nodelist.strip(),
                name=name,
                reason=reason.strip() if reason.strip() != "None" else "",
                elapsed=elapsed.strip(),
                time_limit=limit.strip(),
            )
        )
    return records


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """sacct's ``ExitCode`` is ``code:signal``."""
    code, _, signal = text.strip().partition(":")
    return ascii_int(code), ascii_int(signal)


def parse_sacct(text: str) -> list[JobRecord]:
    """Allocation records in sacct's order (with --duplicates: earlier, requeued runs first)."""
    records = []
    for line in text.splitlines():
        if not line.strip():
            continue
        job_id, state, exit_code, nodes, nodelist, elapsed, limit, name = _split(line, len(SACCT_FIELDS), "sacct")
        code, signal = parse_exit_code(exit_code)
        records.append(
            JobRecord(
                job_id=job_id.strip(),
                state=parse_state(state),
                nodes=_int(nodes),
                nodelist="" if nodelist.strip() == "None assigned" else nodelist.strip(),
                name=name,
                elapsed=elapsed.strip(),
                time_limit=limit.strip(),
                exit_code=code,
                exit_signal=signal,
            )
        )
    return records


#: squeue --format and sacct --format that find a submission by its ``--comment`` token: id, working dir, comment.
TAGGED_FORMAT = "%i|%Z|%k"
TAGGED_FIELDS = ("JobIDRaw", "WorkDir", "Comment")


def parse_tagged(text: str) -> list[tuple[str, str, str]]:
    """``(job id, working dir, comment)`` per line; the comment is last and never holds our tokens' ``|``."""
    found = []
    for line in text.splitlines():
        job_id, sep, rest = line.partition("|")
        if not sep or not job_id.strip():
            continue
        workdir, _, comment = rest.rpartition("|")
        found.append((job_id.strip(), workdir, "" if comment.strip() == "(null)" else comment.strip()))
    return found


_SCONTROL_KEYS = (
    "JobId",
    "JobState",
    "Reason",
    "Restarts",
    "NumNodes",
    "NodeList",
    "ExitCode",
    "BatchHost",
    "PreemptTime",
    "EndTime",
)


def parse_scontrol_job(text: str) -> dict[str, str]:
    """The keys of ``scontrol show job -o`` that never contain spaces (JobName and Command may)."""
    found: dict[str, str] = {}
    for key in _SCONTROL_KEYS:
        match = re.search(rf"(?:^|\s){key}=(\S*)", text)
        if match:
            found[key] = match.group(1)
    return found


#: Slurm 24.05 and newer requeue a preempted job that ends within GraceTime themselves.
SLURM_REQUEUES_PREEMPTED_FROM = SlurmVersion(24, 5)


@dataclass(frozen=True)
class Preemption:
    """Slurm's own preemption (PreemptMode=REQUEUE) of a job, as ``scontrol show job`` tells it."""

    grace_s: int
    ended_after_s: int
    requeue_by: str
    """``slurm`` where Slurm requeues a job that ended within GraceTime itself (24.05+), else ``batch``."""

    @property
    def fit(self) -> bool:
        return self.ended_after_s <= self.grace_s


def slurm_epoch(text: str) -> int | None:
    """Slurm's local ``2026-12-03T07:12:18`` as epoch seconds; None for ``None``/``Unknown``."""
    try:
        return int(datetime.datetime.fromisoformat(text).timestamp())
    except ValueError:
        return None


def parse_preemption(fields: Mapping[str, str], version: SlurmVersion | None, now_s: float) -> Preemption | None:
    """A PreemptTime on the job means Slurm preempted it; EndTime is the end of its GraceTime.

    ``fields`` from :func:`parse_scontrol_job`; an unknown ``version`` counts as older than 24.05. Pure.
    """
    preempt_at = slurm_epoch(fields.get("PreemptTime", ""))
    if preempt_at is None:
        return None
    end_at = slurm_epoch(fields.get("EndTime", "")) or preempt_at
    requeue_by = "slurm" if version is not None and version >= SLURM_REQUEUES_PREEMPTED_FROM else "batch"
    return Preemption(end_at - preempt_at, int(now_s) - preempt_at, requeue_by)


_SUBMITTED = re.compile(r"^([0-9]+)(?:;\S+)?$")


def parse_sbatch_parsable(text: str) -> str:
    """``sbatch --parsable`` prints ``JOBID`` or ``JOBID;CLUSTER``."""
    line = text.strip().splitlines()[-1] if text.strip() else ""
    match = _SUBMITTED.match(line.strip())
    if not match:
        raise SlurmError(f"sbatch: unexpected output {text.strip()!r}; expected a job id")
    return match.group(1)


@dataclass(frozen=True)
class TestOnlyResult:
    """What ``sbatch --test-only`` predicts: when and where the job would start."""

    start: str
    nodelist: str
    partition: str

    __test__ = False


#: sbatch's ``info()`` line, as every release prints it: 22.05-24.11 ``Job 4 to start at T using 4 processors on
#: nodes n[3-4] in partition debug``; 25.05 on adds `` on cluster C`` when the reply names one and a stray `` a``
#: before ``using`` (src/api/allocate.c); a heterogeneous job's line ends ``processors on n[1-4]``, no partition.
_TEST_ONLY = re.compile(
    r"Job [0-9]+ to start at (?P<start>\S+)(?: on cluster \S+)?(?: a)? using [0-9]+ processors"
    r" on (?:nodes )?(?P<nodes>\S+)(?: in partition (?P<part>\S+))?"
)


def parse_test_only(text: str) -> TestOnlyResult:
    """The predicted start and nodes, from whichever line of sbatch's reply carries them."""
    match = _TEST_ONLY.search(text)
    if not match:
        raise SlurmError(f"sbatch --test-only: unexpected output {text.strip()!r}")
    return TestOnlyResult(match["start"], match["nodes"], match["part"] or "")


#: an array element's id, ``ARRAY_INDEX``
_ELEMENT = re.compile(rf"({DIGITS})_({DIGITS})")
#: accounting's one record of an array's elements that never started: ``ARRAY_[1-2,5%2]`` (``%``: the throttle)
_UNSTARTED = re.compile(rf"({DIGITS})_\[([0-9,-]+)(?:%{DIGITS})?\]")


def accounting_ids(job_ids: Sequence[str]) -> list[str]:
    """The ids to ask sacct about ``job_ids``: an element also by its array.

    slurmdbd keeps the elements that never started (pending when the array was cancelled) in one
    ``ARRAY_[spec]`` record, which ``sacct --jobs=ARRAY_INDEX`` does not return (seen on 22.05).
    """
    ids = list(job_ids)
    for job_id in job_ids:
        element = _ELEMENT.fullmatch(job_id)
        if element and element.group(1) not in ids:
            ids.append(element.group(1))
    return ids


def holds_element(record_id: str, job_id: str) -> bool:
    """Whether accounting's record ``record_id`` (``5001_[1-2%1]``) stands for element ``job_id`` (``5001_2``)."""
    element, unstarted = _ELEMENT.fullmatch(job_id), _UNSTARTED.fullmatch(record_id)
    if not element or not unstarted or element.group(1) != unstarted.group(1):
        return False
    index = int(element.group(2))
    for part in unstarted.group(2).split(","):
        first, _, last = part.partition("-")
        low, high = ascii_int(first), ascii_int(last or first)
        if low is not None and high is not None and low <= index <= high:
            return True
    return False


def merge_status(
    job_id: str,
    queued: list[JobRecord],
    accounted: list[JobRecord],
    restarts: int | None = None,
) -> JobStatus | None:
    """The controller's view wins while it knows the job; accounting afterwards.

    ``restarts``: the controller's restart count when known; otherwise the
    number of earlier (requeued) accounting records of the same job.
    """
    mine = [r for r in accounted if r.job_id == job_id] or [r for r in accounted if holds_element(r.job_id, job_id)]
    if restarts is None:
        restarts = max(len(mine) - 1, 0)
    live = [r for r in queued if r.job_id == job_id]
    if live:
        rec, source = live[0], "squeue"
    elif mine:
        rec, source = mine[-1], "sacct"
    else:
        return None
    return JobStatus(
        job_id=job_id,
        state=rec.state,
        nodes=rec.nodes,
        nodelist=rec.nodelist,
        name=rec.name,
        restarts=restarts,
        source=source,
        reason=rec.reason,
        elapsed=rec.elapsed,
        exit_code=rec.exit_code,
    )
