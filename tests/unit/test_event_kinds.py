"""Event kinds have one owner (records/events.py): every kind has a producer, every kind a reader waits for exists.

Producers are found in the source with ``ast``: a call of a kind's payload class anywhere in the
package outside records/ (an import alias counts), or the batch template's ``helper event RUN <kind>``.
Readers compare against :class:`EventKind` members; a string literal compared with an event's kind
in a reading module is the drift this test exists to stop.
"""

import ast
import json
import re
from pathlib import Path

import pytest

from air_hpc.chaos.outcome import DETECTION_KINDS
from air_hpc.demo import SHOWN_KINDS
from air_hpc.observe.records import FAULT_KINDS, PREEMPT_KINDS
from air_hpc.records.events import PAYLOADS, EventKind, EventLog, payload_from_text, read_events
from air_hpc.records.rundir import RunDir
from air_hpc.runtime import batch

PACKAGE = Path(__file__).resolve().parents[2] / "air_hpc"
#: The kind strings on disk: renaming one would make every older events.jsonl unreadable to the tools.
ON_DISK = {
    "start", "startup", "stop", "signal", "preempted", "requeue", "checkpoint_saved", "checkpoint_failed",
    "checkpoint_skipped", "checkpoint_partial", "checkpoint_interval", "fresh_start", "resume", "crash_loop",
    "rank_failed", "hang", "unhealthy", "straggler", "node_dead", "spares_exhausted", "in_job_restart", "step_started",
    "step_ended", "snapshot_buddies", "snapshot_skipped", "memory_resume", "route",
}  # fmt: skip
#: Modules that read events: observe/, chaos/, ops/, the demo and the crash-loop rule.
READERS = ("observe", "chaos", "ops", "demo.py", "resilience/progress.py")


def producers(root: Path) -> set[EventKind]:
    """Kinds whose payload class is called somewhere under ``root`` outside records/, or that the template emits."""
    by_name = {cls.__name__: kind for kind, cls in PAYLOADS.items()}
    found: set[EventKind] = set()
    for path in root.rglob("*.py"):
        if path.relative_to(root).parts[0] == "records":
            continue
        tree = ast.parse(path.read_text(), str(path))
        names = dict(by_name)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "air_hpc.records.events":
                names.update({a.asname: by_name[a.name] for a in node.names if a.asname and a.name in by_name})
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if name in names:
                    found.add(names[name])
    for template in (root / "templates").resolve().rglob("*.j2"):  # package data: a link to sbatch/
        found.update(EventKind(k) for k in re.findall(r'helper event "\$run_dir" (\w+)', template.read_text()))
    return found


def literal_kind_comparisons(root: Path, readers: tuple[str, ...] = READERS) -> list[str]:
    """``event.kind == "..."`` or ``e.kind in {"...", ...}`` in a reading module: a kind nobody owns."""
    hits = []
    paths = [p for r in readers for p in ((root / r).rglob("*.py") if (root / r).is_dir() else [root / r])]
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            reads_kind = any(isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides)
            literals = [c for s in sides for c in ast.walk(s) if isinstance(c, ast.Constant) and type(c.value) is str]
            if reads_kind and literals:
                hits.append(f"{path.relative_to(root)}:{node.lineno}: {literals[0].value!r}")
    return hits


def test_every_kind_has_one_payload_and_the_strings_on_disk_stay() -> None:
    assert set(PAYLOADS) == set(EventKind)
    assert all(cls.KIND is kind for kind, cls in PAYLOADS.items())
    assert {kind.value for kind in EventKind} == ON_DISK


def test_every_kind_has_a_producer() -> None:
    missing = set(EventKind) - producers(PACKAGE)
    assert not missing, f"event kinds that nothing emits: {sorted(missing)}"


@pytest.mark.parametrize(
    "waited_for",
    [PREEMPT_KINDS, FAULT_KINDS, DETECTION_KINDS, SHOWN_KINDS],
    ids=["preempt", "fault", "detection", "demo"],
)
def test_every_kind_a_reader_waits_for_exists(waited_for: frozenset[EventKind]) -> None:
    assert waited_for and all(isinstance(kind, EventKind) for kind in waited_for)


def test_readers_compare_kinds_against_the_enum_only() -> None:
    assert literal_kind_comparisons(PACKAGE) == []


def test_the_scans_can_fail(tmp_path: Path) -> None:
    """A kind nobody emits, an aliased producer, and a reader waiting for a string are all seen."""
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "a.py").write_text(
        "from air_hpc.records.events import Hang as H, Stop\nH(1, 'x', 1.0, 0, [], [], 'y')\nStop(1, 'x', None)\n"
    )
    (tmp_path / "observe").mkdir()
    (tmp_path / "observe" / "b.py").write_text("x = [e for e in events if e.kind == 'rank_failed']\n")
    assert producers(tmp_path) == {EventKind.HANG, EventKind.STOP}
    assert literal_kind_comparisons(tmp_path, ("observe",)) == ["observe/b.py:1: 'rank_failed'"]


def test_the_batch_shells_event_writes_the_line_it_always_wrote(tmp_path: Path) -> None:
    """The template's words (``event RUN signal --at T --field signal=SIGUSR2``) give the same line as before."""
    env = {"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "1", "SLURM_JOB_NODELIST": "n1", "SLURM_NODELIST": "n1"}
    argv = ["event", str(tmp_path), "signal", "--at", "12.5", "--field", "signal=SIGUSR2"]
    assert batch.main(argv, env) == 0
    assert json.loads(RunDir(tmp_path).events.read_text()) == {
        "time": 12.5,
        "kind": "signal",
        "job_id": "42",
        "restart_count": 1,
        "signal": "SIGUSR2",
    }


@pytest.mark.parametrize(
    ("kind", "fields", "message"),
    [("node_failed", {}, "unknown event kind 'node_failed'"), ("signal", {"sig": "x"}, "takes the fields signal")],
)
def test_the_batch_shell_cannot_write_a_kind_or_field_nobody_reads(kind: str, fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        payload_from_text(kind, fields)


def test_the_context_comes_before_the_payload(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl", {"job_id": "7", "restart_count": 0})
    log.emit(payload_from_text("signal", {"signal": "SIGTERM"}), at_s=3.0)
    (row,) = read_events(log.path)
    assert list(row) == ["time", "kind", "job_id", "restart_count", "signal"]
