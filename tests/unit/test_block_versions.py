"""Version-aware block requests: what each Slurm release accepts, the request made for it, the job's own placement.

The rules come from each release's ``eval_nodes_block.c`` and were checked on real controllers
(25.05.8 refuses a node list beside several segments, 26.05.3 accepts one covering the whole job):
``tests/integration/test_slurm_matrix.py`` submits the requests below to each build.
"""

import os
import sys
from pathlib import Path

import pytest

from air_hpc.config import load_job
from air_hpc.errors import ConfigError, TopologyError
from air_hpc.exitcodes import ExitCode
from air_hpc.records.rundir import RunDir
from air_hpc.runtime.supervisor import Supervisor, load_topology, unpinned_order
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.nodes import out_of_service, parse_scontrol_nodes
from air_hpc.slurm.version import SlurmVersion, block_request_rules
from air_hpc.topology import treeconf
from air_hpc.topology.blocks import BlockModel
from air_hpc.topology.request import place_in_allocation, request_nodes, unpinnable

REPO = Path(__file__).resolve().parents[2]
TESTBED_JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"
BLOCKS = "BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[5-8]\nBlockName=b3 Nodes=n[9-12]\nBlockSizes=4,8,16\n"
TOPOLOGY = treeconf.parse_block(BLOCKS, "topology.conf")
TP_ACROSS_NODES = (
    "resources.nodes=4",
    "resources.tasks_per_node=1",
    "parallel.tp=2",
    "parallel.pp=2",
    "hardware.nvlink_domain_nodes=4",
)


def job_in(tmp_path: Path, small_corpus: Path, *overrides: str):
    topo = tmp_path / "topology.conf"
    topo.write_text(BLOCKS)
    base = [f"run.root={tmp_path / 'runs'}", f"data.path={small_corpus}", f"cluster.topology_file={topo}"]
    return load_job(TESTBED_JOB, [*base, *TP_ACROSS_NODES, *overrides])


@pytest.mark.parametrize(
    ("version", "segments", "pinned"),
    [
        (SlurmVersion(22, 5, 8), False, False),
        (SlurmVersion(23, 11, 10), False, False),
        (SlurmVersion(24, 5, 0), True, False),
        (SlurmVersion(25, 5, 8), True, False),
        (SlurmVersion(25, 11, 0), True, True),
        (SlurmVersion(26, 5, 3), True, True),
        (None, True, False),
    ],
)
def test_each_release_has_its_block_rules(version: SlurmVersion | None, segments: bool, pinned: bool) -> None:
    rules = block_request_rules(version)
    assert (rules.segments, rules.pinned_segments) == (segments, pinned)
    assert rules.wide_segments == pinned, "segments wider than a base block arrived with pinned segments, in 25.11"


def test_a_segment_wider_than_a_base_block_is_left_to_slurm_from_25_11(tmp_path: Path, small_corpus: Path) -> None:
    """8-node segments on 4-node blocks: each spans an aggregate of 2 blocks, which Slurm chooses."""
    job = job_in(tmp_path, small_corpus, "resources.nodes=8", "resources.spare_nodes=8", "placement.segment=8")
    live = {f"n{i}" for i in range(1, 13)} - {"n12"}
    topology = treeconf.parse_block(BLOCKS.replace("n[9-12]", "n[9-12]\nBlockName=b4 Nodes=n[13-16]"), "t.conf")
    request, notes = request_nodes(job, topology, "t.conf", live, ["n11"], version=parse("26.05.3"), out_of_service=[])
    assert (request.nodelist, request.segment, request.exclude) == (None, 8, "n11"), notes
    assert "keeps each segment inside one aggregate of 2 blocks; not pinned: Slurm places the segments" in notes[0]


