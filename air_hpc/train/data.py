"""HDF5 token data: build it from text (``prepare``); the reader is :mod:`air_hpc.data`.

File format (``format`` attribute 1)::

    /tokens       1-D unsigned ints, every document's tokens back to back, each followed by EOD
    /doc_offsets  1-D uint64, start of each document in /tokens, plus the total at the end
    attrs: format, tokenizer, vocab_size, eod_id

``prepare`` streams: it tokenizes each input in blocks into a chunked, resizable
scratch file (memory stays constant in the input size), then copies the tokens
into a contiguous dataset of the final file, written under a temporary name and
renamed into place, so a crash never leaves a half-written corpus behind.
"""

import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import h5py
import numpy as np

from air_hpc.data.hdf5 import FORMAT_VERSION
from air_hpc.data.hdf5 import CorpusInfo as CorpusInfo  # the format's reader, re-exported for callers of prepare
from air_hpc.data.hdf5 import inspect as inspect
from air_hpc.errors import InputError

log = logging.getLogger(__name__)

_BLOCK_BYTES = 1 << 20
_CHUNK_TOKENS = 1 << 16


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eod_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, end-of-document 256: needs nothing but Python."""

    name = "byte"
    vocab_size = 257
    eod_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A local Hugging Face ``tokenizer.json`` (optional ``tokenizers`` package; never downloads)."""

    def __init__(self, path: Path) -> None:
        try:
            from tokenizers import Tokenizer as _Tokenizer
        except ImportError:
            raise InputError(
                f"--tokenizer {path}: a tokenizer directory needs the `tokenizers` package "
                "(pip install tokenizers), or use --tokenizer byte"
            ) from None
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise InputError(f"--tokenizer {path}: no tokenizer.json there; expected 'byte' or a tokenizer directory")
        self._tok = _Tokenizer.from_file(str(file))
        self.name = str(path)
        base = self._tok.get_vocab_size(with_added_tokens=True)
        eod = self._tok.token_to_id("<|endoftext|>") or self._tok.token_to_id("</s>")
        self.eod_id = eod if eod is not None else base
        self.vocab_size = max(base, self.eod_id + 1)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids)))


#: The repository this package lives in (for the demo corpus built from the project's own text).
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def project_sources(root: Path = PROJECT_ROOT) -> list[Path]:
    """The demo and test corpus: the README and the package's Python sources, in a fixed order.

    Built on demand (``air-hpc data prepare --project -o runs/data/corpus.h5``) rather than
    committed: it follows the code it is made of, and the same tree always gives the same file.
    """
    readme = root / "README.md"
    sources = sorted((root / "air_hpc").rglob("*.py"), key=lambda p: p.relative_to(root).as_posix())
    return [readme, *sources] if readme.is_file() else sources


def load_tokenizer(spec: str) -> Tokenizer:
    if spec == "byte":
        return ByteTokenizer()
    path = Path(spec).expanduser()
    if not path.exists():
        raise InputError(f"--tokenizer {spec}: not 'byte' and no such file or directory")
    return HFTokenizer(path)


