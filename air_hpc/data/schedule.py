"""Which source each global sample index draws from, in a weighted blend.

Source ``d`` with normalised weight ``w_d`` owns the events ``(k + 0.5) / w_d`` for
``k = 0, 1, ...``; the blend's sample ``i`` is the ``i``-th event in (time, source)
order, and the sample it draws is that source's ``k``. So after any prefix of ``n``
samples every source has drawn within one sample of ``w_d * n`` (megatron-core's
greedy ``build_blending_indices`` keeps the same bound), and the schedule is a
pure function of the index: block ``b`` is computed from the counts before it,
found in closed form, never by replaying the samples before it. The order
therefore survives restarts and changes of data-parallel size, and nothing as
long as the run has to be built or cached up front.
"""

from collections.abc import Sequence
from typing import Any

import numpy as np

#: Samples per computed block of the schedule (two blocks are kept).
BLOCK = 1 << 14


class BlendSchedule:
    """Global sample index -> (source, the source's own sample index)."""

    def __init__(self, weights: Sequence[float], block: int = BLOCK) -> None:
        w = np.asarray(weights, dtype=np.float64)
        if w.ndim != 1 or len(w) == 0 or (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
            raise ValueError(f"blend weights must be finite, >= 0 and not all 0, got {list(weights)}")
        self.num_sources = len(w)
        self.active = np.flatnonzero(w > 0)
        self.stride = w.sum() / w[self.active]
        self.block = block
        self._blocks: dict[int, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = {}

    def _time(self, active: np.ndarray[Any, Any], k: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return (k.astype(np.float64) + 0.5) * self.stride[active]

    def counts_before(self, n: int) -> np.ndarray[Any, Any]:
        """Samples each source has given in the first ``n`` samples of the blend (one entry per source)."""
        if n < 0:
            raise ValueError(f"sample index {n} < 0")
        counts = np.zeros(self.num_sources, dtype=np.int64)
        counts[self.active] = self._active_counts(n)
        return counts

    def _active_counts(self, n: int) -> np.ndarray[Any, Any]:
        ids = np.arange(len(self.active))
        c = np.maximum(np.ceil(n / self.stride - 0.5), 0).astype(np.int64)
        while True:
            last = np.where(c > 0, self._time(ids, c - 1), -np.inf)
            nxt = self._time(ids, c)
            # Ties go to the lower source: compare (time, source) pairs.
            worst = int(np.lexsort((ids, last))[-1])
            best = int(np.lexsort((ids, nxt))[0])
            total = int(c.sum())
            if total > n:
                c[worst] -= 1
            elif total < n:
                c[best] += 1
            elif (last[worst], worst) > (nxt[best], best):
                c[worst] -= 1
                c[best] += 1
            else:
                return c

    def _compute_block(self, b: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        start = self._active_counts(b * self.block)
        take = np.ceil(self.block / self.stride).astype(np.int64) + 3
        while True:
            src = np.repeat(np.arange(len(self.active)), take)
            k = np.concatenate([np.arange(s, s + t) for s, t in zip(start, take, strict=True)])
            order = np.lexsort((src, self._time(src, k)))[: self.block]
            used = np.bincount(src[order], minlength=len(self.active))
            if (used < take).all():
                return self.active[src[order]].astype(np.int64), k[order]
            take = take * 2

    def _get_block(self, b: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        found = self._blocks.get(b)
        if found is None:
            found = self._compute_block(b)
            self._blocks = {key: v for key, v in self._blocks.items() if key in (b - 1, b + 1)} | {b: found}
        return found

    def assign(self, indices: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """(source, sample of that source) for each global index."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(self.active) == 1:
            return np.full(len(indices), self.active[0], dtype=np.int64), indices
        first, last = int(indices.min()) // self.block, int(indices.max()) // self.block
        if first == last:  # a micro-batch inside one block: the common case, without masks
            src, k = self._get_block(first)
            offsets = indices - first * self.block
            return src[offsets], k[offsets]
        sources = np.empty(len(indices), dtype=np.int64)
        samples = np.empty(len(indices), dtype=np.int64)
        blocks = indices // self.block
        for b in np.unique(blocks):
            mask = blocks == b
            src, k = self._get_block(int(b))
            offsets = indices[mask] - int(b) * self.block
            sources[mask], samples[mask] = src[offsets], k[offsets]
        return sources, samples