@pytest.mark.parametrize(
    ("version", "overrides", "message"),
    [
        (
            "25.05.8",
            ["resources.spare_nodes=8"],
            "Slurm 25.05.8 cannot place it (each segment must fit in one base block; Slurm 25.11",
        ),
        (
            "26.05.3",
            ["resources.nodes=12", "train.global_batch_size=12"],
            "placement.segment: --segment=8 does not divide the job's 12 nodes",
        ),
        (
            "26.05.3",
            ["resources.spare_nodes=4"],
            "placement.segment: --segment=8 (every segment, a spare one included, has the same size) must divide the 4",
        ),
    ],
    ids=["25.05-refuses", "not-dividing", "spares-not-whole-segments"],
)
def test_a_wide_segment_slurm_would_refuse_is_refused_naming_the_rule(
    tmp_path: Path, small_corpus: Path, version: str, overrides: list[str], message: str
) -> None:
    job = job_in(tmp_path, small_corpus, "resources.nodes=8", "placement.segment=8", *overrides)
    with pytest.raises(TopologyError) as info:
        request_nodes(job, TOPOLOGY, "topology.conf", None, [], version=parse(version))
    assert message in str(info.value) and info.value.exit_code == ExitCode.USAGE


def test_a_list_beside_several_segments_is_refused_before_25_11_only() -> None:
    model = BlockModel(TOPOLOGY)
    nodes = ("n1", "n2", "n5", "n6")
    refused = unpinnable(model, nodes, 2, block_request_rules(SlurmVersion(25, 5, 8)))
    assert refused is not None and "Slurm 25.05.8 refuses a node list beside --segment=2" in refused
    assert "requires nodes with segment are not supported" in refused
    assert unpinnable(model, nodes, 2, block_request_rules(SlurmVersion(26, 5, 3))) is None
    assert unpinnable(model, nodes, 2, block_request_rules(None)) is not None, "an unknown release is not pinned"


def test_without_segments_a_list_is_pinned_only_inside_a_shared_block() -> None:
    model = BlockModel(TOPOLOGY)
    rules = block_request_rules(SlurmVersion(25, 5, 8))
    assert unpinnable(model, ("n1", "n2", "n3", "n4"), None, rules) is None
    assert unpinnable(model, ("n1", "n2", "n3", "n4", "n5", "n6"), None, rules) is None  # one aggregate of 8
    for crossing in (("n1", "n2", "n5", "n6"), ("n3", "n4", "n9", "n10")):  # 4 nodes: one base block
        refused = unpinnable(model, crossing, None, rules)
        assert refused is not None and "requires nodes that do not have shared block" in refused


@pytest.mark.parametrize(
    ("version", "nodelist", "segment"),
    [("26.05.3", "n[1-6]", 2), ("25.05.8", None, 2), ("23.11.10", "n[1-6]", None)],
    ids=["26.05-pins", "25.05-slurm-places", "23.11-no-segment-option"],
)
def test_the_request_follows_the_release(
    tmp_path: Path, small_corpus: Path, version: str, nodelist: str | None, segment: int | None
) -> None:
    job = job_in(tmp_path, small_corpus, "resources.spare_nodes=2")
    live = {f"n{i}" for i in range(1, 13)} - {"n12"}
    request, notes = request_nodes(
        job, TOPOLOGY, "topology.conf", live, ["n11"], version=parse(version), out_of_service=["n12"]
    )
    assert (request.nodelist, request.segment) == (nodelist, segment), notes
    if nodelist is None:  # Slurm places it: the bad and the drained node are excluded by name
        assert request.exclude == "n[11-12]" and not request.rank_hosts and not request.spares
    else:
        assert request.exclude == "n11" and len(request.rank_hosts) == 4 and len(request.spares) == 2


def parse(version: str) -> SlurmVersion:
    major, minor, micro = (int(part) for part in version.split("."))
    return SlurmVersion(major, minor, micro)


