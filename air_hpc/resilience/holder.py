"""Talking to the node's snapshot holder (:mod:`air_hpc.runtime.snapholder`): its wire format and a client.

Frames both ways are ``u32 length | JSON header | payload``, the header's ``nbytes`` giving the
payload's length. The holder never interprets a payload; the reader checks it
(:func:`air_hpc.resilience.snapshot.decode`).

A ``put`` does not stream the blob through the socket: the rank writes it once into a memfd,
seals the memfd against any further write, shrink or grow (``F_ADD_SEALS``), and passes the
descriptor with the frame (``SCM_RIGHTS``); the holder maps it read-only and keeps the mapping,
which keeps the memory alive after the rank is gone. That is one copy of a snapshot instead of
three (the socket's two and the holder's zeroed buffer), and no work for the holder's process.
"""

import fcntl
import json
import mmap
import os
import socket
import struct
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: The largest header a peer may send (a header is a few hundred bytes).
MAX_HEADER_BYTES = 1 << 20
#: The environment variable that names the holders' socket directory (set by the supervisor for the ranks).
SOCKET_DIR_ENV = "AIR_HPC_SNAPSHOT_DIR"


def socket_path(directory: Path, node: str) -> Path:
    """The holder socket of ``node`` (one directory per job start, one socket per node)."""
    return directory / f"{node}.sock"


#: The seals a blob's memfd carries: nobody, its writer included, can change it once it is put.
SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


def send_frame(
    sock: socket.socket,
    header: dict[str, Any],
    payload: Sequence[bytes | memoryview] = (),
    fds: Sequence[int] = (),
) -> None:
    """One frame; ``fds`` travel with its first bytes (``SCM_RIGHTS``)."""
    body = json.dumps({**header, "nbytes": sum(len(p) for p in payload)}).encode()
    head = struct.pack("<I", len(body)) + body
    sent = socket.send_fds(sock, [head], list(fds)) if fds else 0
    sock.sendall(head[sent:])
    for part in payload:
        sock.sendall(part)


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 24))
        if k == 0:
            raise ConnectionError(f"peer closed after {got} of {n} bytes")
        got += k
    return buf


def recv_frame(sock: socket.socket, fds: list[int] | None = None) -> tuple[dict[str, Any], bytearray]:
    """One frame; with ``fds``, descriptors that came with it are appended there (the caller closes them)."""
    if fds is None:
        prefix = _recv_exact(sock, 4)
    else:
        first, got, _, _ = socket.recv_fds(sock, 4, maxfds=4)
        fds.extend(got)
        if not first:
            raise ConnectionError("peer closed")
        prefix = bytearray(first) + _recv_exact(sock, 4 - len(first))
    (length,) = struct.unpack("<I", prefix)
    if length > MAX_HEADER_BYTES:
        raise ConnectionError(f"header of {length} bytes refused")
    header = json.loads(bytes(_recv_exact(sock, length)))
    if not isinstance(header, dict):
        raise ConnectionError("header is not a JSON object")
    return header, _recv_exact(sock, int(header.get("nbytes", 0)))


class HolderError(OSError):
    """The holder did not answer, or refused."""


