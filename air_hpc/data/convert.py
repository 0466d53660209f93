"""Convert token corpora between air-hpc's HDF5 files and Megatron's indexed ``.bin``/``.idx`` pairs.

Both directions keep the tokens bit for bit and the document boundaries; memory
stays bounded by the block size. HDF5 -> indexed goes through megatron-core's own
``IndexedDatasetBuilder`` (one document per HDF5 document, written in sequences of
at most a block), so Megatron reads the result like any corpus of its own, plus a
``PREFIX.json`` beside it with the tokenizer, vocabulary size and end-of-document id
the index has no room for. Indexed -> HDF5 reads the index through megatron-core's
``IndexedDataset`` and copies the ``.bin`` in blocks into a contiguous ``/tokens``.
Each output is written under a temporary name and renamed into place.
"""

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from air_hpc.data import hdf5
from air_hpc.data.shards import describe, kind_of, read_index, sidecar
from air_hpc.errors import InputError

log = logging.getLogger(__name__)

BLOCK_TOKENS = 1 << 22
#: numpy dtypes megatron-core's DType enum can store.
_MEGATRON_DTYPES = ("uint8", "int8", "int16", "int32", "int64", "uint16")


@dataclass(frozen=True)
class Vocabulary:
    """What made the tokens: the index of a Megatron corpus does not record it."""

    tokenizer: str
    vocab_size: int
    eod_id: int


def to_indexed(source: Path, prefix: Path, block_tokens: int = BLOCK_TOKENS) -> Path:
    """Write the HDF5 token file ``source`` as ``prefix.bin``/``prefix.idx`` (+ ``prefix.json``)."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder  # torch: only here

    info = hdf5.inspect(source)
    dtype = np.dtype(info.dtype)
    if dtype.name not in _MEGATRON_DTYPES:
        dtype = np.dtype(np.int32 if info.vocab_size <= np.iinfo(np.int32).max else np.int64)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    tmp = prefix.with_name(f".{prefix.name}.tmp-{os.getpid()}")
    try:
        builder = IndexedDatasetBuilder(f"{tmp}.bin", dtype=dtype.type)
        with h5py.File(source, "r") as fh:
            tokens, offsets = fh["tokens"], fh["doc_offsets"][:]
            for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
                for piece in range(start, end, block_tokens):
                    builder.add_item(_as_tensor(tokens[piece : min(piece + block_tokens, end)].astype(dtype)))
                builder.end_document()
        builder.finalize(f"{tmp}.idx")
        meta = {"tokenizer": info.tokenizer, "vocab_size": info.vocab_size, "eod_id": info.eod_id}
        Path(f"{tmp}.json").write_text(json.dumps(meta, indent=2) + "\n")
        for suffix in (".bin", ".idx", ".json"):
            _durable_rename(Path(f"{tmp}{suffix}"), Path(f"{prefix}{suffix}"))
    finally:
        for suffix in (".bin", ".idx", ".json"):
            Path(f"{tmp}{suffix}").unlink(missing_ok=True)
    log.info("wrote %s.bin/.idx: %d tokens, %d documents", prefix, info.tokens, info.documents)
    return prefix


def _as_tensor(values: np.ndarray[Any, Any]) -> Any:
    import torch

    return torch.from_numpy(np.ascontiguousarray(values))


def to_hdf5(prefix: Path, output: Path, vocab: Vocabulary | None, block_tokens: int = BLOCK_TOKENS) -> Path:
    """Write the Megatron corpus ``prefix`` as an HDF5 token file; ``vocab`` where ``prefix.json`` is absent."""
    shard = describe(prefix)
    if vocab is None:
        if shard.tokenizer is None or shard.vocab_size is None or shard.eod_id is None:
            raise InputError(
                f"{prefix}.idx: no {sidecar(prefix).name} says which tokenizer made it; "
                "give --tokenizer-name, --vocab-size and --eod-id"
            )
        vocab = Vocabulary(shard.tokenizer, shard.vocab_size, shard.eod_id)
    index = read_index(prefix)
    lengths = index.sequence_lengths.astype(np.int64)
    ends = np.concatenate([[0], np.cumsum(lengths)])
    doc_offsets = ends[index.document_indices].astype(np.uint64)
    source_dtype = np.dtype(index.dtype)
    dtype = source_dtype if source_dtype.kind == "u" else np.dtype(_unsigned_for(vocab.vocab_size))
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    try:
        with h5py.File(tmp, "w") as out, open(f"{prefix}.bin", "rb") as raw:
            tokens = out.create_dataset("tokens", (shard.tokens,), dtype=dtype)
            for start in range(0, shard.tokens, block_tokens):
                count = min(block_tokens, shard.tokens - start)
                block = np.frombuffer(raw.read(count * source_dtype.itemsize), dtype=source_dtype)
                if len(block) != count:
                    raise InputError(f"{prefix}.bin: ends at token {start + len(block)}, its index says {shard.tokens}")
                if block.size and (int(block.min()) < 0 or int(block.max()) >= vocab.vocab_size):
                    raise InputError(
                        f"{prefix}.bin: token ids {int(block.min())}..{int(block.max())} near token {start} are "
                        f"outside the vocabulary of {vocab.vocab_size}"
                    )
                tokens[start : start + count] = block.astype(dtype, copy=False)
            out.create_dataset("doc_offsets", data=doc_offsets)
            out.attrs.update(
                format=hdf5.FORMAT_VERSION,
                tokenizer=vocab.tokenizer,
                vocab_size=vocab.vocab_size,
                eod_id=vocab.eod_id,
            )
        _durable_rename(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)
    log.info("wrote %s: %d tokens, %d documents", output, shard.tokens, len(doc_offsets) - 1)
    return output


def _unsigned_for(vocab_size: int) -> type[np.unsignedinteger[Any]]:
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return dtype
    return np.uint64


def _durable_rename(tmp: Path, final: Path) -> None:
    with tmp.open("rb+") as fh:
        os.fsync(fh.fileno())
    tmp.replace(final)


def convert_shards(shards: list[Path], out_dir: Path, vocab: Vocabulary | None) -> list[Path]:
    """Each shard into the other format under ``out_dir``, named after it: ``x.h5`` -> ``x.bin``/``x.idx``,
    Megatron ``x`` -> ``x.h5``."""
    written = []
    for shard in shards:
        if kind_of(shard) == "hdf5":
            written.append(to_indexed(shard, out_dir / shard.stem))
        else:
            written.append(to_hdf5(shard, out_dir / f"{shard.name}.h5", vocab))
    return written
