"""SLO targets against the fleet report, and the fleet's Prometheus gauges, on sacct output recorded on the testbed.

The recording has one tenant (``root``) and QOS ``normal``; a fake ``sacctmgr`` on PATH names the accounts and
QOS the way slurmdbd lists them.
"""

import json
import math
import stat
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from air_hpc.errors import ConfigError
from air_hpc.fleet.report import FleetReport, Prices, build_fleet_report
from air_hpc.fleet.slo import Attainment, all_met, check_names, evaluate, load_slo
from air_hpc.slurm.accounting import iter_lines, parse_accounting
from tests.conftest import REPO, RunMain
from tests.unit.test_fleet_report import FIXTURE, SINCE, UNTIL, WINDOW, fake_sacct


def report() -> FleetReport:
    return build_fleet_report(parse_accounting(iter_lines(FIXTURE.read_text())), WINDOW, {}, Prices())


def slo_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "slo.yaml"
    path.write_text(text)
    return path


def test_the_shipped_example_loads() -> None:
    slo = load_slo(REPO / "configs" / "slo.yaml")
    assert set(slo.tenants) == {"research", "product", "ops"} and set(slo.qos) == {"high", "scavenger"}
    assert slo.tenants["ops"].scheduling_goodput_min == 0.5  # from defaults
    check_names(slo, ("root", "research", "product", "ops"), ("normal", "high", "scavenger"))


def test_attainment_and_error_budget(tmp_path: Path) -> None:
    """Waits of the 11 started jobs: 0 s x8, 1, 8, 15, 32 s; one preemption and 0 infrastructure failures in 15 min."""
    slo = load_slo(
        slo_file(
            tmp_path,
            "tenants:\n  root:\n    queue_wait_p95_min: 0.25\n    queue_wait_p50_min: 1\n"
            "    preemptions_per_day_max: 192\n    runtime_goodput_min: 0.5\n"
            "qos:\n  normal:\n    queue_wait_max_min: 1\n",
        )
    )
    results = {(r.scope, r.target): r for r in evaluate(slo, report())}
    p95 = results[("tenant", "queue_wait_p95_min")]
    assert p95.met is False and p95.measured == pytest.approx(32 / 60)
    assert p95.budget_left == pytest.approx(1 - 1 / (0.05 * 11))  # one wait over 15 s; 5% of 11 allowed
    assert results[("tenant", "queue_wait_p50_min")].met is True
    preempt = results[("tenant", "preemptions_per_day_max")]
    assert preempt.met is True and preempt.budget_left == pytest.approx(1 - 1 / (192 * WINDOW.days))
    runtime = results[("tenant", "runtime_goodput_min")]
    assert runtime.met is None and runtime.measured is None  # no run records: nothing measured, nothing missed
    assert results[("qos", "queue_wait_max_min")].met is True
    assert not all_met(results.values())


