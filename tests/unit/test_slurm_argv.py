"""Slurm's commands are spelled only in ``slurm/`` (and the testbed, which runs its own cluster): everything
else asks the one :class:`~air_hpc.slurm.client.SlurmClient` through a typed call (ARCHITECTURE.md).

An argv is a list or tuple literal whose first element names a Slurm command.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "air_hpc"
COMMANDS = frozenset({"sbatch", "scontrol", "scancel", "squeue", "sacct", "sacctmgr", "sinfo", "srun", "salloc"})
#: Packages that may spell a Slurm command line.
OWNERS = frozenset({"slurm", "testbed"})


def argv_literals(source: str) -> list[tuple[int, str]]:
    """(line, command) of every list or tuple literal that starts with a Slurm command."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.List | ast.Tuple) and node.elts:
            first = node.elts[0]
            if isinstance(first, ast.Constant) and first.value in COMMANDS:
                found.append((node.lineno, str(first.value)))
    return found


def test_slurm_argv_is_built_only_in_slurm_and_the_testbed() -> None:
    outside = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {command}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in OWNERS
        for line, command in argv_literals(path.read_text())
    ]
    assert not outside, "Slurm argv outside slurm/ (add a typed SlurmClient call):\n" + "\n".join(outside)


def test_the_scan_finds_an_argv_in_a_list_or_a_tuple() -> None:
    source = 'a = ["scontrol", "update", job]\nb = ("sbatch", "--parsable")\nc = ["echo", "sbatch"]\n'
    assert argv_literals(source) == [(1, "scontrol"), (2, "sbatch")]
