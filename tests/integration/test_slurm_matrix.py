"""The version matrix: a testbed from each Slurm build in ``AIR_HPC_SLURM_PREFIXES`` (``:``-separated prefixes of
``scripts/slurm-build.sh``), its version shown, every parser run on what it prints, and a dry run it accepts.

Skipped when the variable is unset: CI runs Debian's 22.05 alone (the rest of tests/integration/). The behaviour
tests proper (submit, preemption, requeue, spares, placement) run on a build with ``scripts/slurm-matrix.sh``.
"""

import json
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from air_hpc.config import load_job
from air_hpc.errors import AirHpcError
from air_hpc.launch.submit import plan
from air_hpc.slurm import hostlist
from air_hpc.slurm.version import SlurmVersion, parse_version
from air_hpc.testbed import Testbed
from air_hpc.testbed.cloud import CloudController
from air_hpc.testbed.prefix import check_prefix
from air_hpc.topology import treeconf
from air_hpc.topology.request import place_in_allocation
from tests.unit import test_slurm_fixtures as fixtures

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
AIR_HPC = str(REPO / ".venv" / "bin" / "air-hpc")
PREFIXES = [p for p in os.environ.get("AIR_HPC_SLURM_PREFIXES", "").split(":") if p]
SKIP = "AIR_HPC_SLURM_PREFIXES is unset: no Slurm builds to test (scripts/slurm-build.sh SOURCE PREFIX)"


PARAMS: list[object] = [*PREFIXES] or [pytest.param(None, marks=pytest.mark.skip(reason=SKIP))]


@pytest.fixture(scope="module", params=PARAMS, ids=lambda p: str(p).rsplit("/", 1)[-1])
def build_bed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    bed = Testbed(tmp_path_factory.mktemp("matrix"))
    bed.up((2, 4, 2), slurm_prefix=Path(request.param))
    try:
        yield bed
    finally:
        bed.down()


