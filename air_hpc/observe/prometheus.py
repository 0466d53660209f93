"""Per-run metrics for Prometheus, with ``prometheus_client``: a textfile for node_exporter, or an HTTP endpoint.

One collector turns a snapshot of every run under a root into metric families
at each scrape (or textfile write), so nothing is cached between scrapes and a
run that appears or finishes shows up at once. Values come from the same model
as ``air-hpc status`` and ``report`` (:mod:`air_hpc.observe.records`,
``progress``, ``report``); a value a run does not have yet is left out, not 0.

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
from air_hpc.observe.progress import run_progress
from air_hpc.observe.records import RunRecords
from air_hpc.observe.report import build_report
from air_hpc.records.rundir import RunDir
from air_hpc.slurm.jobs import JobState

log = logging.getLogger(__name__)

PREFIX = "air_hpc_run"

#: The coarse states of ``air_hpc_run_state`` (one series per state, 1 for the current one).
STATES = ("not_submitted", "pending", "running", "completed", "failed", "cancelled", "unknown")
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
    run: str
    path: str
    job_id: str | None
    executor: str | None
    state: JobState | None
    step: int | None
    total_steps: int | None
    loss: float | None
    tokens_per_s: float | None
    goodput: float | None
    restarts: int
    checkpoint_age_s: float | None
    heartbeat_age_s: float | None


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
    progress = run_progress(records, now_s)
    report = build_report(records)
    return RunMetrics(
        run=run_dir.path.name,
        path=str(run_dir.path),
        job_id=job_id,
        executor=executor,
        state=state,
        step=progress.step if progress else None,
        total_steps=records.total_steps,
        loss=progress.loss if progress else None,
        tokens_per_s=progress.tokens_per_s if progress else None,
        goodput=report.goodput if report else None,
        restarts=max(restarts, progress.restarts if progress else 0),
        checkpoint_age_s=progress.last_checkpoint_age_s if progress else None,
        heartbeat_age_s=heartbeat_age_s(run_dir, now_s),
    )


def families(runs: Sequence[RunMetrics]) -> list[Metric]:
    """The metric families of a snapshot of runs (label ``run``: the run directory's name)."""
    info = InfoMetricFamily(PREFIX, "The run's directory and current job.", labels=["run"])
    state = GaugeMetricFamily(
        f"{PREFIX}_state", "1 for the run's current state, 0 for the others.", labels=["run", "state"]
    )
    gauges: dict[str, tuple[GaugeMetricFamily, Callable[[RunMetrics], float | None]]] = {
        "step": (GaugeMetricFamily(f"{PREFIX}_step", "Last trained step.", labels=["run"]), lambda r: r.step),
        "total": (
            GaugeMetricFamily(f"{PREFIX}_total_steps", "Steps the run trains in all.", labels=["run"]),
            lambda r: r.total_steps,
        ),
        "loss": (GaugeMetricFamily(f"{PREFIX}_loss", "Loss of the last step.", labels=["run"]), lambda r: r.loss),
        "tokens": (
            GaugeMetricFamily(
                f"{PREFIX}_tokens_per_second", "Training throughput (median of recent steps).", labels=["run"]
            ),
            lambda r: r.tokens_per_s,
        ),
        "goodput": (
            GaugeMetricFamily(
                f"{PREFIX}_goodput_ratio",
                "Productive training time / wall time since the first start.",
                labels=["run"],
                unit="ratio",
            ),
            lambda r: r.goodput,
        ),
        "checkpoint": (
            GaugeMetricFamily(
                f"{PREFIX}_checkpoint_age_seconds",
                "Seconds since the last checkpoint saved.",
                labels=["run"],
                unit="seconds",
            ),
            lambda r: r.checkpoint_age_s,
        ),
        "heartbeat": (
            GaugeMetricFamily(
                f"{PREFIX}_heartbeat_age_seconds",
                "Seconds since the newest rank heartbeat of the latest start.",
                labels=["run"],
                unit="seconds",
            ),
            lambda r: r.heartbeat_age_s,
        ),
    }
    restarts = CounterMetricFamily(f"{PREFIX}_restarts", "Restarts (requeues) of the run so far.", labels=["run"])
    for r in runs:
        info.add_metric(
            [r.run],
            {
                "path": r.path,
                "job_id": r.job_id or "",
                "executor": r.executor or "",
                "slurm_state": str(r.state) if r.state is not None else "",
            },
        )
        current = phase(r.state)
        for name in STATES:
            state.add_metric([r.run, name], 1.0 if name == current else 0.0)
        for family, value_of in gauges.values():
            value = value_of(r)
            if value is not None:
                family.add_metric([r.run], float(value))
        restarts.add_metric([r.run], float(r.restarts))
    return [info, state, *(family for family, _ in gauges.values()), restarts]


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
