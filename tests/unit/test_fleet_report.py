"""The fleet report on sacct output recorded on the testbed (``tests/data/fleet/sacct-22.05.8.out``).

The recording (Slurm 22.05.8, 8 nodes, partitions batch and urgent with partition preemption) holds: a
2-node job that completed, a 1-node job exiting 3, an 8-node job, a cancelled job, urgent jobs, a job
requeued with ``scontrol requeue`` (two records), a job preempted by an urgent one then cancelled (two
records), a job killed at its time limit and a job cancelled while pending (no Start). Expected values are
computed here from the same text with the csv module, not from the report's code.
"""

import csv
import datetime
import json
import os
import stat
from pathlib import Path

import pytest

from air_hpc.fleet.jobs import Window, group_jobs, job_facts
from air_hpc.fleet.report import Prices, build_fleet_report, nearest_rank
from air_hpc.fleet.runs import RunFacts
from air_hpc.slurm.accounting import FLEET_FIELDS, gpus_of_tres, iter_lines, parse_accounting
from air_hpc.slurm.jobs import JobState
from tests.conftest import RunMain

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "fleet" / "sacct-22.05.8.out"
SINCE, UNTIL = "2026-12-04T17:40:00", "2026-12-04T17:55:00"


def epoch(text: str) -> float:
    return datetime.datetime.fromisoformat(text).timestamp()


WINDOW = Window(epoch(SINCE), epoch(UNTIL))


def csv_rows(text: str) -> list[dict[str, str]]:
    return [dict(zip(FLEET_FIELDS, r, strict=True)) for r in csv.reader(text.splitlines(), delimiter="|")]


def test_every_recorded_line_parses_into_its_job() -> None:
    text = FIXTURE.read_text()
    parsed = parse_accounting(iter_lines(text))
    assert parsed.malformed == 0 and len(parsed.rows) == len(text.splitlines()) == 14
    jobs = group_jobs(parsed.rows)
    requeued = jobs["11006"]
    assert [r.state for r in requeued] == [JobState.REQUEUED, JobState.COMPLETED]
    assert requeued[1].submit_s == epoch("2026-12-04T17:47:52") and requeued[1].reason == "BeginTime"
    never = jobs["11012"][0]
    assert (never.start_s, never.elapsed_s, never.gpus, never.state) == (None, 0, 0, JobState.CANCELLED)
    assert [r.state for r in jobs["11009"]] == [JobState.PREEMPTED, JobState.CANCELLED]


def test_malformed_lines_are_counted_with_their_line_never_raised() -> None:
    good = FIXTURE.read_text().splitlines()
    bad = [
        "garbage",
        good[0].replace("|2|billing", "|two|billing"),
        good[1].replace("2026-12-04T17:46:59", "2026-13-04T17:46:59", 1),
        good[2].replace("T17:47:07", "T17:4x:07"),
        "١٢|" + good[3].split("|", 1)[1],
    ]
    parsed = parse_accounting(iter_lines("\n".join([*good, *bad, ""])))
    assert (len(parsed.rows), parsed.malformed) == (14, 5)
    assert parsed.examples[0].startswith("line 15: expected 17 '|'-separated fields, got 1")
    assert "NNodes 'two' is not a whole number" in parsed.examples[1]
    assert "Submit '2026-13-04T17:46:59' is not a time" in parsed.examples[2]


@pytest.mark.parametrize("odd", ["17:+7:52", "17:4\uff17:52", "17:47: 2", "17:47:5 ", "17:\u06657:52", "17:47:61"])
def test_a_time_with_a_sign_space_or_non_ascii_digit_is_malformed(odd: str) -> None:
    """``int`` reads ``+7``, `` 2`` and a fullwidth ``7``; a time field must not, even in an hour already seen."""
    good = FIXTURE.read_text().splitlines()
    line = good[2].replace("T17:47:07", f"T{odd}")
    assert line != good[2]
    parsed = parse_accounting(iter_lines("\n".join([*good, line])))
    assert (len(parsed.rows), parsed.malformed) == (14, 1)
    assert f"T{odd}' is not a time" in parsed.examples[0]


@pytest.mark.parametrize(
    ("tres", "gpus"),
    [
        ("billing=8,cpu=8,gres/gpu=8,gres/gpu:h100=8,mem=1T,node=1", 8),
        ("cpu=8,gres/gpu:a100=2,gres/gpu:h100=4,node=2", 6),
        ("billing=2,cpu=2,node=2", 0),
        ("", 0),
        ("gres/gpu=x", 0),
    ],
)
def test_gpus_from_alloc_tres(tres: str, gpus: int) -> None:
    assert gpus_of_tres(tres) == gpus


def test_node_seconds_waits_and_interruptions_equal_what_sacct_says() -> None:
    text = FIXTURE.read_text()
    rows = csv_rows(text)
    report = build_fleet_report(parse_accounting(iter_lines(text)), WINDOW, {}, Prices())
    (tenant,) = report.tenants
    assert tenant.key == "root" and tenant.jobs == len({r["JobIDRaw"] for r in rows}) == 12
    running_none = all(r["End"] != "Unknown" for r in rows)
    assert running_none
    assert tenant.node_seconds == sum(int(r["ElapsedRaw"]) * int(r["NNodes"]) for r in rows)
    first: dict[str, dict[str, str]] = {}
    for r in rows:
        if r["JobIDRaw"] not in first or r["Submit"] < first[r["JobIDRaw"]]["Submit"]:
            first[r["JobIDRaw"]] = r
    waits = sorted(epoch(r["Start"]) - epoch(r["Submit"]) for r in first.values() if r["Start"] != "None")
    assert (tenant.queue_wait_s.p50, tenant.queue_wait_s.p95, tenant.queue_wait_s.max) == (
        nearest_rank(waits, 0.5),
        nearest_rank(waits, 0.95),
        max(waits),
    )
    assert tenant.preemptions == sum(r["State"] == "PREEMPTED" for r in rows) == 1
    assert tenant.requeues == len(rows) - len(first) == 2
    assert tenant.failures == {"infrastructure": 0, "application": 1, "user": 5}
    assert tenant.pending == 0 and tenant.gpu_seconds == 0 and tenant.cost_usd is None
    assert report.total.node_seconds == tenant.node_seconds and [q.key for q in report.qos] == ["normal"]


def test_a_window_clips_usage_like_sreport() -> None:
    parsed = parse_accounting(iter_lines(FIXTURE.read_text()))
    cut = Window(WINDOW.since_s, epoch("2026-12-04T17:47:22"))  # job 11003 (8 nodes) ran 17:47:07-17:47:37
    facts = job_facts(group_jobs(parsed.rows)["11003"], cut)
    assert (facts.held_s, facts.node_s, facts.held_total_s) == (15.0, 120.0, 30.0)


def test_scheduling_goodput_is_held_over_wanted_node_seconds() -> None:
    parsed = parse_accounting(iter_lines(FIXTURE.read_text()))
    facts = job_facts(group_jobs(parsed.rows)["11009"], WINDOW)  # preempted, waited 6 s, restarted, cancelled
    assert facts.requeue_waits_s == (6.0,) and facts.restart_gap_s == 6.0 and facts.queue_s == 2.0
    assert facts.wanted_node_s == 8 * (epoch("2026-12-04T17:49:22") - epoch("2026-12-04T17:48:31"))
    assert facts.node_s == 8 * (36 + 7)


def test_a_job_still_pending_waits_until_the_window_ends() -> None:
    line = "7|7|product|high|bob|batch|PENDING|0:0|2026-12-04T17:50:00|2026-12-04T17:50:00|Unknown|Unknown|0|4||Res|x"
    report = build_fleet_report(parse_accounting([line]), WINDOW, {}, Prices(usd_per_node_hour=2.0))
    (tenant,) = report.tenants
    assert (tenant.pending, tenant.queue_wait_s.count, tenant.badput_s["queue"]) == (1, 0, 300.0)
    assert tenant.goodput["scheduling"] == 0.0 and tenant.cost_usd == 0.0


def test_gpu_hours_are_priced_by_the_gpu_hour_else_the_node_hour() -> None:
    gpu = "8|8|research|normal|amy|batch|COMPLETED|0:0|{t}|{t}|{t}|{e}|3600|2|cpu=16,gres/gpu=16,node=2|None|big"
    line = gpu.format(t="2026-12-04T17:41:00", e="2026-12-04T18:41:00")
    long_window = Window(WINDOW.since_s, epoch("2026-12-04T19:00:00"))
    priced = build_fleet_report(parse_accounting([line]), long_window, {}, Prices(3.0, 2.5)).total
    assert (priced.gpu_seconds, priced.node_seconds, priced.cost_usd) == (16 * 3600, 2 * 3600, 16 * 2.5)
    by_node = build_fleet_report(parse_accounting([line]), long_window, {}, Prices(3.0, None)).total
    assert by_node.cost_usd == 2 * 3.0


