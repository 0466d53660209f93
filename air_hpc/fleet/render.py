"""The fleet report for people (rich tables) and for programs (the JSON of ``--json``). Pure."""

import datetime
from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from air_hpc.fleet.report import BADPUT_KINDS, FleetReport, GroupReport
from air_hpc.fleet.slo import Attainment


def _when(epoch_s: float) -> str:
    return datetime.datetime.fromtimestamp(epoch_s).astimezone().isoformat(timespec="seconds")


def report_json(report: FleetReport, slo: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The ``--json`` document: window, tenants, QOS, the fleet's total, the worst jobs, what was read, SLOs."""
    window = report.window
    return {
        "window": {
            "since": _when(window.since_s),
            "until": _when(window.until_s),
            "since_s": window.since_s,
            "until_s": window.until_s,
            "days": window.days,
        },
        "empty": report.empty,
        "tenants": [t.to_json("account") for t in report.tenants],
        "qos": [q.to_json("qos") for q in report.qos],
        "total": report.total.to_json("account"),
        "worst_jobs": [w.to_json() for w in report.worst],
        "sacct": {
            "rows": report.rows,
            "malformed": report.malformed,
            "malformed_examples": list(report.malformed_examples),
        },
        "runs": {"directories": report.runs_seen, "jobs_with_records": report.total.jobs_with_records},
        "slo": list(slo),
    }


def duration(seconds: float | None) -> str:
    """``45 s``, ``12.5 min``, ``3.2 h``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{100 * ratio:.1f}%"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def _cost(usd: float | None) -> str:
    return "-" if usd is None else f"${usd:,.2f}"


def usage_table(title: str, label: str, groups: Sequence[GroupReport], total: GroupReport | None) -> Table:
    """Jobs, node- and GPU-hours, queue waits, preemptions, requeues, failures and cost per group."""
    table = Table(title=title, title_justify="left")
    for name in (label, "jobs", "node-h", "GPU-h", "wait p50", "wait p95", "wait max", "requeue p95"):
        table.add_column(name, justify="left" if name == label else "right")
    for name in ("preempt", "requeue", "fail infra/app/user", "cost"):
        table.add_column(name, justify="right")
    for g in [*groups, *([total] if total is not None else [])]:
        f = g.failures
        table.add_row(
            g.key,
            f"{g.jobs}" + (f" ({g.pending} pending)" if g.pending else ""),
            _hours(g.node_seconds),
            _hours(g.gpu_seconds),
            duration(g.queue_wait_s.p50),
            duration(g.queue_wait_s.p95),
            duration(g.queue_wait_s.max),
            duration(g.requeue_wait_s.p95),
            str(g.preemptions),
            str(g.requeues),
            f"{f['infrastructure']}/{f['application']}/{f['user']}",
            _cost(g.cost_usd),
            end_section=g is total or (total is not None and g is groups[-1]),
        )
    return table


def goodput_table(title: str, label: str, groups: Sequence[GroupReport], total: GroupReport | None) -> Table:
    """Goodput by kind and badput by cause per group."""
    table = Table(title=title, title_justify="left")
    table.add_column(label)
    for name in ("scheduling", "runtime", "program", "overall"):
        table.add_column(name, justify="right")
    for kind in BADPUT_KINDS:
        table.add_column(f"{kind.replace('_', ' ')}", justify="right")
    table.add_column("with records", justify="right")
    for g in [*groups, *([total] if total is not None else [])]:
        table.add_row(
            g.key,
            *(_percent(g.goodput[k]) for k in ("scheduling", "runtime", "program", "overall")),
            *(duration(g.badput_s[k]) for k in BADPUT_KINDS),
            f"{g.jobs_with_records}/{g.jobs}",
            end_section=total is not None and g is groups[-1],
        )
    return table


def worst_table(report: FleetReport) -> Table:
    table = Table(title="Worst jobs by badput", title_justify="left")
    for name in ("job", "account", "qos", "run / job name", "badput", "of which"):
        table.add_column(name, justify="right" if name == "badput" else "left")
    for w in report.worst:
        parts = ", ".join(f"{k.replace('_', ' ')} {duration(v)}" for k, v in w.badput_s.items() if v > 0)
        table.add_row(
            w.job_id,
            w.account,
            w.qos,
            w.name + ("" if w.ours else " (not ours)"),
            duration(sum(w.badput_s.values())),
            parts,
        )
    return table


def notes(report: FleetReport, priced: bool) -> list[str]:
    """What the reader must know to trust the numbers."""
    found = [
        f"{report.rows} sacct record(s) of {report.total.jobs} job(s); {report.total.jobs_with_records} with run "
        f"records (runtime and program goodput, start-up, checkpoint and lost-work badput come from those only)"
    ]
    if report.malformed:
        found.append(f"{report.malformed} malformed sacct line(s) skipped, e.g. {report.malformed_examples[0]}")
    if not priced:
        found.append("no price: give --cluster or --hardware with usd_per_node_hour / usd_per_gpu_hour for the cost")
    return found


def _slo_value(key: str, value: float | None) -> str:
    if value is None:
        return "-"
    if "goodput" in key:
        return _percent(value)
    return f"{value:.1f}" + (" min" if key.endswith("_min") and "wait" in key else "/day")


def slo_json(results: Sequence[Attainment], report: FleetReport) -> list[dict[str, Any]]:
    """Each target's attainment, with the worst jobs by badput of its tenant or QOS."""
    groups = {("tenant", g.key): g for g in report.tenants} | {("qos", g.key): g for g in report.qos}
    found = []
    for result in results:
        group = groups.get((result.scope, result.name))
        worst = [w.to_json() for w in group.worst] if group is not None else []
        found.append({**result.to_json(), "worst_jobs": worst})
    return found


def slo_view(results: Sequence[Attainment], report: FleetReport) -> RenderableType:
    """The targets, met or missed, with the error budget left; then the worst jobs of each missed group."""
    table = Table(title="Service levels", title_justify="left")
    for name in ("scope", "name", "target", "limit", "measured", "attainment", "budget left", ""):
        table.add_column(name, justify="right" if name in ("limit", "measured", "budget left") else "left")
    for r in results:
        mark = "-" if r.met is None else ("met" if r.met else "MISSED")
        left = "-" if r.budget_left is None else f"{100 * r.budget_left:.0f}%"
        style = "red" if r.met is False else None
        table.add_row(
            r.scope, r.name, r.target, _slo_value(r.target, r.limit), _slo_value(r.target, r.measured), r.detail,
            left, mark, style=style,
        )  # fmt: skip
    parts: list[RenderableType] = [table]
    groups = {("tenant", g.key): g for g in report.tenants} | {("qos", g.key): g for g in report.qos}
    missed = dict.fromkeys((r.scope, r.name) for r in results if r.met is False)
    for scope, name in missed:
        group = groups.get((scope, name))
        for w in group.worst if group is not None else ():
            lost = ", ".join(f"{k.replace('_', ' ')} {duration(v)}" for k, v in w.badput_s.items() if v > 0)
            parts.append(Text(f"  {scope} {name}: job {w.job_id} {w.name}: {lost}"))
    return Group(*parts)


def report_view(report: FleetReport, priced: bool) -> RenderableType:
    """Everything for the terminal."""
    span = f"{_when(report.window.since_s)} to {_when(report.window.until_s)}"
    if report.empty:
        return Group(
            Text(f"No jobs in the window {span}: an empty report."), *(Text(n) for n in notes(report, priced)[1:])
        )
    parts: list[RenderableType] = [
        Text(f"Fleet report, {span} ({report.window.days:.2f} days)", style="bold"),
        usage_table("Tenants", "account", report.tenants, report.total),
        goodput_table("Goodput and badput by tenant", "account", report.tenants, report.total),
        usage_table("QOS", "qos", report.qos, None),
        goodput_table("Goodput and badput by QOS", "qos", report.qos, None),
    ]
    if report.worst:
        parts.append(worst_table(report))
    parts.extend(Text(n, style="dim") for n in notes(report, priced))
    return Group(*parts)
