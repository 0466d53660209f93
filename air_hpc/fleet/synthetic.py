"""Synthetic ``sacct`` output of a busy shared cluster, for the fleet benchmark and tests. Seeded, so reproducible.

Lines follow :data:`~air_hpc.slurm.accounting.FLEET_FIELDS` the way ``sacct -a -X -P -n --duplicates``
prints them: one per run of each job, requeued runs (``PREEMPTED``, ``REQUEUED``, ``NODE_FAIL``) before the
run that followed, in submission order across jobs, times in local ``YYYY-MM-DDTHH:MM:SS``. About 40% of
jobs are requeued, some many times, so 100,000 jobs make about a million lines.
"""

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

TENANTS = ("research", "product", "ops", "vision", "speech", "infra", "eval", "data")
QOS = ("high", "normal", "scavenger")
#: End states of a job's last run, with their weights.
LAST_STATES = (
    ("COMPLETED", 70),
    ("FAILED", 8),
    ("CANCELLED by 1001", 7),
    ("TIMEOUT", 4),
    ("OUT_OF_MEMORY", 2),
    ("NODE_FAIL", 1),
    ("RUNNING", 3),
    ("PENDING", 5),
)
#: How an interrupted (requeued) run ended, with weights.
REQUEUED_STATES = (("PREEMPTED", 6), ("REQUEUED", 3), ("NODE_FAIL", 1))


class _LocalTimes:
    """Epoch seconds as Slurm's local time text, one ``localtime`` per hour."""

    def __init__(self) -> None:
        self._hours: dict[int, str] = {}

    def __call__(self, epoch_s: int | None) -> str:
        if epoch_s is None:
            return "Unknown"
        hour, rest = divmod(epoch_s, 3600)
        prefix = self._hours.get(hour)
        if prefix is None:
            prefix = self._hours[hour] = time.strftime("%Y-%m-%dT%H", time.localtime(hour * 3600))
        minutes, seconds = divmod(rest, 60)
        return f"{prefix}:{minutes:02d}:{seconds:02d}"


@dataclass(frozen=True)
class _Run:
    submit_s: int
    start_s: int | None
    end_s: int | None
    state: str


def _runs(rng: random.Random, submit_s: int, now_s: int) -> list[_Run]:
    """One job's runs: its requeued ones, then its last."""
    requeues = rng.randint(1, 44) if rng.random() < 0.4 else 0
    last = rng.choices([s for s, _ in LAST_STATES], [w for _, w in LAST_STATES])[0]
    runs = []
    at = submit_s
    for index in range(requeues + 1):
        start = at + int(rng.expovariate(1 / 600))
        final = index == requeues
        if (final and last == "PENDING") or start >= now_s:
            runs.append(_Run(at, None, None, "PENDING"))
            break
        end = start + int(rng.expovariate(1 / (7200 if final else 1800))) + 1
        if (final and last == "RUNNING") or end >= now_s:
            runs.append(_Run(at, start, None, "RUNNING"))
            break
        state = last if final else rng.choices([s for s, _ in REQUEUED_STATES], [w for _, w in REQUEUED_STATES])[0]
        runs.append(_Run(at, start, end, state))
        at = end
    return runs


def sacct_lines(jobs: int, seed: int, now_s: int, days: float = 7.0) -> Iterator[str]:
    """``jobs`` jobs submitted over the ``days`` before ``now_s``, as sacct prints them, in submission order."""
    rng = random.Random(seed)
    when = _LocalTimes()
    records = []
    for number in range(jobs):
        job_id = str(1_000_000 + number)
        nodes = min(int(rng.paretovariate(1.2)), 64)
        head = f"{job_id}|{job_id}|{rng.choice(TENANTS)}|{rng.choice(QOS)}|user{rng.randrange(200)}|batch|"
        tres = f"billing={8 * nodes},cpu={112 * nodes},gres/gpu={8 * nodes},mem={2000 * nodes}G,node={nodes}"
        name = f"train-{rng.randrange(5000)}" + ("|x" if rng.random() < 0.001 else "")  # a name with the separator
        submit = now_s - int(rng.random() * days * 86400)
        for run in _runs(rng, submit, now_s):
            records.append((run.submit_s, head, run, nodes, tres, name))
    records.sort(key=lambda r: r[0])
    for submit_s, head, run, nodes, tres, name in records:
        elapsed = 0 if run.start_s is None else (run.end_s if run.end_s is not None else now_s) - run.start_s
        code = "0:0" if run.state in ("COMPLETED", "RUNNING", "PENDING") else "1:0"
        yield (
            f"{head}{run.state}|{code}|{when(submit_s)}|{when(submit_s)}|{when(run.start_s)}|"
            f"{when(run.end_s)}|{elapsed}|{nodes}|{tres if run.start_s is not None else ''}|None|{name}"
        )
