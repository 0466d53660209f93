"""Per-tenant and per-QOS gauges of the fleet report for Prometheus, beside the per-run exporter.

Each scrape (or textfile write) builds the report of the trailing window afresh
through the given function, so nothing is cached. A scrape whose report cannot
be built (slurmdbd down) answers ``air_hpc_fleet_up 0`` and the reason in the
log, instead of failing the whole scrape.
"""

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from air_hpc.errors import AirHpcError
from air_hpc.fleet.jobs import FAILURE_KINDS
from air_hpc.fleet.report import BADPUT_KINDS, FleetReport, GroupReport
from air_hpc.fleet.slo import Attainment

log = logging.getLogger(__name__)

PREFIX = "air_hpc_fleet"


@dataclass(frozen=True)
class _Gauge:
    name: str
    help: str
    value_of: Callable[[GroupReport], float | None]
    unit: str = ""


_GAUGES = (
    _Gauge("jobs", "Jobs in the window.", lambda g: g.jobs),
    _Gauge("pending_jobs", "Jobs still waiting at the window's end.", lambda g: g.pending),
    _Gauge("node_seconds", "Node-seconds held in the window.", lambda g: g.node_seconds, "seconds"),
    _Gauge("gpu_seconds", "GPU-seconds held in the window.", lambda g: g.gpu_seconds, "seconds"),
    _Gauge("preemptions", "Runs preempted in the window.", lambda g: g.preemptions),
    _Gauge("requeues", "Requeues in the window.", lambda g: g.requeues),
    _Gauge("cost_usd", "Cost of the window's usage at the configured prices.", lambda g: g.cost_usd),
)


def _group_families(label: str, groups: Sequence[GroupReport]) -> list[Metric]:
    scope = "tenant" if label == "account" else "qos"
    out: list[Metric] = []
    for gauge in _GAUGES:
        family = GaugeMetricFamily(f"{PREFIX}_{scope}_{gauge.name}", gauge.help, labels=[label], unit=gauge.unit)
        for g in groups:
            value = gauge.value_of(g)
            if value is not None:
                family.add_metric([g.key], float(value))
        out.append(family)
    waits = GaugeMetricFamily(
        f"{PREFIX}_{scope}_queue_wait_seconds", "Submission to first start, by quantile.", labels=[label, "quantile"]
    )
    failures = GaugeMetricFamily(
        f"{PREFIX}_{scope}_failures", "Failures in the window by kind.", labels=[label, "kind"]
    )
    goodput = GaugeMetricFamily(f"{PREFIX}_{scope}_goodput_ratio", "Goodput by kind.", labels=[label, "kind"])
    badput = GaugeMetricFamily(
        f"{PREFIX}_{scope}_badput_seconds", "Job time lost in the window by cause.", labels=[label, "cause"]
    )
    for g in groups:
        for quantile, value in (("0.5", g.queue_wait_s.p50), ("0.95", g.queue_wait_s.p95), ("1", g.queue_wait_s.max)):
            if value is not None:
                waits.add_metric([g.key, quantile], value)
        for kind in FAILURE_KINDS:
            failures.add_metric([g.key, kind], float(g.failures[kind]))
        for kind, ratio in g.goodput.items():
            if ratio is not None:
                goodput.add_metric([g.key, kind], ratio)
        for cause in BADPUT_KINDS:
            badput.add_metric([g.key, cause], g.badput_s[cause])
    return [*out, waits, failures, goodput, badput]


def _slo_families(results: Sequence[Attainment]) -> list[Metric]:
    met = GaugeMetricFamily(
        f"{PREFIX}_slo_met", "1 when the target is met, 0 when missed (absent: nothing to measure).",
        labels=["scope", "name", "target"],
    )  # fmt: skip
    left = GaugeMetricFamily(
        f"{PREFIX}_slo_error_budget_left_ratio", "Share of the error budget not yet spent (below 0: overspent).",
        labels=["scope", "name", "target"],
    )  # fmt: skip
    for r in results:
        if r.met is not None:
            met.add_metric([r.scope, r.name, r.target], 1.0 if r.met else 0.0)
        if r.budget_left is not None and r.budget_left > float("-inf"):
            left.add_metric([r.scope, r.name, r.target], r.budget_left)
    return [met, left]


def families(report: FleetReport, slo: Sequence[Attainment] = ()) -> list[Metric]:
    """Every family of one report (labels ``account`` or ``qos``)."""
    window = GaugeMetricFamily(f"{PREFIX}_window_seconds", "Length of the trailing window.", unit="seconds")
    window.add_metric([], report.window.until_s - report.window.since_s)
    malformed = GaugeMetricFamily(f"{PREFIX}_sacct_malformed_lines", "sacct lines that did not parse.")
    malformed.add_metric([], float(report.malformed))
    return [
        window,
        malformed,
        *_group_families("account", report.tenants),
        *_group_families("qos", report.qos),
        *_slo_families(slo),
    ]


class FleetCollector(Collector):
    """Builds the report at every collection; ``up`` 0 (and no other family) when it cannot."""

    def __init__(self, build: Callable[[], tuple[FleetReport, Sequence[Attainment]]]) -> None:
        self._build = build

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(f"{PREFIX}_up", "1 when Slurm's accounting answered this scrape.")
        try:
            report, slo = self._build()
        except AirHpcError as exc:
            log.warning("fleet metrics: %s", exc)
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        yield from families(report, slo)


def registry_of(build: Callable[[], tuple[FleetReport, Sequence[Attainment]]]) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(FleetCollector(build))
    return registry
