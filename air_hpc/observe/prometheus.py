"""Per-run metrics for Prometheus, with ``prometheus_client``: a textfile for node_exporter, or an HTTP endpoint.

One collector turns a snapshot of every run under a root into metric families
at each scrape (or textfile write), so nothing is cached between scrapes and a
run that appears or finishes shows up at once. Values come from the same
per-run summary as ``air-hpc runs`` (:mod:`air_hpc.observe.summary`, built on
``records``, ``progress`` and ``report``); a value a run does not have yet is
left out, not 0.

The endpoint answers in OpenMetrics when the scraper asks for it (Prometheus
does) and in the classic text format otherwise; the textfile is written in the
classic format that node_exporter's textfile collector reads, atomically
(temporary file, then rename) so the collector never sees half a file.
"""

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from air_hpc.errors import UserError
from air_hpc.health.heartbeat import read_beats
from air_hpc.observe.records import RunRecords
from air_hpc.observe.summary import RunSummary, summarize
from air_hpc.records.rundir import RunDir
from air_hpc.slurm.jobs import JobState

log = logging.getLogger(__name__)

PREFIX = "air_hpc_run"

#: The coarse states of ``air_hpc_run_state`` (one series per state, 1 for the current one).
STATES = ("not_submitted", "pending", "running", "completed", "failed", "cancelled", "unknown", "unreadable")
_PHASE = {
    JobState.PENDING: "pending",
    JobState.CONFIGURING: "pending",
    JobState.REQUEUED: "pending",
    JobState.REQUEUE_HOLD: "pending",
    JobState.REQUEUE_FED: "pending",
    JobState.RESV_DEL_HOLD: "pending",
    JobState.SUSPENDED: "pending",
    JobState.RUNNING: "running",
    JobState.COMPLETING: "running",
    JobState.SIGNALING: "running",
    JobState.STAGE_OUT: "running",
    JobState.RESIZING: "running",
    JobState.COMPLETED: "completed",
    JobState.CANCELLED: "cancelled",
}


def phase(state: JobState | None) -> str:
    """The coarse state of a job: ``None`` (not submitted) and every failure kind fold into a few values."""
    if state is None:
        return "not_submitted"
    if state is JobState.UNKNOWN:
        return "unknown"
    return _PHASE.get(state, "failed" if state.terminal else "unknown")


@dataclass(frozen=True)
class RunMetrics:
    summary: RunSummary
    job_id: str | None
    executor: str | None
    state: JobState | None
    heartbeat_age_s: float | None
    problem: str | None = None
    """Why the run's own files could not be read (state ``unreadable``, no numbers); None when they were."""


def heartbeat_age_s(run_dir: RunDir, now_s: float) -> float | None:
    """Seconds since the newest beat of the run's latest start (its newest heartbeat generation)."""
    try:
        generations = [d for d in run_dir.heartbeat.iterdir() if d.is_dir()]
    except OSError:
        return None
    if not generations:
        return None
    newest = max(generations, key=lambda d: d.stat().st_mtime)
    beats = read_beats(newest)
    return max(now_s - max(b.time_s for b in beats.values()), 0.0) if beats else None


def run_metrics(
    run_dir: RunDir,
    records: RunRecords,
    state: JobState | None,
    job_id: str | None,
    executor: str | None,
    restarts: int,
    now_s: float,
) -> RunMetrics:
    """A run's numbers now: from its records, plus the job state the caller looked up."""
    summary = summarize(run_dir, records, restarts, now_s)
    return RunMetrics(summary, job_id, executor, state, heartbeat_age_s(run_dir, now_s))


@dataclass(frozen=True)
class _Gauge:
    name: str
    help: str
    value_of: Callable[[RunMetrics], float | None]
    unit: str = ""


_GAUGES = (
    _Gauge("step", "Last trained step.", lambda r: r.summary.step),
    _Gauge("total_steps", "Steps the run trains in all.", lambda r: r.summary.total_steps),
    _Gauge("loss", "Loss of the last step.", lambda r: r.summary.loss),
    _Gauge("tokens_per_second", "Training throughput (median of recent steps).", lambda r: r.summary.tokens_per_s),
    _Gauge(
        "goodput_ratio",
        "Productive training time / wall time since the first start.",
        lambda r: r.summary.goodput,
        "ratio",
    ),
    _Gauge(
        "checkpoint_age_seconds",
        "Seconds since the last checkpoint saved.",
        lambda r: r.summary.last_checkpoint_age_s,
        "seconds",
    ),
    _Gauge(
        "heartbeat_age_seconds",
        "Seconds since the newest rank heartbeat of the latest start.",
        lambda r: r.heartbeat_age_s,
        "seconds",
    ),
)


def families(runs: Sequence[RunMetrics]) -> list[Metric]:
    """The metric families of a snapshot of runs (label ``run``: the run directory's name)."""
    info = InfoMetricFamily(PREFIX, "The run's directory and current job.", labels=["run"])
    state = GaugeMetricFamily(
        f"{PREFIX}_state", "1 for the run's current state, 0 for the others.", labels=["run", "state"]
    )
    gauges = [
        (GaugeMetricFamily(f"{PREFIX}_{g.name}", g.help, labels=["run"], unit=g.unit), g.value_of) for g in _GAUGES
    ]
    restarts = CounterMetricFamily(f"{PREFIX}_restarts", "Restarts (requeues) of the run so far.", labels=["run"])
    for r in runs:
        run = r.summary.name
        info.add_metric(
            [run],
            {
                "path": r.summary.path,
                "job_id": r.job_id or "",
                "executor": r.executor or "",
                "slurm_state": str(r.state) if r.state is not None else "",
                "problem": r.problem or "",
            },
        )
        current = "unreadable" if r.problem is not None else phase(r.state)
        for name in STATES:
            state.add_metric([run, name], 1.0 if name == current else 0.0)
        for family, value_of in gauges:
            value = value_of(r)
            if value is not None:
                family.add_metric([run], float(value))
        restarts.add_metric([run], float(r.summary.restarts))
    return [info, state, *(family for family, _ in gauges), restarts]


class RunsCollector(Collector):
    """Calls ``snapshot`` at every collection, so each scrape reads the runs afresh."""

    def __init__(self, snapshot: Callable[[], Sequence[RunMetrics]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        yield from families(self._snapshot())


def registry_of(snapshot: Callable[[], Sequence[RunMetrics]]) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(RunsCollector(snapshot))
    return registry


def write_textfile(path: Path, registry: CollectorRegistry) -> None:
    """For node_exporter's textfile collector (``*.prom``): written beside ``path``, then renamed over it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_to_textfile(str(path), registry)
    except OSError as exc:
        raise UserError(f"--textfile {path}: cannot write: {exc.strerror or exc}") from None


def serve(registry: CollectorRegistry, port: int, addr: str = "127.0.0.1") -> tuple[str, int, Callable[[], None]]:
    """Serve ``/metrics`` in a background thread; returns the bound address, port and a stop function."""
    try:
        server, thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        raise UserError(f"--serve {port} --bind {addr}: cannot listen there: {exc.strerror or exc}") from None

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    host, bound = server.server_address[:2]
    return str(host), int(bound), stop
