"""Hot spares on topology/block clusters: selection, the node request and sbatch lines, the supervisor's choice.

No real-testbed test: the local testbed runs Slurm 22.05 (Debian 12), which has
no topology/block (added in Slurm 23.11; Debian 13 ships 24.11). The block rules
themselves are checked against a real 25.05 controller in
:mod:`air_hpc.topology.blocks`; here every chosen set is checked with
:func:`~air_hpc.topology.blocks.violation`, the same rules.
"""

import itertools
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from air_hpc.cli.main import cli
from air_hpc.config import load_job
from air_hpc.errors import ConfigError, TopologyError
from air_hpc.exitcodes import ExitCode
from air_hpc.health.badnodes import read_bad_nodes
from air_hpc.launch.plan import LiveCluster, node_request
from air_hpc.launch.submit import plan
from air_hpc.records.events import read_events
from air_hpc.records.rundir import RunDir
from air_hpc.runtime.supervisor import Supervisor, load_topology, replace_nodes
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.fake import FakeSlurm
from air_hpc.slurm.version import SlurmVersion
from air_hpc.topology import treeconf
from air_hpc.topology.block_spares import nearest_spares, select_with_spares
from air_hpc.topology.blocks import BlockModel, aggregate_fabric, violation
from air_hpc.topology.select import pick_spare

REPO = Path(__file__).resolve().parents[2]
TESTBED_JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"
#: TP spans two nodes (one rank per node): the request carries --segment=2
#: a release that accepts a node list covering the whole job beside --segment
PINS = SlurmVersion(26, 5, 3)
TP_ACROSS_NODES = (
    "resources.nodes=4",
    "resources.tasks_per_node=1",
    "parallel.tp=2",
    "parallel.pp=2",
    "hardware.nvlink_domain_nodes=4",
)


def model_of(block_nodes: list[int], sizes: tuple[int, ...] = ()) -> BlockModel:
    lines, start = [], 1
    for i, count in enumerate(block_nodes, start=1):
        lines.append(f"BlockName=b{i:02d} Nodes=gb[{start:03d}-{start + count - 1:03d}]")
        start += count
    if sizes:
        lines.append("BlockSizes=" + ",".join(map(str, sizes)))
    return BlockModel(treeconf.parse_block("\n".join(lines) + "\n", "b.conf"))


def gb(*numbers: int) -> tuple[str, ...]:
    return tuple(f"gb{n:03d}" for n in numbers)


def every(model: BlockModel) -> set[str]:
    return set(model.block_of)


def check(model: BlockModel, picked, nodes: int, spares: int) -> None:
    """What Slurm needs of any answer: the sizes, no overlap, and the block rules on the whole allocation."""
    assert len(picked.selection.nodes) == nodes and len(picked.spares) == spares
    assert not set(picked.selection.nodes) & set(picked.spares)
    assert violation(model, [*picked.selection.nodes, *picked.spares], picked.segment) is None


def test_a_spare_goes_in_the_jobs_block_when_it_has_room() -> None:
    m = model_of([4, 4], (4, 8))
    picked = select_with_spares(m, every(m), 2, 1)
    check(m, picked, 2, 1)
    assert picked.selection.nodes == gb(1, 2) and picked.spares == gb(3) and picked.nodelist == "gb[001-003]"


def test_a_full_block_gets_its_spare_from_the_neighbouring_block() -> None:
    m = model_of([4, 4, 4, 4], (4, 8, 16))
    picked = select_with_spares(m, every(m), 4, 1)
    check(m, picked, 4, 1)
    assert picked.selection.nodes == gb(1, 2, 3, 4) and picked.spares == gb(5)


def test_spare_segments_go_to_the_nearest_block() -> None:
    m = model_of([4, 4, 4, 4])
    busy = set(gb(1, 2, 5, 6))  # b01 and b02 half used
    picked = select_with_spares(m, every(m) - busy, 4, 4, segment=2)
    check(m, picked, 4, 4)
    assert picked.segment == 2
    assert picked.selection.nodes == gb(9, 10, 11, 12)  # one block beats two halves
    assert picked.spares == gb(13, 14, 15, 16)  # b04 shares b03's pair


def test_a_partly_used_block_gives_spares_before_a_wholly_free_one() -> None:
    m = model_of([4, 4, 4, 4])
    picked = select_with_spares(m, every(m) - set(gb(13)), 8, 1)
    check(m, picked, 8, 1)
    assert picked.selection.nodes == gb(*range(1, 9)) and picked.spares == gb(14)  # b03 stays whole


def test_each_of_the_jobs_blocks_gets_a_spare_while_there_are_spares() -> None:
    m = model_of([6, 6])
    job = (*gb(1, 2, 3), *gb(7, 8, 9))
    assert nearest_spares(m, job, every(m), 2, None) == gb(4, 10)
    assert nearest_spares(m, job, every(m), 4, None) == gb(4, 5, 10, 11)


