"""No import cycle between air_hpc's packages, and submission, runtime, ownership, operations and
inspection depend on each other only downwards (issue 25 item 4; ARCHITECTURE.md's "no package-level
import cycles").

The graph is read from the source with ``ast``: every ``import`` counts, at module level, inside a
function (the lazy imports that keep ``air-hpc --help`` and the batch helper light are still
dependencies) and under ``TYPE_CHECKING`` (an annotation names what the module is written against).
A package is a direct subpackage of ``air_hpc`` or a top-level module (``errors``, ``demo``, ...);
``from air_hpc import __version__`` names the root package itself, which is no layer.
"""

import ast
import graphlib
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "air_hpc"

#: Which of the five run-handling packages each may import: the runtime and ownership never import
#: submission, operations or inspection, and ownership imports none of the others.
LAYERS: dict[str, frozenset[str]] = {
    "launch": frozenset({"runtime", "ownership"}),
    "runtime": frozenset({"ownership"}),
    "ops": frozenset({"ownership"}),
    "doctor": frozenset(),
    "ownership": frozenset(),
}


def _package_of(dotted: str, root: Path) -> str | None:
    """``air_hpc.launch.submit`` -> ``launch``; ``None`` outside air_hpc or for the root package."""
    parts = dotted.split(".")
    if parts[0] != "air_hpc" or len(parts) < 2 or parts[1] == "__init__":
        return None
    if (root / parts[1]).is_dir() or (root / f"{parts[1]}.py").is_file():
        return parts[1]
    return None  # an attribute of air_hpc/__init__.py (``__version__``)


def _imported(node: ast.AST) -> list[str]:
    """Every dotted name one import statement may load (``from air_hpc import x`` may load ``air_hpc.x``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return []


def package_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Package -> the other air_hpc packages its modules import."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in sorted(root.rglob("*.py")):
        source = _package_of(".".join(("air_hpc", *path.relative_to(root).with_suffix("").parts)), root)
        if source is None:
            continue  # air_hpc/__init__.py: the version, no imports
        deps = graph[source]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            assert not (isinstance(node, ast.ImportFrom) and node.level), f"{path}: relative import"
            targets = {_package_of(name, root) for name in _imported(node)}
            deps.update(target for target in targets if target is not None and target != source)
    return dict(graph)


def cycle_in(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One cycle of packages, or ``None`` when the graph orders cleanly."""
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def test_there_is_no_import_cycle_between_packages() -> None:
    graph = package_graph()
    assert cycle_in(graph) is None, f"package import cycle: {' -> '.join(cycle_in(graph) or [])}"


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_run_handling_packages_import_each_other_only_downwards(package: str) -> None:
    imported = package_graph()[package] & set(LAYERS)
    assert imported <= LAYERS[package], f"{package} imports {sorted(imported - LAYERS[package])}"


def test_the_runtime_does_not_import_render() -> None:
    """The batch template is rendered from the runtime's facts (stop signals), never the other way round."""
    assert "render" not in package_graph()["runtime"]


def test_the_graph_sees_function_local_imports_and_finds_a_cycle(tmp_path: Path) -> None:
    """The checks above can fail: a lazy import inside a function is an edge, and two such edges a cycle."""
    for name, body in {
        "a/__init__.py": "",
        "a/one.py": "def f():\n    from air_hpc.b.two import g\n",
        "b/__init__.py": "",
        "b/two.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import air_hpc.a.one\n",
        "c.py": "from air_hpc import __version__\n",
    }.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(body)
    graph = package_graph(tmp_path)
    assert graph == {"a": {"b"}, "b": {"a"}, "c": set()}
    assert sorted(set(cycle_in(graph) or [])) == ["a", "b"]
