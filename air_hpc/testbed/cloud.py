"""A throw-away slurmctld of CLOUD nodes: ask the real topology/tree plugin where a job would go.

It lives beside the testbed as one more Slurm daemon air-hpc starts on this host: its slurm.conf
comes from the same writer (:func:`air_hpc.testbed.conf.cloud_slurm_conf`) and its ports from the
same picker (:func:`air_hpc.testbed.ports.free_ports`). The topology integration tests and
``scripts/bench/placement.py`` use it; the library itself never starts it.

Power-saved cloud nodes (``State=CLOUD`` with ``SuspendProgram``/``ResumeProgram``
set to ``/bin/true``) are allocatable without any slurmd, so one controller on
loopback can hold tens of thousands of nodes and answer
``sbatch --test-only`` in milliseconds. Authentication is ``auth/none``: the
controller listens on 127.0.0.1 only and lives for one benchmark or test.
Queries go through :class:`SlurmClient`; only the daemon itself is spawned here.
"""

import logging
import re
import socket
import subprocess
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from types import TracebackType

from air_hpc.errors import SlurmError, TestbedError
from air_hpc.slurm import hostlist
from air_hpc.slurm.client import ONCE, SlurmClient
from air_hpc.testbed.conf import cloud_slurm_conf
from air_hpc.testbed.ports import free_ports
from air_hpc.testbed.prefix import SlurmBuild

log = logging.getLogger(__name__)

_PLACED = re.compile(r"on nodes (\S+) in partition")
#: slurmctld's refusals of a job it cannot place (node or topology configuration, a required node list)
_CANNOT_PLACE = ("configuration is not available", "topology", "Required nodes")


class CloudController:
    """Start with ``with CloudController(topology_text, nodes, workdir) as ctl:``; stopped on exit."""

    def __init__(
        self,
        topology_text: str,
        nodes: Sequence[str],
        workdir: Path,
        ctld_host: str | None = None,
        extra_conf: Sequence[str] = (),
        build: SlurmBuild | None = None,
        topology_plugin: str = "topology/tree",
    ) -> None:
        """``build``: the Slurm build whose slurmctld and commands to run (None: the system's);
        ``topology_plugin``: ``topology/block`` when ``topology_text`` holds ``BlockName=`` lines."""
        self.workdir = workdir
        self.topology_plugin = topology_plugin
        self.build = build
        self.extra_conf = tuple(extra_conf)
        self.nodes = tuple(nodes)
        self.topology_text = topology_text
        self.ctld_host = ctld_host or socket.gethostname()
        self.conf = workdir / "slurm.conf"
        self.client = SlurmClient(
            env={"SLURM_CONF": str(self.conf)}, timeout_s=60.0, retries=0, bin_dir=build.bin_dir if build else None
        )
        self._proc: subprocess.Popen[bytes] | None = None
        self._drained: set[str] = set()

    def __enter__(self) -> "CloudController":
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self, timeout_s: float = 60.0) -> None:
        for sub in ("state", "spool"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(
            cloud_slurm_conf(
                self.workdir, self.nodes, self.ctld_host, free_ports(2), self.extra_conf, self.topology_plugin
            )
        )
        (self.workdir / "topology.conf").write_text(self.topology_text)
        out = (self.workdir / "slurmctld.out").open("wb")
        self._proc = subprocess.Popen(
            [self.build.daemon("slurmctld") if self.build else "slurmctld", "-D", "-i", "-f", str(self.conf)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=self.client.env,
        )
        out.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise TestbedError(
                    f"slurmctld exited with {self._proc.returncode}; see {self.workdir / 'slurmctld.out'} "
                    f"and {self.workdir / 'slurmctld.log'}"
                )
            ping = self.client.run(["scontrol", "ping"], check=False, retry=ONCE)
            if "is UP" in ping.stdout:
                log.info("cloud slurmctld up with %d nodes (pid %d)", len(self.nodes), self._proc.pid)
                return
            time.sleep(0.2)
        self.stop()
        raise TestbedError(f"slurmctld did not answer within {timeout_s} s; see {self.workdir / 'slurmctld.log'}")

    def stop(self) -> None:
        """Stop the controller this object started (and nothing else)."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=15)
        self._proc = None

    def set_unavailable(self, nodes: Collection[str]) -> None:
        """Drain exactly ``nodes``: resume those drained before and no longer listed."""
        wanted = set(nodes)
        resume = self._drained - wanted
        drain = wanted - self._drained
        if resume:
            self._update(resume, "State=RESUME")
        if drain:
            self._update(drain, "State=DRAIN", "Reason=unavailable")
        self._drained = wanted

    def _update(self, nodes: Collection[str], *settings: str) -> None:
        self.client.run(["scontrol", "update", f"NodeName={hostlist.compress(nodes)}", *settings])

    def placement(self, count: int, options: Sequence[str] = ()) -> tuple[str, ...] | None:
        """Nodes ``sbatch --test-only -N count --exclusive [options]`` would start on; None if Slurm cannot place it."""
        args = ["sbatch", "--test-only", "-N", str(count), "--exclusive", *options, "--wrap", "true"]
        result = self.client.run(args, check=False, retry=ONCE)
        match = _PLACED.search(result.stderr + result.stdout)
        if match:
            return tuple(hostlist.expand(match.group(1), "sbatch --test-only"))
        if result.returncode != 0 and any(words in result.stderr for words in _CANNOT_PLACE):
            return None
        if result.returncode != 0:
            raise SlurmError(f"sbatch --test-only -N {count} failed: {result.stderr.strip()}")
        raise SlurmError(f"sbatch --test-only -N {count}: no node list in {result.stderr.strip()!r}")

    def show_topology(self) -> str:
        return self.client.run(["scontrol", "show", "topology"]).stdout
