"""The one port picker of every Slurm daemon air-hpc starts on this host (the testbed's, the CLOUD-node controller's).

``bind(0)`` hands out a port from Linux's ephemeral range (32768-60999), where any outgoing
connection of a busy neighbour may take it between our choice and the daemon's own bind. Ports are
drawn below that range instead, and below the span jobs' ``MASTER_PORT`` is drawn from (a daemon
holding a job's rendezvous port would fail that job's rank 0), and held open together while
choosing, so they are distinct.
"""

import random
import socket

from air_hpc.runtime.rendezvous import MASTER_PORT_BASE

#: Below jobs' MASTER_PORT span (20000-31999), itself below Linux's default ephemeral range (32768-60999).
PORT_RANGE = (10000, MASTER_PORT_BASE - 1)


def free_ports(count: int, rng: random.Random | None = None) -> list[int]:
    """Distinct loopback ports that are free now, held open together while choosing."""
    rng = rng or random.Random()
    sockets: list[socket.socket] = []
    try:
        while len(sockets) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", rng.randint(*PORT_RANGE)))
            except OSError:
                s.close()
                continue
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
