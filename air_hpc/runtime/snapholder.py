"""The per-node snapshot holder: keeps the ranks' in-memory snapshots alive when the ranks die.

The supervisor starts one holder per node of the allocation (``srun --overlap`` with one task,
:mod:`air_hpc.runtime.snapholders`) before the training step and stops it when the job ends,
so a snapshot outlives the training processes of a failed step. Ranks on the node talk to it
over a Unix socket in a directory only the job's user can enter; nothing leaves the node this
way (a rank's copy for its buddy on another node travels through the training's own process
group and is put into the buddy's holder by the buddy).

The holder stores opaque blobs keyed by (owner rank, step) with the small JSON description the
putter gives; it never interprets a blob (the reader checks its checksum, :mod:`snapshot`). It
keeps the newest :data:`KEEP_STEPS` steps of each owner: while the ranks put step ``s+1`` one
by one, step ``s`` stays complete.

Wire format, both ways: ``u32 length | JSON header | payload`` where the header's ``nbytes``
says how long the payload is. Requests: ``put`` (owner, step, info, size; the blob comes as
one sealed memfd passed with the frame, :func:`air_hpc.resilience.holder.sealed_memfd`, which
the holder maps read-only and keeps: one that is not sealed against writes, or is not ``size``
bytes, is refused), ``list``, ``get`` (owner, step; the answer's payload is the blob), ``stats``.
"""

import contextlib
import fcntl
import logging
import mmap
import os
import signal
import socket
import socketserver
import stat
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from air_hpc.resilience.holder import SEALS, recv_frame, send_frame, socket_path

log = logging.getLogger(__name__)

#: Steps kept per owner rank.
KEEP_STEPS = 2


@dataclass
class _Item:
    info: dict[str, Any]
    blob: bytes | bytearray | mmap.mmap


class Store:
    """The held blobs, newest :data:`KEEP_STEPS` steps per owner (thread-safe)."""

    def __init__(self) -> None:
        self._items: dict[tuple[int, int], _Item] = {}
        self._lock = threading.Lock()

    def put(self, owner: int, step: int, info: dict[str, Any], blob: bytes | bytearray | mmap.mmap) -> None:
        with self._lock:
            self._items[(owner, step)] = _Item(info, blob)
            steps = sorted((s for o, s in self._items if o == owner), reverse=True)
            for old in steps[KEEP_STEPS:]:
                del self._items[(owner, old)]

    def get(self, owner: int, step: int) -> _Item | None:
        with self._lock:
            return self._items.get((owner, step))

    def listing(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {**item.info, "owner": o, "step": s, "bytes": len(item.blob)} for (o, s), item in self._items.items()
            ]

    def held_bytes(self) -> int:
        with self._lock:
            return sum(len(item.blob) for item in self._items.values())


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        store: Store = self.server.store  # type: ignore[attr-defined]
        sock: socket.socket = self.request
        with contextlib.suppress(ConnectionError, OSError, ValueError):
            while True:
                fds: list[int] = []
                try:
                    header, _ = recv_frame(sock, fds)
                    self._answer(store, sock, header, fds)
                finally:
                    for fd in fds:
                        os.close(fd)

    @staticmethod
    def _answer(store: Store, sock: socket.socket, header: dict[str, Any], fds: list[int]) -> None:
        op = header.get("op")
        if op == "put":
            try:
                blob = _sealed_blob(fds, int(header["size"]))
            except ValueError as exc:
                send_frame(sock, {"ok": False, "why": str(exc)})
                return
            store.put(int(header["owner"]), int(header["step"]), dict(header.get("info", {})), blob)
            send_frame(sock, {"ok": True})
        elif op == "list":
            send_frame(sock, {"ok": True, "items": store.listing()})
        elif op == "get":
            item = store.get(int(header["owner"]), int(header["step"]))
            if item is None:
                send_frame(sock, {"ok": False, "why": "not held"})
            else:
                send_frame(sock, {"ok": True, "info": item.info}, [memoryview(item.blob)])
        elif op == "stats":
            send_frame(sock, {"ok": True, "held_bytes": store.held_bytes(), "pid": os.getpid()})
        else:
            send_frame(sock, {"ok": False, "why": f"unknown op {op!r}"})


def _sealed_blob(fds: list[int], size: int) -> bytes | mmap.mmap:
    """The put's memfd mapped read-only, once it is sealed against writes and has ``size`` bytes."""
    if len(fds) != 1:
        raise ValueError(f"put needs one memfd with it, got {len(fds)} descriptor(s)")
    (fd,) = fds
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as exc:
        raise ValueError(f"put's descriptor is not a memfd ({exc})") from exc
    if seals & SEALS != SEALS:
        raise ValueError("put's memfd is not sealed against writes; refused")
    actual = os.fstat(fd).st_size
    if actual != size:
        raise ValueError(f"put's memfd is {actual} bytes, the request says {size}")
    if size == 0:
        return b""
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def serve(path: Path) -> None:
    """Hold snapshots at ``path`` until SIGTERM/SIGINT (the socket is removed on the way out)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    for directory, owners in ((path.parent.parent, (0, os.getuid())), (path.parent, (os.getuid(),))):
        info = os.lstat(directory)  # another user's directory on the way could swap the socket for theirs
        if not stat.S_ISDIR(info.st_mode) or info.st_uid not in owners:
            raise SystemExit(f"snapholder: {directory} is not this user's directory; refusing to hold snapshots")
    os.chmod(path.parent, 0o700)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a stale socket of this node from a holder that was killed
    old_umask = os.umask(0o177)
    try:
        server = _Server(str(path), _Handler)
    finally:
        os.umask(old_umask)
    server.store = Store()  # type: ignore[attr-defined]
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    thread = threading.Thread(target=server.serve_forever, name="snapholder", daemon=True)
    thread.start()
    log.info("holding snapshots at %s (pid %d)", path, os.getpid())
    stop.wait()
    server.shutdown()
    server.server_close()
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="air-hpc snapholder: %(message)s", stream=sys.stderr)
    if len(args) != 2:
        print("usage: python -m air_hpc.runtime.snapholder SOCKET_DIR NODE", file=sys.stderr)
        return 2
    serve(socket_path(Path(args[0]), args[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