def test_the_nearest_block_is_the_one_in_the_smallest_shared_aggregate() -> None:
    m = model_of([2, 2, 2, 2])
    # The job fills b03: b04 shares its pair; b01 comes first in the file but only the top aggregate joins them.
    assert nearest_spares(m, gb(5, 6), every(m), 2, None) == gb(7, 8)
    assert violation(m, [*gb(5, 6), *gb(1, 2)]) is not None  # why file order would be wrong


def test_the_job_moves_with_its_spares_when_they_cannot_sit_beside_it() -> None:
    m = model_of([4, 4, 4, 4])
    busy = {*gb(4), *gb(5, 6, 7, 8)}  # b01 has 3 free, b02 none: a spare beside the job would cross pairs
    picked = select_with_spares(m, every(m) - busy, 3, 2)
    check(m, picked, 3, 2)
    assert picked.selection.nodes == gb(9, 10, 11) and picked.spares == gb(12, 13)


def test_in_the_aggregate_they_move_to_the_spares_sit_in_the_jobs_block_first() -> None:
    m = model_of([2, 2, 2, 2], (2, 4))
    # The job alone would take gb004 (b02's last free node); b02 and b01 have no room for spares beside it.
    picked = select_with_spares(m, set(gb(4, 5, 6, 7, 8)), 1, 2)
    check(m, picked, 1, 2)
    assert picked.selection.nodes == gb(5) and picked.spares == gb(6, 7)


def test_spares_that_break_the_segment_are_refused() -> None:
    m = model_of([4, 4])
    with pytest.raises(TopologyError, match=r"--segment=2 .* must divide the 1 spare\(s\).* use a multiple of 2"):
        select_with_spares(m, every(m), 2, 1, segment=2)
    picked = select_with_spares(m, every(m), 2, 2, segment=2)  # one TP group + one spare segment
    check(m, picked, 2, 2)
    assert picked.segment == 2


def test_pick_spare_follows_the_block_aggregates() -> None:
    topology = model_of([2, 2, 2, 2]).topology
    fabric = aggregate_fabric(topology)
    assert pick_spare(fabric, "gb005", ["gb003", "gb007"]) == "gb007"  # b03 and b04 share a pair
    assert pick_spare(topology.to_fabric(), "gb005", ["gb003", "gb007"]) == "gb003"  # flat: file order
    assert pick_spare(fabric, "gb005", ["gb003", "gb007", "gb006"]) == "gb006"  # its own block first


# ---- the node request and the batch script --------------------------------------------------------


def job_in(tmp_path: Path, small_corpus: Path, *overrides: str):
    return load_job(TESTBED_JOB, [f"run.root={tmp_path / 'runs'}", f"data.path={small_corpus}", *overrides])


def block_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "topology.conf"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("blocks", "nodelist", "spares"),
    [
        ("BlockName=b1 Nodes=n[1-6]\nBlockName=b2 Nodes=n[7-12]\nBlockSizes=6,12\n", "n[1-6]", ("n5", "n6")),
        ("BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[5-8]\nBlockSizes=4,8\n", "n[1-6]", ("n5", "n6")),
    ],
    ids=["same-block", "next-block"],
)
def test_the_batch_script_asks_for_the_job_and_its_spares_in_segments(
    tmp_path: Path, small_corpus: Path, blocks: str, nodelist: str, spares: tuple[str, ...]
) -> None:
    topo = block_file(tmp_path, blocks)
    overrides = (f"cluster.topology_file={topo}", "resources.spare_nodes=2", "cluster.slurm_version=26.05.3")
    planned = plan(job_in(tmp_path, small_corpus, *overrides, *TP_ACROSS_NODES))
    assert planned.request.spares == spares and set(planned.request.rank_hosts) == {"n1", "n2", "n3", "n4"}
    lines = planned.script.splitlines()
    for line in ("#SBATCH --nodes=6", f"#SBATCH --nodelist={nodelist}", "#SBATCH --segment=2"):
        assert line in lines
    assert not [line for line in lines if line.startswith("#SBATCH --switches")]
    assert "-m air_hpc.runtime.supervisor" in planned.script
    assert "srun --ntasks=4 --distribution=arbitrary" in planned.script


