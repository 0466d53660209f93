"""One rank's training state as a self-checking byte blob, for in-memory snapshots (``memory_interval_steps``).

A snapshot must be cheap to take after every step and safe to read back from another
process: nothing in it is pickled. The blob is

    MAGIC | u64 header length | header (JSON) | tensor bytes (64-byte aligned) | XXH3-128 of all before it

The digest guards against corruption (a bit flip, a torn copy, a wrong buffer), not against a
forger: only the job's own user reaches the holders (a 0700 socket directory, its owner checked),
and XXH3 hashes at memory speed (~8 GB/s, 7x sha256 with SHA-NI on one core) on a path that
runs after every step and again on every restore.

The header holds the step, the owner rank, the world size and the parallel layout, and the
state as a JSON tree whose tensors are references into the tensor bytes (dtype, shape,
offset). The state is what a persistent checkpoint holds, unsharded and for this rank only:
each model chunk's ``state_dict``, the optimizer's ``state_dict``, the scheduler's, the RNG
streams (:func:`air_hpc.resilience.state.capture_rng`) and the progress counters.

:func:`capture` copies the tensors into one reusable host buffer (the only part on the
training's critical path; from a GPU the copy is asynchronous and :meth:`Capture.seal`
waits for it), :meth:`Capture.seal` hashes it, :func:`decode` checks magic, header and
checksum before any tensor is built, and :func:`restore` loads a decoded snapshot into a
:class:`~air_hpc.resilience.training_state.TrainingState`.
"""

import io
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import xxhash

from air_hpc.config.layout import ParallelLayout
from air_hpc.errors import CheckpointError
from air_hpc.resilience.training_state import TrainingState

MAGIC = b"AIRSNAP2"
FORMAT = 2
DIGEST_BYTES = 16
_ALIGN = 64
_DTYPES = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}


class SnapshotError(CheckpointError):
    """A snapshot that cannot be taken (an unsupported value) or must not be loaded (corrupt, wrong step)."""


