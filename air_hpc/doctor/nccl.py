"""Whether a job's NCCL settings name interfaces, HCAs and GIDs a node has, and what to set instead. Pure.

NCCL's own syntax (its environment documentation): ``NCCL_SOCKET_IFNAME`` and ``NCCL_IB_HCA`` are
comma lists matched by prefix, exactly with a leading ``=``, and excluded with a leading ``^``;
an ``NCCL_IB_HCA`` entry may name a port (``mlx5_0:1``). ``NCCL_IB_GID_INDEX`` matters on RoCE
ports only, where it must name a RoCE v2 GID with a routable address.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from air_hpc.doctor.checks import Finding, Severity
from air_hpc.doctor.node import NodeNetwork, RdmaPort, node_label

#: Interfaces that never carry NCCL's bootstrap between nodes.
_VIRTUAL = ("lo", "docker", "virbr", "veth", "ifb", "br-", "cni", "flannel", "cali", "tun", "tap")


@dataclass(frozen=True)
class NameList:
    """One NCCL list variable, parsed."""

    names: tuple[str, ...]
    exact: bool
    exclude: bool

    @classmethod
    def parse(cls, value: str) -> "NameList":
        exclude = value.startswith("^")
        value = value.removeprefix("^")
        exact = value.startswith("=")
        value = value.removeprefix("=")
        return cls(tuple(n.strip() for n in value.split(",") if n.strip()), exact, exclude)

    def matches(self, name: str, pattern: str) -> bool:
        return name == pattern if self.exact else name.startswith(pattern)

    def selects(self, name: str) -> bool:
        hit = any(self.matches(name, p.split(":")[0]) for p in self.names)
        return hit != self.exclude


def nccl_findings(env: Mapping[str, str], node: NodeNetwork, device: str, on_compute_node: bool) -> list[Finding]:
    """What in ``env`` NCCL could not use on ``node``; errors only where ``node`` is a compute node."""
    severity: Severity = "error" if on_compute_node else "warning"
    where = node_label(node.host, on_compute_node)
    return [Finding(severity, key, f"{message} on {where}") for key, message in _problems(env, node, device)]


def _problems(env: Mapping[str, str], node: NodeNetwork, device: str) -> list[tuple[str, str]]:
    problems = []
    if "NCCL_SOCKET_IFNAME" in env:
        problems += _interface_problems(env["NCCL_SOCKET_IFNAME"], node)
    if env.get("NCCL_IB_DISABLE") == "1":
        return problems
    ports = [p for p in node.ports if p.active]
    if "NCCL_IB_HCA" in env:
        wanted = NameList.parse(env["NCCL_IB_HCA"])
        problems += _hca_problems(wanted, node)
        ports = [p for p in ports if wanted.selects(p.device)]
    if "NCCL_IB_GID_INDEX" in env:
        problems += _gid_problems(env["NCCL_IB_GID_INDEX"], [p for p in ports if p.roce])
    if device == "cuda" and not any(p.active for p in node.ports):
        problems.append(("NCCL_IB_HCA", "no active RDMA port: NCCL would carry inter-node traffic over TCP sockets"))
    return problems


def _interface_problems(value: str, node: NodeNetwork) -> list[tuple[str, str]]:
    wanted = NameList.parse(value)
    up = [i.name for i in node.interfaces if i.up]
    if any(wanted.selects(name) for name in up if name != "lo"):
        return []
    return [("NCCL_SOCKET_IFNAME", f"{value!r} selects no interface that is up (up: {', '.join(up) or 'none'})")]


def _hca_problems(wanted: NameList, node: NodeNetwork) -> list[tuple[str, str]]:
    devices = sorted({p.device for p in node.ports})
    have = ", ".join(devices) or "no RDMA devices"
    if wanted.exclude:
        if any(p.active and wanted.selects(p.device) for p in node.ports):
            return []
        return [("NCCL_IB_HCA", f"'^{','.join(wanted.names)}' leaves no active RDMA port ({have})")]
    missing, inactive = [], []
    for entry in wanted.names:
        name, _, port = entry.partition(":")
        matched = [p for p in node.ports if wanted.matches(p.device, name) and (not port or str(p.port) == port)]
        if not matched:
            missing.append(entry)
        elif not any(p.active for p in matched):
            inactive.append(entry)
    problems = []
    if missing:
        problems.append(("NCCL_IB_HCA", f"names {', '.join(missing)}, which this node does not have ({have})"))
    if inactive:
        problems.append(("NCCL_IB_HCA", f"names {', '.join(inactive)}, which has no ACTIVE port"))
    return problems


def _gid_problems(value: str, roce_ports: list[RdmaPort]) -> list[tuple[str, str]]:
    if not value.isdigit():
        return [("NCCL_IB_GID_INDEX", f"{value!r} is not a GID index (a non-negative integer)")]
    index = int(value)
    wrong = []
    for port in roce_ports:
        gid = next((g for g in port.gids if g.index == index), None)
        if gid is None or not gid.routable:
            better = [g.index for g in port.gids if g.routable]
            hint = f"; routable RoCE v2 GIDs there: {', '.join(map(str, better))}" if better else ""
            what = "is empty" if gid is None else f"is {gid.kind or 'of unknown type'} {gid.address}"
            wrong.append(f"{port.device}:{port.port} GID {index} {what}{hint}")
    return [("NCCL_IB_GID_INDEX", w) for w in wrong]


def suggested_nccl_env(node: NodeNetwork) -> dict[str, str]:
    """Interfaces that are up (virtual ones left out), active RDMA devices, a GID index routable on every RoCE port."""
    env: dict[str, str] = {}
    physical = [i.name for i in node.interfaces if i.up and not i.name.startswith(_VIRTUAL)]
    if physical:
        env["NCCL_SOCKET_IFNAME"] = "=" + ",".join(physical)
    active = [p for p in node.ports if p.active]
    if active:
        env["NCCL_IB_HCA"] = "=" + ",".join(sorted({p.device for p in active}))
    roce = [p for p in active if p.roce]
    if roce:
        common = set.intersection(*({g.index for g in p.gids if g.routable} for p in roce))
        if common:
            env["NCCL_IB_GID_INDEX"] = str(min(common))
    return env
