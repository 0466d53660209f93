"""Service levels per tenant or QOS: the targets file, and each target's attainment and error budget. Pure but for
reading the file.

The file (``configs/slo.yaml``) maps tenants (Slurm accounts) and QOS names to
targets; ``defaults`` apply to every tenant listed, under its own values::

    defaults: {goodput_min: 0.5}
    tenants:
      research: {queue_wait_p95_min: 60, preemptions_per_day_max: 20}
    qos:
      high: {queue_wait_p95_min: 5}

The error budget is what the target allows to go wrong, and ``budget_left``
the share of it not yet spent (1: untouched, 0: spent, below 0: overspent):
for ``queue_wait_p95_min: 60`` the 5% of jobs allowed to wait longer than an
hour; for ``goodput_min: 0.8`` the 20% of time allowed to be lost; for
``preemptions_per_day_max: 4`` four preemptions per day of the window.
"""

import difflib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from air_hpc.config.load import Source, read_yaml
from air_hpc.errors import ConfigError
from air_hpc.fleet.report import FleetReport, GroupReport, nearest_rank


class Targets(BaseModel):
    """One tenant's or QOS's targets; every one optional."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    queue_wait_p50_min: float | None = Field(None, gt=0, description="Half the jobs start within this (minutes).")
    queue_wait_p95_min: float | None = Field(None, gt=0, description="95% of jobs start within this (minutes).")
    queue_wait_max_min: float | None = Field(None, gt=0, description="No job waits longer for its first start.")
    requeue_wait_p95_min: float | None = Field(None, gt=0, description="95% of restarts come within this (minutes).")
    goodput_min: float | None = Field(None, ge=0, le=1, description="Overall goodput at least this (0-1).")
    scheduling_goodput_min: float | None = Field(None, ge=0, le=1, description="Scheduling goodput at least this.")
    runtime_goodput_min: float | None = Field(None, ge=0, le=1, description="Runtime goodput at least this.")
    preemptions_per_day_max: float | None = Field(None, ge=0, description="Preemptions per day of the window.")
    infrastructure_failures_per_day_max: float | None = Field(
        None, ge=0, description="Failures of the platform (node failure, hang, failed health check) per day."
    )


class SloFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    defaults: Targets = Targets()
    tenants: dict[str, Targets] = Field(default_factory=dict)
    qos: dict[str, Targets] = Field(default_factory=dict)


@dataclass(frozen=True)
class Slo:
    """The loaded file, with the line of each tenant and QOS for messages."""

    path: Path
    tenants: Mapping[str, Targets]
    qos: Mapping[str, Targets]
    lines: Mapping[str, int]
    """``tenants.NAME`` / ``qos.NAME`` -> line."""


def load_slo(path: Path) -> Slo:
    """Read and validate the targets; an unknown key or a bad value is one line with the file's line."""
    source = Source()
    raw = read_yaml(path, source)
    try:
        parsed = SloFile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(exc.errors()[0], source, path)) from None
    defaults = parsed.defaults.model_dump(exclude_none=True)
    tenants = {name: Targets(**{**defaults, **t.model_dump(exclude_none=True)}) for name, t in parsed.tenants.items()}
    lines = {key: line for key, (_, line) in source.lines.items() if key.count(".") == 1}
    return Slo(path, tenants, dict(parsed.qos), lines)


def _describe(error: Mapping[str, Any], source: Source, path: Path) -> str:
    loc = [str(part) for part in error["loc"]]
    key = ".".join(loc)
    where = source.where(key) or str(path)
    if error["type"] == "extra_forbidden":
        fields = list(SloFile.model_fields) if len(loc) == 1 else list(Targets.model_fields)
        return f"{where}: unknown key {key!r}{_suggest(loc[-1], fields)}"
    return f"{where}: {key}: {str(error['msg']).removeprefix('Value error, ')}"


def _suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_names(slo: Slo, tenants: Sequence[str], qos: Sequence[str]) -> None:
    """Every tenant and QOS the file names must exist in Slurm; else one line with its file line and a guess."""
    for scope, names, known in (("tenants", slo.tenants, tenants), ("qos", slo.qos, qos)):
        for name in names:
            if name not in known:
                line = slo.lines.get(f"{scope}.{name}")
                where = f"{slo.path}:{line}" if line else str(slo.path)
                what = "tenant (Slurm account)" if scope == "tenants" else "QOS"
                known_text = ", ".join(known) or "none"
                raise ConfigError(
                    f"{where}: unknown {what} {name!r}{_suggest(name, known)} (Slurm knows: {known_text})"
                )


