"""Per-rank heartbeats: what each rank is doing (setup / load / step / save / sync_save) and since when.

Each rank owns one small JSON file under ``<run>/heartbeat/<generation>/``,
replaced atomically on every beat (write + rename, no fsync: a beat is
worth nothing after a crash, and it must be cheap enough for every step).
The generation directory (``records.generation``) keeps the files of one start of
the job apart from those of the previous start. The watchdog of a rank keeps
the last beat in memory, so checking it costs no file access; the files are
read only to diagnose a hang and to show progress. Each beat ends a silent interval of the
phase before it, which the heartbeat hands to its observer: the learned hang limits.
"""

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, cast, get_args

from air_hpc.records.files import atomic_write
from air_hpc.records.generation import beat_path
from air_hpc.records.names import BEAT_GLOB

log = logging.getLogger(__name__)

Phase = Literal["setup", "load", "step", "save", "sync_save", "done"]
"""``load``: resuming from a checkpoint; ``save``: an async save's blocking part; ``sync_save``: a save that
training waits for (final, on a stop, or with async saves off)."""
PHASES: tuple[Phase, ...] = get_args(Phase)
#: Phase names of beat files written before ``checkpoint`` was split into load and the two saves.
LEGACY_PHASES: dict[str, Phase] = {"checkpoint": "save"}


@dataclass(frozen=True)
class Beat:
    rank: int
    host: str
    pid: int
    phase: Phase
    step: int
    """The step being trained (or checkpointed); 0 during setup."""
    time_s: float
    """Wall-clock time of the beat (``time.time()``; compared across nodes, so clocks must be synced)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))


class Heartbeat:
    """This rank's heartbeat: the last beat in memory (for the watchdog) and in its file (for everyone else).

    ``file_interval_s`` throttles the file: rewritten on a phase change or when
    the file is that old, so thousands of ranks stepping every second do not
    flood a shared filesystem's metadata server. The in-memory beat, which the
    watchdog reads, is always current; :meth:`flush` writes it out.
    """

    def __init__(
        self,
        directory: Path,
        rank: int,
        host: str,
        clock: Callable[[], float] = time.time,
        file_interval_s: float = 0.0,
        observer: Callable[[Phase, float], None] | None = None,
    ) -> None:
        """``observer`` hears of every interval a beat ends: the phase and its seconds without a beat."""
        self.directory = directory
        self.rank = rank
        self.host = host
        self._clock = clock
        self._file_interval_s = file_interval_s
        self._observer = observer
        self._file_lock = threading.Lock()  # the watchdog thread flushes too
        self._path = beat_path(directory, rank)
        self._tmp = self._path.with_name(f".{self._path.name}.tmp")
        directory.mkdir(parents=True, exist_ok=True)
        self.last = Beat(rank, host, os.getpid(), "setup", 0, clock())
        self._written = self.last
        self._write(self.last)

    def beat(self, phase: Phase, step: int | None = None) -> None:
        """Record progress: entering ``phase`` (or making progress in it) at ``step`` (unchanged when None)."""
        if phase not in PHASES:
            raise ValueError(f"heartbeat phase {phase!r} is not one of {', '.join(PHASES)}")
        before = self.last
        beat = Beat(self.rank, self.host, before.pid, phase, before.step if step is None else step, self._clock())
        self.last = beat
        if self._observer is not None and before.phase != "done":
            self._observer(before.phase, beat.time_s - before.time_s)
        if beat.phase != self._written.phase or beat.time_s - self._written.time_s >= self._file_interval_s:
            self._write(beat)

    def flush(self) -> None:
        """Write the last beat to the file now (before a diagnosis reads everyone's files)."""
        self._write(self.last)

    def _write(self, beat: Beat) -> None:
        self._written = beat
        try:
            with self._file_lock:
                atomic_write(self._path, beat.to_json(), durable=False, tmp=self._tmp)
        except OSError as exc:
            # A full or flaky filesystem must not stop training; the in-memory beat still guards the rank.
            log.warning("heartbeat %s not written: %s", self._path, exc)


def read_beats(directory: Path) -> dict[int, Beat]:
    """Every rank's last beat in a generation directory; unreadable files are skipped."""
    beats: dict[int, Beat] = {}
    for path in sorted(directory.glob(BEAT_GLOB)):
        try:
            raw = json.loads(path.read_text())
            phase = LEGACY_PHASES.get(raw["phase"], raw["phase"])
            if phase not in PHASES:
                raise ValueError(phase)
            beat = Beat(
                int(raw["rank"]),
                str(raw["host"]),
                int(raw["pid"]),
                cast(Phase, phase),
                int(raw["step"]),
                float(raw["time_s"]),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("skipping heartbeat %s: %s", path, exc)
            continue
        beats[beat.rank] = beat
    return beats
