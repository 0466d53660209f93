"""No write in a run directory follows a symbolic link (issue 27 item 3).

Each test plants a link where a tool writes (``.owner.json.tmp``, ``.metrics.jsonl.tmp``,
``metrics.jsonl``, ``events.jsonl``, ``submissions.jsonl``, ``.latest.tmp``, a heartbeat's
temporary file, the heartbeat directory itself) pointing at a file outside the run, and shows
that the outside file is untouched and that the error names the refused path. Prune removes
``.trash-*`` links instead of leaving them behind.
"""

import logging
from pathlib import Path

import pytest

from air_hpc.exitcodes import ExitCode
from air_hpc.health.badnodes import append_bad_nodes
from air_hpc.health.heartbeat import Heartbeat
from air_hpc.ownership.owner import claim
from air_hpc.records.events import EventLog, Signal
from air_hpc.records.files import UnsafePathError, atomic_write, create_new, remove_tree
from air_hpc.records.generation import write_exit_code
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import record_submission
from air_hpc.resilience.store import CheckpointStore
from air_hpc.train.metrics import MetricsWriter, StepMetrics

OUTSIDE = b"the outside file: not the run's\n"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "o.txt"
    path.parent.mkdir()
    path.write_bytes(OUTSIDE)
    return path


@pytest.fixture
def run(tmp_path: Path) -> RunDir:
    run_dir = RunDir(tmp_path / "run")
    run_dir.path.mkdir()
    return run_dir


def plant(link: Path, target: Path) -> Path:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return link


def step(number: int) -> StepMetrics:
    return StepMetrics(number, 1.0, 1e-3, 0.5, 10.0, 0.1, time=1.0)


def test_submit_does_not_write_the_owner_through_a_planted_tmp(run: RunDir, outside: Path) -> None:
    link = plant(run.path / ".owner.json.tmp", outside)
    with pytest.raises(UnsafePathError, match=str(link)), claim(run, lambda owner: False) as record:
        record("7", "slurm")
    assert outside.read_bytes() == OUTSIDE and not run.owner.exists()


def test_the_owner_lock_is_no_link(run: RunDir, outside: Path) -> None:
    link = plant(run.owner_lock, outside)
    with pytest.raises(UnsafePathError, match=str(link)), claim(run, lambda owner: False):
        pass
    assert outside.read_bytes() == OUTSIDE


def test_the_trainer_keeps_its_metrics_in_the_run(run: RunDir, outside: Path) -> None:
    run.metrics.write_text(step(1).to_json() + "\n" + step(2).to_json() + "\n")
    link = plant(run.path / ".metrics.jsonl.tmp", outside)
    with pytest.raises(UnsafePathError, match=str(link)):
        MetricsWriter(run.metrics, keep_through_step=1)  # a resume rewrites the file through the tmp
    assert outside.read_bytes() == OUTSIDE and run.metrics.read_text().count("\n") == 2


def test_metrics_are_never_appended_through_a_link(run: RunDir, outside: Path) -> None:
    plant(run.metrics, outside)
    with pytest.raises(UnsafePathError, match=str(run.metrics)):
        MetricsWriter(run.metrics, keep_through_step=0)
    assert outside.read_bytes() == OUTSIDE


@pytest.mark.parametrize("name", ["events", "submissions", "bad_nodes"])
def test_appends_refuse_a_link(run: RunDir, outside: Path, name: str) -> None:
    link = plant(getattr(run, name), outside)
    with pytest.raises(UnsafePathError, match=f"{link}: refusing to write through a symbolic link"):
        if name == "events":
            EventLog(run.events).emit(Signal(signal="SIGUSR2"))
        elif name == "submissions":
            record_submission(run, "7", "slurm")
        else:
            append_bad_nodes(run.bad_nodes, ["n1"], "hung")
    assert outside.read_bytes() == OUTSIDE


def test_the_latest_pointer_is_not_written_through_a_planted_tmp(tmp_path: Path, outside: Path) -> None:
    store = CheckpointStore(tmp_path / "run" / "checkpoints", keep_last=3)
    staging = store.begin(5)
    (staging / "common.pt").write_bytes(b"x" * 10)
    link = plant(store.root / ".latest.tmp", outside)
    with pytest.raises(UnsafePathError, match=str(link)):
        store.commit(5)
    assert outside.read_bytes() == OUTSIDE


def test_a_heartbeat_is_not_written_through_a_link_and_says_so(
    tmp_path: Path, outside: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "run" / "heartbeat" / "7-0"
    link = plant(directory / ".rank-00000.json.tmp", outside)
    with caplog.at_level(logging.WARNING):
        Heartbeat(directory, 0, "n1")
    assert outside.read_bytes() == OUTSIDE
    assert f"{link}: refusing to write through a symbolic link" in caplog.text


def test_a_linked_start_directory_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    directory = plant(tmp_path / "run" / "heartbeat" / "7-0", elsewhere)
    with pytest.raises(UnsafePathError, match=f"{directory}: refusing to write through a symbolic link to a dir"):
        write_exit_code(directory, ExitCode.HUNG)
    assert list(elsewhere.iterdir()) == []


def test_a_leftover_regular_tmp_is_replaced_and_a_new_file_is_created_once(tmp_path: Path) -> None:
    (tmp_path / ".f.tmp").write_text("half a write")
    atomic_write(tmp_path / "f", "whole\n")
    assert (tmp_path / "f").read_text() == "whole\n" and not (tmp_path / ".f.tmp").exists()
    assert create_new(tmp_path / "g", b"1") and not create_new(tmp_path / "g", b"2")
    assert (tmp_path / "g").read_bytes() == b"1"


def test_prune_removes_trash_links_and_keeps_what_they_point_at(tmp_path: Path) -> None:
    keep = tmp_path / "outside-dir"
    keep.mkdir()
    (keep / "precious").write_bytes(OUTSIDE)
    store = CheckpointStore(tmp_path / "run" / "checkpoints", keep_last=3)
    store.root.mkdir(parents=True)
    plant(store.root / ".trash-step_0000001-99", keep)
    plant(store.root / ".tmp-step_0000002", keep)
    store.remove_partial()
    assert sorted(p.name for p in store.root.iterdir()) == []
    assert (keep / "precious").read_bytes() == OUTSIDE
    remove_tree(tmp_path / "missing")  # nothing there: nothing to do