def run_facts_of(name: str, **fields: object) -> RunFacts:
    base: dict[str, object] = {
        "productive_s": 30.0,
        "startup_s": 4.0,
        "restart_latency_s": 9.0,
        "checkpoint_stall_s": 1.0,
        "lost_work_s": 2.0,
        "mfu": None,
        "preempted_at_s": (),
        "failed_at_s": (),
    }
    return RunFacts(name=name, path=Path("/runs") / name, **{**base, **fields})  # type: ignore[arg-type]


def test_our_job_gets_its_runs_events_and_time() -> None:
    """Job 11006 was requeued (REQUEUED): the run's own events say the first start hung (infrastructure)."""
    parsed = parse_accounting(iter_lines(FIXTURE.read_text()))
    hang_at = epoch("2026-12-04T17:47:50")
    run = run_facts_of("gpt-a", failed_at_s=((hang_at, "infrastructure"),), preempted_at_s=(hang_at + 1,), mfu=0.4)
    report = build_fleet_report(parsed, WINDOW, {"11006": run}, Prices())
    (tenant,) = report.tenants
    assert tenant.failures["infrastructure"] == 1 and tenant.preemptions == 2  # 11009 (sacct) + the event
    assert tenant.jobs_with_records == 1
    held = 5 + 25  # the two runs of 11006, 2 nodes each
    assert tenant.goodput["runtime"] == pytest.approx(30.0 * 2 / (held * 2))
    assert tenant.goodput["program"] == pytest.approx(0.4)
    assert tenant.badput_s["startup"] == pytest.approx(4.0 + (9.0 - 6.0))  # restart latency less the 6 s wait
    assert tenant.badput_s["lost_work"] == 2.0 and tenant.badput_s["checkpoint_stall"] == 1.0
    ours = next(w for w in report.worst if w.job_id == "11006")
    assert ours.name == "gpt-a" and ours.ours


def test_an_empty_window_is_an_empty_report() -> None:
    report = build_fleet_report(parse_accounting([]), WINDOW, {}, Prices())
    assert report.empty and report.tenants == () and report.total.queue_wait_s.p95 is None


