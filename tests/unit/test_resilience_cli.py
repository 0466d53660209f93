"""``air-hpc ckpt list|verify|prune`` through the CLI's error boundary."""

import json
import os
import pty
import select
import sys
import time
from pathlib import Path

import pytest

from air_hpc.resilience.store import CheckpointStore
from tests.conftest import RunMain
from tests.unit.test_resilience_store import flip_byte, save


@pytest.fixture
def run(tmp_path: Path) -> Path:
    store = CheckpointStore(tmp_path / "run" / "checkpoints", keep_last=5)
    for step in (10, 20, 30):
        save(store, step)
    store.begin(40)
    (store.staging_dir(40) / "__0_0.distcp").write_bytes(b"partial")
    return tmp_path / "run"


def test_list_json(run: Path, run_main: RunMain) -> None:
    code, out, _ = run_main(["ckpt", "list", str(run), "--json"])
    assert code == 0
    data = json.loads(out)
    assert data["latest"] == 30
    rows = [(c["step"], c["complete"], c["verified"]) for c in data["checkpoints"]]
    assert rows == [(10, True, True), (20, True, True), (30, True, True), (40, False, False)]
    assert data["checkpoints"][0]["bytes"] > 3000


def test_list_table_shows_latest_and_corruption(run: Path, run_main: RunMain) -> None:
    flip_byte(run / "checkpoints" / "step_0000020" / "__0_0.distcp")
    code, out, _ = run_main(["ckpt", "list", str(run), "--sha256"])
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["step", "size", "complete", "checked", "note"]
    assert "sha256 ok" in lines[1] and "FAILED" in lines[2] and "corrupt" in lines[2] and lines[3].endswith("latest")
    assert "save did not finish" in lines[4]
    assert lines[5] == "checked: sha256 of every file matches the manifest (contents read in full)"


def test_list_says_a_size_check_reads_no_contents(run: Path, run_main: RunMain) -> None:
    flip_byte(run / "checkpoints" / "step_0000020" / "__0_0.distcp")
    code, out, _ = run_main(["ckpt", "list", str(run)])
    assert code == 0
    lines = out.splitlines()
    assert "sizes ok" in lines[2] and "sha256" not in lines[2]
    assert lines[-1].startswith("checked: file sizes match the manifest (contents not read")


def test_verify_ok_and_corrupt(run: Path, run_main: RunMain) -> None:
    code, out, _ = run_main(["ckpt", "verify", str(run), "30"])
    assert code == 0 and "step 30: ok (3 files" in out
    flip_byte(run / "checkpoints" / "step_0000020" / "common.pt", offset=3)
    code, out, err = run_main(["ckpt", "verify", str(run)])
    assert code == 1
    assert "step 10: ok" in out and "step 20: CORRUPT" in out
    assert err.count("\n") == 1 and "step_0000020/common.pt: sha256" in err


def test_prune(run: Path, run_main: RunMain) -> None:
    code, out, _ = run_main(["ckpt", "prune", str(run), "--keep", "1", "--every", "20", "--partial", "--yes"])
    assert code == 0 and "removed 1 checkpoint(s): 10" in out and "unfinished .tmp-step_0000040" in out
    assert CheckpointStore(run / "checkpoints", keep_last=1).committed_steps() == [20, 30]
    code, out, _ = run_main(["ckpt", "prune", str(run), "--keep", "1", "--every", "20"])
    assert code == 0 and out == f"nothing to remove in {run / 'checkpoints'} (kept: 20, 30)\n"


def test_prune_dry_run_deletes_nothing(run: Path, run_main: RunMain) -> None:
    code, out, _ = run_main(["ckpt", "prune", str(run), "--keep", "1", "--partial", "--dry-run"])
    assert code == 0
    assert out == (
        f"would remove 2 checkpoint(s) of {run / 'checkpoints'}: step(s) 10, 20, keeping 30, "
        "and the unfinished save(s) .tmp-step_0000040; nothing removed (--dry-run)\n"
    )
    store = CheckpointStore(run / "checkpoints", keep_last=1)
    assert store.committed_steps() == [10, 20, 30] and len(store.partial()) == 1


def test_prune_off_a_terminal_without_yes_refuses(run: Path, run_main: RunMain) -> None:
    code, out, err = run_main(["ckpt", "prune", str(run), "--keep", "1"])
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "would remove 2 checkpoint(s)" in err and "not on a terminal to confirm" in err and "--yes" in err
    assert CheckpointStore(run / "checkpoints", keep_last=1).committed_steps() == [10, 20, 30]


def read_terminal(fd: int, until: bytes | None, timeout_s: float = 120) -> bytes:
    """What the program wrote to the terminal, up to ``until`` (None: until it closed the terminal)."""
    got = b""
    deadline = time.monotonic() + timeout_s
    while until is None or until not in got:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"no {until!r} on the terminal within {timeout_s} s: {got!r}")
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the program closed the terminal
            chunk = b""
        if not chunk:
            if until is not None:
                raise AssertionError(f"the program ended without {until!r}: {got!r}")
            break
        got += chunk
    return got


@pytest.mark.parametrize(("answer", "left"), [("n", [10, 20, 30]), ("y", [30])])
def test_prune_on_a_terminal_asks_first(run: Path, answer: str, left: list[int]) -> None:
    """A real pseudo-terminal: the question is shown and only a yes deletes."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: air-hpc with the pty as its terminal
        os.execv(sys.executable, [sys.executable, "-m", "air_hpc", "ckpt", "prune", str(run), "--keep", "1"])
    try:
        shown = read_terminal(fd, b"[y/N]")
        assert b"remove 2 checkpoint(s)" in shown and b"step(s) 10, 20, keeping 30" in shown
        os.write(fd, answer.encode() + b"\n")
        rest = read_terminal(fd, None)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (b"removed 2 checkpoint(s): 10, 20" if answer == "y" else b"nothing removed") in rest
    assert CheckpointStore(run / "checkpoints", keep_last=1).committed_steps() == left


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ckpt", "list", "/nonexistent/run"], "no such run"),
        (["ckpt", "verify", "{run}", "99"], "no such checkpoint: step 99; committed steps: 10, 20, 30"),
        (["ckpt", "verify", "{run}", "40"], "no such checkpoint: step 40 (an unfinished save of it exists)"),
        (["ckpt", "prune", "{run}", "--keep", "0"], "--keep"),
        (["ckpt", "prune", "{run}"], "Missing option '--keep'"),
    ],
)
def test_bad_input(run: Path, run_main: RunMain, args: list[str], message: str) -> None:
    code, _, err = run_main([a.format(run=run) for a in args])
    assert code == 2 and message in err and "CORRUPT" not in err


def test_verify_json_and_json_errors(run: Path, run_main: RunMain) -> None:
    code, out, _ = run_main(["ckpt", "verify", str(run), "30", "--json"])
    assert code == 0
    assert json.loads(out)["checkpoints"] == [
        {"step": 30, "ok": True, "files": 3, "bytes": json.loads(out)["checkpoints"][0]["bytes"]}
    ]
    code, out, err = run_main(["ckpt", "verify", str(run), "99", "--json"])
    assert code == 2 and err == ""
    assert json.loads(out) == {
        "error": f"error: {run / 'checkpoints'}: no such checkpoint: step 99; committed steps: 10, 20, 30",
        "exit_code": 2,
    }
    assert out.startswith('{\n  "error"')


def test_verify_empty_run_fails(tmp_path: Path, run_main: RunMain) -> None:
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    code, _, err = run_main(["ckpt", "verify", str(tmp_path / "empty")])
    assert code == 1 and "no committed checkpoints" in err