def _cli(bed: Testbed, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it after ``eval "$(air-hpc testbed env)"``."""
    env = {**os.environ, **bed.env}
    return subprocess.run([AIR_HPC, *args], capture_output=True, text=True, env=env, timeout=300, check=False)


def test_every_command_and_daemon_is_the_builds(build_bed: Testbed) -> None:
    build = build_bed.build
    assert build is not None
    state_dir = str(build_bed.layout.root)
    status = json.loads(_cli(build_bed, "testbed", "status", "--state-dir", state_dir, "--json").stdout)
    assert (status["slurm_version"], status["slurm_prefix"]) == (str(build.version), str(build.prefix))
    assert build_bed.client().version() == build.version
    assert status["up"] and status["nodes"] == {f"n{i}": "idle" for i in range(1, 9)}
    exported = _cli(build_bed, "testbed", "env", "--state-dir", state_dir).stdout
    assert f"export PATH={build.prefix}/bin:{build.prefix}/sbin:" in exported
    doctor = _cli(build_bed, "doctor")
    assert doctor.returncode == 0, doctor.stderr
    assert f"Slurm {build.version}," in doctor.stdout


def test_every_parser_reads_what_the_build_prints(build_bed: Testbed, tmp_path: Path) -> None:
    build = build_bed.build
    assert build is not None
    capture = subprocess.run(
        [str(REPO / "scripts" / "slurm-capture.sh"), str(build_bed.layout.root), str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"},
        timeout=300,
        check=False,
    )
    assert capture.returncode == 0, capture.stderr
    release = tmp_path / str(build.version)
    assert parse_version((release / "sbatch-version.out").read_text()) == build.version
    for check in (
        fixtures.test_version_of_every_command_is_the_directory_release,
        fixtures.test_test_only_reply_and_refusal,
        fixtures.test_squeue_keeps_names_states_and_reasons,
        fixtures.test_scontrol_show_job,
        fixtures.test_sacct_records_every_run,
        fixtures.test_node_states_and_groups,
        fixtures.test_partitions_config_and_topology,
    ):
        check(release)


def test_dry_run_is_accepted(build_bed: Testbed, tmp_path: Path, small_corpus: Path) -> None:
    job = str(REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml")
    sets = ["--set", f"run.root={tmp_path}", "--set", f"data.path={small_corpus}"]
    done = _cli(build_bed, "submit", "--dry-run", job, *sets)
    assert done.returncode == 0, done.stderr
    assert "dry run: sbatch --test-only: would start" in done.stderr


# ---- block jobs on a real topology/block controller (CLOUD nodes) -------------------------------------------
#: 16 NVL72-like blocks of 18 nodes, every aggregation level enabled
BLOCK_TOPOLOGY = (
    "".join(f"BlockName=b{b + 1:02d} Nodes=gb[{b * 18 + 1:04d}-{b * 18 + 18:04d}]\n" for b in range(16))
    + "BlockSizes=18,36,72,144,288\n"
)
BLOCK_NODES = [f"gb{i:04d}" for i in range(1, 16 * 18 + 1)]
#: (nodes, --segment, hot spares): inside a block, across blocks, segments of TP groups, spares in whole segments
BLOCK_JOBS = [
    (8, None, 0),
    (18, None, 0),
    (20, None, 0),
    (40, None, 0),
    (8, None, 2),
    (16, 4, 0),
    (36, 9, 0),
    (40, 4, 0),
    (72, 18, 0),
    (16, 4, 4),
    (36, 9, 9),
    (12, 6, 6),
]
BLOCK_SEEDS = (1, 2, 3)


@pytest.fixture(scope="module", params=PARAMS, ids=lambda p: str(p).rsplit("/", 1)[-1])
def block_ctld(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudController]:
    build = check_prefix(Path(request.param))
    if build.version < SlurmVersion(24, 5):
        pytest.skip(f"Slurm {build.version} has no --segment (topology/block jobs are checked from 24.05)")
    workdir = tmp_path_factory.mktemp("blocks")
    with CloudController(BLOCK_TOPOLOGY, BLOCK_NODES, workdir, build=build, topology_plugin="topology/block") as ctl:
        yield ctl


def block_job(ctl: CloudController, root: Path, corpus: Path, nodes: int, segment: int | None, spares: int):
    sets = [f"run.root={root}", f"data.path={corpus}", "cluster.partition=all", "cluster.exclusive=true"]
    sets += [f"cluster.topology_file={ctl.workdir / 'topology.conf'}", "hardware.nvlink_domain_nodes=18"]
    sets += [f"resources.nodes={nodes}", "resources.tasks_per_node=1", "resources.cpus_per_task=1"]
    sets += [f"resources.spare_nodes={spares}"]
    sets += ["parallel.tp=1", "parallel.pp=1", "train.micro_batch_size=1", f"train.global_batch_size={nodes}"]
    sets += [f"run.name=block-{nodes}-{segment}-{spares}"]
    sets += [f"placement.segment={segment}"] if segment else []
    return load_job(REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml", sets)


def test_block_dry_runs_are_accepted_wherever_slurm_places_the_job(
    block_ctld: CloudController, tmp_path: Path, small_corpus: Path
) -> None:
    """Random drains of 5-12%: each job Slurm itself places (no node list) passes our `submit --dry-run` too.

    25.05 refuses a node list beside several segments, so there the request leaves the segments to Slurm
    (and the ranks are placed on the nodes it chose); 26.05 takes the pinned list.
    """
    ctl = block_ctld
    assert ctl.build is not None
    pins = ctl.build.version >= SlurmVersion(25, 11)
    topology = treeconf.parse_block(BLOCK_TOPOLOGY, "topology.conf")
    placeable = accepted = 0
    refused: list[str] = []
    for seed in BLOCK_SEEDS:
        rng = random.Random(seed)
        drained = rng.sample(BLOCK_NODES, round(len(BLOCK_NODES) * rng.uniform(0.05, 0.12)))
        ctl.set_unavailable(drained)
        for nodes, segment, spares in BLOCK_JOBS:
            theirs = ctl.placement(nodes + spares, [f"--segment={segment}"] if segment else [])
            if theirs is None:
                continue  # Slurm itself cannot place it with these drains: nothing to compare
            placeable += 1
            job = block_job(ctl, tmp_path / f"s{seed}", small_corpus, nodes, segment, spares)
            try:
                planned = plan(job, ctl.client, test_only=True)
            except AirHpcError as exc:
                refused.append(f"seed {seed}: {nodes}+{spares} nodes, --segment={segment}: {exc}")
                continue
            if planned.test_only is None:
                refused.append(f"seed {seed}: {nodes}+{spares}, --segment={segment}: no test-only ({planned.notes})")
                continue
            accepted += 1
            if segment and not pins:  # a node list beside several segments would be refused: Slurm places them
                assert planned.request.nodelist is None, planned.notes
            elif planned.request.nodelist is None:
                assert any(n.startswith("not enough free nodes now") for n in planned.notes), planned.notes
            if planned.request.nodelist is None:  # Slurm chose: the ranks go on its nodes, TP groups in blocks
                chosen = hostlist.expand(planned.test_only.nodelist, "sbatch --test-only")
                assert place_in_allocation(job, topology, chosen, drained) is not None, (chosen, segment)
    print(f"Slurm {ctl.build.version}: {accepted} of {placeable} placeable block jobs accepted")
    assert not refused, "\n".join(refused)
    assert placeable >= len(BLOCK_SEEDS) * len(BLOCK_JOBS) // 2, "the drains left too few cases to compare"


#: (nodes, --segment, hot spares) with segments wider than a base block of 18: two blocks each, four blocks each
WIDE_SEGMENT_JOBS = [(72, 36, 0), (36, 36, 36), (144, 72, 0)]


def test_a_wide_segment_goes_to_slurm_from_25_11_and_is_refused_before(
    block_ctld: CloudController, tmp_path: Path, small_corpus: Path
) -> None:
    """A segment larger than a base block: 25.05 refuses it ("segment > bblock_node_cnt is not supported"),
    and so do we, naming the rule; 25.11 and later place each segment in an aggregate, and our dry run,
    which leaves such segments to Slurm, is accepted."""
    ctl = block_ctld
    assert ctl.build is not None
    ctl.set_unavailable(BLOCK_NODES[5:72:23])  # drains in the first four blocks only: aggregates elsewhere stay whole
    wide = ctl.build.version >= SlurmVersion(25, 11)
    for nodes, segment, spares in WIDE_SEGMENT_JOBS:
        theirs = ctl.placement(nodes + spares, [f"--segment={segment}"])
        job = block_job(ctl, tmp_path, small_corpus, nodes, segment, spares)
        if not wide:
            assert theirs is None, f"Slurm {ctl.build.version} placed --segment={segment}: {theirs}"
            with pytest.raises(AirHpcError, match=r"cannot place it \(each segment must fit in one base block"):
                plan(job, ctl.client, test_only=True)
            continue
        assert theirs is not None, f"Slurm {ctl.build.version} could not place {nodes}+{spares} x {segment}"
        planned = plan(job, ctl.client, test_only=True)
        assert planned.test_only is not None and planned.request.nodelist is None, planned.notes
        assert planned.request.segment == segment and "not pinned: Slurm places the segments" in planned.notes[-1]
        chosen = hostlist.expand(planned.test_only.nodelist, "sbatch --test-only")
        per_aggregate: dict[int, int] = {}  # aligned aggregates of segment/18 blocks: each holds whole segments
        for node in chosen:
            aggregate = (int(node[2:]) - 1) // 18 // (segment // 18)
            per_aggregate[aggregate] = per_aggregate.get(aggregate, 0) + 1
        assert all(count % segment == 0 for count in per_aggregate.values()), (segment, per_aggregate)


def test_block_dry_run_through_the_cli(block_ctld: CloudController, tmp_path: Path, small_corpus: Path) -> None:
    """The command a user runs, with segments and spares, on each release's controller."""
    ctl = block_ctld
    ctl.set_unavailable(BLOCK_NODES[3:5])
    assert ctl.build is not None
    env = {**os.environ, "SLURM_CONF": str(ctl.conf), "PATH": f"{ctl.build.bin_dir}:{os.environ['PATH']}"}
    job = str(REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml")
    sets = [f"run.root={tmp_path}", f"data.path={small_corpus}", "cluster.partition=all"]
    sets += [f"cluster.topology_file={ctl.workdir / 'topology.conf'}", "resources.nodes=16", "resources.spare_nodes=4"]
    sets += ["resources.tasks_per_node=1", "resources.cpus_per_task=1", "parallel.tp=1", "parallel.pp=1"]
    sets += ["placement.segment=4"]
    sets += ["train.micro_batch_size=1", "train.global_batch_size=16"]
    args = [AIR_HPC, "submit", "--dry-run", job, *(part for s in sets for part in ("--set", s))]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "dry run: sbatch --test-only: would start" in done.stderr
    pinned = ctl.build.version >= SlurmVersion(25, 11)
    assert ("--nodelist=" in done.stdout) is pinned, done.stdout
    assert "#SBATCH --segment=4" in done.stdout and "#SBATCH --nodes=20" in done.stdout