def fake_sacct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: str, rc: int = 0, err: str = "") -> None:
    """A ``sacct`` on PATH that prints recorded text (the testbed tests run the real one)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "out").write_text(out)
    (bin_dir / "err").write_text(err)
    script = bin_dir / "sacct"
    script.write_text(f"#!/bin/sh\ncat '{bin_dir}/out'\ncat '{bin_dir}/err' >&2\nexit {rc}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_CONF", raising=False)


def test_report_json_through_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_main: RunMain) -> None:
    fake_sacct(tmp_path, monkeypatch, FIXTURE.read_text() + "torn|line\n")
    code, out, _ = run_main(
        ["fleet", "report", "--since", SINCE, "--until", UNTIL, "--root", str(tmp_path / "none"), "--json"]
    )
    data = json.loads(out)
    assert code == 0 and data["sacct"] == {
        "rows": 14,
        "malformed": 1,
        "malformed_examples": ["line 15: expected 17 '|'-separated fields, got 2: 'torn|line'"],
    }
    (tenant,) = data["tenants"]
    assert set(tenant) >= {
        "account", "jobs", "node_seconds", "gpu_seconds", "queue_wait_s", "preemptions", "requeues", "failures",
        "goodput", "badput_s", "cost_usd",
    }  # fmt: skip
    assert set(tenant["queue_wait_s"]) == {"p50", "p95", "max"} and data["window"]["since_s"] == epoch(SINCE)
    assert set(tenant["failures"]) == {"infrastructure", "application", "user"} and data["slo"] == []


def test_report_table_and_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_main: RunMain) -> None:
    fake_sacct(tmp_path, monkeypatch, FIXTURE.read_text())
    png = tmp_path / "fleet.png"
    args = ["fleet", "report", "--since", SINCE, "--until", UNTIL, "--root", str(tmp_path), "--plot", str(png)]
    code, out, _ = run_main([*args, "--cluster", "testbed"])
    assert code == 0 and "Tenants" in out and "preempt-me (not ours)" in out and f"plot: {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_empty_window_says_so_and_exits_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_main: RunMain) -> None:
    fake_sacct(tmp_path, monkeypatch, "")
    code, out, _ = run_main(["fleet", "report", "--since", SINCE, "--until", UNTIL, "--root", str(tmp_path)])
    assert code == 0 and "No jobs in the window" in out and "an empty report" in out


#: What sacct 22.05 prints when slurmdbd is not running (recorded on the testbed).
DBD_DOWN = (
    "sacct: error: slurm_persist_conn_open_without_init: failed to open persistent connection to "
    "host:127.0.0.1:13419: Connection refused\nsacct: error: Sending PersistInit msg: Connection refused\n"
    "sacct: error: Problem talking to the database: Connection refused\n"
)


@pytest.mark.parametrize(
    ("rc", "err", "message"),
    [
        (1, DBD_DOWN, "Slurm accounting (slurmdbd) unreachable: sacct: error: Problem talking to the database"),
        (1, "sacct: error: Slurm accounting storage is disabled\n", "no Slurm accounting: the cluster has no slurmdbd"),
    ],
)
def test_no_slurmdbd_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_main: RunMain, rc: int, err: str, message: str
) -> None:
    fake_sacct(tmp_path, monkeypatch, "", rc, err)
    code, out, stderr = run_main(["fleet", "report", "--root", str(tmp_path)])
    assert code == 2 and out == "" and stderr.count("\n") == 1 and message in stderr, stderr


def test_no_sacct_is_one_line_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_main: RunMain) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    code, _, err = run_main(["fleet", "report", "--root", str(tmp_path)])
    assert code == 2 and err == "error: sacct not found: install Slurm's client tools (slurm-client) on this host\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "yesterday"], "--since 'yesterday': expected a time such as"),
        (["--since", "1h", "--until", "2h"], "is not before --until '2h': the window is empty"),
        (["--plot", "out.jpg"], "--plot out.jpg: expected a .png file name"),
        (["--cluster", "testbd"], "testbd: no such file, nor a shipped cluster profile; did you mean 'testbed'?"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_main: RunMain, args: list[str], message: str
) -> None:
    fake_sacct(tmp_path, monkeypatch, FIXTURE.read_text())
    code, _, err = run_main(["fleet", "report", "--root", str(tmp_path), *args])
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_a_bad_price_names_its_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_main: RunMain
) -> None:
    fake_sacct(tmp_path, monkeypatch, FIXTURE.read_text())
    profile = tmp_path / "prod.yaml"
    profile.write_text("partition: batch\nusd_per_node_hour: -3\n")
    code, _, err = run_main(["fleet", "report", "--root", str(tmp_path), "--cluster", str(profile)])
    assert code == 2 and f"{profile}:2: cluster.usd_per_node_hour: Input should be greater than or equal to 0" in err
    profile.write_text("partition: batch\nusd_per_node_hours: 3\n")
    code, _, err = run_main(["fleet", "report", "--root", str(tmp_path), "--cluster", str(profile)])
    assert code == 2 and "unknown key 'cluster.usd_per_node_hours'; did you mean 'cluster.usd_per_node_hour'?" in err


def test_the_benchmarks_synthetic_sacct_parses_and_adds_up() -> None:
    """The benchmark's generator, small: every line parses, and the report's node-seconds and requeues equal the
    lines' own, summed here with split (a job name may hold the separator: it is the last field)."""
    from air_hpc.fleet.synthetic import sacct_lines

    now_s = int(epoch(UNTIL))
    lines = list(sacct_lines(400, seed=7, now_s=now_s))
    parsed = parse_accounting(lines)
    assert parsed.malformed == 0 and len(parsed.rows) == len(lines) > 400
    fields = [dict(zip(FLEET_FIELDS, line.split("|", len(FLEET_FIELDS) - 1), strict=True)) for line in lines]
    window = Window(now_s - 8 * 86400, now_s + 1)
    report = build_fleet_report(parsed, window, {}, Prices())
    assert report.total.node_seconds == sum(int(f["ElapsedRaw"]) * int(f["NNodes"]) for f in fields)
    assert report.total.requeues == len(fields) - len({f["JobIDRaw"] for f in fields}) > 0
    assert report.total.preemptions == sum(f["State"] == "PREEMPTED" for f in fields) > 0
    assert {t.key for t in report.tenants} <= {f["Account"] for f in fields} and report.total.jobs == 400
