"""Every job record in a time window, from ``sacct -a -X -P --duplicates``: the fixed field list and its pure parser.

The fleet report (``air_hpc.fleet``) reads one line per allocation of every
job, ours or not: ``--duplicates`` keeps each requeued run as its own line
(a requeue makes a new record whose ``Submit`` is the requeue time), ``-X``
leaves out the steps. Lines of one job are not adjacent (sacct orders by
submission), so a consumer groups them by ``JobIDRaw``.

Parsing is built for a million lines: a time is two dict lookups (a cache of
each minute's epoch, and its seconds), repeated strings (accounts, QOS, states, TRES) are shared,
and a line that does not parse is counted with its line number, never raised.
"""

import datetime
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from air_hpc.slurm.jobs import JobState, parse_state

#: ``sacct --format`` of the fleet view, with ``--parsable2``; the job name last, the one field that may hold ``|``.
FLEET_FIELDS = (
    "JobIDRaw",
    "JobID",
    "Account",
    "QOS",
    "User",
    "Partition",
    "State",
    "ExitCode",
    "Submit",
    "Eligible",
    "Start",
    "End",
    "ElapsedRaw",
    "NNodes",
    "AllocTRES",
    "Reason",
    "JobName",
)
_FIELDS = len(FLEET_FIELDS)

#: What sacct prints for a time it does not know (a pending job's Start, a running job's End).
NO_TIME = frozenset({"", "Unknown", "None", "N/A"})
#: Kept examples of malformed lines (the count is exact).
MALFORMED_EXAMPLES = 5


class AccountingRow(NamedTuple):
    """One allocation record of a job: its first run, or a run after a requeue (a tuple: a million are made fast)."""

    job_id: str
    """``JobIDRaw``: the numeric id (an array task has its own)."""
    display_id: str
    """``JobID``: ``123`` or ``120_3`` for an array task."""
    account: str
    qos: str
    user: str
    partition: str
    state: JobState
    exit_code: int
    exit_signal: int
    submit_s: int
    """When this record was submitted: the job's submission, or for a requeued run, the requeue."""
    eligible_s: int | None
    start_s: int | None
    """None while it has not started."""
    end_s: int | None
    """None while it runs (or never ran)."""
    elapsed_s: int
    nodes: int
    gpus: int
    """``gres/gpu`` of AllocTRES (0 without GPUs, or before an allocation)."""
    reason: str
    name: str


@dataclass(frozen=True)
class Accounting:
    """The parsed answer: rows in sacct's order, and the lines that did not parse."""

    rows: tuple[AccountingRow, ...]
    malformed: int = 0
    examples: tuple[str, ...] = field(default=())
    """``line N: why: text`` of the first few malformed lines."""


class _Malformed(ValueError):
    pass


#: "00".."59" and "60" (a leap second) as numbers: a dict lookup is stricter than ``int`` (no sign, space or
#: non-ASCII digit gets through) and faster.
_SIXTY = {f"{n:02d}": n for n in range(61)}


class _Times:
    """Slurm's local ``2026-12-04T17:47:52`` as epoch seconds, one ``mktime`` per distinct hour.

    The common case is two dict lookups: the epoch of the text's minute (``2026-12-04T17:47:``), cached,
    plus its seconds. A zone changes its offset on an hour boundary, so the hour's epoch is the one
    ``mktime`` a minute needs.
    """

    def __init__(self) -> None:
        self._hours: dict[str, int] = {}
        self._minutes: dict[str, int] = {}

    def parse(self, text: str, what: str) -> int | None:
        base = self._minutes.get(text[:17])
        if base is not None and len(text) == 19:
            seconds = _SIXTY.get(text[17:])
            if seconds is not None:
                return base + seconds
        return self._slow(text, what)

    def _slow(self, text: str, what: str) -> int | None:
        if text in NO_TIME:
            return None
        if text.isascii() and text.isdigit():  # SLURM_TIME_FORMAT=%s
            return int(text)
        minute, seconds = _SIXTY.get(text[14:16], 60), _SIXTY.get(text[17:19])
        if len(text) != 19 or text[10] != "T" or text[13] != ":" or text[16] != ":" or minute > 59 or seconds is None:
            raise _Malformed(f"{what} {text!r} is not a time")
        hour = self._hours.get(text[:13])
        if hour is None:
            try:
                hour = self._hours[text[:13]] = int(datetime.datetime.fromisoformat(f"{text[:13]}:00:00").timestamp())
            except ValueError:
                raise _Malformed(f"{what} {text!r} is not a time") from None
        base = self._minutes[text[:17]] = hour + 60 * minute
        return base + seconds


