"""The fleet report as one PNG for a weekly review: where each tenant's node-hours went, waits, interruptions."""

from pathlib import Path
from typing import Any

from air_hpc.errors import UserError
from air_hpc.fleet.render import duration
from air_hpc.fleet.report import BADPUT_KINDS, FleetReport

_COLORS = {
    "productive": "#2e7d32",
    "queue": "#9e9e9e",
    "startup": "#f9a825",
    "checkpoint_stall": "#1565c0",
    "lost_work": "#c62828",
    "restart_gap": "#6a1b9a",
}


def _time_split(report: FleetReport) -> dict[str, list[float]]:
    """Hours per tenant: productive (ours), and each badput cause."""
    split = {"productive": [t.productive_s / 3600 for t in report.tenants]}
    for kind in BADPUT_KINDS:
        split[kind] = [t.badput_s[kind] / 3600 for t in report.tenants]
    return split


def plot_fleet(report: FleetReport, out: Path) -> Path:
    """Write the PNG; four panels: time by cause, queue waits, preemptions and failures, goodput by kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [t.key for t in report.tenants]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (time_ax, wait_ax), (fault_ax, good_ax) = axes
    left = [0.0] * len(names)
    for kind, hours in _time_split(report).items():
        time_ax.barh(names, hours, left=left, color=_COLORS[kind], label=kind.replace("_", " "))
        left = [a + b for a, b in zip(left, hours, strict=True)]
    time_ax.set_title("Job time by cause (hours; productive: our runs)")
    time_ax.legend(fontsize=7, loc="lower right")
    xs = range(len(names))
    for offset, key in ((-0.2, "p50"), (0.2, "p95")):
        values = [(getattr(t.queue_wait_s, key) or 0.0) / 60 for t in report.tenants]
        wait_ax.bar([x + offset for x in xs], values, width=0.4, label=f"queue wait {key}")
    wait_ax.set_xticks(list(xs), names)
    wait_ax.set_ylabel("minutes")
    wait_ax.set_title("Queue wait, submission to first start")
    wait_ax.legend(fontsize=7)
    _faults(fault_ax, report, names)
    _goodput(good_ax, report, names)
    span = f"{duration(report.window.until_s - report.window.since_s)} window"
    fig.suptitle(f"Fleet report: {report.total.jobs} jobs, {report.total.node_seconds / 3600:.2f} node-hours, {span}")
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=80)
    except OSError as exc:
        raise UserError(f"--plot {out}: cannot write: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return out


def _faults(ax: Any, report: FleetReport, names: list[str]) -> None:
    series = {
        "preemptions": [t.preemptions for t in report.tenants],
        "requeues": [t.requeues for t in report.tenants],
        **{f"{k} failures": [t.failures[k] for t in report.tenants] for k in ("infrastructure", "application", "user")},
    }
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        ax.bar([x - 0.4 + width * (i + 0.5) for x in range(len(names))], values, width=width, label=label)
    ax.set_xticks(list(range(len(names))), names)
    ax.set_title("Interruptions")
    ax.legend(fontsize=7)


def _goodput(ax: Any, report: FleetReport, names: list[str]) -> None:
    kinds = ("scheduling", "runtime", "program", "overall")
    width = 0.2
    for i, kind in enumerate(kinds):
        values = [100 * (t.goodput[kind] or 0.0) for t in report.tenants]
        ax.bar([x - 0.3 + width * i for x in range(len(names))], values, width=width, label=kind)
    ax.set_xticks(list(range(len(names))), names)
    ax.set_ylim(0, 100)
    ax.set_ylabel("%")
    ax.set_title("Goodput by kind (missing: not known)")
    ax.legend(fontsize=7)
