"""Bytes that are not UTF-8 in a run's JSON-lines files crash no reader (issue 27 item 5).

300 random bytes (seeded; the same every run) appended to events.jsonl, metrics.jsonl and
submissions.jsonl: every command that reads them answers as before, without a traceback, and
the Prometheus exposition (what ``metrics --serve`` answers a scrape with) is built.
"""

import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client import generate_latest

from air_hpc.cli.main import cli
from air_hpc.observe.prometheus import registry_of
from air_hpc.ops.states import snapshot
from air_hpc.records.jsonl import read_jsonl
from air_hpc.records.metrics import read_metrics
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import record_submission
from air_hpc.slurm.fake import FakeSlurm
from tests.unit.test_observe_report import preempted_run

GARBAGE = random.Random(27).randbytes(300)
FILES = ("events", "metrics", "submissions")


@pytest.fixture
def spoiled(tmp_path: Path) -> tuple[RunDir, FakeSlurm]:
    """The preempted run of test_observe_report, running on the fake, with garbage after every JSON-lines file."""
    run_dir = preempted_run(tmp_path / "runs")
    fake = FakeSlurm()
    job_id = fake.sbatch(run_dir.job_json)
    record_submission(run_dir, job_id, "slurm")
    fake.start(job_id, "n[1-2]")
    out, _ = run_dir.batch_logs(job_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("job 100 start 1 on n[1-2]\n")
    for name in FILES:
        with getattr(run_dir, name).open("ab") as out:
            out.write(b"\n" + GARBAGE + b"\n")
    assert any(b >= 0x80 for b in GARBAGE)
    return run_dir, fake


def test_the_garbage_is_not_utf8() -> None:
    with pytest.raises(UnicodeDecodeError):
        GARBAGE.decode("utf-8")


def test_every_reader_skips_and_counts_the_lines_it_cannot_decode(
    spoiled: tuple[RunDir, FakeSlurm], caplog: pytest.LogCaptureFixture
) -> None:
    run_dir, _ = spoiled
    assert [e["kind"] for e in read_jsonl(run_dir.events)][:2] == ["start", "checkpoint_saved"]
    assert [r["step"] for r in read_metrics(run_dir.metrics)] == [1, 2, 3, 4, 5, 6, 7, 8, 6, 7, 8, 9, 10]
    assert [r["kind"] for r in read_jsonl(run_dir.submissions)] == ["submitted"]
    assert "not whole UTF-8 JSON" in caplog.text


@pytest.mark.parametrize(
    "args",
    [
        ["status", "{run}", "--json"],
        ["report", "{run}", "--json"],
        ["plot", "{run}", "--output", "{tmp}/run.png"],
        ["logs", "{run}"],
        ["runs", "--root", "{root}", "--json"],
        ["metrics", "--root", "{root}", "--textfile", "{tmp}/runs.prom"],
    ],
    ids=lambda args: args[0],
)
def test_commands_answer_without_a_traceback(
    spoiled: tuple[RunDir, FakeSlurm], tmp_path: Path, args: list[str]
) -> None:
    run_dir, fake = spoiled
    words = [a.format(run=run_dir.path, root=run_dir.path.parent, tmp=tmp_path) for a in args]
    result = CliRunner().invoke(cli, words, obj={"slurm_client": fake})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and "UnicodeDecodeError" not in result.output
    if "--json" in words:
        json.loads(result.stdout)


def test_a_scrape_is_answered(spoiled: tuple[RunDir, FakeSlurm]) -> None:
    """``metrics --serve`` answers each scrape with this exposition; it raised (HTTP 500) on the garbage."""
    run_dir, fake = spoiled
    text = generate_latest(registry_of(lambda: snapshot(str(run_dir.path.parent), fake))).decode()
    assert 'air_hpc_run_step{run="gpt-tiny-local"} 10.0' in text
