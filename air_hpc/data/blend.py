"""Training samples from one source of shards or a weighted blend of sources.

A *source* is the shards one ``data.path`` or ``data.blend[i].path`` names, read
as one sample space: shard ``s`` gives ``(tokens_s - 1) // seq_len`` samples of
``seq_len + 1`` consecutive tokens, and the source's samples are visited in a
seeded permutation per epoch (the permutation of ``data.path`` alone is the one
single-file runs have always used, so their checkpoints resume unchanged; a blend
seeds each source's with its position too). The blend's schedule
(:mod:`air_hpc.train.schedule`) says which source each global sample index draws
from and which of its samples. Everything is a pure function of the global
index and the seed: a run resumes, or changes data-parallel size, and sees the
same samples in the same global order.

:func:`plan` checks the sources before anything starts (each bad input one
line naming its config key and file).
"""

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from air_hpc.config.models import DataConfig, JobConfig
from air_hpc.data.schedule import BlendSchedule
from air_hpc.data.shards import FilePool, ShardInfo, describe, expand, is_glob
from air_hpc.errors import InputError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourcePlan:
    """One checked source of a blend."""

    key: str  # its config key, for messages
    spec: Path
    weight: float  # normalised share of the samples
    shards: tuple[ShardInfo, ...]
    shard_samples: tuple[int, ...]

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def documents(self) -> int:
        return sum(s.documents for s in self.shards)

    @property
    def samples(self) -> int:
        return sum(self.shard_samples)


@dataclass(frozen=True)
class BlendPlan:
    sources: tuple[SourcePlan, ...]
    seq_len: int
    single: bool  # data.path alone: the single-file order of earlier releases
    tokenizer: str | None
    vocab_size: int | None

    @property
    def weights(self) -> list[float]:
        return [s.weight for s in self.sources]


def _source_keys(cfg: DataConfig) -> list[str]:
    return ["data.path"] if cfg.blend is None else [f"data.blend.{i}.path" for i in range(len(cfg.blend))]


def plan(cfg: DataConfig, seq_len: int) -> BlendPlan:
    """Every source found, described and checked against the others."""
    sources = _checked_sources(cfg, seq_len, skip_missing_files=False)
    tokenizer, vocab = _common_tokenizer(sources)
    return BlendPlan(tuple(sources), seq_len, cfg.blend is None, tokenizer, vocab)


def precheck(cfg: DataConfig, seq_len: int) -> None:
    """:func:`plan`'s checks for ``config show``, where a source naming one file not built yet is no error."""
    _common_tokenizer(_checked_sources(cfg, seq_len, skip_missing_files=True))


def _checked_sources(cfg: DataConfig, seq_len: int, *, skip_missing_files: bool) -> list[SourcePlan]:
    total = sum(s.weight for s in cfg.sources())
    sources = []
    for key, source in zip(_source_keys(cfg), cfg.sources(), strict=True):
        if skip_missing_files and _not_built_yet(source.path):
            log.info("%s: %s does not exist yet; its checks wait for submit", key, source.path)
            continue
        sources.append(_source(key, source.path, source.weight / total, seq_len))
    return sources


def _not_built_yet(spec: Path) -> bool:
    indexed = (Path(f"{spec}.idx"), Path(f"{spec.with_suffix('')}.idx"))
    return not is_glob(spec) and not spec.exists() and not any(p.exists() for p in indexed)


