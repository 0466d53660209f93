"""Parse ``ibstat`` text into typed ports: which InfiniBand links are up, and how fast.

``ibstat`` (infiniband-diags) prints one ``CA 'name'`` block per adapter and a
``Port N:`` block per port, with ``State`` (Down / Initializing / Armed /
Active), ``Physical state`` (Disabled / Polling / LinkUp / ...), ``Rate`` in
Gb/s and ``Link layer`` (InfiniBand or Ethernet for RoCE). A port carries
traffic only when it is Active and LinkUp; a port stuck in Initializing has a
physical link but no subnet manager configured it.
"""

import re
from dataclasses import dataclass

from air_hpc.errors import InputError

_CA = re.compile(r"^CA '(?P<name>[^']+)'\s*$")
_PORT = re.compile(r"^Port (?P<number>[0-9]+):\s*$")
_FIELD = re.compile(r"^(?P<key>[A-Za-z][A-Za-z ]*?):\s*(?P<value>.*)$")
_NUMBER = re.compile(r"^[0-9]+(\.[0-9]+)?")


@dataclass(frozen=True)
class IbPort:
    ca: str
    port: int
    state: str
    physical_state: str
    rate_gbps: float
    link_layer: str

    @property
    def name(self) -> str:
        """``mlx5_0:1``, the form NCCL_IB_HCA accepts."""
        return f"{self.ca}:{self.port}"

    @property
    def up(self) -> bool:
        return self.state == "Active" and self.physical_state == "LinkUp"

    @property
    def describe(self) -> str:
        return f"{self.name} {self.state}/{self.physical_state} {self.rate_gbps:g} Gb/s {self.link_layer}"


def parse_ibstat(text: str, source: str = "ibstat") -> tuple[IbPort, ...]:
    """Every port of every adapter in ``text``; raises InputError naming the line when a block is malformed."""
    ports: list[IbPort] = []
    ca: str | None = None
    port: int | None = None
    port_line = 0
    fields: dict[str, str] = {}

    def close_port() -> None:
        if ca is None or port is None:
            return
        missing = [key for key in ("State", "Physical state", "Rate") if key not in fields]
        if missing:
            raise InputError(f"{source}:{port_line}: port {ca}:{port} has no {', '.join(missing)}")
        rate = _NUMBER.match(fields["Rate"])
        if rate is None:
            raise InputError(f"{source}:{port_line}: port {ca}:{port} rate {fields['Rate']!r} is not a number")
        ports.append(
            IbPort(
                ca=ca,
                port=port,
                state=fields["State"],
                physical_state=fields["Physical state"],
                rate_gbps=float(rate.group()),
                link_layer=fields.get("Link layer", "InfiniBand"),
            )
        )

    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if match := _CA.match(line):
            close_port()
            ca, port, fields = match["name"], None, {}
        elif match := _PORT.match(line):
            if ca is None:
                raise InputError(f"{source}:{number}: 'Port' before any 'CA' line")
            close_port()
            port, port_line, fields = int(match["number"]), number, {}
        elif port is not None and (match := _FIELD.match(line)):
            fields[match["key"]] = match["value"].strip()
    close_port()
    return tuple(ports)


def select_ports(ports: tuple[IbPort, ...], hcas: tuple[str, ...]) -> tuple[IbPort, ...]:
    """The ports named by ``hcas`` entries (``mlx5_0`` means all its ports, ``mlx5_0:1`` one port)."""
    wanted = []
    for port in ports:
        if any(hca in (port.ca, port.name) for hca in hcas):
            wanted.append(port)
    return tuple(wanted)
