"""``data prepare`` over many inputs: one process per input group, every core busy, sharded output.

Inputs are packed, in the order given, into groups of at least ``group_bytes`` of text
(from their sizes alone), so the groups, and with them the output, do not depend on
the number of workers: group ``g`` writes ``part-GGGGG-KKKK.h5``, a new shard once the
current one holds ``shard_tokens`` tokens at a document end. A worker holds one
block of tokens at a time (``CorpusWriter``), so memory stays bounded by the block
size per worker. Workers report characters read through a manager's queue to the
parent's progress bar.
"""

import logging
import multiprocessing
import os
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from air_hpc.data.hdf5 import CorpusInfo
from air_hpc.errors import InputError
from air_hpc.train.data import CorpusWriter, check_inputs, documents, load_tokenizer

log = logging.getLogger(__name__)

#: Text per input group unless told otherwise: big enough to amortise a process's start.
GROUP_BYTES = 64 << 20
_REPORT_CHARS = 1 << 20


@dataclass(frozen=True)
class Group:
    index: int
    inputs: tuple[Path, ...]


def plan_groups(inputs: Sequence[Path], group_bytes: int) -> list[Group]:
    """Consecutive inputs packed until a group holds ``group_bytes``; the last group takes the rest."""
    groups: list[Group] = []
    current: list[Path] = []
    size = 0
    for path in inputs:
        current.append(path)
        size += path.stat().st_size
        if size >= group_bytes:
            groups.append(Group(len(groups), tuple(current)))
            current, size = [], 0
    if current:
        groups.append(Group(len(groups), tuple(current)))
    return groups


@dataclass(frozen=True)
class _Task:
    group: Group
    out_dir: Path
    tokenizer: str
    shard_tokens: int
    progress: Any  # a multiprocessing manager's queue (a proxy: it travels with the task)


def _write_group(task: _Task, report: Callable[[int], None]) -> list[CorpusInfo]:
    """Tokenize one group into its shards (in a worker process)."""
    tokenizer = load_tokenizer(task.tokenizer)
    written: list[CorpusInfo] = []
    writer: CorpusWriter | None = None
    try:
        for path in task.group.inputs:
            for doc in documents(path):
                if writer is None:
                    writer = CorpusWriter(
                        task.out_dir / f"part-{task.group.index:05d}-{len(written):04d}.h5", tokenizer
                    )
                writer.add(doc, report)
                if writer.tokens >= task.shard_tokens:
                    written.append(writer.finish())
                    writer = None
        if writer is not None and writer.tokens:
            written.append(writer.finish())
            writer = None
    finally:
        if writer is not None:
            writer.abort()
    return written


def _run_task(task: _Task) -> list[CorpusInfo]:
    pending = 0

    def report(chars: int) -> None:
        nonlocal pending
        pending += chars
        if pending >= _REPORT_CHARS:
            task.progress.put(pending)
            pending = 0

    infos = _write_group(task, report)
    if pending:
        task.progress.put(pending)
    return infos


def prepare_sharded(
    inputs: Sequence[Path],
    out_dir: Path,
    tokenizer: str,
    shard_tokens: int,
    workers: int | None = None,
    group_bytes: int = GROUP_BYTES,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[CorpusInfo]:
    """Tokenize ``inputs`` into shards under ``out_dir`` with ``workers`` processes (default: every core).

    ``on_progress(done, total)`` hears characters read against the inputs' total size.
    """
    check_inputs(inputs)
    load_tokenizer(tokenizer)  # a bad tokenizer is one line here, not one per worker
    if out_dir.exists() and any(out_dir.glob("part-*.h5")):
        raise InputError(f"{out_dir}: holds shards (part-*.h5) already; write to a new directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    groups = plan_groups(inputs, group_bytes)
    total = sum(p.stat().st_size for p in inputs)
    workers = max(1, min(workers or os.cpu_count() or 1, len(groups)))
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        progress = manager.Queue()
        tasks = [_Task(g, out_dir, tokenizer, shard_tokens, progress) for g in groups]
        drained = _Drain(progress, total, on_progress)
        try:
            with context.Pool(workers) as pool:
                results = pool.map(_run_task, tasks, chunksize=1)
        finally:
            drained.stop()
    infos = [info for group in results for info in group]
    if not infos:
        raise InputError(f"{', '.join(map(str, inputs))}: no text to tokenize")
    log.info("wrote %d shards under %s from %d inputs in %d groups", len(infos), out_dir, len(inputs), len(groups))
    return infos


class _Drain:
    """The parent's thread that adds up the workers' progress reports."""

    def __init__(self, progress: Any, total: int, on_progress: Callable[[int, int], None] | None) -> None:
        self.progress, self.total, self.on_progress = progress, total, on_progress
        self.done = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prepare-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._take(timeout=0.2)

    def _take(self, timeout: float) -> None:
        try:
            self.done += self.progress.get(timeout=timeout)
        except queue.Empty:
            return
        if self.on_progress is not None:
            self.on_progress(min(self.done, self.total), self.total)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        while not self.progress.empty():
            self._take(timeout=0)
        if self.on_progress is not None:
            self.on_progress(self.total, self.total)
