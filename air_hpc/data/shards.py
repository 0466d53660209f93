"""Token shards on disk: find them (file, directory, glob), describe them, read tokens from them.

Two formats: air-hpc's HDF5 token files (:mod:`air_hpc.data.hdf5`) and Megatron's
indexed ``.bin``/``.idx`` pair, whose index is read by megatron-core's own
``IndexedDataset``. Either way a shard is a flat run of tokens at a known byte
offset of one file, read through a memory map after an ``fstat`` of the file: a
shard truncated or removed under a running job is an error naming the file
(a map read past a truncated end would kill the process with SIGBUS). Files are
opened lazily through a :class:`FilePool` that keeps at most ``max_open`` of them
open per process (least recently used closed first).
"""

import glob
import json
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import h5py
import numpy as np

from air_hpc.data import hdf5
from air_hpc.errors import InputError

log = logging.getLogger(__name__)

HDF5_SUFFIXES = (".h5", ".hdf5")
INDEXED_SUFFIXES = (".bin", ".idx")
_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class ShardInfo:
    """One shard: where its tokens lie and what made them (None where the format does not say)."""

    path: Path
    kind: Literal["hdf5", "indexed"]
    tokens: int
    documents: int
    tokenizer: str | None
    vocab_size: int | None
    eod_id: int | None
    dtype: str
    offset: int | None  # byte offset of the first token in ``path``; None: chunked HDF5, read through h5py

    @property
    def end_bytes(self) -> int:
        """The file size the shard needs (0 where h5py reads it)."""
        return 0 if self.offset is None else self.offset + self.tokens * np.dtype(self.dtype).itemsize


def is_glob(spec: Path) -> bool:
    return any(c in _GLOB_CHARS for c in str(spec))


def expand(spec: Path, key: str) -> list[Path]:
    """The shards ``spec`` names, in a fixed order: HDF5 files and indexed prefixes (``x`` for ``x.bin``/``x.idx``)."""
    if is_glob(spec):
        found = [Path(p) for p in sorted(glob.glob(str(spec)))]
        shards = _shards_among(found)
        if not shards:
            raise InputError(f"{key}: {spec} matches no HDF5 (.h5, .hdf5) or Megatron (.bin/.idx) shard")
        return shards
    if spec.is_dir():
        shards = _shards_among(sorted(p for p in spec.iterdir() if p.is_file()))
        if not shards:
            raise InputError(f"{key}: directory {spec} holds no HDF5 (.h5, .hdf5) or Megatron (.bin/.idx) shard")
        return shards
    return [spec.with_suffix("") if spec.suffix in INDEXED_SUFFIXES else spec]


def _shards_among(paths: list[Path]) -> list[Path]:
    shards: list[Path] = []
    for path in paths:
        if path.suffix in HDF5_SUFFIXES:
            shards.append(path)
        elif path.suffix == ".idx":
            shards.append(path.with_suffix(""))
    return shards


def kind_of(shard: Path) -> Literal["hdf5", "indexed"]:
    return "indexed" if shard.suffix not in HDF5_SUFFIXES and Path(f"{shard}.idx").exists() else "hdf5"


def describe(shard: Path) -> ShardInfo:
    """Open a shard's header or index and check it; an :class:`InputError` names the file and the problem."""
    if kind_of(shard) == "indexed":
        return _describe_indexed(shard)
    info = hdf5.inspect(shard)
    offset = None
    if info.contiguous:
        with h5py.File(shard, "r") as fh:
            tokens = fh["tokens"]
            offset = tokens.id.get_offset() if tokens.compression is None else None
    return ShardInfo(
        shard, "hdf5", info.tokens, info.documents, info.tokenizer, info.vocab_size, info.eod_id, info.dtype, offset
    )


def sidecar(prefix: Path) -> Path:
    """``PREFIX.json``: tokenizer, vocab_size and eod_id of an indexed corpus (the .idx has no room for them)."""
    return Path(f"{prefix}.json")


def _describe_indexed(prefix: Path) -> ShardInfo:
    bin_path = Path(f"{prefix}.bin")
    if not bin_path.is_file():
        raise InputError(f"{prefix}.idx: no {bin_path.name} beside it (a Megatron corpus is a .bin/.idx pair)")
    index = read_index(prefix)
    lengths = index.sequence_lengths.astype(np.int64)
    pointers = index.sequence_pointers
    itemsize = np.dtype(index.dtype).itemsize
    expected = np.concatenate([[0], np.cumsum(lengths[:-1] * itemsize)]) if len(lengths) else lengths
    if not np.array_equal(pointers, expected):
        raise InputError(
            f"{prefix}.idx: sequences are not stored back to back in {bin_path.name}; rewrite it with "
            "megatron-core's IndexedDatasetBuilder"
        )
    tokens = int(lengths.sum())
    size = bin_path.stat().st_size
    if size < tokens * itemsize:
        raise InputError(f"{bin_path}: {size} bytes, its index needs {tokens * itemsize}: truncated")
    meta = _read_sidecar(prefix)
    return ShardInfo(
        path=bin_path,
        kind="indexed",
        tokens=tokens,
        documents=len(index.document_indices) - 1,
        tokenizer=meta.get("tokenizer"),
        vocab_size=meta.get("vocab_size"),
        eod_id=meta.get("eod_id"),
        dtype=str(np.dtype(index.dtype)),
        offset=0,
    )