@dataclass(frozen=True)
class SnapshotInfo:
    """What a snapshot says about itself; the holder lists these without reading the tensors."""

    owner: int
    step: int
    world: int
    layout: ParallelLayout

    def to_json(self) -> dict[str, Any]:
        layout = self.layout
        return {
            "owner": self.owner,
            "step": self.step,
            "world": self.world,
            "layout": {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "vpp": layout.vpp},
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "SnapshotInfo":
        try:
            return cls(int(doc["owner"]), int(doc["step"]), int(doc["world"]), ParallelLayout(**doc["layout"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"snapshot header: {exc!r}") from exc


# -- the tree -----------------------------------------------------------------------------------
def _encode(value: Any, tensors: list[torch.Tensor], path: str) -> Any:
    """``value`` as JSON with tensors replaced by their index in ``tensors``; anything else is refused."""
    if isinstance(value, torch.Tensor):
        tensors.append(value.detach())
        return {"t": len(tensors) - 1}
    if isinstance(value, bool | int | float | str) or value is None:
        return {"v": value}
    if isinstance(value, Mapping):
        items = []
        for key, item in value.items():
            if not isinstance(key, str | int) or isinstance(key, bool):
                raise SnapshotError(f"snapshot: key {key!r} at {path} is neither a string nor an integer")
            items.append([key, _encode(item, tensors, f"{path}.{key}")])
        return {"d": items}
    if isinstance(value, list | tuple):
        tag = "l" if isinstance(value, list) else "u"
        return {tag: [_encode(item, tensors, f"{path}[{i}]") for i, item in enumerate(value)]}
    if isinstance(value, io.BytesIO | bytes):  # Transformer Engine's _extra_state
        raw = value.getvalue() if isinstance(value, io.BytesIO) else value
        tensors.append(
            torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        )
        return {"io" if isinstance(value, io.BytesIO) else "b": len(tensors) - 1}
    raise SnapshotError(f"snapshot: cannot store {type(value).__name__} at {path} (tensors and plain data only)")


def _decode(node: Any, tensors: list[torch.Tensor]) -> Any:
    if not isinstance(node, dict) or len(node) != 1:
        raise SnapshotError(f"snapshot header: malformed node {str(node)[:80]}")
    ((tag, body),) = node.items()
    if tag == "v":
        return body
    if tag == "t":
        return tensors[int(body)]
    if tag == "d":
        return {key: _decode(item, tensors) for key, item in body}
    if tag in ("l", "u"):
        items = [_decode(item, tensors) for item in body]
        return items if tag == "l" else tuple(items)
    if tag in ("b", "io"):
        raw = tensors[int(body)].numpy().tobytes()
        return raw if tag == "b" else io.BytesIO(raw)
    raise SnapshotError(f"snapshot header: unknown tag {tag!r}")


def state_tree(training: TrainingState, rng: Mapping[str, Any]) -> dict[str, Any]:
    """Everything a resume needs of this rank, as one tree of tensors and plain data."""
    scheduler = training.scheduler
    return {
        "model": [chunk.state_dict() for chunk in training.model_chunks],  # type: ignore[attr-defined]
        "optimizer": training.optimizer.state_dict(),  # type: ignore[attr-defined]
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": dict(rng),
        "progress": dict(training.progress),
    }


# -- capture ------------------------------------------------------------------------------------
class Capture:
    """One snapshot being taken: the header, and the tensors' bytes in a host buffer this capture owns."""

    def __init__(self, info: SnapshotInfo, header: bytes, buffer: torch.Tensor, event: Any) -> None:
        self.info = info
        self.header = header
        self.buffer = buffer
        self._event = event
        self.digest = b""

    @property
    def nbytes(self) -> int:
        return len(self.header) + self.buffer.numel() + DIGEST_BYTES

    def seal(self) -> "Capture":
        """Wait for an asynchronous device copy, then checksum header and data (off the critical path)."""
        if self._event is not None:
            self._event.synchronize()
        digest = xxhash.xxh3_128(self.header)
        digest.update(self.data())
        self.digest = digest.digest()
        return self

    def parts(self) -> tuple[memoryview, memoryview, bytes]:
        """The blob in three parts (header, data, digest), to send without joining them."""
        return memoryview(self.header), self.data(), self.digest

    def data(self) -> memoryview:
        """The tensor bytes, without a copy."""
        array: Any = self.buffer.numpy()
        return memoryview(array)


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def capture(
    info: SnapshotInfo, tree: Mapping[str, Any], reuse: torch.Tensor | None = None, pin: bool = False
) -> Capture:
    """Copy ``tree``'s tensors into one host buffer (``reuse`` when it has the right size) and build the header."""
    tensors: list[torch.Tensor] = []
    encoded = _encode(tree, tensors, "state")
    table: list[dict[str, Any]] = []
    offset = 0
    for tensor in tensors:
        name = str(tensor.dtype).removeprefix("torch.")
        if name not in _DTYPES:
            raise SnapshotError(f"snapshot: tensor dtype {name} is not supported")
        nbytes = tensor.numel() * tensor.element_size()
        table.append({"dtype": name, "shape": list(tensor.shape), "offset": offset, "nbytes": nbytes})
        offset = _aligned(offset + nbytes)
    if reuse is not None and reuse.numel() == offset:
        buffer = reuse
    else:
        buffer = torch.empty(offset, dtype=torch.uint8, pin_memory=pin)
    on_device = False
    for tensor, row in zip(tensors, table, strict=True):
        if row["nbytes"]:
            source = tensor.contiguous().reshape(-1).view(torch.uint8)
            on_device = on_device or source.is_cuda
            buffer[row["offset"] : row["offset"] + row["nbytes"]].copy_(source, non_blocking=source.is_cuda)
    event = None
    if on_device:
        event = torch.cuda.Event()
        event.record()
    doc = {"format": FORMAT, **info.to_json(), "tensors": table, "data_bytes": offset, "tree": encoded}
    body = json.dumps(doc, separators=(",", ":")).encode()
    header = MAGIC + struct.pack("<Q", len(body)) + body
    pad = _aligned(len(header)) - len(header)
    header += b" " * pad  # the data starts aligned in a received blob too
    return Capture(info, header, buffer, event)


# -- read back ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Decoded:
    info: SnapshotInfo
    tree: dict[str, Any]


def decode(blob: bytes | bytearray | memoryview, expect: SnapshotInfo | None = None) -> Decoded:
    """Check magic, checksum and header of ``blob``, then build its tree (tensors copied out of the blob)."""
    view = memoryview(blob)
    if len(view) < len(MAGIC) + 8 + DIGEST_BYTES or bytes(view[: len(MAGIC)]) != MAGIC:
        raise SnapshotError("not a snapshot (bad magic or too short)")
    body_len = struct.unpack("<Q", view[len(MAGIC) : len(MAGIC) + 8])[0]
    if xxhash.xxh3_128(view[:-DIGEST_BYTES]).digest() != bytes(view[-DIGEST_BYTES:]):
        raise SnapshotError("checksum mismatch (XXH3-128 of the snapshot differs from the one it was sealed with)")
    start = len(MAGIC) + 8
    try:
        doc = json.loads(bytes(view[start : start + body_len]))
    except (ValueError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"snapshot header is not JSON ({exc})") from exc
    if doc.get("format") != FORMAT:
        raise SnapshotError(f"snapshot format {doc.get('format')!r}, expected {FORMAT}")
    info = SnapshotInfo.from_json(doc)
    if expect is not None and info != expect:
        raise SnapshotError(f"snapshot is {info}, expected {expect}")
    data_start = _aligned(start + body_len)
    data = view[data_start:-DIGEST_BYTES]
    if len(data) != int(doc["data_bytes"]):
        raise SnapshotError(f"snapshot data is {len(data)} bytes, its header says {doc['data_bytes']}")
    tensors = [_tensor(data, row) for row in doc["tensors"]]
    return Decoded(info, _decode(doc["tree"], tensors))


def _tensor(data: memoryview, row: Mapping[str, Any]) -> torch.Tensor:
    dtype = _DTYPES.get(str(row["dtype"]))
    offset, nbytes = int(row["offset"]), int(row["nbytes"])
    if dtype is None or offset < 0 or offset + nbytes > len(data):
        raise SnapshotError(f"snapshot tensor table entry out of range: {row}")
    shape = [int(n) for n in row["shape"]]
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(bytearray(data[offset : offset + nbytes]), dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


def restore(training: TrainingState, decoded: Decoded, device: torch.device | None = None) -> None:
    """Load a decoded snapshot into this rank's model, optimizer and scheduler, and its RNG streams."""
    from air_hpc.resilience.state import restore_rng

    tree = decoded.tree
    chunks = list(training.model_chunks)
    if len(tree["model"]) != len(chunks):
        raise SnapshotError(f"snapshot has {len(tree['model'])} model chunk(s), this rank builds {len(chunks)}")
    for chunk, state in zip(chunks, tree["model"], strict=True):
        chunk.load_state_dict(state)
    optimizer_state = tree["optimizer"]
    if device is not None:
        optimizer_state = _to_device(optimizer_state, device)
    training.optimizer.load_state_dict(optimizer_state)
    if training.scheduler is not None and tree["scheduler"] is not None:
        training.scheduler.load_state_dict(tree["scheduler"])
    restore_rng(tree["rng"])


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_device(v, device) for v in value)
    return value
