"""The fabric model every importer produces and every consumer reads.

A fabric is a forest of switches. Leaf switches (level 0) hold compute nodes;
every other switch holds switches one level down. Each switch has at most one
parent and each node sits under exactly one leaf, which is what Slurm's
topology/tree plugin assumes. :func:`build_fabric` checks all of that once, so
selection and placement can trust the value.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from air_hpc.errors import TopologyError


@dataclass(frozen=True)
class Switch:
    name: str
    level: int
    parent: str | None
    #: child switches (empty for a leaf)
    children: tuple[str, ...] = ()
    #: compute nodes (leaves only), in the order the source lists them
    nodes: tuple[str, ...] = ()
    #: free text written above the switch in topology.conf (e.g. which rail leaves were grouped)
    comment: str = ""

    @property
    def is_leaf(self) -> bool:
        return self.level == 0


@dataclass(frozen=True)
class SwitchSpec:
    """One switch as a source describes it, before levels and parents are known."""

    name: str
    children: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    comment: str = ""
    #: line in the source file, for error messages
    line: int | None = None


@dataclass(frozen=True)
class Fabric:
    """A checked forest of switches; build it with :func:`build_fabric`."""

    #: every switch by name, in source order
    switches: Mapping[str, Switch]
    #: where the fabric came from (a file name), for messages
    source: str = ""
    #: leaf switch of every compute node
    leaf_of: Mapping[str, str] = field(default_factory=dict)

    @cached_property
    def height(self) -> int:
        """Number of switch levels (1 for a single leaf, 2 for leaves under spines, ...)."""
        return 1 + max((s.level for s in self.switches.values()), default=-1)

    @cached_property
    def roots(self) -> tuple[str, ...]:
        return tuple(name for name, s in self.switches.items() if s.parent is None)

    @cached_property
    def leaves(self) -> tuple[str, ...]:
        """Leaf switches in switch order (depth-first from the roots, children in source order)."""
        return tuple(name for name in self.switch_order if self.switches[name].is_leaf)

    @cached_property
    def switch_order(self) -> tuple[str, ...]:
        """All switches depth-first from the roots; neighbours in this order share a parent."""
        out: list[str] = []
        stack = list(reversed(self.roots))
        while stack:
            name = stack.pop()
            out.append(name)
            stack.extend(reversed(self.switches[name].children))
        return tuple(out)

    @cached_property
    def nodes(self) -> tuple[str, ...]:
        """Every compute node in switch order: nodes that share a leaf (then a spine) are adjacent."""
        return tuple(node for leaf in self.leaves for node in self.switches[leaf].nodes)

    @cached_property
    def node_index(self) -> Mapping[str, int]:
        return MappingProxyType({node: i for i, node in enumerate(self.nodes)})

    def ancestors(self, switch: str) -> tuple[str, ...]:
        """The switch itself and every switch above it, bottom-up."""
        chain = [switch]
        parent = self.switches[switch].parent
        while parent is not None:
            chain.append(parent)
            parent = self.switches[parent].parent
        return tuple(chain)

    def path_of(self, node: str) -> tuple[str, ...]:
        """Switches from the node's leaf up to its root."""
        try:
            return self.ancestors(self.leaf_of[node])
        except KeyError:
            raise TopologyError(f"{self.source or 'fabric'}: node {node!r} is not under any leaf switch") from None

    @cached_property
    def leaves_under(self) -> Mapping[str, tuple[str, ...]]:
        """Leaf switches below every switch, in switch order."""
        below: dict[str, list[str]] = {name: [] for name in self.switches}
        for leaf in self.leaves:
            for sw in self.ancestors(leaf):
                below[sw].append(leaf)
        return MappingProxyType({name: tuple(leaves) for name, leaves in below.items()})

    def common_level(self, a: str, b: str) -> int:
        """Level of the lowest switch joining nodes a and b: -1 for the same node, ``height`` if none does."""
        if a == b:
            return -1
        path_a = self.path_of(a)
        path_b = set(self.path_of(b))
        for sw in path_a:
            if sw in path_b:
                return self.switches[sw].level
        return self.height


