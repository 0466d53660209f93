"""Synthetic fat trees: the testbed's small tree and the benchmark's big ones.

Node and switch names are stable (``n1..nN``, ``leaf1..``, ``spine1..``,
``core1``) because the testbed writes its topology.conf from
``fat_tree([2, 4, 2])`` and the tests refer to those names.
"""

import random
from collections.abc import Sequence

from air_hpc.errors import TopologyError
from air_hpc.topology.fabric import Fabric, SwitchSpec, build_fabric


def fat_tree(
    leaves: Sequence[int],
    prefix: str = "n",
    *,
    leaves_per_spine: int | None = None,
    spines_per_core: int | None = None,
    source: str = "synthetic",
) -> Fabric:
    """A tree with ``leaves[i]`` nodes on leaf i+1, numbered consecutively from ``{prefix}1``.

    With ``leaves_per_spine=None`` every leaf hangs off ``spine1`` (2 levels; 1 level
    for a single leaf). Otherwise leaves are grouped ``leaves_per_spine`` to a spine;
    more than one spine gets a ``core1`` on top (3 levels), or several cores
    under ``top1`` when ``spines_per_core`` is also given (4 levels).
    """
    if not leaves or any(count < 1 for count in leaves):
        raise TopologyError(f"{source}: leaf sizes must be a non-empty list of positive counts, got {list(leaves)}")
    specs: list[SwitchSpec] = []
    next_node = 1
    leaf_names: list[str] = []
    for i, count in enumerate(leaves, start=1):
        nodes = tuple(f"{prefix}{k}" for k in range(next_node, next_node + count))
        next_node += count
        leaf_names.append(f"leaf{i}")
        specs.append(SwitchSpec(name=f"leaf{i}", nodes=nodes))
    if len(leaves) == 1 and leaves_per_spine is None:
        return build_fabric(specs, source)
    group = leaves_per_spine or len(leaf_names)
    spine_names = _group(specs, leaf_names, group, "spine")
    if len(spine_names) > 1:
        if spines_per_core is None:
            specs.append(SwitchSpec(name="core1", children=tuple(spine_names)))
        else:
            core_names = _group(specs, spine_names, spines_per_core, "core")
            if len(core_names) > 1:
                specs.append(SwitchSpec(name="top1", children=tuple(core_names)))
    return build_fabric(specs, source)


def _group(specs: list[SwitchSpec], children: Sequence[str], size: int, kind: str) -> list[str]:
    if size < 1:
        raise TopologyError(f"synthetic: {kind} fan-out must be >= 1, got {size}")
    names = []
    for k, start in enumerate(range(0, len(children), size), start=1):
        names.append(f"{kind}{k}")
        specs.append(SwitchSpec(name=f"{kind}{k}", children=tuple(children[start : start + size])))
    return names


def random_leaf_sizes(total_nodes: int, smallest: int, largest: int, rng: random.Random) -> list[int]:
    """Leaf sizes drawn from [smallest, largest] that add up to exactly ``total_nodes``."""
    sizes: list[int] = []
    left = total_nodes
    while left > 0:
        size = min(left, rng.randint(smallest, largest))
        sizes.append(size)
        left -= size
    return sizes


def sized_fat_tree(
    total_nodes: int,
    levels: int,
    *,
    seed: int = 0,
    leaf_sizes: tuple[int, int] = (16, 64),
    leaves_per_spine: int = 16,
    prefix: str = "n",
) -> Fabric:
    """A benchmark tree of ``total_nodes`` nodes with 2 or 3 switch levels and uneven leaves."""
    if levels not in (2, 3):
        raise TopologyError(f"synthetic: levels must be 2 or 3, got {levels}")
    sizes = random_leaf_sizes(total_nodes, leaf_sizes[0], leaf_sizes[1], random.Random(seed))
    if levels == 2:
        return fat_tree(sizes, prefix)
    return fat_tree(sizes, prefix, leaves_per_spine=leaves_per_spine)
