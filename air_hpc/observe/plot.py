"""One PNG of a run: loss, throughput and a timeline of starts, checkpoints and interruptions.

The x axis is wall time since the first start, so an interruption shows as a
gap in the curves and a shaded span in the timeline, with the steps trained
again after it drawn on top of their lost first run. Start-up (a start to its
first step) is shaded too, and tokens/s is drawn raw and as a running median.
"""

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from air_hpc.observe.records import PREEMPT_KINDS, RunRecords, StepRecord
from air_hpc.observe.report import RunReport
from air_hpc.records.events import EventKind

CAUSE_COLORS = {"preemption": "tab:orange", "hang": "tab:red", "unhealthy": "tab:purple", "unknown": "tab:gray"}
STARTUP_COLOR = "tab:cyan"
#: Steps in the running median of tokens/s (odd, centred).
SMOOTH_STEPS = 5


def running_median(values: list[float], window: int = SMOOTH_STEPS) -> list[float]:
    """Centred running median; the window shrinks at the ends so every point has a value."""
    half = window // 2
    return [statistics.median(values[max(i - half, 0) : i + half + 1]) for i in range(len(values))]


def startup_spans(records: RunRecords, report: RunReport) -> list[tuple[float, float]]:
    """(start, first step began) of each start that reached a step."""
    spans = []
    for start, segment in zip(records.starts_s, _segments(records, report), strict=False):
        began = [(s.time_s or 0.0) - (s.step_time_s or 0.0) for s in segment if s.time_s is not None]
        if began and min(began) > start:
            spans.append((start, min(began)))
    return spans


def _segments(records: RunRecords, report: RunReport) -> list[list[StepRecord]]:
    """Timed steps split at each restart, so lines are not drawn across an interruption."""
    bounds = [r.interrupted_s for r in report.restarts]
    segments: list[list[StepRecord]] = [[] for _ in range(len(bounds) + 1)]
    for step in records.steps:
        if step.time_s is None:
            continue
        index = sum(1 for b in bounds if step.time_s > b + 1e-9)
        segments[index].append(step)
    return segments


def plot_run(records: RunRecords, report: RunReport, output: Path, title: str) -> Path:
    """Draw the run and write ``output`` (PNG); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = report.first_start_s

    def minutes(t: float) -> float:
        return (t - t0) / 60.0

    fig, (ax_loss, ax_tps, ax_time) = plt.subplots(
        3, 1, figsize=(11, 8), sharex=True, gridspec_kw={"height_ratios": [3, 2, 1.4]}
    )
    _plot_training(ax_loss, ax_tps, records, report, minutes)
    _shade_startups((ax_loss, ax_tps, ax_time), records, report, minutes)
    _timeline(ax_time, records, report, minutes)
    _shade_restarts((ax_loss, ax_tps, ax_time), report, minutes)
    ax_loss.legend(loc="upper right", fontsize=8)
    ax_time.set_xlabel("minutes since the first start")
    goodput = f"{100 * report.goodput:.1f}%" if report.goodput is not None else "n/a"
    fig.suptitle(
        f"{title}: step {report.steps_done}{f'/{report.total_steps}' if report.total_steps else ''}, "
        f"{len(report.restarts)} restart(s), goodput {goodput}"
    )
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110, format="png")
    plt.close(fig)
    return output


def _plot_training(ax_loss: Any, ax_tps: Any, records: RunRecords, report: RunReport, minutes: Any) -> None:
    """Loss, and tokens/s with its running median, one line per start."""
    for number, segment in enumerate(_segments(records, report)):
        if not segment:
            continue
        label = "first start" if number == 0 else f"after restart {number}"
        xs = [minutes(s.time_s or report.first_start_s) for s in segment]
        losses = [(x, s.loss) for x, s in zip(xs, segment, strict=True) if s.loss is not None]
        if losses:
            ax_loss.plot(*zip(*losses, strict=True), marker=".", markersize=3, linewidth=1, label=label)
        rates = [(x, s.tokens_per_s) for x, s in zip(xs, segment, strict=True) if s.tokens_per_s is not None]
        if rates:
            times, values = zip(*rates, strict=True)
            first = number == 0
            ax_tps.plot(
                times, values, ".", markersize=3, color="tab:gray", alpha=0.5, label="per step" if first else None
            )
            ax_tps.plot(
                times,
                running_median(list(values)),
                linewidth=1.5,
                color="tab:blue",
                label=f"running median ({SMOOTH_STEPS} steps)" if first else None,
            )
    ax_loss.set_ylabel("loss")
    ax_tps.set_ylabel("tokens/s")
    ax_tps.legend(loc="lower right", fontsize=7)


def _shade_startups(axes: Sequence[Any], records: RunRecords, report: RunReport, minutes: Any) -> None:
    """Each start's start-up span on every axis (labelled once, on the first)."""
    for number, (since, until) in enumerate(startup_spans(records, report)):
        for ax in axes:
            ax.axvspan(
                minutes(since),
                minutes(until),
                color=STARTUP_COLOR,
                alpha=0.2,
                linewidth=0,
                label="start-up" if number == 0 and ax is axes[0] else None,
            )


