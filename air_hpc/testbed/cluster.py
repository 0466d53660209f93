"""The embedded Slurm testbed: munge, MariaDB, slurmdbd, slurmctld and one slurmd per node.

Every daemon runs in the foreground under a PID we record (with its start time,
so a recycled PID is never mistaken for ours), listens on loopback on ports
chosen free at ``up``, and keeps all its state under one directory. Each
slurmd runs in its own UTS and mount namespace so ``hostname`` inside a job is
the emulated node's name.
"""

import contextlib
import getpass
import json
import logging
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import psutil

from air_hpc.errors import SlurmError, TestbedError
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.nodes import fetch_sinfo_states
from air_hpc.slurm.version import parse_version
from air_hpc.testbed import conf, tenants
from air_hpc.testbed.conf import Layout, Ports, Settings
from air_hpc.testbed.ports import free_ports
from air_hpc.testbed.prefix import SlurmBuild, check_prefix, daemon_version
from air_hpc.topology import treeconf
from air_hpc.topology.synthetic import fat_tree

log = logging.getLogger(__name__)

CLUSTER_NAME = "airtb"
#: Node names of the further cluster (``up --clusters 2``, named CLUSTER_NAME + "b"): b1, b2, ...
MEMBER_NODE_PREFIX = "b"
DEFAULT_LEAVES = (2, 4, 2)
#: Node states of a node in service (sinfo's long names, without flags such as ``*``, not responding).
IN_SERVICE = frozenset({"idle", "allocated", "mixed", "completing"})

#: Binaries a Slurm build (``--slurm-prefix``) provides instead of Debian's packages.
SLURM_BINARIES = frozenset({"slurmdbd", "slurmctld", "slurmd", "sinfo", "scontrol"})

#: binary -> Debian package that provides it, for the "please install" message.
REQUIRED_BINARIES = {
    "munged": "munge",
    "mungekey": "munge",
    "mariadbd": "mariadb-server",
    "mariadb-install-db": "mariadb-server",
    "slurmdbd": "slurmdbd",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sinfo": "slurm-client",
    "scontrol": "slurm-client",
    "unshare": "util-linux",
}


@dataclass(frozen=True)
class Daemon:
    name: str
    pid: int
    create_time: float

    def process(self) -> psutil.Process | None:
        """The live process, or None if it ended or the PID now belongs to someone else."""
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) > 1.0 or proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc
        except psutil.Error:
            return None


def member_names(clusters: int) -> list[str]:
    """The names of the testbed's further clusters (``up --clusters N``): ``airtbb`` for the second."""
    return [CLUSTER_NAME + chr(ord("a") + i) for i in range(1, clusters)]


@dataclass(frozen=True)
class Member:
    """A further Slurm cluster of the testbed: its own slurmctld and slurmds, the testbed's slurmdbd and munge."""

    name: str
    nodes: tuple[str, ...]
    ports: Ports
    layout: Layout

    @classmethod
    def of(cls, root: Layout, data: dict[str, Any]) -> "Member":
        ports = Ports(**{**data["ports"], "slurmd": tuple(data["ports"]["slurmd"])})
        return cls(data["name"], tuple(data["nodes"]), ports, root.member(data["name"]))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "nodes": list(self.nodes), "ports": asdict(self.ports)}


def _members(layout: Layout, state: dict[str, Any] | None) -> list[Member]:
    return [Member.of(layout, m) for m in (state or {}).get("members", [])]


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "air-hpc" / "testbed"


def missing_packages(search_path: str | None = None, slurm_from_build: bool = False) -> list[str]:
    """Debian packages whose daemons or tools are not on the search path (PATH plus the sbin dirs).

    ``slurm_from_build``: Slurm's own binaries come from a checked build, so only munge, MariaDB and util-linux count.
    """
    if search_path is None:
        search_path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    needed = {b: p for b, p in REQUIRED_BINARIES.items() if not (slurm_from_build and b in SLURM_BINARIES)}
    return sorted({pkg for binary, pkg in needed.items() if not shutil.which(binary, path=search_path)})


def _system_daemon(name: str) -> str:
    """Where the system's daemon is (Debian puts them in /usr/sbin, often not on a user's PATH)."""
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])) or name