class HolderClient:
    """One rank's connection to its node's holder; reconnects once after a broken connection.

    The first connection waits up to ``connect_timeout_s`` (the supervisor starts the holder beside the
    ranks); once connected, a holder that went away fails at once instead of stalling every snapshot.
    """

    def __init__(self, path: Path, connect_timeout_s: float = 10.0) -> None:
        self.path = path
        self.connect_timeout_s = connect_timeout_s
        self._sock: socket.socket | None = None
        self._connected_once = False

    def _connect(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        deadline = time.monotonic() + (0.0 if self._connected_once else self.connect_timeout_s)
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(self.path))
            except OSError as exc:
                sock.close()
                if time.monotonic() > deadline:
                    raise HolderError(f"snapshot holder {self.path}: {exc}") from exc
                time.sleep(0.1)
                continue
            owner = os.stat(self.path).st_uid
            if owner != os.getuid():
                sock.close()
                raise HolderError(f"snapshot holder {self.path}: owned by uid {owner}, not this user; not used")
            self._sock = sock
            self._connected_once = True
            return sock

    def _ask(
        self, header: dict[str, Any], payload: Sequence[bytes | memoryview] = (), fds: Sequence[int] = ()
    ) -> tuple[dict[str, Any], bytearray]:
        for attempt in (0, 1):
            sock = self._connect()
            try:
                send_frame(sock, header, payload, fds)
                answer, data = recv_frame(sock)
            except (OSError, ValueError) as exc:
                self.close()
                if attempt:
                    raise HolderError(f"snapshot holder {self.path}: {exc}") from exc
                continue
            if not answer.get("ok"):
                raise HolderError(f"snapshot holder {self.path}: {answer.get('why', 'refused')}")
            return answer, data
        raise AssertionError("unreachable")

    def put(self, owner: int, step: int, info: dict[str, Any], parts: Sequence[bytes | memoryview]) -> None:
        """Hand the blob ``parts`` joined to the holder, as a sealed memfd (one copy, none through the socket)."""
        fd, size = sealed_memfd(parts)
        self.put_memfd(owner, step, info, fd, size)

    def put_memfd(self, owner: int, step: int, info: dict[str, Any], fd: int, size: int) -> None:
        """Hand a sealed memfd of ``size`` bytes to the holder (closed here, put or not)."""
        try:
            self._ask({"op": "put", "owner": owner, "step": step, "info": info, "size": size}, fds=[fd])
        finally:
            os.close(fd)

    def listing(self) -> list[dict[str, Any]]:
        return list(self._ask({"op": "list"})[0]["items"])

    def get(self, owner: int, step: int) -> bytearray:
        return self._ask({"op": "get", "owner": owner, "step": step})[1]

    def held_bytes(self) -> int:
        return int(self._ask({"op": "stats"})[0]["held_bytes"])

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _memfd() -> int:
    try:
        return os.memfd_create("air-hpc-snapshot", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError as exc:
        raise HolderError(f"memfd_create: {exc}") from exc


def sealed_memfd(parts: Sequence[bytes | memoryview]) -> tuple[int, int]:
    """A new memfd holding ``parts`` one after the other, sealed (:data:`SEALS`); returns it and its size."""
    fd = _memfd()
    try:
        offset = 0
        for part in parts:
            view = memoryview(part).cast("B")
            while view:
                written = os.pwrite(fd, view[: 1 << 30], offset)
                offset += written
                view = view[written:]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    except OSError as exc:
        os.close(fd)
        raise HolderError(f"snapshot memfd: {exc}") from exc
    return fd, offset


class BlobWriter:
    """A memfd of ``size`` bytes mapped writable, to receive a blob in place (a buddy's copy from gloo).

    :meth:`seal` unmaps it (every view of :attr:`map` must be gone by then) and seals it for
    :meth:`HolderClient.put_memfd`: the received bytes go to the holder without another copy.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.fd = _memfd()
        try:
            os.ftruncate(self.fd, size)
            self.map = mmap.mmap(self.fd, size) if size else None
        except OSError as exc:
            os.close(self.fd)
            raise HolderError(f"snapshot memfd of {size} bytes: {exc}") from exc

    def seal(self) -> int:
        """The sealed descriptor (the caller owns it); the mapping is closed."""
        if self.map is not None:
            self.map.close()
            self.map = None
        try:
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, SEALS)
        except OSError as exc:
            self.close()
            raise HolderError(f"snapshot memfd: {exc}") from exc
        return self.fd

    def close(self) -> None:
        """Drop it unsent."""
        if self.map is not None:
            self.map.close()
            self.map = None
        os.close(self.fd)
