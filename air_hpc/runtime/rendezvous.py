"""Where rank 0 listens: MASTER_ADDR and MASTER_PORT, the same for the batch script and every executor.

Standard library only: the batch script's helper (``runtime.batch``) and the ranks both import it.

The port is derived from the job id and the start (restart count), so that every rank computes the
same one without asking, two jobs rarely share one, and a start never needs the port a previous
start used (a process left over from it might still hold it). Where the batch script runs on rank
0's node it also checks that the port can be bound, and takes the next one in the span that can,
before it publishes MASTER_PORT to the ranks: a taken port is replaced, not retried into a crash loop.
The in-job supervisor does the same before it restarts a step (:func:`free_port_from`).
"""

import contextlib
import errno
import logging
import socket
from collections.abc import Callable

log = logging.getLogger(__name__)

#: MASTER_PORT = base + (job id + restart count x stride) modulo span: rarely shared by two jobs, and below
#: Linux's default ephemeral range (32768-60999), where any outgoing connection may hold it.
MASTER_PORT_BASE = 20000
MASTER_PORT_SPAN = 12000
#: A prime near half the span: a restart's port is far from the ports of the neighbouring job ids (jobs
#: submitted about the same time), and a job's restarts go round the whole span before one repeats.
RESTART_STRIDE = 6007

#: How many ports on from the derived one a start tries before it gives up looking.
PORTS_TRIED = 64


def master_port(job_id: int, restart_count: int = 0) -> int:
    """Rank 0's port for this start of the job, as every rank derives it."""
    return MASTER_PORT_BASE + (job_id + restart_count * RESTART_STRIDE) % MASTER_PORT_SPAN


def can_bind(port: int) -> bool:
    """Whether a listener could bind ``port`` on every address here, as the TCPStore's does (SO_REUSEADDR)."""
    families = [socket.AF_INET, *([socket.AF_INET6] if socket.has_ipv6 else [])]
    for family in families:
        with contextlib.ExitStack() as stack:
            try:
                sock = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            except OSError:
                continue  # no IPv6 on this host
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(("", port))
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    return False
                if exc.errno != errno.EADDRNOTAVAIL:  # IPv6 switched off: nothing there to collide with
                    raise
    return True


def free_master_port(job_id: int, restart_count: int, bindable: Callable[[int], bool] = can_bind) -> int:
    """This start's port, or the first one after it in the span that ``bindable`` accepts (run on rank 0's node)."""
    return free_port_from(master_port(job_id, restart_count), bindable)


def free_port_from(first: int, bindable: Callable[[int], bool] = can_bind) -> int:
    """``first``, or the first port after it in the span that ``bindable`` accepts; ``first`` if none of them is."""
    for offset in range(PORTS_TRIED):
        port = MASTER_PORT_BASE + (first - MASTER_PORT_BASE + offset) % MASTER_PORT_SPAN
        if bindable(port):
            if offset:
                log.warning("rendezvous port %d is taken on this node; rank 0 listens on %d instead", first, port)
            return port
    log.warning("ports %d and the %d after it are all taken here; rank 0 tries %d", first, PORTS_TRIED - 1, first)
    return first