def _count(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0 or not text.isascii():
        raise _Malformed(f"{what} {text!r} is not a whole number")
    return value


def gpus_of_tres(tres: str) -> int:
    """``billing=8,cpu=8,gres/gpu=8,gres/gpu:h100=8,node=1`` -> 8 (the untyped count; a typed one alone counts)."""
    total = typed = 0
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key == "gres/gpu" and value.isascii() and value.isdigit():
            total = int(value)
        elif key.startswith("gres/gpu:") and value.isascii() and value.isdigit():
            typed += int(value)
    return total or typed


class _Parser:
    """Parses lines one at a time; shares repeated strings and caches TRES and time parsing across lines."""

    def __init__(self) -> None:
        self.times = _Times()
        self.strings: dict[str, str] = {}
        self.states: dict[str, JobState] = {}
        self.tres: dict[str, int] = {}
        self.counts: dict[str, int] = {}

    def state(self, text: str) -> JobState:
        state = self.states.get(text)
        if state is None:
            state = self.states[text] = parse_state(text)
        return state

    def small(self, text: str, what: str) -> int:
        """A count with few distinct values (nodes, exit codes), parsed once each."""
        value = self.counts.get(text)
        if value is None:
            value = self.counts[text] = _count(text, what)
        return value

    def row(self, line: str) -> AccountingRow:
        parts = line.split("|", _FIELDS - 1)
        if len(parts) != _FIELDS:
            raise _Malformed(f"expected {_FIELDS} '|'-separated fields, got {len(parts)}")
        job_id, display, account, qos, user, partition, state, exit_code, *rest = parts
        submit, eligible, start, end, elapsed, nodes, tres, reason, name = rest
        if not (job_id.isascii() and job_id.isdigit()):
            raise _Malformed(f"JobIDRaw {job_id!r} is not a job id")
        code, _, signal = exit_code.partition(":")
        gpus = self.tres.get(tres)
        if gpus is None:
            gpus = self.tres[tres] = gpus_of_tres(tres)
        times, share = self.times.parse, self.strings.setdefault
        submit_s = times(submit, "Submit")
        if submit_s is None:
            raise _Malformed(f"Submit {submit!r} is not a time")
        return AccountingRow(
            share(job_id, job_id),
            share(display, display),
            share(account, account),
            share(qos, qos),
            share(user, user),
            share(partition, partition),
            self.states.get(state) or self.state(state),
            self.small(code, "ExitCode"),
            self.small(signal or "0", "ExitCode signal"),
            submit_s,
            submit_s if eligible == submit else times(eligible, "Eligible"),
            times(start, "Start"),
            times(end, "End"),
            _count(elapsed, "ElapsedRaw"),
            self.small(nodes, "NNodes"),
            gpus,
            "" if reason == "None" else share(reason, reason),
            share(name, name),
        )


def iter_lines(text: str) -> Iterator[str]:
    """The lines of ``text`` one by one, without a list of them all (a million lines of sacct is 150 MB)."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        if end < 0:
            end = len(text)
        yield text[start:end].rstrip("\r")
        start = end + 1


def parse_accounting(lines: Iterable[str]) -> Accounting:
    """Rows of ``sacct -P -n --format=FLEET_FIELDS`` output; malformed lines are counted, never raised. Pure."""
    parser = _Parser()
    rows: list[AccountingRow] = []
    malformed = 0
    examples: list[str] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(parser.row(line))
        except _Malformed as exc:
            malformed += 1
            if len(examples) < MALFORMED_EXAMPLES:
                examples.append(f"line {number}: {exc}: {line[:120]!r}")
    return Accounting(tuple(rows), malformed, tuple(examples))
