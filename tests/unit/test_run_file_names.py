"""A run file's name is spelled once, in records/names.py (issue 25 item 7): a module that spells
``"submissions.jsonl"`` itself reads or labels a file that a rename in records/ would leave behind."""

import ast
from pathlib import Path

from air_hpc.records import names

PACKAGE = Path(__file__).resolve().parents[2] / "air_hpc"

#: The names with an extension (``job.json``, ``events.jsonl``, ``slurm-%j.out``, ...); bare words such as
#: ``logs`` or ``kind`` are also dictionary keys and prose, and ``.json`` alone is every JSON file's suffix.
RUN_FILES = frozenset(
    value
    for key, value in vars(names).items()
    if key.isupper() and isinstance(value, str) and "." in value.lstrip(".") and value != names.BEAT_SUFFIX
)


def _docstrings(tree: ast.AST) -> set[int]:
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, nodes) and node.body and isinstance(node.body[0], ast.Expr)
    }


def spelled_names(root: Path) -> list[str]:
    """``path:line 'name'`` for each string outside records/ (docstrings aside) that is a run file's name."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] == "records":
            continue
        tree = ast.parse(path.read_text(), str(path))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in RUN_FILES and id(node) not in docs:
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.value!r}")
    return found


def test_run_file_names_come_from_records() -> None:
    assert {"submissions.jsonl", "job.sbatch", "events.jsonl", "slurm-%j.out"} <= RUN_FILES
    assert spelled_names(PACKAGE) == [], "use air_hpc.records.names instead"


def test_the_walk_finds_a_spelled_name_and_skips_docstrings(tmp_path: Path) -> None:
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "names.py").write_text('SUBMISSIONS = "submissions.jsonl"\n')
    (tmp_path / "m.py").write_text('"""events.jsonl"""\n\ndef f(d):\n    """job.json"""\n    return d / "job.json"\n')
    assert spelled_names(tmp_path) == ["m.py:5 'job.json'"]
