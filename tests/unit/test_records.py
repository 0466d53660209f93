"""Run records: one JSON-lines schema read back from old and new files, and every file name owned by records/."""

import ast
import json
import re
from pathlib import Path

import pytest

from air_hpc.records import names
from air_hpc.records.events import CrashLoop, EventLog, Signal, read_events
from air_hpc.records.jsonl import read_jsonl
from air_hpc.records.metrics import read_metrics, step_of
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import record_submission, started_time, submissions

REPO = Path(__file__).resolve().parents[2]


def test_events_and_submissions_share_one_schema(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    EventLog(run_dir.events).emit(Signal(signal="SIGUSR2"))
    record_submission(run_dir, "7", "slurm", now_s=100.0)
    (event,) = [json.loads(line) for line in run_dir.events.read_text().splitlines()]
    (submitted,) = [json.loads(line) for line in run_dir.submissions.read_text().splitlines()]
    assert (event["kind"], submitted["kind"]) == ("signal", "submitted")
    assert list(event)[:2] == list(submitted)[:2] == ["time", "kind"]


def test_files_written_before_the_shared_schema_still_read(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    run_dir.submissions.write_text(
        '{"event": "submitted", "job_id": "7", "executor": "slurm", "time": 5}\n'
        '{"event": "started", "job_id": "7", "restart_count": 0, "nodelist": "n1", "time": 9}\n'
        '{"kind": "started", "job_id": "7", "restart_count": 1, "nodelist": "n1", "time": 12}\n'
    )
    assert [row["kind"] for row in read_jsonl(run_dir.submissions)] == ["submitted", "started", "started"]
    (record,) = submissions(run_dir)
    assert (record.job_id, record.starts) == ("7", 2)
    assert started_time(run_dir.submissions, "7") == 12.0


def test_a_field_named_event_in_a_new_line_is_kept(tmp_path: Path) -> None:
    log = EventLog(tmp_path / names.EVENTS, {"event": "watchdog"})
    log.emit(CrashLoop(generation="7-0", why="no progress"))
    (row,) = read_events(log.path)
    assert (row["kind"], row["event"]) == ("crash_loop", "watchdog")


@pytest.mark.parametrize(
    "name",
    [
        names.SUBMISSIONS,
        names.EVENTS,
        names.BAD_NODES,
        names.HOSTFILE,
        names.BEAT_GLOB,
        names.EXIT_CODE_FILE,
        names.ARMED_FILE_PREFIX,
        names.STOP_REQUESTED_FILE,
        names.HEARTBEAT,
    ],
)
def test_the_batch_template_names_no_run_file_itself(name: str) -> None:
    """Every run-file name reaches the template through the render context (``SbatchSpec.context``)."""
    bash = _template_text()
    assert not re.search(r"/['\"]?" + re.escape(name), bash)
    assert f'"{names.KIND}"' not in bash


def _template_text() -> str:
    """The templates' own text: Jinja expressions, statements and comments removed."""
    text = "\n".join(path.read_text() for path in sorted((REPO / "sbatch").rglob("*.j2")))
    return re.sub(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", "", text, flags=re.S)


def _imports(package: str) -> set[str]:
    found = set()
    for path in (REPO / "air_hpc" / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [("health", ("air_hpc.resilience",)), ("render", ("air_hpc.resilience", "air_hpc.health"))],
)
def test_layering(package: str, forbidden: tuple[str, ...]) -> None:
    assert not {m for m in _imports(package) if m.startswith(forbidden)}


def test_metrics_have_one_reader_that_skips_what_is_not_a_whole_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = RunDir(tmp_path).metrics
    assert read_metrics(path) == []
    path.write_text(
        '{"step": 1, "loss": 2.5}\n{"step": true}\n{"loss": 1}\n[1]\n{"step": "2"}\n'
        '{"step": 2, "loss": 2.25}\n{"step": 3, "lo'
    )
    assert read_metrics(path) == [{"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.25}]
    assert "torn" in caplog.text
    assert [step_of(line) for line in path.read_text().splitlines()] == [1, None, None, None, None, 2, None]


def test_no_module_but_records_reads_metrics_jsonl() -> None:
    """``run_dir.metrics`` is only ever handed to ``read_metrics`` or the trainer's writer."""
    allowed = {"read_metrics", "MetricsWriter", "exists", "is_file"}
    found = []
    for path in (REPO / "air_hpc").rglob("*.py"):
        if path.parent.name == "records":
            continue
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr == "metrics"):
                continue
            user = parents.get(node)
            if isinstance(user, ast.Attribute) and user.attr in allowed:
                continue
            if isinstance(user, ast.Call) and isinstance(user.func, ast.Name | ast.Attribute):
                name = user.func.id if isinstance(user.func, ast.Name) else user.func.attr
                if name in allowed:
                    continue
            if isinstance(user, ast.JoinedStr | ast.FormattedValue):
                continue  # named in a message
            found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == []
