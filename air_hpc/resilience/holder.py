"""Talking to the node's snapshot holder (:mod:`air_hpc.runtime.snapholder`): its wire format and a client.

Frames both ways are ``u32 length | JSON header | payload``, the header's ``nbytes`` giving the
payload's length. The holder never interprets a payload; the reader checks it
(:func:`air_hpc.resilience.snapshot.decode`).
"""

import json
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


def send_frame(sock: socket.socket, header: dict[str, Any], payload: Sequence[bytes | memoryview] = ()) -> None:
    body = json.dumps({**header, "nbytes": sum(len(p) for p in payload)}).encode()
    sock.sendall(struct.pack("<I", len(body)) + body)
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


def recv_frame(sock: socket.socket) -> tuple[dict[str, Any], bytearray]:
    (length,) = struct.unpack("<I", _recv_exact(sock, 4))
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
        self, header: dict[str, Any], payload: Sequence[bytes | memoryview] = ()
    ) -> tuple[dict[str, Any], bytearray]:
        for attempt in (0, 1):
            sock = self._connect()
            try:
                send_frame(sock, header, payload)
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
        self._ask({"op": "put", "owner": owner, "step": step, "info": info}, parts)

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