def token_dtype(vocab_size: int) -> np.dtype[Any]:
    """The narrowest unsigned type holding every id."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


def documents(path: Path) -> Iterator[Iterator[str]]:
    """Each document of an input as a stream of text pieces: a JSONL line's ``text``, or a whole text file."""
    if path.suffix in {".jsonl", ".ndjson"}:
        with path.open(encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as exc:
                    raise InputError(f"{path}:{number}: not a JSON object: {exc}") from None
                if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                    raise InputError(f"{path}:{number}: expected an object with a string 'text' field")
                yield iter((record["text"],))
        return

    def pieces() -> Iterator[str]:
        """Blocks cut after a line end, so a subword tokenizer rarely sees a word split (only in huge lines)."""
        carry = ""
        with path.open(encoding="utf-8", errors="replace") as fh:
            while block := fh.read(_BLOCK_BYTES):
                text = carry + block
                head, newline, carry = text.rpartition("\n")
                if newline:
                    yield head + newline
                elif len(text) >= 4 * _BLOCK_BYTES:
                    yield text
                    carry = ""
        if carry:
            yield carry

    yield pieces()


def prepare(inputs: Iterable[Path], output: Path, tokenizer: Tokenizer) -> CorpusInfo:
    """Tokenize ``inputs`` (text or JSONL) into one HDF5 token file at ``output``."""
    inputs = list(inputs)
    check_inputs(inputs)
    writer = CorpusWriter(output, tokenizer)
    try:
        for path in inputs:
            for doc in documents(path):
                writer.add(doc)
        if writer.tokens == 0:
            raise InputError(f"{', '.join(map(str, inputs))}: no text to tokenize")
        return writer.finish()
    finally:
        writer.abort()


def check_inputs(inputs: Sequence[Path]) -> None:
    for path in inputs:
        if not path.is_file():
            raise InputError(f"{path}: no such input file")


class CorpusWriter:
    """One HDF5 token file being written: tokens grow in blocks in a chunked scratch file (memory stays
    bounded by the block), then :meth:`finish` copies them into a contiguous dataset of the final file,
    written under a temporary name and renamed into place; :meth:`abort` removes what is left."""

    def __init__(self, output: Path, tokenizer: Tokenizer) -> None:
        self.output = output
        self.tokenizer = tokenizer
        output.parent.mkdir(parents=True, exist_ok=True)
        self.scratch = output.with_name(f".{output.name}.scratch-{os.getpid()}")
        self.final_tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
        self.raw: h5py.File | None = h5py.File(self.scratch, "w")
        self._tokens = _Appender(self.raw, "tokens", token_dtype(tokenizer.vocab_size))
        self._offsets = _Appender(self.raw, "doc_offsets", np.dtype(np.uint64))
        self._offsets.extend([0])

    @property
    def tokens(self) -> int:
        return self._tokens.length

    def add(self, pieces: Iterable[str], progress: Callable[[int], None] | None = None) -> None:
        """One document: its pieces' tokens, then end-of-document. ``progress`` hears each piece's length."""
        for piece in pieces:
            self._tokens.extend(self.tokenizer.encode(piece))
            if progress is not None:
                progress(len(piece))
        self._tokens.extend([self.tokenizer.eod_id])
        self._offsets.extend([self._tokens.length])

    def finish(self) -> CorpusInfo:
        if self.raw is None:
            raise InputError(f"{self.output}: written already")
        with h5py.File(self.final_tmp, "w") as out:
            self._tokens.copy_contiguous(out)
            self._offsets.copy_contiguous(out)
            out.attrs.update(
                format=FORMAT_VERSION,
                tokenizer=self.tokenizer.name,
                vocab_size=self.tokenizer.vocab_size,
                eod_id=self.tokenizer.eod_id,
            )
        with self.final_tmp.open("rb+") as fh:
            os.fsync(fh.fileno())
        self.final_tmp.replace(self.output)
        self.abort()
        info = inspect(self.output)
        log.info("wrote %s: %d tokens, %d documents", self.output, info.tokens, info.documents)
        return info

    def abort(self) -> None:
        if self.raw is not None:
            self.raw.close()
            self.raw = None
        self.scratch.unlink(missing_ok=True)
        self.final_tmp.unlink(missing_ok=True)


class _Appender:
    """A growing 1-D dataset written in large blocks: memory stays bounded by the buffer."""

    def __init__(self, fh: h5py.File, name: str, dtype: np.dtype[Any]) -> None:
        self.name = name
        self.dtype = dtype
        self.dataset = fh.create_dataset(name, (0,), maxshape=(None,), dtype=dtype, chunks=(_CHUNK_TOKENS,))
        self.buffer: list[int] = []
        self.length = 0

    def extend(self, values: Sequence[int]) -> None:
        self.buffer.extend(values)
        self.length += len(values)
        if len(self.buffer) >= _BLOCK_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            start = self.dataset.shape[0]
            self.dataset.resize((start + len(self.buffer),))
            self.dataset[start:] = np.asarray(self.buffer, dtype=self.dtype)
            self.buffer = []

    def copy_contiguous(self, out: h5py.File) -> None:
        """Write the data as a contiguous dataset of ``out`` (which the reader can memory-map)."""
        self.flush()
        dest = out.create_dataset(self.name, (self.length,), dtype=self.dtype)
        for start in range(0, self.length, _BLOCK_BYTES):
            dest[start : start + _BLOCK_BYTES] = self.dataset[start : start + _BLOCK_BYTES]


def sample_text(path: Path, max_tokens: int = 200) -> str:
    """The first tokens of the corpus, decoded when the tokenizer is the byte tokenizer."""
    info = inspect(path)
    with h5py.File(path, "r") as fh:
        ids = fh["tokens"][:max_tokens].tolist()
    if info.tokenizer == ByteTokenizer.name:
        return ByteTokenizer().decode(ids)
    return " ".join(map(str, ids))


def micro_batch_indices(
    consumed_samples: int, micro_batch: int, micro_batch_size: int, dp_rank: int, dp_size: int
) -> np.ndarray[Any, Any]:
    """Global sample indices of one micro-batch of one DP rank, counted from the run's start.

    A global batch is ``num_micro_batches`` rounds of ``dp_size * micro_batch_size``
    consecutive indices; DP rank ``r`` takes the ``r``-th slice of each round.
    """
    start = consumed_samples + (micro_batch * dp_size + dp_rank) * micro_batch_size
    return np.arange(start, start + micro_batch_size, dtype=np.int64)
