"""The supervisor's snapshot holders: one per node of the allocation, for the life of the job start.

With ``checkpoint.memory_interval_steps`` set, the ranks keep their in-memory snapshots in a
holder process on their node (:mod:`air_hpc.runtime.snapholder`), not in themselves, so the
snapshots survive a failed training step. The supervisor starts the holders, spares included
(a rank moved to a spare finds a holder there), before the first training step, and ends them
when it ends; a holder on a node that died dies with the node, and its snapshots come back from
the buddy copies on the other nodes.
"""

import contextlib
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from air_hpc.resilience.holder import SOCKET_DIR_ENV
from air_hpc.slurm import env as slurm_env
from air_hpc.slurm.client import SlurmClient

log = logging.getLogger(__name__)

#: How long a holder gets to exit after SIGTERM before it is killed.
STOP_GRACE_S = 5.0

__all__ = ["SOCKET_DIR_ENV", "Holders", "holder_dir"]


def holder_dir(job_id: str, restart_count: int) -> Path:
    """The node-local directory of this job start's holder sockets (short: a socket path must fit 107 bytes)."""
    return Path(tempfile.gettempdir()) / f"air-hpc-{os.getuid()}" / f"snap-{job_id or os.getpid()}.{restart_count}"


class Holders:
    """The holder steps of one job start; :meth:`stop` ends every one still running."""

    def __init__(self, client: SlurmClient, job_id: str, directory: Path, log_dir: Path) -> None:
        env = {k: v for k, v in client.env.items() if k != slurm_env.HOSTFILE}  # each holder places its one task
        self.client = SlurmClient(env=env)
        self.job_id = job_id
        self.directory = directory
        self.log_dir = log_dir
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, nodes: Sequence[str]) -> None:
        """One holder step per node, without waiting for them (the ranks retry connecting for a while)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "air_hpc.runtime.snapholder", str(self.directory)]
        for node in nodes:
            if node in self._procs:
                continue
            log_path = self.log_dir / f"snapholder-{node}.log"
            self._procs[node] = self.client.start_step(node, [*argv, node], self.job_id, log_path)
        log.info("snapshot holders started on %d node(s) at %s", len(nodes), self.directory)

    def stop(self) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
        for node, proc in self._procs.items():
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                log.warning("snapshot holder on %s did not stop in %.0f s; killing it", node, STOP_GRACE_S)
                proc.kill()
                proc.wait()
        self._procs.clear()