@pytest.mark.parametrize("version", ["25.05.8", "24.05.0"])
def test_before_25_11_the_job_and_its_spares_are_whole_segments_slurm_places(
    tmp_path: Path, small_corpus: Path, version: str
) -> None:
    topo = block_file(tmp_path, "BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[5-8]\nBlockSizes=4,8\n")
    overrides = (f"cluster.topology_file={topo}", "resources.spare_nodes=2", f"cluster.slurm_version={version}")
    planned = plan(job_in(tmp_path, small_corpus, *overrides, *TP_ACROSS_NODES))
    assert (planned.request.nodelist, planned.request.spares, planned.request.rank_hosts) == (None, (), ())
    lines = planned.script.splitlines()
    assert "#SBATCH --nodes=6" in lines and "#SBATCH --segment=2" in lines
    assert not [line for line in lines if line.startswith("#SBATCH --nodelist")]
    assert f"not pinned: Slurm {version} refuses a node list beside --segment=2" in "\n".join(planned.notes)


def test_unpinned_spares_leave_the_nodes_to_slurms_segments(tmp_path: Path, small_corpus: Path) -> None:
    topo = block_file(tmp_path, "BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[5-8]\nBlockSizes=4,8\n")
    overrides = (f"cluster.topology_file={topo}", "resources.spare_nodes=2", "placement.pin_nodes=false")
    planned = plan(job_in(tmp_path, small_corpus, *overrides, *TP_ACROSS_NODES))
    lines = planned.script.splitlines()
    assert "#SBATCH --nodes=6" in lines and "#SBATCH --segment=2" in lines
    assert not [line for line in lines if line.startswith("#SBATCH --nodelist")]


def test_spares_that_cannot_fit_the_block_layout_are_one_line_exit_2(tmp_path: Path, small_corpus: Path) -> None:
    topo = block_file(tmp_path, "BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[5-8]\nBlockSizes=4,8\n")
    fake = FakeSlurm(nodes={f"n{i}": "IDLE" for i in range(1, 9)})
    args = ["submit", str(TESTBED_JOB), "--set", f"run.root={tmp_path}", "--set", f"data.path={small_corpus}"]
    args += ["--set", f"cluster.topology_file={topo}", "--set", "resources.spare_nodes=1"]
    for override in TP_ACROSS_NODES:
        args += ["--set", override]
    with pytest.raises(ConfigError) as info:
        cli.main(args=args, prog_name="air-hpc", standalone_mode=False, obj={"slurm_client": fake})
    message = str(info.value)
    assert info.value.exit_code == ExitCode.USAGE and "\n" not in message
    assert message.startswith(
        f"resources.spare_nodes: 1 spare(s) beside 4 node(s) do not fit the block layout of {topo}:"
    )
    assert message.endswith("use a multiple of 2"), message
    assert not [c for c in fake.calls if c[:2] == ["sbatch", "--parsable"]]


def test_more_spares_than_the_blocks_hold_is_a_config_error(tmp_path: Path, small_corpus: Path) -> None:
    topo = block_file(tmp_path, "BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[5-8]\nBlockSizes=4,8\n")
    job = job_in(tmp_path, small_corpus, f"cluster.topology_file={topo}", "resources.spare_nodes=7")
    with pytest.raises(ConfigError, match=r"^resources\.spare_nodes: 2 node\(s\) \+ 7 spare\(s\) exceed the 8 node"):
        plan(job)


# ---- the supervisor -------------------------------------------------------------------------------

FAKE_SRUN = """
import os, sys
attempt = int(os.environ["AIR_HPC_STEP_ATTEMPT"])
hosts = open(os.environ["SLURM_HOSTFILE"]).read().split()
with open(os.environ["LOG"], "a") as log:
    log.write(" ".join(hosts) + "\\n")
if attempt == 0:
    print(f"srun: error: {hosts[0]}: task 0: Killed", file=sys.stderr, flush=True)
    sys.exit(137)
"""


def test_the_supervisor_replaces_a_dead_node_with_the_spare_in_its_block(tmp_path: Path, small_corpus: Path) -> None:
    topo = block_file(tmp_path, "BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[5-8]\nBlockSizes=4,8\n")
    overrides = (f"cluster.topology_file={topo}", "resources.spare_nodes=2", "health.preflight=false")
    job = job_in(tmp_path, small_corpus, *overrides)
    run_dir = RunDir.of(job)
    run_dir.path.mkdir(parents=True)
    run_dir.write_job(job)
    srun = tmp_path / "srun.py"
    srun.write_text(FAKE_SRUN)
    hostfile = run_dir.path / "hostfile"
    hostfile.write_text("n5\nn5\nn6\nn6\n")
    log = tmp_path / "srun.log"
    environ = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[4-7]", "SLURM_HOSTFILE": str(hostfile)}
    environ["LOG"] = str(log)
    fabric, blocks = load_topology(job)
    assert fabric is not None and fabric.leaf_of["n6"] == "b2" and blocks is not None
    probed: list[tuple[str, ...]] = []

    def probe(hosts):
        probed.append(tuple(hosts))
        return ("n6",)  # n6 died; n5's rank only failed first

    sup = Supervisor(job, run_dir, [sys.executable, str(srun)], environ, SlurmClient(), fabric, probe)
    assert sup.run() == ExitCode.OK
    assert probed and log.read_text().splitlines() == ["n5 n5 n6 n6", "n5 n5 n7 n7"]  # n7: b2, like n6
    assert read_bad_nodes(run_dir.bad_nodes) == ("n6",)
    restarts = [e for e in read_events(run_dir.events) if e["kind"] == "in_job_restart"]
    assert [e["replaced"] for e in restarts] == [{"n6": "n7"}] and restarts[0]["spares_left"] == ["n4"]
    # Allocation order alone would have taken n4, in the other block.
    assert replace_nodes(("n5", "n6"), ["n6"], ["n4", "n7"], None)[2] == {"n6": "n4"}