def _build_of(state: dict[str, Any] | None) -> SlurmBuild | None:
    """The Slurm build a testbed's state names (checked when it came up), or None for the system's Slurm."""
    if not state or not state.get("slurm_prefix"):
        return None
    return SlurmBuild(Path(state["slurm_prefix"]), parse_version(f"slurm {state['slurm_version']}", "testbed state"))


class Testbed:
    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, state_dir: Path | None = None) -> None:
        self.layout = Layout((state_dir or default_state_dir()).resolve())

    # ---- public operations -------------------------------------------------

    @property
    def build(self) -> SlurmBuild | None:
        """The Slurm build this testbed runs (``up --slurm-prefix``); None: the system's Slurm."""
        return _build_of(self._read_state())

    @property
    def env(self) -> dict[str, str]:
        """What a shell (``testbed env``) or a client needs to use this testbed: its slurm.conf, and with a
        build its commands first on ``PATH``."""
        build = self.build
        env = {"SLURM_CONF": str(self.layout.slurm_conf)}
        if build is not None:
            env["PATH"] = build.search_path(os.environ.get("PATH", ""))
        return env

    def client(self, **kwargs: Any) -> SlurmClient:
        build = self.build
        return SlurmClient(env=self.env, bin_dir=build.bin_dir if build else None, **kwargs)

    def clusters(self) -> list[dict[str, str]]:
        """Every Slurm cluster of the testbed, as a cluster profile lists them (``cluster.clusters``): its name,
        slurm.conf and topology file; the testbed's own cluster first."""
        own = {"name": CLUSTER_NAME, "slurm_conf": str(self.layout.slurm_conf)}
        listed = [{**own, "topology_file": str(self.layout.topology_conf)}]
        for member in _members(self.layout, self._read_state()):
            lay = member.layout
            listed.append(
                {"name": member.name, "slurm_conf": str(lay.slurm_conf), "topology_file": str(lay.topology_conf)}
            )
        return listed

    def member_client(self, name: str, **kwargs: Any) -> SlurmClient:
        """A client of a further cluster through its own slurm.conf (no ``-M``): what its daemons' checks use."""
        build = self.build
        env = {**self.env, "SLURM_CONF": str(self.layout.member(name).slurm_conf)}
        return SlurmClient(env=env, bin_dir=build.bin_dir if build else None, **kwargs)

    def up(
        self,
        leaves: Sequence[int] = DEFAULT_LEAVES,
        timeout_s: float = 90.0,
        settings: Settings | None = None,
        slurm_prefix: Path | None = None,
    ) -> dict[str, Any]:
        """Start the testbed and wait until every node is idle; on one that runs, start only what is down.

        A partly running testbed keeps its live daemons and its jobs: the dead daemons start again on
        their recorded ports and ``up`` waits until every node is back in service. Nothing is cancelled.
        ``slurm_prefix``: run that Slurm build's daemons and commands, not the system's.
        """
        settings = settings or Settings()
        build = check_prefix(slurm_prefix) if slurm_prefix is not None else None
        leaves = tuple(leaves)
        if not leaves or any(n < 1 for n in leaves):
            raise TestbedError(f"--leaves {','.join(map(str, leaves))}: expected node counts >= 1, e.g. 2,4,2")
        if settings.preempt_grace_s < 0:
            raise TestbedError(f"testbed.preempt_grace_s: {settings.preempt_grace_s} must be >= 0 seconds")
        if settings.preempt_by == "qos" and not settings.tenants:
            raise TestbedError("--preempt-by qos: preemption by QOS needs the QOS tiers of --tenants")
        if settings.clusters not in (1, 2):
            raise TestbedError(f"--clusters {settings.clusters}: the testbed runs 1 or 2 clusters")
        if settings.clusters > 1 and settings.tenants:
            raise TestbedError("--clusters 2 with --tenants: the tenants are set up on one cluster only")
        state = self._read_state()
        if state and self._all_alive(state):
            self._check_same_shape(state, leaves, settings, build)
            log.info("testbed already up in %s", self.layout.root)
            return self.status()
        if state:
            self._check_same_shape(state, leaves, settings, build)
            return self._restart_down(state, timeout_s)
        self._stop_node_processes()  # job steps a crashed testbed (or an older down) left behind
        missing = missing_packages(slurm_from_build=build is not None)
        if missing:
            raise TestbedError(
                "the testbed needs Debian packages that are not installed: "
                f"apt-get install --no-install-recommends {' '.join(missing)}"
            )
        try:
            self._start(leaves, timeout_s, settings, build)
        except TestbedError as exc:
            log.warning("testbed start failed (%s); retrying once on fresh ports", exc)
            self._start(leaves, timeout_s, settings, build)
        return self.status()

    def down(self, timeout_s: float = 30.0) -> list[Daemon]:
        """Stop every daemon ``up`` started and every process of the nodes: job steps (slurmstepd) included."""
        state = self._read_state()
        if not state:
            self._stop_node_processes(timeout_s)
            return []
        daemons = [Daemon(**d) for d in state["daemons"]]
        self._cancel_jobs(daemons)
        for member in _members(self.layout, state):
            self._cancel_jobs(daemons, member.name)
        stopped = self._stop_daemons(daemons, timeout_s)
        self._stop_node_processes(timeout_s)
        self.layout.state_json.unlink(missing_ok=True)
        return stopped

    def _stop_daemons(self, daemons: Sequence[Daemon], timeout_s: float) -> list[Daemon]:
        """TERM, then KILL, each daemon with its children, the last started first; returns those that ran."""
        stopped: list[Daemon] = []
        for daemon in reversed(daemons):
            proc = daemon.process()
            if proc is None:
                continue
            family = [*proc.children(recursive=True), proc]
            for p in family:
                with contextlib.suppress(psutil.Error):
                    p.terminate()
            _, alive = psutil.wait_procs(family, timeout=timeout_s / 2)
            for p in alive:
                with contextlib.suppress(psutil.Error):
                    p.kill()
            psutil.wait_procs(alive, timeout=timeout_s / 2)
            stopped.append(daemon)
        return stopped

    def node_processes(self) -> list[psutil.Process]:
        """Every process inside this testbed's node namespaces: slurmd, slurmstepd, the jobs' tasks.

        Each slurmd runs in its own mount namespace with this testbed's hosts file bound on /etc/hosts,
        and everything it starts inherits that: a process whose /etc/hosts is this very file is ours.
        """
        try:
            ours = os.stat(self.layout.hosts)
        except FileNotFoundError:
            return []
        return namespace_members(_hosts_file, (ours.st_dev, ours.st_ino))

    def _stop_node_processes(self, timeout_s: float = 30.0) -> None:
        """TERM, then KILL, whatever still runs in this testbed's node namespaces."""
        procs = self.node_processes()
        if not procs:
            return
        log.info("stopping %d process(es) left in the testbed's nodes: %s", len(procs), [p.pid for p in procs])
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        _, alive = psutil.wait_procs(procs, timeout=min(5.0, timeout_s / 2))
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(alive, timeout=timeout_s / 2)

    def status(self) -> dict[str, Any]:
        state = self._read_state()
        if not state:
            return {"state_dir": str(self.layout.root), "up": False, "daemons": {}, "nodes": {}}
        daemons = {d["name"]: {"pid": d["pid"], "alive": Daemon(**d).process() is not None} for d in state["daemons"]}
        nodes: dict[str, str] = {}
        members = _members(self.layout, state)
        member_nodes: dict[str, dict[str, str]] = {m.name: {} for m in members}
        if all(d["alive"] for d in daemons.values()):
            nodes = fetch_sinfo_states(self.client(retries=0))
            for m in members:
                member_nodes[m.name] = fetch_sinfo_states(self.member_client(m.name, retries=0))
        return {
            "state_dir": str(self.layout.root),
            "up": all(d["alive"] for d in daemons.values()),
            "slurm_version": state.get("slurm_version"),
            "slurm_prefix": state.get("slurm_prefix"),
            "slurm_conf": str(self.layout.slurm_conf),
            "topology_conf": str(self.layout.topology_conf),
            "leaves": state["leaves"],
            "settings": {**asdict(Settings()), **state.get("settings", {})},
            "ports": state["ports"],
            "daemons": daemons,
            "nodes": nodes,
            "clusters": [
                {**listed, "nodes": nodes if listed["name"] == CLUSTER_NAME else member_nodes[listed["name"]]}
                for listed in self.clusters()
            ],
        }

    # ---- start-up ------------------------------------------------------------

    def _start(self, leaves: tuple[int, ...], timeout_s: float, settings: Settings, build: SlurmBuild | None) -> None:
        lay = self.layout
        fabric = fat_tree(leaves)
        nodes = list(fabric.nodes)
        too_deep = conf.step_socket_overflow(lay, nodes)
        if too_deep:
            raise TestbedError(too_deep)
        for directory in (lay.etc, lay.run, lay.log, lay.spool, lay.ctld_state, lay.munge_dir):
            directory.mkdir(parents=True, exist_ok=True)
        lay.root.chmod(0o755)
        lay.munge_dir.chmod(0o711)
        further = [list(fat_tree(leaves, MEMBER_NODE_PREFIX).nodes) for _ in member_names(settings.clusters)]
        numbers = free_ports(3 + len(nodes) + sum(1 + len(n) for n in further))
        ports = Ports(
            slurmctld=numbers[0], slurmdbd=numbers[1], mariadb=numbers[2], slurmd=tuple(numbers[3:][: len(nodes)])
        )
        lay.slurm_conf.write_text(conf.slurm_conf(lay, ports, nodes, socket.gethostname(), CLUSTER_NAME, settings))
        members = []
        taken = 3 + len(nodes)
        for name, member_nodes in zip(member_names(settings.clusters), further, strict=True):
            own = numbers[taken : taken + 1 + len(member_nodes)]
            taken += len(own)
            member_ports = replace(ports, slurmctld=own[0], slurmd=tuple(own[1:]))
            members.append(self._write_member(name, member_nodes, member_ports, leaves, settings))
        lay.slurmdbd_conf.write_text(conf.slurmdbd_conf(lay, ports))
        lay.slurmdbd_conf.chmod(0o600)
        lay.cgroup_conf.write_text(conf.cgroup_conf())
        lay.topology_conf.write_text(treeconf.render(fabric, header="Written by air-hpc testbed up."))
        lay.hosts.write_text(conf.hosts_file([*nodes, *(n for m in members for n in m.nodes)], socket.gethostname()))
        state: dict[str, Any] = {
            "leaves": list(leaves),
            "settings": asdict(settings),
            "nodes": nodes,
            "ports": asdict(ports),
            "slurm_prefix": str(build.prefix) if build else None,
            "slurm_version": str(build.version if build else daemon_version(_system_daemon("slurmctld"))),
            "daemons": [],
            "members": [m.to_json() for m in members],
        }
        deadline = time.monotonic() + timeout_s
        try:
            for name in _start_order(nodes, members):
                self._launch(state, name, ports, deadline)
            self._wait_nodes(state, deadline, in_service=False)
            if settings.tenants:
                tenants.apply(self.client(), len(nodes), getpass.getuser(), settings.preempt_grace_s)
        except BaseException:
            # Stop what this start began, without cancelling anything: a job slurmctld recovered stays queued.
            self._stop_daemons([Daemon(**d) for d in state["daemons"]], 30.0)
            self._stop_node_processes()
            self.layout.state_json.unlink(missing_ok=True)
            raise

    def _write_member(
        self, name: str, nodes: list[str], ports: Ports, leaves: tuple[int, ...], settings: Settings
    ) -> Member:
        """A further cluster's slurm.conf, cgroup.conf and topology.conf under ``ROOT/NAME/etc``."""
        lay = self.layout.member(name)
        for directory in (lay.etc, lay.run, lay.log, lay.spool, lay.ctld_state):
            directory.mkdir(parents=True, exist_ok=True)
        lay.root.chmod(0o755)
        lay.slurm_conf.write_text(conf.slurm_conf(lay, ports, nodes, socket.gethostname(), name, settings))
        lay.cgroup_conf.write_text(conf.cgroup_conf())
        fabric = fat_tree(leaves, MEMBER_NODE_PREFIX)
        lay.topology_conf.write_text(treeconf.render(fabric, header=f"Written by air-hpc testbed up (cluster {name})."))
        return Member(name, tuple(nodes), ports, lay)

    def _launch(self, state: dict[str, Any], name: str, ports: Ports, deadline: float) -> None:
        """Start one daemon of the testbed on its port and wait until it listens (slurmd: registers later)."""
        lay = self.layout
        build = _build_of(state)
        daemon = build.daemon if build else str
        if "/" in name:  # a further cluster's: CLUSTER/slurmctld, CLUSTER/slurmd-NODE
            cluster, _, what = name.partition("/")
            member = next(m for m in _members(lay, state) if m.name == cluster)
            if what == "slurmctld":
                argv = [daemon("slurmctld"), "-D", "-i", "-f", str(member.layout.slurm_conf)]
                self._start_daemon(state, name, argv, log_name=f"{cluster}-slurmctld")
                _wait_port(member.ports.slurmctld, deadline, name, member.layout.log / "slurmctld.log")
            else:
                node = what.removeprefix("slurmd-")
                (member.layout.spool / node).mkdir(exist_ok=True)
                argv = self._slurmd_argv(node, daemon("slurmd"), member.layout.slurm_conf)
                self._start_daemon(state, name, argv, log_name=f"{cluster}-{what}")
            return
        if name == "munged":
            self._start_munge(state)
        elif name == "mariadbd":
            self._start_mariadb(state, ports, deadline)
        elif name == "slurmdbd":
            self._start_daemon(state, "slurmdbd", [daemon("slurmdbd"), "-D"], env={"SLURM_CONF": str(lay.slurm_conf)})
            _wait_port(ports.slurmdbd, deadline, "slurmdbd", lay.log / "slurmdbd.log")
        elif name == "slurmctld":
            self._start_daemon(state, "slurmctld", [daemon("slurmctld"), "-D", "-i", "-f", str(lay.slurm_conf)])
            _wait_port(ports.slurmctld, deadline, "slurmctld", lay.log / "slurmctld.log")
        else:
            node = name.removeprefix("slurmd-")
            (lay.spool / node).mkdir(exist_ok=True)
            # The private mount namespace gets a hosts file naming every node, so the node's
            # own hostname and its peers (MASTER_ADDR inside jobs) resolve to loopback.
            self._start_daemon(state, name, self._slurmd_argv(node, daemon("slurmd")))

    def _restart_down(self, state: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Start again, on their recorded ports and configuration, only the daemons that are down.

        The live ones and every job are left alone (slurmctld recovers its jobs from its state files,
        a restarted slurmd finds its running steps); nothing is cancelled to come up.
        """
        down = [d["name"] for d in state["daemons"] if Daemon(**d).process() is None]
        log.warning("testbed in %s is partly running; restarting %s", self.layout.root, ", ".join(down))
        recorded = state["ports"]
        ports = Ports(**{**recorded, "slurmd": tuple(recorded["slurmd"])})
        deadline = time.monotonic() + timeout_s
        if "munged" in down:
            self.layout.munge_socket.unlink(missing_ok=True)  # the dead munged's socket would read as up
        for name in [n for n in _start_order(state["nodes"], _members(self.layout, state)) if n in down]:
            self._launch(state, name, ports, deadline)
        self._wait_nodes(state, deadline, in_service=True)
        return self.status()

    def _check_same_shape(
        self, state: dict[str, Any], leaves: tuple[int, ...], settings: Settings, build: SlurmBuild | None
    ) -> None:
        if tuple(state["leaves"]) != leaves:
            raise TestbedError(
                f"testbed in {self.layout.root} is already up with leaves "
                f"{','.join(map(str, state['leaves']))}; run `air-hpc testbed down` first"
            )
        running = _build_of(state)
        if running != build:
            raise TestbedError(
                f"testbed in {self.layout.root} is already up with "
                f"{f'Slurm {running.version} from {running.prefix}' if running else 'the system Slurm'}; "
                "run `air-hpc testbed down` first"
            )
        if {**asdict(Settings()), **state.get("settings", {})} != asdict(settings):
            raise TestbedError(
                f"testbed in {self.layout.root} is already up with settings {state.get('settings')}; "
                "run `air-hpc testbed down` first"
            )

    def _slurmd_argv(self, name: str, slurmd: str, slurm_conf: Path | None = None) -> list[str]:
        lay = self.layout
        return [
            "unshare",
            "--uts",
            "--mount",
            "--",
            "sh",
            "-c",
            'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"',
            "sh",
            name,
            str(lay.hosts),
            slurmd,
            "-D",
            "-N",
            name,
            "-f",
            str(slurm_conf or lay.slurm_conf),
        ]

    # ---- node faults ---------------------------------------------------------------

    def kill_node(self, name: str) -> list[int]:
        """Kill node ``name`` as a power loss would: its slurmd and every job process it started, at once.

        Its processes are those in the node's private UTS namespace, which only they share. Returns the PIDs killed.
        """
        proc = self._node_daemon(name).process()
        if proc is None:
            raise TestbedError(f"slurmd of {name} is not running")
        family = namespace_members(_uts_namespace, _uts_namespace(proc.pid))  # slurmd itself included
        for p in family:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(family, timeout=10)
        log.info("killed node %s: pids %s", name, [p.pid for p in family])
        return [p.pid for p in family]

    def restart_node(self, name: str, timeout_s: float = 60.0) -> None:
        """Start node ``name``'s slurmd again after :meth:`kill_node`; returns once the node is back in service."""
        state = self._read_state()
        if not state:
            raise TestbedError(f"no testbed in {self.layout.root}")
        if self._node_daemon(name).process() is None:
            build = _build_of(state)
            self._start_daemon(
                state, f"slurmd-{name}", self._slurmd_argv(name, build.daemon("slurmd") if build else "slurmd")
            )
        deadline = time.monotonic() + timeout_s
        client = self.client(retries=0, timeout_s=5)
        while time.monotonic() < deadline:
            with contextlib.suppress(SlurmError):
                if fetch_sinfo_states(client).get(name, "").rstrip("*~#") in {"idle", "allocated", "mixed"}:
                    return
            time.sleep(0.5)
        raise TestbedError(f"node {name} did not return to service in {timeout_s:g} s")

    def _node_daemon(self, name: str) -> Daemon:
        state = self._read_state() or {"daemons": []}
        for d in state["daemons"]:
            if d["name"] == f"slurmd-{name}":
                return Daemon(**d)
        raise TestbedError(f"no node {name} in the testbed in {self.layout.root}")

    def _start_munge(self, state: dict[str, Any]) -> None:
        lay = self.layout
        if not lay.munge_key.exists():
            _check_call(["mungekey", "--create", f"--keyfile={lay.munge_key}"], "mungekey")
        lay.munge_key.chmod(0o600)
        self._start_daemon(
            state,
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={lay.munge_socket}",
                f"--key-file={lay.munge_key}",
                f"--pid-file={lay.pid_file('munged-own')}",
                f"--log-file={lay.log / 'munged.log'}",
                f"--seed-file={lay.munge_dir / 'munged.seed'}",
            ],
        )
        deadline = time.monotonic() + 10
        while not lay.munge_socket.exists():
            if time.monotonic() > deadline:
                raise TestbedError(f"munged did not create {lay.munge_socket}; see {lay.log / 'munged.log'}")
            time.sleep(0.05)

    def _start_mariadb(self, state: dict[str, Any], ports: Ports, deadline: float) -> None:
        lay = self.layout
        if not (lay.mariadb_dir / "mysql").is_dir():
            _check_call(
                [
                    "mariadb-install-db",
                    "--no-defaults",
                    f"--datadir={lay.mariadb_dir}",
                    "--user=root",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                    "--skip-name-resolve",
                ],
                "mariadb-install-db",
            )
        # Grant tables are skipped: the server listens on loopback only and holds nothing but this
        # testbed's accounting records, which spares slurmdbd a user and password.
        self._start_daemon(
            state,
            "mariadbd",
            [
                "mariadbd",
                "--no-defaults",
                f"--datadir={lay.mariadb_dir}",
                f"--socket={lay.mariadb_socket}",
                f"--port={ports.mariadb}",
                "--bind-address=127.0.0.1",
                "--user=root",
                "--skip-grant-tables",
                "--skip-name-resolve",
                f"--pid-file={lay.pid_file('mariadbd-own')}",
                f"--log-error={lay.log / 'mariadbd.log'}",
                "--innodb-buffer-pool-size=16M",
                "--performance-schema=OFF",
                "--innodb-flush-log-at-trx-commit=2",
            ],
        )
        _wait_port(ports.mariadb, deadline, "mariadbd", lay.log / "mariadbd.log")

    def _start_daemon(
        self,
        state: dict[str, Any],
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        log_name: str | None = None,
    ) -> None:
        """Start ``name`` and record it in the state file, in place of its earlier (dead) record."""
        log_path = self.layout.log / f"{log_name or name}.out"
        with log_path.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )
        daemon = Daemon(name=name, pid=proc.pid, create_time=psutil.Process(proc.pid).create_time())
        order = _start_order(state["nodes"], _members(self.layout, state))
        others = [d for d in state["daemons"] if d["name"] != name]
        state["daemons"] = sorted([*others, asdict(daemon)], key=lambda d: order.index(d["name"]))
        self._write_state(state)
        log.info("started %s (pid %d)", name, proc.pid)

    def _wait_nodes(self, state: dict[str, Any], deadline: float, in_service: bool) -> None:
        """Until every node is idle (a fresh start) or in service, running jobs included (a restart)."""
        client = self.client(retries=0, timeout_s=5)
        wanted = IN_SERVICE if in_service else frozenset({"idle"})
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            dead = [d["name"] for d in state["daemons"] if Daemon(**d).process() is None]
            if dead:
                raise TestbedError(f"{', '.join(dead)} exited during start-up; see {self.layout.log}/{dead[0]}.out")
            try:
                states = fetch_sinfo_states(client)
                for member in _members(self.layout, state):  # node names differ between the clusters
                    states.update(fetch_sinfo_states(self.member_client(member.name, retries=0, timeout_s=5)))
            except SlurmError:
                states = {}
            every = [*state["nodes"], *(n for m in _members(self.layout, state) for n in m.nodes)]
            if states and all(states.get(n, "").rstrip("~#") in wanted for n in every):
                return
            time.sleep(0.5)
        raise TestbedError(
            f"nodes did not {'return to service' if in_service else 'become idle'} in time: "
            f"{states or 'no answer from slurmctld'}; see logs in {self.layout.log}"
        )

    # ---- helpers ---------------------------------------------------------------

    def _cancel_jobs(self, daemons: list[Daemon], cluster: str | None = None) -> None:
        ctld = next((d for d in daemons if d.name == (f"{cluster}/slurmctld" if cluster else "slurmctld")), None)
        if ctld is None or ctld.process() is None:
            return
        client = (
            self.member_client(cluster, retries=0, timeout_s=10) if cluster else self.client(retries=0, timeout_s=10)
        )
        try:
            client.run(["scancel", "--full", "--user", "root"], check=False)
        except SlurmError as exc:
            log.warning("could not cancel jobs before stopping: %s", exc)

    def _all_alive(self, state: dict[str, Any]) -> bool:
        return bool(state["daemons"]) and all(Daemon(**d).process() is not None for d in state["daemons"])

    def _read_state(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self.layout.state_json.read_text())
            return data
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise TestbedError(f"{self.layout.state_json}: unreadable testbed state ({exc})") from None

    def _write_state(self, state: dict[str, Any]) -> None:
        tmp = self.layout.state_json.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.layout.state_json)


