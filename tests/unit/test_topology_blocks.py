"""Slurm's block rules (levels, aggregates, segments) and block-aware selection, against brute force."""

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from air_hpc.errors import TopologyError
from air_hpc.topology import treeconf
from air_hpc.topology.block_select import select_blocks
from air_hpc.topology.blocks import BlockModel, aggregate_level, violation


def model_of(block_nodes: list[int], sizes: tuple[int, ...] = (), prefix: str = "gb") -> BlockModel:
    lines, start = [], 1
    for i, count in enumerate(block_nodes, start=1):
        lines.append(f"BlockName=b{i:02d} Nodes={prefix}[{start:03d}-{start + count - 1:03d}]")
        start += count
    if sizes:
        lines.append("BlockSizes=" + ",".join(map(str, sizes)))
    return BlockModel(treeconf.parse_block("\n".join(lines) + "\n", "b.conf"))


def nvl72(blocks: int = 16) -> BlockModel:
    sizes = tuple(18 << k for k in range((blocks - 1).bit_length() + 1))
    return model_of([18] * blocks, sizes)


def test_levels_follow_blocksizes() -> None:
    m = nvl72()
    assert m.base_size == 18 and m.levels == (0, 1, 2, 3, 4)
    assert m.shape(18).level == 0 and m.shape(19).level == 1 and m.shape(72).level == 2 and m.shape(73).level == 3
    skipping = model_of([18] * 8, (18, 72))
    assert skipping.shape(20).level == 2 and skipping.shape(20).max_lower == 2
    assert skipping.shape(200).level is None
    assert model_of([4] * 4).levels == (0, 1, 2, 3)  # Slurm's default without BlockSizes


@pytest.mark.parametrize("count", [20, 36, 54, 72])
def test_fullest_blocks_anywhere_would_be_refused_but_selection_is_not(count: int) -> None:
    """The issue's case: 16x18 nodes, blocks 1 and 3 fuller than their neighbours."""
    m = nvl72()
    busy = {f"gb{n:03d}" for n in [*range(13, 19), *range(19, 37), *range(55, 73)]}  # b01 12 free, b02/b04 busy
    available = set(m.block_of) - busy
    fullest_anywhere = [f"gb{n:03d}" for n in [*range(1, 13), *range(37, 37 + count - 12)]]  # b01 + b03...
    assert "do not have shared block" in (violation(m, fullest_anywhere) or "")
    sel = select_blocks(m, available, count)
    assert violation(m, sel.nodes) is None
    assert not set(sel.nodes) & busy and len(sel.nodes) == count
    assert sel.aggregate_nodes == 18 << aggregate_level([m.block_of[n] for n in sel.nodes])


def test_nodelist_across_aggregates_is_refused() -> None:
    m = nvl72()
    crossing = [f"gb{n:03d}" for n in range(28, 48)]  # b02 + b03: not one aligned pair
    assert "do not have shared block" in (violation(m, crossing) or "")
    assert violation(m, [f"gb{n:03d}" for n in range(1, 21)]) is None


@pytest.mark.parametrize("segment", [4, 5, 8, 10, 12, 18])
def test_segments_stay_inside_base_blocks(segment: int) -> None:
    m = nvl72()
    available = set(m.block_of) - {f"gb{n:03d}" for n in range(1, 145, 7)}
    count = segment * 6
    sel = select_blocks(m, available, count, segment)
    assert sel.segment == segment and len(sel.segments) == 6
    for seg in sel.segments:
        assert len(seg) == segment and len({m.block_of[n] for n in seg}) == 1
    assert violation(m, sel.nodes, segment) is None
    assert sel.sbatch_options == (f"--nodes={count}", f"--nodelist={sel.nodelist}", f"--segment={segment}")


def test_bad_segments() -> None:
    m = nvl72()
    with pytest.raises(TopologyError, match=r"b\.conf: --segment=20 is larger than the base block size 18"):
        select_blocks(m, set(m.block_of), 40, 20)
    with pytest.raises(TopologyError, match="does not divide"):
        select_blocks(m, set(m.block_of), 30, 4)
    assert select_blocks(m, set(m.block_of), 8, 8).segment is None  # Slurm ignores segment == job size


