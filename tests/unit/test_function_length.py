"""No function in air_hpc/ or scripts/ longer than 60 lines (issue 16 item 6, issue 25 item 7 for the benchmarks):
a long body hides its phases; name them."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: The package, and the benchmarks and other scripts beside it.
ROOTS = (REPO / "air_hpc", REPO / "scripts")
MAX_LINES = 60

#: Functions their owners are still splitting; empty this as they land.
ALLOWED: set[str] = set()


def long_functions(root: Path, max_lines: int = MAX_LINES) -> dict[str, int]:
    """``path:Qualified.name`` -> lines (``def`` to last line, decorators excluded) of each longer function."""
    found: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        stack: list[tuple[ast.AST, str]] = [(tree, "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    name = f"{prefix}{child.name}"
                    length = (child.end_lineno or child.lineno) - child.lineno + 1
                    if not isinstance(child, ast.ClassDef) and length > max_lines:
                        found[f"{path.relative_to(root).as_posix()}:{name}"] = length
                    stack.append((child, f"{name}."))
                else:
                    stack.append((child, prefix))
    return found


def all_long_functions() -> dict[str, int]:
    return {f"{root.name}/{name}": n for root in ROOTS for name, n in long_functions(root).items()}


@pytest.mark.parametrize("root", ROOTS, ids=lambda root: root.name)
def test_the_walk_sees_python_files_under(root: Path) -> None:
    assert any(root.rglob("*.py")), f"{root} moved: the length limit would check nothing there"


def test_no_function_in_the_package_or_scripts_is_longer_than_60_lines() -> None:
    too_long = {name: n for name, n in all_long_functions().items() if name not in ALLOWED}
    assert not too_long, f"split these into named parts (over {MAX_LINES} lines): {too_long}"


def test_the_allow_list_names_only_functions_still_too_long() -> None:
    """An entry whose function was split (or renamed) must leave the list, so it cannot hide a new one."""
    split_already = ALLOWED - set(all_long_functions())
    assert not split_already, f"remove from ALLOWED: {split_already}"


def test_the_walk_finds_nested_functions_and_methods(tmp_path: Path) -> None:
    body = "\n".join(f"            x{i} = {i}" for i in range(60))
    (tmp_path / "m.py").write_text(f"class A:\n    def f(self):\n        def g():\n{body}\n        return g\n")
    assert long_functions(tmp_path) == {"m.py:A.f": 63, "m.py:A.f.g": 61}
