"""Slurm 25.05's topology.yaml (topology.yaml(5)): several named topologies, tree, block or flat.

Read through PyYAML's node tree so every error names the file and line, and
checked by the same rules as topology.conf (:func:`build_fabric`,
:func:`treeconf.block_topology`). Written with every hostlist compressed; the
block topology (when there is one) is the cluster default, since on NVLink
systems it is what jobs should be packed by.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import yaml

from air_hpc.digits import ascii_int
from air_hpc.errors import TopologyError
from air_hpc.slurm import hostlist
from air_hpc.topology.fabric import Fabric, SwitchSpec, build_fabric
from air_hpc.topology.treeconf import Block, BlockTopology, block_topology, check_block_sizes


@dataclass(frozen=True)
class NamedTopology:
    name: str
    cluster_default: bool
    #: None for ``flat: true``
    topology: Fabric | BlockTopology | None


def looks_like_yaml(text: str) -> bool:
    """topology.yaml starts (after comments) with a list item naming a topology."""
    for line in text.splitlines():
        stripped = line.split("#", 1)[0].strip()
        if stripped and stripped != "---":
            return stripped.startswith("- topology:") or stripped.startswith("-topology:")
    return False


def parse(text: str, source: str) -> tuple[NamedTopology, ...]:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise TopologyError(f"{where}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    except RecursionError:
        raise TopologyError(f"{source}: YAML nested too deeply; expected a list of topologies") from None
    if not isinstance(root, yaml.SequenceNode) or not root.value:
        raise TopologyError(f"{source}:1: expected a list of topologies ('- topology: NAME' then tree: or block:)")
    out: list[NamedTopology] = []
    for item in root.value:
        entry = _mapping(item, source, {"topology", "cluster_default", "tree", "block", "flat"})
        name = _scalar(entry.get("topology"), source, item, "topology")
        kinds = [k for k in ("tree", "block", "flat") if k in entry]
        if len(kinds) != 1:
            raise TopologyError(f"{_at(source, item)}: topology {name!r} must define exactly one of tree, block, flat")
        default = _bool(entry.get("cluster_default"), source)
        kind = kinds[0]
        topology: Fabric | BlockTopology | None
        if kind == "tree":
            topology = _tree(entry["tree"], source)
        elif kind == "block":
            topology = _block(entry["block"], source)
        else:
            topology = None
        out.append(NamedTopology(name=name, cluster_default=default, topology=topology))
    names = [t.name for t in out]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise TopologyError(f"{_at(source, root.value[i])}: topology {name!r} defined twice")
    return tuple(out)


def cluster_default(topologies: Sequence[NamedTopology], source: str) -> Fabric | BlockTopology:
    """The first ``cluster_default: true`` topology (else the first one), which jobs without a partition get."""
    chosen = next((t for t in topologies if t.cluster_default), topologies[0])
    if chosen.topology is None:
        raise TopologyError(f"{source}: the default topology {chosen.name!r} is flat; nothing to select from")
    return chosen.topology


def render(tree: Fabric | None, block: BlockTopology | None) -> str:
    """topology.yaml text with a ``tree`` and/or a ``block`` topology (the block one is the cluster default)."""
    items: list[dict[str, object]] = []
    if block is not None:
        body: dict[str, object] = {}
        if block.block_sizes:
            body["block_sizes"] = list(block.block_sizes)
        body["blocks"] = [{"block": b.name, "nodes": hostlist.compress(b.nodes)} for b in block.blocks]
        items.append({"topology": "block", "cluster_default": True, "block": body})
    if tree is not None:
        by_level = sorted(tree.switch_order, key=lambda name: tree.switches[name].level)
        switches = []
        for name in by_level:
            switch = tree.switches[name]
            if switch.is_leaf:
                switches.append({"switch": name, "nodes": hostlist.compress(switch.nodes)})
            else:
                switches.append({"switch": name, "children": hostlist.compress(switch.children)})
        items.append({"topology": "tree", "cluster_default": block is None, "tree": {"switches": switches}})
    if not items:
        raise TopologyError("topology.yaml: nothing to write (neither a tree nor blocks)")
    return "---\n" + yaml.safe_dump(items, sort_keys=False, default_flow_style=False)


def _at(source: str, node: yaml.Node) -> str:
    return f"{source}:{node.start_mark.line + 1}"


def _mapping(node: yaml.Node, source: str, allowed: set[str]) -> dict[str, yaml.Node]:
    if not isinstance(node, yaml.MappingNode):
        raise TopologyError(f"{_at(source, node)}: expected a mapping with keys {sorted(allowed)}")
    out: dict[str, yaml.Node] = {}
    for key_node, value in node.value:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        if not isinstance(key, str) or key not in allowed:
            raise TopologyError(f"{_at(source, key_node)}: unknown key {key!r}; expected one of {sorted(allowed)}")
        if key in out:
            raise TopologyError(f"{_at(source, key_node)}: key {key!r} given twice")
        out[key] = value
    return out


def _scalar(node: yaml.Node | None, source: str, parent: yaml.Node, key: str) -> str:
    if node is None:
        raise TopologyError(f"{_at(source, parent)}: missing {key}:")
    if not isinstance(node, yaml.ScalarNode) or not str(node.value).strip():
        raise TopologyError(f"{_at(source, node)}: {key} must be a non-empty string")
    return str(node.value).strip()


def _bool(node: yaml.Node | None, source: str) -> bool:
    if node is None:
        return False
    value = str(node.value).lower() if isinstance(node, yaml.ScalarNode) else ""
    if value not in {"true", "false", "yes", "no"}:
        raise TopologyError(f"{_at(source, node)}: cluster_default must be true or false")
    return value in {"true", "yes"}


def _sequence(node: yaml.Node, source: str, what: str) -> list[yaml.Node]:
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise TopologyError(f"{_at(source, node)}: {what} must be a non-empty list")
    return list(node.value)


def _tree(node: yaml.Node, source: str) -> Fabric:
    body = _mapping(node, source, {"switches"})
    if "switches" not in body:
        raise TopologyError(f"{_at(source, node)}: tree needs switches:")
    specs = []
    for item in _sequence(body["switches"], source, "switches"):
        entry = _mapping(item, source, {"switch", "children", "nodes"})
        name = _scalar(entry.get("switch"), source, item, "switch")
        where = _at(source, item)
        children = entry.get("children")
        nodes = entry.get("nodes")
        specs.append(
            SwitchSpec(
                name=name,
                children=tuple(hostlist.expand(_scalar(children, source, item, "children"), where))
                if children is not None
                else (),
                nodes=tuple(hostlist.expand(_scalar(nodes, source, item, "nodes"), where)) if nodes is not None else (),
                line=item.start_mark.line + 1,
            )
        )
    return build_fabric(specs, source)


def _block(node: yaml.Node, source: str) -> BlockTopology:
    body = _mapping(node, source, {"block_sizes", "blocks"})
    if "blocks" not in body:
        raise TopologyError(f"{_at(source, node)}: block needs blocks:")
    sizes: tuple[int, ...] = ()
    sizes_line = None
    if "block_sizes" in body:
        size_nodes = _sequence(body["block_sizes"], source, "block_sizes")
        values = [str(n.value) if isinstance(n, yaml.ScalarNode) else "" for n in size_nodes]
        if not all(ascii_int(v) is not None and len(v) < 10 for v in values):
            raise TopologyError(f"{_at(source, body['block_sizes'])}: block_sizes must be a list of node counts")
        sizes = tuple(int(v) for v in values)
        sizes_line = body["block_sizes"].start_mark.line + 1
        check_block_sizes(sizes, f"{source}:{sizes_line}")
    blocks = []
    for item in _sequence(body["blocks"], source, "blocks"):
        entry = _mapping(item, source, {"block", "nodes"})
        name = _scalar(entry.get("block"), source, item, "block")
        nodes = hostlist.expand(_scalar(entry.get("nodes"), source, item, "nodes"), _at(source, item))
        blocks.append(Block(name=name, nodes=tuple(nodes), line=item.start_mark.line + 1))
    return block_topology(blocks, sizes, source, sizes_line)