@dataclass(frozen=True)
class Attainment:
    """One target of one tenant or QOS, against the window's report."""

    scope: str
    """``tenant`` or ``qos``."""
    name: str
    target: str
    """The key, e.g. ``queue_wait_p95_min``."""
    limit: float
    measured: float | None
    """In the target's unit (minutes, a ratio, per day); None when the window holds nothing to measure."""
    met: bool | None
    """None: nothing to measure (no jobs, no run records), which misses nothing."""
    budget_left: float | None
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "name": self.name,
            "target": self.target,
            "limit": self.limit,
            "measured": self.measured,
            "met": self.met,
            "budget_left": self.budget_left,
            "detail": self.detail,
        }


def _wait_target(key: str, limit_min: float, waits: Sequence[float], q: float | None) -> tuple[Any, ...]:
    """(measured min, met, budget left, detail) of a wait target: a quantile, or the max when ``q`` is None."""
    if not waits:
        return None, None, None, "no waits in the window"
    ordered = sorted(waits)
    limit_s = 60 * limit_min
    over = sum(w > limit_s for w in ordered)
    if q is None:
        worst = ordered[-1]
        return worst / 60, worst <= limit_s, 1 - worst / limit_s, f"{over} of {len(ordered)} over {limit_min:g} min"
    value = nearest_rank(ordered, q) or 0.0
    allowed = (1 - q) * len(ordered)
    left = 1 - over / allowed if allowed > 0 else (1.0 if over == 0 else -math.inf)
    share = 100 * (len(ordered) - over) / len(ordered)
    return value / 60, value <= limit_s, left, f"{share:.1f}% of {len(ordered)} within {limit_min:g} min"


def _ratio_target(limit: float, measured: float | None) -> tuple[Any, ...]:
    if measured is None:
        return None, None, None, "not measured (no jobs, or none with run records)"
    allowed = 1 - limit
    left = 1 - (1 - measured) / allowed if allowed > 0 else (1.0 if measured >= 1 else -math.inf)
    return measured, measured >= limit, left, f"{100 * measured:.1f}% against {100 * limit:.1f}%"


def _rate_target(limit: float, count: int, days: float) -> tuple[Any, ...]:
    rate = count / days if days > 0 else 0.0
    budget = limit * days
    left = 1 - count / budget if budget > 0 else (1.0 if count == 0 else -math.inf)
    return rate, rate <= limit, left, f"{count} in {days:.2f} days (budget {budget:.1f})"


def _measure(key: str, limit: float, group: GroupReport, days: float) -> tuple[Any, ...]:
    if key.startswith("queue_wait_") or key.startswith("requeue_wait_"):
        waits = group.queue_waits_s if key.startswith("queue") else group.requeue_waits_s
        q = {"p50": 0.5, "p95": 0.95, "max": None}[key.split("_")[2]]
        return _wait_target(key, limit, waits, q)
    if key.endswith("goodput_min"):
        kind = "overall" if key == "goodput_min" else key.removesuffix("_goodput_min")
        return _ratio_target(limit, group.goodput[kind])
    count = group.preemptions if key == "preemptions_per_day_max" else group.failures["infrastructure"]
    return _rate_target(limit, count, days)


def evaluate(slo: Slo, report: FleetReport) -> list[Attainment]:
    """Each target against the report; a tenant or QOS without jobs in the window is measured as empty."""
    results = []
    for scope, targets, groups in (("tenant", slo.tenants, report.tenants), ("qos", slo.qos, report.qos)):
        by_key = {g.key: g for g in groups}
        for name, wanted in sorted(targets.items()):
            group = by_key.get(name) or GroupReport.empty(name)
            for key, limit in wanted.model_dump(exclude_none=True).items():
                measured, met, left, detail = _measure(key, float(limit), group, report.window.days)
                results.append(Attainment(scope, name, key, float(limit), measured, met, left, detail))
    return results


def all_met(results: Iterable[Attainment]) -> bool:
    return all(r.met is not False for r in results)
