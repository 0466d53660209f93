"""Where rank 0 listens: MASTER_ADDR and MASTER_PORT, the same for the batch script and every executor.

Standard library only: the batch script's helper (``runtime.batch``) and the ranks both import it.

The port is derived from the job id and the start (restart count), so that every rank computes the
same one without asking, two jobs rarely share one, and a start never needs the port a previous
start used (a process left over from it might still hold it). Where the batch script runs on rank
0's node it also checks that the port can be bound, and takes the next one in the span that can,
before it publishes MASTER_PORT to the ranks: a taken port is replaced, not retried into a crash loop.
The in-job supervisor does the same before it restarts a step (:func:`free_port_from`).

The other ranks connect only once rank 0 listens (:func:`wait_for_listener`): torch's store client
backs off for about half a second after a refused connection, so a rank that came a few
milliseconds before rank 0's store cost every start (and every in-job restart) that much.
"""

import contextlib
import errno
import logging
import socket
import time
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
#: :func:`wait_for_listener` tries again after this long, doubling up to :data:`LISTENER_POLL_MAX_S`.
LISTENER_POLL_S = 0.005
#: The longest pause between two tries: what a rank adds at most, and all ranks' tries stay a few per second.
LISTENER_POLL_MAX_S = 0.1


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


def wait_for_listener(
    host: str,
    port: int,
    timeout_s: float,
    connect: Callable[[str, int], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Whether ``host:port`` accepted a connection within ``timeout_s`` (tried with a growing pause).

    A refused or failed try is tried again; after ``timeout_s`` the caller connects anyway and torch's
    own error names what is wrong (a wrong address, a rank 0 that never came).
    """
    connect = connect or _connect_and_close
    deadline = clock() + timeout_s
    pause = LISTENER_POLL_S
    while True:
        try:
            connect(host, port)
            return True
        except OSError:
            if clock() >= deadline:
                return False
        sleep(pause)
        pause = min(pause * 2, LISTENER_POLL_MAX_S)


def _connect_and_close(host: str, port: int) -> None:
    socket.create_connection((host, port), timeout=1.0).close()