@pytest.mark.parametrize("value", ["25.05", "slurm 25.05.8", "latest", "25.05.8;x"])
def test_a_slurm_version_that_is_no_release_names_the_key(tmp_path: Path, small_corpus: Path, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        job_in(tmp_path, small_corpus, f"cluster.slurm_version={value}")
    assert info.value.exit_code == ExitCode.USAGE
    assert "cluster.slurm_version" in str(info.value) and "expected e.g. 25.05.8" in str(info.value)


@pytest.mark.parametrize(
    ("state", "held"),
    [
        ("IDLE+DRAIN", True),
        ("ALLOCATED+DRAIN", True),
        ("DOWN+NOT_RESPONDING", True),
        ("IDLE+MAINT+RESERVED", True),
        ("drained", True),
        ("down*", True),
        ("MIXED", False),
        ("ALLOCATED", False),
        ("IDLE+CLOUD+POWERED_DOWN", False),
        ("IDLE+CLOUD+POWERED_DOWN+NOT_RESPONDING", False),
        ("IDLE+NOT_RESPONDING", True),
        ("IDLE+DRAIN+POWERED_DOWN+NOT_RESPONDING", True),
        ("idle~", False),
    ],
)
def test_out_of_service_is_drained_or_down_not_busy(state: str, held: bool) -> None:
    assert out_of_service(state) is held


def test_node_states_name_the_out_of_service_nodes() -> None:
    text = (
        "NodeName=n1 State=IDLE\nNodeName=n2 State=ALLOCATED\nNodeName=n3 State=IDLE+DRAIN\nNodeName=n4 State=DOWN*\n"
    )
    assert parse_scontrol_nodes(text).out_of_service == {"n3", "n4"}


def test_the_job_places_ranks_on_the_segments_slurm_chose(tmp_path: Path, small_corpus: Path) -> None:
    job = job_in(tmp_path, small_corpus, "resources.spare_nodes=2")
    allocated = ["n3", "n4", "n5", "n6", "n9", "n10"]  # Slurm's three segments of 2: in b1, b2 and b3
    ranks = place_in_allocation(job, TOPOLOGY, allocated, bad=())
    assert ranks is not None and len(ranks) == 4 and set(ranks) <= set(allocated)
    model = BlockModel(TOPOLOGY)
    for group in range(0, 4, 2):  # ranks 2k, 2k+1 form a TP group: one block each
        assert model.block_of[ranks[group]] == model.block_of[ranks[group + 1]]
    assert set(ranks) == {"n3", "n4", "n5", "n6"}, "b1 and b2 share an aggregate; b3's segment is the spare"
    whole = place_in_allocation(job, TOPOLOGY, ["n3", "n4", "n5", "n6", "n7", "n8"], bad=())
    assert whole is not None and set(whole) == {"n5", "n6", "n7", "n8"}, "the fewest blocks: all of b2"


def test_a_bad_node_in_the_allocation_is_left_to_the_spares(tmp_path: Path, small_corpus: Path) -> None:
    job = job_in(tmp_path, small_corpus, "resources.spare_nodes=2")
    allocated = ["n1", "n2", "n3", "n4", "n5", "n6"]
    ranks = unpinned_order(job, TOPOLOGY, allocated, bad=["n2"])
    assert "n2" not in ranks and len(set(ranks)) == 4
    model = BlockModel(TOPOLOGY)
    assert all(model.block_of[ranks[g]] == model.block_of[ranks[g + 1]] for g in (0, 2))
    # Without a block topology the order is Slurm's, healthy nodes first.
    assert unpinned_order(job, None, allocated, bad=["n2"]) == ("n1", "n3", "n4", "n5")


FAKE_SRUN = """
import os
with open(os.environ["LOG"], "a") as log:
    log.write(" ".join(open(os.environ["SLURM_HOSTFILE"]).read().split()) + "\\n")
"""


def test_the_supervisor_orders_ranks_on_an_unpinned_block_allocation(tmp_path: Path, small_corpus: Path) -> None:
    job = job_in(tmp_path, small_corpus, "resources.spare_nodes=2", "health.preflight=false")
    run_dir = RunDir.of(job)
    run_dir.path.mkdir(parents=True)
    run_dir.write_job(job)
    srun = tmp_path / "srun.py"
    srun.write_text(FAKE_SRUN)
    log = tmp_path / "srun.log"
    environ = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[4-9]", "LOG": str(log)}
    environ.pop("SLURM_HOSTFILE", None)
    fabric, blocks = load_topology(job)
    sup = Supervisor(job, run_dir, [sys.executable, str(srun)], environ, SlurmClient(), fabric, blocks=blocks)
    assert sup.run() == ExitCode.OK
    hosts = log.read_text().split()
    model = BlockModel(TOPOLOGY)
    assert len(hosts) == 4 and {model.block_of[h] for h in hosts} == {1}, "n5-n8 fill b2; n4 and n9 are spares"
