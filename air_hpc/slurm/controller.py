"""Is anyone listening where slurm.conf says the controller is? A TCP probe, before any Slurm command runs.

Slurm's own tools keep retrying a controller that refuses connections (``squeue``
took a minute, ``sbatch`` over 100 s with slurmctld stopped). A refused TCP
connect on every controller address is a definite answer in milliseconds, so
the client fails at once instead. Anything less definite (no readable
slurm.conf, a configless cluster, a name that does not resolve, a connect
that times out) proves nothing: the client then runs the command under its
deadline as usual.
"""

import logging
import socket
from collections.abc import Mapping
from pathlib import Path

from air_hpc.digits import ascii_int

log = logging.getLogger(__name__)

DEFAULT_CONF = Path("/etc/slurm/slurm.conf")
DEFAULT_PORT = 6817


def conf_path(env: Mapping[str, str]) -> Path:
    return Path(env.get("SLURM_CONF") or DEFAULT_CONF)


def controller_addresses(conf_text: str) -> list[tuple[str, int]]:
    """``(address, port)`` of every controller in slurm.conf text: ``SlurmctldHost=name(addr)``, else the name.

    ``SlurmctldPort`` may be a range (``6817-6820``): the controller listens on each.
    """
    hosts: list[str] = []
    ports = [DEFAULT_PORT]
    for raw in conf_text.splitlines():
        line = raw.split("#", 1)[0].strip()
        key, sep, value = line.partition("=")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "slurmctldhost" and value:
            name, _, addr = value.partition("(")
            hosts.append(addr.rstrip(")").strip() or name.strip())
        elif key in ("controladdr", "controlmachine") and value and not hosts:
            hosts.append(value)
        elif key == "slurmctldport":
            first, _, last = value.partition("-")
            low, high = ascii_int(first), ascii_int(last or first)
            if low is not None and high is not None and 0 < low <= high < 65536:
                ports = list(range(low, min(high, low + 15) + 1))
    return [(host, port) for host in hosts if host for port in ports]


def _refuses(address: str, port: int, timeout_s: float) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def refused_everywhere(env: Mapping[str, str], timeout_s: float = 2.0) -> list[tuple[str, int]]:
    """The controller addresses, when every one of them refuses a connection; else ``[]`` (no proof)."""
    path = conf_path(env)
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    addresses = controller_addresses(text)
    if not addresses or not all(_refuses(host, port, timeout_s) for host, port in addresses):
        return []
    log.debug("every controller address in %s refuses connections: %s", path, addresses)
    return addresses


def describe(addresses: list[tuple[str, int]]) -> str:
    return ", ".join(f"{host}:{port}" for host, port in addresses)