def _source(key: str, spec: Path, weight: float, seq_len: int) -> SourcePlan:
    shards = tuple(describe(p) for p in expand(spec, key))
    counts = tuple(max(s.tokens - 1, 0) // seq_len for s in shards)
    entry = SourcePlan(key, spec, weight, shards, counts)
    if entry.tokens == 0:
        raise InputError(f"{key}: {spec} holds no tokens ({len(shards)} shard(s))")
    if entry.samples == 0:
        raise InputError(
            f"{key}: {spec}: every shard is shorter than one sample of model.seq_len + 1 = "
            f"{seq_len + 1} tokens (longest {max(s.tokens for s in shards)})"
        )
    return entry


def _common_tokenizer(sources: list[SourcePlan]) -> tuple[str | None, int | None]:
    """The one tokenizer and vocabulary every shard that says so was made with."""
    first: ShardInfo | None = None
    for source in sources:
        for shard in source.shards:
            if shard.tokenizer is None and shard.vocab_size is None:
                continue
            if first is None:
                first = shard
            elif (shard.tokenizer, shard.vocab_size) != (first.tokenizer, first.vocab_size):
                raise InputError(
                    f"{source.key}: {shard.path} was made with tokenizer {shard.tokenizer} (vocab "
                    f"{shard.vocab_size}), {first.path} with {first.tokenizer} (vocab {first.vocab_size}); "
                    "every shard of a run needs the same tokenizer"
                )
    return (first.tokenizer, first.vocab_size) if first is not None else (None, None)


def report(blend: BlendPlan, total_samples: int) -> dict[str, Any]:
    """What ``data inspect`` shows: each source's size and what ``total_samples`` samples draw from it."""
    drawn = BlendSchedule(blend.weights).counts_before(total_samples)
    return {
        "seq_len": blend.seq_len,
        "samples": total_samples,
        "tokenizer": blend.tokenizer,
        "vocab_size": blend.vocab_size,
        "sources": [
            {
                "key": s.key,
                "path": str(s.spec),
                "weight": s.weight,
                "shards": len(s.shards),
                "formats": sorted({shard.kind for shard in s.shards}),
                "tokens": s.tokens,
                "documents": s.documents,
                "samples": s.samples,
                "drawn": int(n),
                "epochs": int(n) / s.samples,
            }
            for s, n in zip(blend.sources, drawn, strict=True)
        ],
    }


def tokenizer_of(cfg: DataConfig) -> str | None:
    """The tokenizer the data was made with (None: no shard says)."""
    for source in cfg.sources():
        for path in expand(source.path, "data"):
            tokenizer = describe(path).tokenizer
            if tokenizer is not None:
                return tokenizer
    return None


def check_for_training(cfg: DataConfig, seq_len: int, vocab_size: int) -> BlendPlan:
    """Everything the trainer needs from the data, checked before any process group starts."""
    found = plan(cfg, seq_len)
    if found.vocab_size is not None and vocab_size < found.vocab_size:
        raise InputError(
            f"model.vocab_size {vocab_size} is smaller than the vocabulary of the data "
            f"({found.tokenizer} tokenizer, {found.vocab_size} ids)"
        )
    return found


class _Source:
    """One source's samples: a seeded permutation per epoch over its shards' samples."""

    def __init__(self, source: SourcePlan, seed: list[int], pool: FilePool, seq_len: int) -> None:
        self.plan = source
        self.seed = seed
        self.pool = pool
        self.seq_len = seq_len
        self.bounds = np.cumsum([0, *source.shard_samples])
        self.samples = int(self.bounds[-1])
        self._orders: dict[int, np.ndarray[Any, Any]] = {}

    def _order(self, epoch: int) -> np.ndarray[Any, Any]:
        """One epoch's permutation; this epoch's and the one before are kept (a batch may straddle two)."""
        order = self._orders.get(epoch)
        if order is None:
            order = np.random.default_rng([*self.seed[:1], epoch, *self.seed[1:]]).permutation(self.samples)
            self._orders = {e: o for e, o in self._orders.items() if e == epoch - 1} | {epoch: order}
        return order

    def positions(self, samples: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """The source-wide sample each of the source's own sample indices is (epochs wrap, each reshuffled)."""
        first, last = int(samples.min()) // self.samples, int(samples.max()) // self.samples
        if first == last:
            return self._order(first)[samples - first * self.samples]
        epochs = samples // self.samples
        out = np.empty(len(samples), dtype=np.int64)
        for epoch in np.unique(epochs):
            mask = epochs == epoch
            out[mask] = self._order(int(epoch))[samples[mask] - int(epoch) * self.samples]
        return out

    def read(self, samples: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> None:
        positions = self.positions(samples)
        if len(self.plan.shards) == 1:
            out[:] = self.pool.read(self.plan.shards[0], positions * self.seq_len, self.seq_len + 1)
            return
        shard_of = np.searchsorted(self.bounds, positions, side="right") - 1
        for shard in np.unique(shard_of):
            mask = shard_of == shard
            starts = (positions[mask] - self.bounds[shard]) * self.seq_len
            out[mask] = self.pool.read(self.plan.shards[shard], starts, self.seq_len + 1)


class BlendedSamples:
    """``[n, seq_len + 1]`` token batches for global sample indices, from a checked :class:`BlendPlan`.

    :meth:`prefetch` reads batches the caller will ask for next in a background thread
    (``data.read_ahead``), so the step that asks finds them read; an error there (a shard
    gone) is raised by the :meth:`batch` call that wanted the batch.
    """

    def __init__(
        self,
        blend: BlendPlan,
        seed: int,
        max_open_files: int = 64,
        vocab_size: int | None = None,
        read_ahead: bool = False,
    ) -> None:
        self.plan = blend
        self._ahead = ThreadPoolExecutor(max_workers=1, thread_name_prefix="read-ahead") if read_ahead else None
        self._pending: dict[tuple[int, int], Future[np.ndarray[Any, Any]]] = {}
        self.schedule = BlendSchedule(blend.weights)
        self.pool = FilePool(max_open_files)
        self.vocab_size = vocab_size
        self.sources = [
            _Source(s, [seed] if blend.single else [seed, i], self.pool, blend.seq_len)
            for i, s in enumerate(blend.sources)
        ]

    def locate(self, global_indices: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """(source, source-wide sample position) of each global index: what the batch will hold."""
        src, own = self.schedule.assign(global_indices)
        positions = np.empty(len(src), dtype=np.int64)
        for d in np.unique(src):
            mask = src == d
            positions[mask] = self.sources[int(d)].positions(own[mask])
        return src, positions

    def prefetch(self, batches: list[np.ndarray[Any, Any]], done_before: int) -> None:
        """Start reading ``batches`` (runs of consecutive indices) in the background; forget what was read
        ahead for indices below ``done_before`` (steps already trained)."""
        if self._ahead is None:
            return
        self._pending = {key: f for key, f in self._pending.items() if key[0] >= done_before}
        for indices in batches:
            key = (int(indices[0]), len(indices))
            if key not in self._pending:
                self._pending[key] = self._ahead.submit(self._read, indices)

    def batch(self, global_indices: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """``[len(indices), seq_len + 1]`` int64 tokens."""
        global_indices = np.asarray(global_indices, dtype=np.int64)
        ahead = self._pending.get((int(global_indices[0]), len(global_indices))) if len(global_indices) else None
        if ahead is not None and np.array_equal(
            global_indices, np.arange(global_indices[0], global_indices[0] + len(global_indices))
        ):
            return ahead.result()
        return self._read(global_indices)

    def _read(self, global_indices: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        src, own = self.schedule.assign(np.asarray(global_indices, dtype=np.int64))
        out = np.empty((len(src), self.plan.seq_len + 1), dtype=np.int64)
        if len(self.sources) == 1:
            self.sources[0].read(own, out)
        for d in np.unique(src) if len(self.sources) > 1 else ():
            mask = src == d
            part = np.empty((int(mask.sum()), self.plan.seq_len + 1), dtype=np.int64)
            self.sources[int(d)].read(own[mask], part)
            out[mask] = part
        if self.vocab_size is not None and out.size and int(out.max()) >= self.vocab_size:
            bad = sorted({self.plan.sources[int(d)].key for d in np.unique(src[(out >= self.vocab_size).any(1)])})
            raise InputError(
                f"{', '.join(bad)}: token id {int(out.max())} is outside model.vocab_size {self.vocab_size}"
            )
        return out

    def source_counts(self, consumed_samples: int) -> dict[str, int]:
        """Samples each source has given to the first ``consumed_samples`` samples of the run."""
        counts = self.schedule.counts_before(consumed_samples)
        return {s.key: int(c) for s, c in zip(self.plan.sources, counts, strict=True)}

    def close(self) -> None:
        if self._ahead is not None:
            for pending in self._pending.values():
                pending.cancel()
            self._ahead.shutdown(wait=True)
            self._pending = {}
        self.pool.close()


def open_samples(job: JobConfig) -> BlendedSamples:
    """The job's training samples, its data checked against its model first."""
    found = check_for_training(job.data, job.model.seq_len, job.model.vocab_size)
    return BlendedSamples(found, job.train.seed, job.data.max_open_files, job.model.vocab_size, job.data.read_ahead)