def _where(source: str, spec: SwitchSpec) -> str:
    return f"{source}:{spec.line}" if spec.line is not None else source


def build_fabric(specs: Sequence[SwitchSpec], source: str = "fabric") -> Fabric:
    """Check the specs form a forest with nodes only on leaves, and compute levels and parents."""
    if not specs:
        raise TopologyError(f"{source}: no switches defined; expected lines like 'SwitchName=leaf1 Nodes=n[1-4]'")
    by_name: dict[str, SwitchSpec] = {}
    for spec in specs:
        if spec.name in by_name:
            first = by_name[spec.name]
            raise TopologyError(
                f"{_where(source, spec)}: switch {spec.name!r} defined twice (first at line {first.line})"
            )
        if spec.children and spec.nodes:
            raise TopologyError(
                f"{_where(source, spec)}: switch {spec.name!r} lists both Switches= and Nodes=; "
                "a switch holds either nodes (leaf) or switches"
            )
        if not spec.children and not spec.nodes:
            raise TopologyError(f"{_where(source, spec)}: switch {spec.name!r} has neither Switches= nor Nodes=")
        by_name[spec.name] = spec

    parent: dict[str, str] = {}
    for spec in specs:
        for child in spec.children:
            if child not in by_name:
                raise TopologyError(f"{_where(source, spec)}: switch {spec.name!r} lists unknown switch {child!r}")
            if child == spec.name:
                raise TopologyError(f"{_where(source, spec)}: switch {spec.name!r} lists itself (a cycle)")
            if child in parent:
                raise TopologyError(
                    f"{_where(source, spec)}: switch {child!r} is under both {parent[child]!r} and {spec.name!r}; "
                    "each switch needs exactly one parent"
                )
            parent[child] = spec.name

    leaf_of: dict[str, str] = {}
    for spec in specs:
        for node in spec.nodes:
            if node in leaf_of:
                raise TopologyError(
                    f"{_where(source, spec)}: node {node!r} is under both {leaf_of[node]!r} and {spec.name!r}; "
                    "Slurm needs each node under exactly one leaf switch"
                )
            leaf_of[node] = spec.name

    levels = _levels(by_name, parent, source)
    switches = {
        spec.name: Switch(
            name=spec.name,
            level=levels[spec.name],
            parent=parent.get(spec.name),
            children=spec.children,
            nodes=spec.nodes,
            comment=spec.comment,
        )
        for spec in specs
    }
    return Fabric(switches=MappingProxyType(switches), source=source, leaf_of=MappingProxyType(leaf_of))


def _levels(by_name: Mapping[str, SwitchSpec], parent: Mapping[str, str], source: str) -> dict[str, int]:
    """Level = longest path down to a leaf (trees may be unbalanced); a walk up from each switch finds cycles."""
    for name in by_name:
        seen = {name}
        up = parent.get(name)
        while up is not None:
            if up in seen:
                spec = by_name[up]
                raise TopologyError(f"{_where(source, spec)}: switches form a cycle through {up!r}")
            seen.add(up)
            up = parent.get(up)
    levels: dict[str, int] = {}
    for name in _bottom_up(by_name):
        children = by_name[name].children
        levels[name] = 1 + max(levels[c] for c in children) if children else 0
    return levels


def _bottom_up(by_name: Mapping[str, SwitchSpec]) -> Iterable[str]:
    """Switches ordered so that every child comes before its parent (the graph is known to be acyclic)."""
    done: set[str] = set()
    order: list[str] = []
    for root in by_name:
        if root in done:
            continue
        stack: list[tuple[str, bool]] = [(root, False)]
        while stack:
            name, expanded = stack.pop()
            if name in done:
                continue
            if expanded:
                done.add(name)
                order.append(name)
                continue
            stack.append((name, True))
            stack.extend((c, False) for c in by_name[name].children if c not in done)
    return order