# ---- property test against brute force ------------------------------------------------------------


@st.composite
def spare_case(draw: st.DrawFn) -> tuple[BlockModel, set[str], int, int, int | None]:
    base = draw(st.integers(1, 3))
    count_blocks = draw(st.integers(1, 4))
    extra = draw(st.lists(st.integers(0, 1), min_size=count_blocks, max_size=count_blocks))
    top = (count_blocks - 1).bit_length()
    levels = draw(st.sets(st.integers(1, top + 1), max_size=top + 1)) if top else set()
    sizes = () if draw(st.booleans()) and not levels else tuple(base << k for k in sorted({0, *levels}))
    m = model_of([base, *(base + e for e in extra[1:])], sizes)
    nodes = sorted(m.block_of)
    available = {n for n in nodes if draw(st.integers(0, 3))} or {nodes[0]}
    count = draw(st.integers(1, max(1, len(available) - 1)))
    spares = draw(st.integers(1, 3))
    segment = draw(st.one_of(st.none(), st.integers(1, base)))
    return m, available, count, spares, segment


def valid_pairs(m: BlockModel, available: set[str], count: int, spares: int, segment: int | None):
    """Every (job, spares) split Slurm accepts whose job alone Slurm would accept too (what selection promises)."""
    try:
        seg = m.check_segment(count, segment, spares)
    except TopologyError:
        return
    for union in itertools.combinations(sorted(available), count + spares):
        if violation(m, union, seg) is None:
            for job in itertools.combinations(union, count):
                if violation(m, job, segment) is None:
                    yield job, tuple(n for n in union if n not in job)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spare_case())
def test_spares_are_valid_and_found_whenever_slurm_allows_them(case) -> None:
    m, available, count, spares, segment = case
    exists = next(valid_pairs(m, available, count, spares, segment), None)
    try:
        picked = select_with_spares(m, available, count, spares, segment)
    except TopologyError:
        assert exists is None, f"{exists} is valid but selection failed"
        return
    check(m, picked, count, spares)
    assert set(picked.selection.nodes) | set(picked.spares) <= available
    assert violation(m, picked.selection.nodes, segment) is None
    unit = picked.segment or 1
    job_blocks = {m.block_of[n] for n in picked.selection.nodes}
    taken = set(picked.selection.nodes)
    left = [len([n for n in m.topology.blocks[i].nodes if n in available and n not in taken]) for i in job_blocks]
    if max(left) >= unit:
        assert {m.block_of[n] for n in picked.spares} & job_blocks, "a job block had room but got no spare"


def test_too_few_free_nodes_now_leave_the_wait_to_slurm_with_the_segment(tmp_path: Path, small_corpus: Path) -> None:
    topo = block_file(tmp_path, "BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[5-8]\nBlockSizes=4,8\n")
    job = job_in(tmp_path, small_corpus, f"cluster.topology_file={topo}", "resources.spare_nodes=2", *TP_ACROSS_NODES)
    request, notes = node_request(job, LiveCluster(available={"n1", "n2", "n5", "n6", "n7"}))
    assert request.nodelist is None and request.segment == 2 and not request.spares
    assert notes[0].startswith("not enough free nodes now")
    request, _ = node_request(job, LiveCluster(available={"n1", "n2", "n5", "n6", "n7", "n8"}, version=PINS))
    assert request.rank_hosts and set(request.rank_hosts) == {"n5", "n6", "n7", "n8"} and request.spares == ("n1", "n2")


def test_spares_stay_in_the_jobs_block_when_the_nearest_block_would_spread_them_too_far() -> None:
    """Found by hypothesis: the nearest block held one free node, so the nearest-first spill took three blocks."""
    m = model_of([3, 3, 3], (3,))
    available = {"gb003", "gb004", "gb005", "gb006", "gb007", "gb008", "gb009"}
    picked = select_with_spares(m, available, 2, 3)
    check(m, picked, 2, 3)
    job_blocks = {m.block_of[n] for n in picked.selection.nodes}
    assert {m.block_of[n] for n in picked.spares} & job_blocks