def test_keeps_whole_blocks_free() -> None:
    m = model_of([4, 4, 4, 4], (4, 8, 16))
    available = set(m.block_of) - {"gb005", "gb006"}  # b02 half free
    sel = select_blocks(m, available, 2)
    assert sel.blocks == ("b02",) and sel.whole_blocks_broken == 0


def test_job_waits_rather_than_moving_up_a_level() -> None:
    """18 nodes must come from one base block: 9 + 9 free in a pair of blocks is not enough for Slurm."""
    m = nvl72(4)
    available = {f"gb{n:03d}" for n in [*range(1, 10), *range(19, 28)]}
    assert select_blocks(m, available, 17, 1).blocks == ("b01", "b02")  # segments of 1 may spread
    with pytest.raises(TopologyError, match="no aggregate of 18 nodes has 18 free nodes"):
        select_blocks(m, available, 18)
    assert violation(m, sorted(available)) is not None


# ------------------------------------------------------------------ property tests against brute force
@st.composite
def small_case(draw: st.DrawFn) -> tuple[BlockModel, set[str], int, int | None]:
    base = draw(st.integers(1, 3))
    count_blocks = draw(st.integers(1, 5))
    extra = draw(st.lists(st.integers(0, 1), min_size=count_blocks, max_size=count_blocks))
    top = (count_blocks - 1).bit_length()
    levels = draw(st.sets(st.integers(1, top + 1), max_size=top + 1)) if top else set()
    sizes = () if draw(st.booleans()) and not levels else tuple(base << k for k in sorted({0, *levels}))
    m = model_of([base, *(base + e for e in extra[1:])], sizes)
    nodes = sorted(m.block_of)
    available = {n for n in nodes if draw(st.booleans())} or {nodes[0]}
    count = draw(st.integers(1, len(available)))
    segment = draw(st.one_of(st.none(), st.integers(1, base)))
    if segment is not None and count % segment:
        segment = None
    return m, available, count, segment


def objective(m: BlockModel, nodes: tuple[str, ...], available: set[str]) -> tuple[int, int, int]:
    used = {m.block_of[n] for n in nodes}
    whole = sum(all(n in available for n in m.topology.blocks[i].nodes) for i in used)
    return aggregate_level(used), len(used), whole


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_case())
def test_selection_is_valid_and_optimal_against_brute_force(case: tuple[BlockModel, set[str], int, int | None]) -> None:
    m, available, count, segment = case
    best = None
    for nodes in itertools.combinations(sorted(available), count):
        if violation(m, nodes, segment) is None:
            key = objective(m, nodes, available)
            best = key if best is None or key < best else best
    try:
        sel = select_blocks(m, available, count, segment)
    except TopologyError:
        assert best is None, f"a valid set exists ({best}) but selection failed"
        return
    assert set(sel.nodes) <= available and len(set(sel.nodes)) == count
    assert violation(m, sel.nodes, segment) is None
    assert objective(m, sel.nodes, available) == best
    for seg in sel.segments:
        assert len({m.block_of[n] for n in seg}) == 1 or sel.segment is None


@settings(max_examples=300, deadline=None)
@given(
    blocks=st.integers(1, 64),
    drained=st.sets(st.integers(0, 64 * 18 - 1), max_size=600),
    count=st.integers(1, 64 * 18),
    segment=st.one_of(st.none(), st.integers(1, 18)),
)
def test_every_selection_on_nvl72_systems_is_valid(
    blocks: int, drained: set[int], count: int, segment: int | None
) -> None:
    m = nvl72(blocks)
    nodes = sorted(m.block_of)
    available = set(nodes) - {nodes[i] for i in drained if i < len(nodes)}
    try:
        sel = select_blocks(m, available, count, segment)
    except TopologyError:
        return
    assert violation(m, sel.nodes, sel.segment) is None
    assert set(sel.nodes) <= available and len(sel.nodes) == count
    if sel.segment is not None:
        assert all(len({m.block_of[n] for n in s}) == 1 for s in sel.segments)