def test_a_tenant_without_jobs_is_measured_empty(tmp_path: Path) -> None:
    slo = load_slo(slo_file(tmp_path, "tenants:\n  idle:\n    queue_wait_p95_min: 5\n    goodput_min: 0.9\n"))
    results = evaluate(slo, report())
    assert [(r.met, r.measured) for r in results] == [(None, None), (None, None)] and all_met(results)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "tenants:\n  root:\n    goodput_mn: 0.5\n",
            ":3: unknown key 'tenants.root.goodput_mn'; did you mean 'goodput_min'?",
        ),
        ("tennants:\n  root: {}\n", ":1: unknown key 'tennants'; did you mean 'tenants'?"),
        (
            "tenants:\n  root:\n    goodput_min: 1.5\n",
            ":3: tenants.root.goodput_min: Input should be less than or equal to 1",
        ),
        ("tenants: [root]\n", ":1: tenants: Input should be a valid dictionary"),
        ("tenants:\n  root:\n    queue_wait_p95_min: [\n", "invalid YAML"),
    ],
)
def test_a_bad_key_or_value_names_the_file_line(tmp_path: Path, text: str, message: str) -> None:
    path = slo_file(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_slo(path)
    assert str(info.value).startswith(str(path)) and message in str(info.value)


def test_an_unknown_tenant_or_qos_names_its_line_and_a_guess(tmp_path: Path) -> None:
    path = slo_file(tmp_path, "tenants:\n  research: {}\n  reserch:\n    goodput_min: 0.5\nqos:\n  hihg: {}\n")
    slo = load_slo(path)
    with pytest.raises(ConfigError, match=rf"^{path}:3: unknown tenant \(Slurm account\) 'reserch'; did you mean "):
        check_names(slo, ("root", "research"), ("high",))
    with pytest.raises(ConfigError, match=rf"^{path}:6: unknown QOS 'hihg'; did you mean 'high'\?"):
        check_names(slo, ("root", "research", "reserch"), ("high",))


def fake_sacctmgr(tmp_path: Path, accounts: str, qos: str) -> None:
    script = tmp_path / "bin" / "sacctmgr"
    script.write_text(f'#!/bin/sh\ncase "$*" in *account*) printf "{accounts}";; *qos*) printf "{qos}";; esac\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_report_with_slo_exits_1_on_a_miss_and_0_when_met(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_main: RunMain
) -> None:
    fake_sacct(tmp_path, monkeypatch, FIXTURE.read_text())
    fake_sacctmgr(tmp_path, "root\\n", "normal\\n")
    args = ["fleet", "report", "--since", SINCE, "--until", UNTIL, "--root", str(tmp_path)]
    missed = slo_file(tmp_path, "tenants:\n  root:\n    queue_wait_p95_min: 0.25\n")
    code, out, _ = run_main([*args, "--slo", str(missed)])
    assert code == 1 and "MISSED" in out and "tenant root: job 11012 never-starts" not in out
    assert "tenant root: job 11010 urgent-job: queue 32 s" in out
    code, out, _ = run_main([*args, "--slo", str(missed), "--json"])
    (result,) = json.loads(out)["slo"]
    assert code == 1 and result["met"] is False and result["worst_jobs"][0]["job_id"] == "11010"
    met = slo_file(tmp_path, "tenants:\n  root:\n    queue_wait_p95_min: 1\n")
    code, out, _ = run_main([*args, "--slo", str(met)])
    assert code == 0 and "met" in out and "MISSED" not in out


def test_report_with_an_unknown_tenant_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_main: RunMain
) -> None:
    fake_sacct(tmp_path, monkeypatch, FIXTURE.read_text())
    fake_sacctmgr(tmp_path, "root\\nresearch\\n", "normal\\n")
    path = slo_file(tmp_path, "tenants:\n  resarch: {queue_wait_p95_min: 1}\n")
    code, out, err = run_main(["fleet", "report", "--root", str(tmp_path), "--slo", str(path)])
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"{path}:2: unknown tenant (Slurm account) 'resarch'; did you mean 'research'?" in err


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_textfile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_main: RunMain) -> None:
    fake_sacct(tmp_path, monkeypatch, FIXTURE.read_text())
    fake_sacctmgr(tmp_path, "root\\n", "normal\\n")
    out_file = tmp_path / "fleet.prom"
    slo = slo_file(tmp_path, "tenants:\n  root:\n    queue_wait_p95_min: 0.25\n")
    code, out, _ = run_main(
        # from the fixture's start, not the default "a day ago" (the fixture's jobs left that on 2026-12-05 17:40)
        ["fleet", "metrics", "--since", SINCE, "--root", str(tmp_path), "--slo", str(slo), "--textfile", str(out_file)]
    )
    assert code == 0 and out.startswith(f"wrote {out_file}")
    found = samples(out_file.read_text())
    root = (("account", "root"),)
    assert found[("air_hpc_fleet_up", ())] == 1.0
    assert found[("air_hpc_fleet_tenant_node_seconds", root)] == 1770.0
    assert found[("air_hpc_fleet_tenant_preemptions", root)] == 1.0
    assert found[("air_hpc_fleet_tenant_queue_wait_seconds", (("account", "root"), ("quantile", "1")))] == 32.0
    assert found[("air_hpc_fleet_tenant_failures", (("account", "root"), ("kind", "user")))] == 5.0
    assert found[("air_hpc_fleet_qos_jobs", (("qos", "normal"),))] == 12.0
    slo_key = (("name", "root"), ("scope", "tenant"), ("target", "queue_wait_p95_min"))
    assert found[("air_hpc_fleet_slo_met", slo_key)] == 0.0
    assert math.isfinite(found[("air_hpc_fleet_slo_error_budget_left_ratio", slo_key)])


def test_metrics_without_slurmdbd_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_main: RunMain
) -> None:
    fake_sacct(tmp_path, monkeypatch, "", 1, "sacct: error: Problem talking to the database: Connection refused\n")
    code, _, err = run_main(["fleet", "metrics", "--root", str(tmp_path), "--textfile", str(tmp_path / "f.prom")])
    assert code == 2 and "slurmdbd" in err and err.count("\n") == 1 and not (tmp_path / "f.prom").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [([], "give one of --textfile OUT.prom or --serve PORT"), (["--textfile", "x.txt"], "reads only *.prom files")],
)
def test_metrics_usage_errors(run_main: RunMain, args: list[str], message: str) -> None:
    code, _, err = run_main(["fleet", "metrics", *args])
    assert code == 2 and message in err


def test_metrics_serve_on_loopback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--serve``: each scrape builds the report again; a scrape while slurmdbd is down answers up 0."""
    import urllib.request

    from air_hpc.fleet.prometheus import registry_of
    from air_hpc.observe.prometheus import serve

    calls = []

    def build() -> tuple[FleetReport, list[Attainment]]:
        calls.append(1)
        if len(calls) > 1:
            raise ConfigError("slurmdbd gone")
        return report(), []

    host, port, stop = serve(registry_of(build), 0, "127.0.0.1")
    try:
        first = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10).read().decode()
        second = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10).read().decode()
    finally:
        stop()
    assert host == "127.0.0.1" and samples(first)[("air_hpc_fleet_up", ())] == 1.0
    assert samples(second) == {("air_hpc_fleet_up", ()): 0.0}