def read_index(prefix: Path) -> Any:
    """megatron-core's reader of ``PREFIX.idx`` (its IndexedDataset), its assertions turned into one line."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset  # torch: only for indexed corpora

    if not Path(f"{prefix}.idx").is_file():
        raise InputError(f"{prefix}.idx: no such Megatron index")
    try:
        return IndexedDataset(str(prefix), mmap=True).index
    except (AssertionError, OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{prefix}.idx: not a Megatron indexed dataset: {exc or type(exc).__name__}") from None


def _read_sidecar(prefix: Path) -> dict[str, Any]:
    path = sidecar(prefix)
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    if not isinstance(meta, dict):
        raise InputError(f"{path}: expected an object with tokenizer, vocab_size and eod_id")
    bad = [k for k in ("vocab_size", "eod_id") if k in meta and not isinstance(meta[k], int)]
    if bad or ("tokenizer" in meta and not isinstance(meta["tokenizer"], str)):
        raise InputError(f"{path}: tokenizer must be a string, vocab_size and eod_id whole numbers")
    return meta


class _Open:
    """One open shard file: a memory map of its tokens checked with ``fstat`` before each read, or an h5py
    dataset for chunked HDF5."""

    def __init__(self, info: ShardInfo) -> None:
        self.info = info
        self.h5: h5py.File | None = None
        self.tokens: np.ndarray[Any, Any] | None = None
        self.fd = -1
        try:
            if info.offset is None:
                self.h5 = h5py.File(info.path, "r")
            else:
                self.fd = os.open(info.path, os.O_RDONLY | os.O_CLOEXEC)
                self.check()
                self.tokens = np.memmap(
                    info.path, dtype=np.dtype(info.dtype), mode="r", offset=info.offset, shape=(info.tokens,)
                )
        except FileNotFoundError:
            self.close()
            raise InputError(f"{info.path}: shard disappeared during the run (no such file now)") from None
        except OSError as exc:
            self.close()
            raise InputError(f"{info.path}: cannot open shard: {exc}") from None

    def check(self) -> None:
        """The file is still there and holds every token its header promised.

        Checked before every read: a memory map of a file truncated under it would end the
        process with SIGBUS, and one of a file removed under it would read on, from a corpus
        nobody can see any more.
        """
        st = os.fstat(self.fd)
        if st.st_nlink == 0:
            raise InputError(f"{self.info.path}: shard removed during the run")
        if st.st_size < self.info.end_bytes:
            raise InputError(
                f"{self.info.path}: shard truncated during the run: {st.st_size} bytes, needs {self.info.end_bytes}"
            )

    def read(self, starts: np.ndarray[Any, Any], window: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """``[len(starts), len(window)]`` tokens, row ``i`` from token ``starts[i]`` on."""
        if self.tokens is not None:
            self.check()
            return np.take(self.tokens, starts[:, None] + window)
        if self.h5 is None:
            raise InputError(f"{self.info.path}: shard read after it was closed")
        dataset = self.h5["tokens"]
        return np.stack([dataset[s : s + len(window)] for s in starts])

    def close(self) -> None:
        self.tokens = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.h5 is not None:
            self.h5.close()
            self.h5 = None


class FilePool:
    """At most ``max_open`` shard files open at once in this process; the least recently used is closed first.

    Reads hold a lock so a read-ahead thread and the training thread never use a
    descriptor the other just closed.
    """

    def __init__(self, max_open: int) -> None:
        if max_open < 1:
            raise ValueError(f"max_open {max_open} < 1")
        self.max_open = max_open
        self._open: OrderedDict[Path, _Open] = OrderedDict()
        self._lock = threading.Lock()
        self.opened = 0  # files opened so far (reopens after eviction included)
        self._windows: dict[int, np.ndarray[Any, Any]] = {}

    def read(self, info: ShardInfo, starts: np.ndarray[Any, Any], length: int) -> np.ndarray[Any, Any]:
        """``[len(starts), length]`` tokens of one shard, row ``i`` from token ``starts[i]`` on."""
        window = self._windows.get(length)
        if window is None:
            window = self._windows[length] = np.arange(length, dtype=np.int64)
        with self._lock:
            handle = self._open.get(info.path)
            if handle is None:
                while len(self._open) >= self.max_open:
                    self._open.popitem(last=False)[1].close()
                handle = self._open[info.path] = _Open(info)
                self.opened += 1
            else:
                self._open.move_to_end(info.path)
            return handle.read(starts, window)

    @property
    def open_files(self) -> int:
        return len(self._open)

    def close(self) -> None:
        with self._lock:
            while self._open:
                self._open.popitem()[1].close()
