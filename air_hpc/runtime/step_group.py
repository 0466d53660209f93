"""Several ``srun`` processes that run one training step together, seen by the supervisor as one process.

A promoted warm standby (``runtime.standby``) is one ``srun`` per node. The group behaves
like the single ``srun`` it stands in for: it has failed as soon as one of them exits
non-zero, and then ends the others (what ``--kill-on-bad-exit`` does inside one ``srun``);
it has ended once all have; a signal goes to each.
"""

import contextlib
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from typing import IO, Protocol


def _stderr(line: str) -> None:
    sys.stderr.write(line)
    sys.stderr.flush()


class StepProcess(Protocol):
    """What the supervisor does with a step: one ``srun`` (a ``Popen``) or a :class:`StepGroup`."""

    def poll(self) -> int | None: ...

    def send_signal(self, signum: int) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class StepGroup:
    """The ``srun`` of each node, by node name; ``on_line`` hears every line any of them writes on stderr."""

    def __init__(self, procs: Mapping[str, "subprocess.Popen[str]"], on_line: Callable[[str], None]) -> None:
        self.procs = dict(procs)
        self._on_line = on_line
        self._ending = False
        self._readers = [
            threading.Thread(target=self._copy, args=(node, p.stderr), name=f"stderr-{node}", daemon=True)
            for node, p in self.procs.items()
        ]
        for reader in self._readers:
            reader.start()

    def _copy(self, node: str, stream: IO[str] | None) -> None:
        """One srun's lines to ``on_line``; once it left the group, to stderr only (its end is no step's failure)."""
        if stream is None:
            return
        for line in stream:
            (self._on_line if node in self.procs else _stderr)(line)

    def listen(self, on_line: Callable[[str], None]) -> None:
        """From now on, lines go to ``on_line`` (a promoted standby's lines go to the step's watch)."""
        self._on_line = on_line

    def alive(self, node: str) -> bool:
        proc = self.procs.get(node)
        return proc is not None and proc.poll() is None

    def keep(self, nodes: set[str]) -> list["subprocess.Popen[str]"]:
        """Only ``nodes`` stay in the group; the others' sruns are asked to end (their standbys leave on the signal)
        and returned, for the caller to reap (killing the one of a dead node, which never answers)."""
        gone = [self.procs.pop(n) for n in [n for n in self.procs if n not in nodes]]
        for proc in gone:
            with contextlib.suppress(OSError):
                proc.terminate()
        return gone

    def poll(self) -> int | None:
        """None while any runs; then the first non-zero code (the others are ended once one fails), else 0."""
        codes = [p.poll() for p in self.procs.values()]
        failed = next((c for c in codes if c not in (None, 0)), None)
        if failed is not None and not self._ending:
            self._ending = True
            self.terminate()
        if any(c is None for c in codes):
            return None
        return failed if failed is not None else 0

    def send_signal(self, signum: int) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.send_signal(signum)

    def terminate(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.terminate()

    def kill(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.kill()

    def wait(self, timeout: float | None = None) -> int:
        for proc in self.procs.values():
            proc.wait(timeout=timeout)
        code = self.poll()
        return 0 if code is None else code

    def join_readers(self, timeout_s: float) -> None:
        for reader in self._readers:
            reader.join(timeout=timeout_s)