def _start_order(nodes: Sequence[str], members: Sequence[Member] = ()) -> list[str]:
    """The daemons in the order they start (each needs the ones before it); ``down`` stops them in reverse.

    A further cluster's controller and nodes come last, as ``CLUSTER/slurmctld`` and ``CLUSTER/slurmd-NODE``.
    """
    further = [f"{m.name}/{d}" for m in members for d in ("slurmctld", *(f"slurmd-{n}" for n in m.nodes))]
    return ["munged", "mariadbd", "slurmdbd", "slurmctld", *(f"slurmd-{n}" for n in nodes), *further]


def namespace_members(key: Callable[[int], object], wanted: object) -> list[psutil.Process]:
    """Every other process whose ``key(pid)`` is ``wanted``: the one search of a node's, or the testbed's, processes.

    slurmstepd daemonizes out of slurmd's process tree, so the tree misses job steps; a namespace
    the testbed gave the node (``key``: its UTS namespace, or the hosts file bound in its mount
    namespace) holds all of them, whatever their PIDs. Processes that end or deny access are skipped.
    """
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):
            if proc.pid != os.getpid() and key(proc.pid) == wanted:
                found.append(proc)
    return found


def _uts_namespace(pid: int) -> str:
    """The process's UTS namespace (``uts:[4026532]``): each node's slurmd gets its own, with the node's hostname."""
    return os.readlink(f"/proc/{pid}/ns/uts")


def _hosts_file(pid: int) -> tuple[int, int]:
    """Device and inode of the process's /etc/hosts: the testbed's own file in every node's mount namespace."""
    seen = os.stat(f"/proc/{pid}/root/etc/hosts")
    return seen.st_dev, seen.st_ino


def _check_call(argv: list[str], what: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode:
        raise TestbedError(f"{what} failed (exit {result.returncode}): {result.stderr.strip()[-500:]}")


def _wait_port(port: int, deadline: float, what: str, log_path: Path) -> None:
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TestbedError(f"{what} did not listen on 127.0.0.1:{port} in time; see {log_path}")
