"""Read whichever topology file a cluster has: topology.conf (tree or block) or topology.yaml."""

from air_hpc.topology import topoyaml, treeconf
from air_hpc.topology.blocks import aggregate_fabric
from air_hpc.topology.fabric import Fabric
from air_hpc.topology.treeconf import BlockTopology


def read_topology(text: str, source_name: str) -> Fabric | BlockTopology:
    """The switch tree or block topology the file holds (topology.yaml, by name or content: its cluster default)."""
    if source_name.endswith((".yaml", ".yml")) or topoyaml.looks_like_yaml(text):
        return topoyaml.cluster_default(topoyaml.parse(text, source_name), source_name)
    if treeconf.is_block_text(text):
        return treeconf.parse_block(text, source_name)
    return treeconf.parse(text, source_name)


def read_any(text: str, source_name: str) -> Fabric:
    """Any topology file as a fabric (blocks as leaves under one switch), for display."""
    topology = read_topology(text, source_name)
    return topology.to_fabric() if isinstance(topology, BlockTopology) else topology


def read_nearness(text: str, source_name: str) -> Fabric:
    """Any topology file as a fabric whose switch levels are the scheduler's distances (blocks under their aggregates).

    For choices by nearness, such as which hot spare replaces a failed node.
    """
    topology = read_topology(text, source_name)
    return aggregate_fabric(topology) if isinstance(topology, BlockTopology) else topology
