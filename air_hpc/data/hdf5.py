"""air-hpc's HDF5 token file: its format and its checked reader.

File format (``format`` attribute 1)::

    /tokens       1-D unsigned ints, every document's tokens back to back, each followed by EOD
    /doc_offsets  1-D uint64, start of each document in /tokens, plus the total at the end
    attrs: format, tokenizer, vocab_size, eod_id
"""

from dataclasses import dataclass
from pathlib import Path

import h5py

from air_hpc.errors import InputError

FORMAT_VERSION = 1


@dataclass(frozen=True)
class CorpusInfo:
    path: Path
    tokens: int
    documents: int
    tokenizer: str
    vocab_size: int
    eod_id: int
    dtype: str
    contiguous: bool


def inspect(path: Path) -> CorpusInfo:
    """Open and check a token file; raise :class:`InputError` naming what is wrong."""
    if not path.is_file():
        raise InputError(
            f"{path}: no such HDF5 token file; build one with `air-hpc data prepare INPUT... -o {path}` "
            f"(the demo corpus: `air-hpc data prepare --project -o {path}`)"
        )
    try:
        with h5py.File(path, "r") as fh:
            missing = [name for name in ("tokens", "doc_offsets") if name not in fh]
            if missing:
                raise InputError(f"{path}: not an air-hpc token file: missing dataset(s) {', '.join(missing)}")
            attrs = {key: fh.attrs.get(key) for key in ("format", "tokenizer", "vocab_size", "eod_id")}
            absent = [key for key, value in attrs.items() if value is None]
            if absent:
                raise InputError(f"{path}: not an air-hpc token file: missing attribute(s) {', '.join(absent)}")
            if int(attrs["format"]) != FORMAT_VERSION:
                raise InputError(f"{path}: token file format {attrs['format']}, expected {FORMAT_VERSION}")
            tokens = fh["tokens"]
            if tokens.ndim != 1 or tokens.dtype.kind != "u":
                raise InputError(f"{path}: /tokens must be a 1-D unsigned integer dataset, got {tokens.dtype}")
            tokenizer = attrs["tokenizer"]
            return CorpusInfo(
                path=path,
                tokens=int(tokens.shape[0]),
                documents=max(int(fh["doc_offsets"].shape[0]) - 1, 0),
                tokenizer=tokenizer.decode() if isinstance(tokenizer, bytes) else str(tokenizer),
                vocab_size=int(attrs["vocab_size"]),
                eod_id=int(attrs["eod_id"]),
                dtype=str(tokens.dtype),
                contiguous=tokens.id.get_offset() is not None,
            )
    except InputError:
        raise
    except (OSError, KeyError, ValueError) as exc:
        raise InputError(f"{path}: cannot read as HDF5: {exc}") from None