def _shade_restarts(axes: Sequence[Any], report: RunReport, minutes: Any) -> None:
    """Each restart's latency (filled) and lost work (hatched) on every axis, labelled on the first."""
    for restart in report.restarts:
        color = CAUSE_COLORS.get(restart.cause, "tab:gray")
        end = restart.resumed_s if restart.resumed_s is not None else report.last_activity_s
        lost_from = restart.interrupted_s - restart.lost_compute_s
        for ax in axes:
            labelled = ax is axes[0]
            ax.axvspan(
                minutes(restart.interrupted_s),
                minutes(end),
                color=color,
                alpha=0.15,
                linewidth=0,
                label=f"restart {restart.number} latency ({restart.cause})" if labelled else None,
            )
            # Training after the last checkpoint that had to be done again: lost too, drawn hatched.
            ax.axvspan(
                minutes(lost_from),
                minutes(restart.interrupted_s),
                facecolor="none",
                edgecolor=color,
                hatch="//",
                alpha=0.4,
                linewidth=0,
                label=f"restart {restart.number} lost work" if labelled else None,
            )


def _timeline(ax: Any, records: RunRecords, report: RunReport, minutes: Any) -> None:
    """Rows: training spans, checkpoints, interruptions (preemption signals, hangs, unhealthy nodes), starts."""
    rows = {"train": 3, "checkpoint": 2, "interrupt": 1, "start": 0}
    for segment in _segments(records, report):
        timed = [s for s in segment if s.time_s is not None]
        if timed:
            began = minutes((timed[0].time_s or 0) - (timed[0].step_time_s or 0))
            ax.broken_barh(
                [(began, minutes(timed[-1].time_s or 0) - began)], (rows["train"] - 0.3, 0.6), color="tab:green"
            )
    saves = [minutes(e.time_s) for e in records.of_kind(EventKind.CHECKPOINT_SAVED)]
    ax.scatter(saves, [rows["checkpoint"]] * len(saves), marker="v", color="tab:blue", zorder=3, label="checkpoint")
    for kinds, color, marker, label in (
        (PREEMPT_KINDS, CAUSE_COLORS["preemption"], "X", "preemption"),
        (frozenset({"hang"}), CAUSE_COLORS["hang"], "X", "hang"),
        (frozenset({"unhealthy"}), CAUSE_COLORS["unhealthy"], "X", "unhealthy node"),
    ):
        times = [minutes(e.time_s) for e in records.events if e.kind in kinds]
        if times:
            ax.scatter(times, [rows["interrupt"]] * len(times), marker=marker, s=80, color=color, zorder=3, label=label)
    starts = [minutes(t) for t in records.starts_s] or [0.0]
    ax.scatter(starts, [rows["start"]] * len(starts), marker="^", color="black", zorder=3, label="(re)start")
    for restart in report.restarts:
        ax.annotate(
            f"restart {restart.number}: {restart.cause}",
            (minutes(restart.interrupted_s), rows["interrupt"]),
            xytext=(4, 6),
            textcoords="offset points",
            fontsize=8,
        )
    ax.set_yticks(list(rows.values()), list(rows))
    ax.set_ylim(-0.7, 3.7)
    ax.legend(loc="center left", bbox_to_anchor=(1.005, 0.5), fontsize=7)
