"""README's "Using it" block runs as written, top to bottom, in a fresh copy of the checkout (issue 24 item 3).

The copy holds the tracked files as they are in the working tree (what a clone of this commit holds) and
this checkout's ``.venv`` (``scripts/setup.sh`` would build the same); the block brings up its own testbed
under its own state directory (``XDG_STATE_HOME``) and takes it down at the end. Blocks that are not run:
the first (``scripts/demo.sh`` and ``scripts/test.sh`` set everything up and run this suite), the
build of another Slurm release (it downloads Slurm's sources and builds for ~20 min), the install on
a real cluster (it downloads CUDA torch) and the fleet examples for a production cluster (a week of its
accounting, a node exporter's textfile directory, a server that runs until stopped; the testbed's own
fleet report is tested in test_fleet_testbed.py).
"""

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
NOT_RUN = (
    "scripts/demo.sh",
    "git clone --bare https://github.com/SchedMD/slurm",
    "python3.11 -m venv",
    "air-hpc fleet report --since 7d --cluster prod",
    "air-hpc fleet report --since 7d --slo",
)
"""First command of each block that is not run here, and why: see the module docstring."""


def readme_blocks(text: str) -> list[str]:
    """The ```bash blocks of README.md, in order, except those named in NOT_RUN."""
    blocks = [textwrap_dedent(b) for b in re.findall(r"^( *)```bash\n(.*?)^\1```", text, re.M | re.S)]
    return [b for b in blocks if not b.lstrip().startswith(NOT_RUN)]


def textwrap_dedent(match: tuple[str, str]) -> str:
    indent, body = match
    return "".join(line.removeprefix(indent) for line in body.splitlines(keepends=True))


def fresh_copy(target: Path) -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    for name in filter(None, tracked):
        source, dest = REPO / name, target / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            dest.symlink_to(os.readlink(source))
        elif source.exists():
            shutil.copy2(source, dest)
    (target / ".venv").symlink_to(REPO / ".venv")


def section(output: str, command: str) -> str:
    """What one command of the block printed (``set -x`` heads each with ``+ command``)."""
    start = output.index(f"+ {command}")
    rest = output[start + 1 :]
    following = re.search(r"^\+ ", rest, re.M)
    return rest[: following.start()] if following else rest


def test_the_readme_block_runs_in_order_on_a_fresh_copy(tmp_path: Path) -> None:
    # The state dir's depth bounds slurmd's step socket paths (108 bytes): keep it short, as a home is.
    state = Path(tempfile.mkdtemp(prefix="air-readme-", dir="/tmp"))
    try:
        run_readme_block(tmp_path, state)
    finally:
        shutil.rmtree(state, ignore_errors=True)


def run_readme_block(tmp_path: Path, state: Path) -> None:
    copy = tmp_path / "clone"
    fresh_copy(copy)
    blocks = readme_blocks((copy / "README.md").read_text())
    assert len(blocks) == 1 and "air-hpc testbed up" in blocks[0] and "air-hpc testbed down" in blocks[0]
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_CONF", "AIR_HPC_RUNS_ROOT", "VIRTUAL_ENV")}
    env.update(XDG_STATE_HOME=str(state), PYTHONPATH=str(copy))
    script = "set -euxo pipefail\n" + blocks[0]
    try:
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=copy,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=1500,
        )
    finally:
        subprocess.run(
            [
                str(REPO / ".venv" / "bin" / "air-hpc"),
                "testbed",
                "down",
                "--state-dir",
                str(state / "air-hpc" / "testbed"),
            ],
            capture_output=True,
            timeout=300,
        )
    output = done.stdout
    assert done.returncode == 0, output[-6000:]
    assert "nothing submitted" not in output
    losses = section(output, "air-hpc logs gpt-tiny-testbed --rank 3 --grep 'loss|error'")
    assert re.search(r"step 30/30 loss \d", losses), losses
    assert (copy / "run.png").is_file() and (copy / "air_hpc.prom").is_file()
    assert (copy / "configs" / "clusters" / "mycluster.yaml").is_file()
