"""The network side of the node air-hpc runs on, read from sysfs: interfaces, RDMA ports and their GIDs.

What NCCL will find there decides whether a hardware preset's ``NCCL_SOCKET_IFNAME``,
``NCCL_IB_HCA`` and ``NCCL_IB_GID_INDEX`` work: a preset written for one site names
``bond0`` and ``mlx5_*`` devices another site does not have, and NCCL then falls back to
TCP or fails at the first collective, minutes into the job. ``sys_root`` lets tests read a
recorded tree.
"""

import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_IFF_UP = 0x1
_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


@dataclass(frozen=True)
class Interface:
    name: str
    up: bool


@dataclass(frozen=True)
class Gid:
    index: int
    address: str
    kind: str
    """``RoCE v2``, ``IB/RoCE v1`` or empty where the kernel does not say."""

    @property
    def routable(self) -> bool:
        """A RoCE v2 GID with an address outside fe80::/10: what NCCL_IB_GID_INDEX should name across subnets."""
        return self.kind == "RoCE v2" and self.address != _ZERO_GID and not self.address.startswith("fe80:")


@dataclass(frozen=True)
class RdmaPort:
    device: str
    port: int
    active: bool
    link_layer: str
    """``InfiniBand`` or ``Ethernet`` (RoCE)."""
    gids: tuple[Gid, ...]

    @property
    def roce(self) -> bool:
        return self.link_layer == "Ethernet"


@dataclass(frozen=True)
class NodeNetwork:
    host: str
    interfaces: tuple[Interface, ...]
    ports: tuple[RdmaPort, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def node_label(host: str, on_compute_node: bool) -> str:
    """How a finding names the node it read: a login node may not look like the compute nodes."""
    return host if on_compute_node else f"{host} (where doctor ran; inside an allocation it checks a compute node)"


def _read(path: Path) -> str | None:
    """A sysfs attribute, or None where it is absent or unreadable (empty GID slots raise EINVAL)."""
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _interface(path: Path) -> Interface:
    flags = _read(path / "flags") or "0"
    try:
        administratively_up = bool(int(flags, 16) & _IFF_UP)
    except ValueError:
        administratively_up = False
    # `unknown` is what loopback and some virtual links report while passing traffic.
    return Interface(path.name, administratively_up and _read(path / "operstate") in ("up", "unknown"))


def _gids(port: Path) -> tuple[Gid, ...]:
    gids = []
    for entry in sorted((port / "gids").glob("*"), key=lambda p: int(p.name) if p.name.isdigit() else -1):
        if not entry.name.isdigit():
            continue
        address = _read(entry)
        if address is None or address == _ZERO_GID:
            continue
        kind = _read(port / "gid_attrs" / "types" / entry.name) or ""
        gids.append(Gid(int(entry.name), address, kind))
    return tuple(gids)


def _ports(device: Path) -> list[RdmaPort]:
    ports = []
    for port in sorted((device / "ports").glob("*")):
        if not port.name.isdigit():
            continue
        state = _read(port / "state") or ""
        ports.append(
            RdmaPort(
                device=device.name,
                port=int(port.name),
                active=state.endswith("ACTIVE"),
                link_layer=_read(port / "link_layer") or "InfiniBand",
                gids=_gids(port),
            )
        )
    return ports


def read_node_network(sys_root: Path = Path("/sys"), host: str | None = None) -> NodeNetwork:
    """Interfaces and RDMA ports as the kernel shows them; a node without RDMA has no ports."""
    net = sys_root / "class" / "net"
    interfaces = tuple(_interface(p) for p in sorted(net.glob("*"))) if net.is_dir() else ()
    rdma = sys_root / "class" / "infiniband"
    ports = tuple(port for dev in sorted(rdma.glob("*")) for port in _ports(dev)) if rdma.is_dir() else ()
    return NodeNetwork(host or socket.gethostname(), interfaces, ports)
