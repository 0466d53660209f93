"""Pure renderers of the Slurm, slurmdbd and cgroup configuration of the daemons the testbed starts.

One slurm.conf writer (:func:`render_slurm_conf`) over one loopback base (:func:`loopback_controller`)
serves both the testbed's cluster (:func:`slurm_conf`) and the CLOUD-node controller (:func:`cloud_slurm_conf`).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from air_hpc.runtime.rendezvous import MASTER_PORT_SPAN
from air_hpc.slurm import hostlist

#: Fixed node resources, applied by slurmd through ``SlurmdParameters=config_overrides``
#: so every emulated node looks the same whatever the host has.
NODE_CPUS = 4
NODE_MEMORY_MB = 4096
#: How long a requeued job must wait before it may start again (Slurm: 120 s by default).
CRED_EXPIRE_S = 5
#: The default partition (training jobs) and the one whose jobs preempt it, on the same nodes.
BATCH_PARTITION = "batch"
URGENT_PARTITION = "urgent"


@dataclass(frozen=True)
class Settings:
    """The testbed's own settings (``testbed.*``), fixed at ``up``."""

    __test__ = False  # not a pytest test class

    preempt_grace_s: int = 30
    """``testbed.preempt_grace_s``: GraceTime of the ``batch`` partition: between Slurm's SIGTERM to a
    preempted job and its kill."""
    preempt_send_user_signal: bool = False
    """``testbed.preempt_send_user_signal``: Slurm sends a preempted job its ``--signal`` instead of SIGTERM."""
    tenants: bool = False
    """``testbed.tenants``: accounts, users, QOS tiers, node quotas and fair-share in slurmdbd, enforced
    (:mod:`air_hpc.testbed.tenants`)."""
    clusters: int = 1
    """``testbed.clusters``: Slurm clusters (1 or 2), each its own slurmctld and slurmds, all registered in the
    one slurmdbd (Slurm's multi-cluster operation: ``-M NAME`` reaches any of them)."""
    preempt_by: Literal["partition", "qos"] = "partition"
    """``testbed.preempt_by``: what lets a job preempt another: its partition's PriorityTier (``urgent`` over
    ``batch``, ``preempt/partition_prio``) or its QOS (``high`` over ``scavenger``, ``preempt/qos``; needs tenants)."""


#: What a testbed with tenants adds to slurm.conf: accounts, limits and QOS enforced, and priority from
#: fair-share, QOS and age (the decay half-life short enough that minutes of testbed usage count).
TENANT_SETTINGS = {
    "AccountingStorageEnforce": "associations,limits,qos",
    "PriorityType": "priority/multifactor",
    "PriorityWeightFairshare": "10000",
    "PriorityWeightQOS": "100000",
    "PriorityWeightAge": "1000",
    "PriorityWeightJobSize": "0",
    "PriorityWeightPartition": "0",
    "PriorityDecayHalfLife": "00:10:00",
    "PriorityCalcPeriod": "1",
    "PriorityMaxAge": "00:10:00",
}


@dataclass(frozen=True)
class Ports:
    slurmctld: int
    slurmdbd: int
    mariadb: int
    slurmd: tuple[int, ...]


#: The first line of every slurm.conf that ``testbed up`` writes: how a ``$SLURM_CONF`` is known for a testbed's.
TESTBED_CONF_HEADER = "Written by air-hpc testbed up; every daemon listens on loopback only."


@dataclass(frozen=True)
class Layout:
    """Every path the testbed writes, all under one state directory."""

    root: Path
    shared: Path | None = None
    """A further cluster's layout: the testbed's own root, whose munge (and slurmdbd) it shares."""

    def member(self, cluster: str) -> "Layout":
        """Where a further cluster of this testbed keeps its own files (``up --clusters 2``): ``ROOT/CLUSTER``."""
        return Layout(self.root / cluster, shared=self.root)

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def slurmdbd_conf(self) -> Path:
        return self.etc / "slurmdbd.conf"

    @property
    def topology_conf(self) -> Path:
        return self.etc / "topology.conf"

    @property
    def hosts(self) -> Path:
        """Every node of the testbed, its further clusters' too: one file, bound on /etc/hosts in every node."""
        return (self.shared or self.root) / "etc" / "hosts"

    @property
    def cgroup_conf(self) -> Path:
        return self.etc / "cgroup.conf"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def ctld_state(self) -> Path:
        return self.root / "ctld-state"

    @property
    def munge_dir(self) -> Path:
        return (self.shared or self.root) / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def munge_key(self) -> Path:
        return self.munge_dir / "munge.key"

    @property
    def mariadb_dir(self) -> Path:
        return self.root / "mariadb"

    @property
    def mariadb_socket(self) -> Path:
        return self.run / "mariadb.sock"

    @property
    def state_json(self) -> Path:
        return self.root / "testbed.json"

    def pid_file(self, daemon: str) -> Path:
        return self.run / f"{daemon}.pid"


#: A Unix socket path holds at most 107 bytes (sun_path is 108 with its NUL).
UNIX_PATH_MAX = 107
#: The longest name slurmd gives a step's socket in a node's spool: ``<node>_<job id>.<step id>``, the job id
#: at most 8 digits (MaxJobId 67043328) and the batch step's id 4294967291.
_STEP_SOCKET = "{node}_99999999.4294967291"


def step_socket_overflow(layout: Layout, nodes: Sequence[str]) -> str | None:
    """Why ``layout`` is too deep for slurmd's step sockets (a job would fail to launch and be held), or None."""
    node = max(nodes, key=len)
    longest = str(layout.spool / node / _STEP_SOCKET.format(node=node))
    if len(longest) <= UNIX_PATH_MAX:
        return None
    room = len(str(layout.root)) - (len(longest) - UNIX_PATH_MAX)
    return (
        f"testbed state dir {layout.root} is too long for slurmd's step sockets ({longest!r} is {len(longest)} "
        f"bytes, a Unix socket path holds {UNIX_PATH_MAX}); use a --state-dir of at most {room} characters"
    )


def loopback_controller(cluster: str, ctld_host: str, ctld_port: int) -> dict[str, str]:
    """What every slurm.conf we write shares: a controller (and its slurmds) on loopback only, run as root.

    ``SlurmctldHost`` must be the machine's real hostname; ``CommunicationParameters`` keeps the daemons
    off other addresses when that name resolves to 127.x. No cgroups, MPI or job completion records;
    the ``topology/tree`` plugin, so switch-aware placement is Slurm's own.
    """
    return {
        "ClusterName": cluster,
        "SlurmctldHost": f"{ctld_host}(127.0.0.1)",
        "SlurmctldPort": str(ctld_port),
        "SlurmUser": "root",
        "CommunicationParameters": "NoCtldInAddrAny,NoInAddrAny",
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "MpiDefault": "none",
        "SelectType": "select/cons_tres",
        "TopologyPlugin": "topology/tree",
        "ReturnToService": "2",
        "JobCompType": "jobcomp/none",
    }


def testbed_of(slurm_conf: Path) -> Path | None:
    """The state directory of the testbed whose ``etc/slurm.conf`` this is, or None for any other file."""
    if slurm_conf.name != "slurm.conf" or slurm_conf.parent.name != "etc":
        return None
    try:
        with slurm_conf.open(encoding="utf-8", errors="replace") as stream:
            first = stream.readline()
    except OSError:
        return None
    return slurm_conf.parent.parent if first.rstrip("\n") == f"# {TESTBED_CONF_HEADER}" else None


def render_slurm_conf(settings: Mapping[str, str], lines: Sequence[str], header: str) -> str:
    """The one slurm.conf writer: a comment, one ``key=value`` line per setting, then ``lines`` (nodes, partitions)."""
    return "\n".join([f"# {header}", *(f"{key}={value}" for key, value in settings.items()), *lines]) + "\n"


#: The first line of a further cluster's slurm.conf (``up --clusters 2``): not the testbed's own ``$SLURM_CONF``.
MEMBER_CONF_HEADER = "Written by air-hpc testbed up for a further cluster of the testbed; loopback only."


def slurm_conf(
    layout: Layout, ports: Ports, nodes: list[str], ctld_host: str, cluster: str, settings: Settings | None = None
) -> str:
    """slurm.conf of the testbed's cluster; a further cluster's (``layout.shared`` set) differs only in its own
    ports, nodes and files, and its accounting goes to the testbed's one slurmdbd (``ports.slurmdbd``)."""
    settings = settings or Settings()
    auth = f"socket={layout.munge_socket},cred_expire={CRED_EXPIRE_S}"
    values = {
        **loopback_controller(cluster, ctld_host, ports.slurmctld),
        # Testbeds side by side start at different job ids, so ports derived from the job id
        # (MASTER_PORT) do not collide between their jobs on this one host.
        "FirstJobId": str(first_job_id(ports.slurmctld)),
        "SlurmdUser": "root",
        "AuthType": "auth/munge",
        "AuthInfo": auth,
        "CredType": "cred/munge",
        "StateSaveLocation": str(layout.ctld_state),
        "SlurmdSpoolDir": f"{layout.spool}/%n",
        "SlurmctldPidFile": str(layout.pid_file("slurmctld-own")),
        "SlurmdPidFile": f"{layout.run}/slurmd-%n-own.pid",
        "SlurmctldLogFile": f"{layout.log}/slurmctld.log",
        "SlurmdLogFile": f"{layout.log}/slurmd-%n.log",
        "SlurmctldDebug": "info",
        "SlurmdDebug": "info",
        "JobAcctGatherType": "jobacct_gather/none",
        "SwitchType": "switch/none",
        "SelectTypeParameters": "CR_CPU",
        "SchedulerType": "sched/backfill",
        "SchedulerParameters": "sched_interval=2,bf_interval=2",
        "SlurmdParameters": "config_overrides",
        "JobRequeue": "1",
        **preemption(settings),
        "MinJobAge": "300",
        "KillWait": "5",
        "UnkillableStepTimeout": "30",
        "SlurmctldTimeout": "30",
        "SlurmdTimeout": "60",
        "MessageTimeout": "10",
        "InactiveLimit": "0",
        "AccountingStorageType": "accounting_storage/slurmdbd",
        "AccountingStorageHost": "127.0.0.1",
        "AccountingStoragePort": str(ports.slurmdbd),
        "AccountingStoragePass": str(layout.munge_socket),
        "MailProg": "/bin/true",
        **(TENANT_SETTINGS if settings.tenants else {}),
    }
    lines = [
        f"NodeName={name} NodeHostname={ctld_host} NodeAddr=127.0.0.1 Port={port} "
        f"CPUs={NODE_CPUS} RealMemory={NODE_MEMORY_MB} State=UNKNOWN"
        for name, port in zip(nodes, ports.slurmd, strict=True)
    ]
    lines.append(
        f"PartitionName={BATCH_PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 "
        f"PreemptMode=REQUEUE GraceTime={settings.preempt_grace_s}"
    )
    lines.append(
        f"PartitionName={URGENT_PARTITION} Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF"
    )
    return render_slurm_conf(values, lines, MEMBER_CONF_HEADER if layout.shared else TESTBED_CONF_HEADER)


def preemption(settings: Settings) -> dict[str, str]:
    """A job in `urgent` preempts jobs in `batch` (or, preempting by QOS, `high` preempts `scavenger`):
    SIGCONT+SIGTERM (or the job's --signal), GraceTime, kill, and Slurm requeues it."""
    return {
        "PreemptType": f"preempt/{'qos' if settings.preempt_by == 'qos' else 'partition_prio'}",
        "PreemptMode": "REQUEUE",
        **({"SlurmctldParameters": "preempt_send_user_signal"} if settings.preempt_send_user_signal else {}),
    }


def cloud_slurm_conf(
    workdir: Path,
    nodes: Sequence[str],
    ctld_host: str,
    ports: Sequence[int],
    extra: Sequence[str] = (),
    topology_plugin: str = "topology/tree",
) -> str:
    """slurm.conf for a controller whose nodes are all power-saved CLOUD nodes on a topology/tree (or block) fabric.

    ``ports``: the controller's and the (never started) slurmds'. ``extra``: further lines (settings
    the base leaves unset, more nodes or partitions).
    """
    values = {
        **loopback_controller("topocloud", ctld_host, ports[0]),
        "TopologyPlugin": topology_plugin,
        "SlurmdPort": str(ports[1]),
        "AuthType": "auth/none",
        "CredType": "cred/none",
        "StateSaveLocation": str(workdir / "state"),
        "SlurmdSpoolDir": str(workdir / "spool"),
        "SlurmctldPidFile": str(workdir / "slurmctld.pid"),
        "SlurmctldLogFile": str(workdir / "slurmctld.log"),
        "SlurmctldDebug": "error",
        "SelectTypeParameters": "CR_Core",
        "SchedulerType": "sched/builtin",
        "SuspendProgram": "/bin/true",
        "ResumeProgram": "/bin/true",
        "SuspendTime": "3600",
        "ResumeTimeout": "600",
        "PrivateData": "cloud",
        "AccountingStorageType": "accounting_storage/none",
    }
    lines = [
        f"NodeName={hostlist.compress(nodes)} CPUs=1 State=CLOUD",
        "PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        *extra,
    ]
    return render_slurm_conf(values, lines, "Written by air-hpc's CLOUD-node controller; it listens on loopback only.")


def first_job_id(ctld_port: int) -> int:
    """Blocks of 1000 ids inside one MASTER_PORT span, so two testbeds' derived ports differ."""
    return 1 + 1000 * (ctld_port % (MASTER_PORT_SPAN // 1000))


def slurmdbd_conf(layout: Layout, ports: Ports) -> str:
    return (
        "\n".join(
            [
                "# Written by air-hpc testbed up.",
                "AuthType=auth/munge",
                f"AuthInfo=socket={layout.munge_socket}",
                "DbdHost=localhost",
                "DbdAddr=127.0.0.1",
                f"DbdPort={ports.slurmdbd}",
                "SlurmUser=root",
                f"PidFile={layout.pid_file('slurmdbd-own')}",
                f"LogFile={layout.log}/slurmdbd.log",
                "DebugLevel=info",
                "StorageType=accounting_storage/mysql",
                "StorageHost=127.0.0.1",
                f"StoragePort={ports.mariadb}",
                "StorageUser=root",
                "StorageLoc=slurm_acct_db",
            ]
        )
        + "\n"
    )


def cgroup_conf() -> str:
    return "# slurmd always loads a cgroup plugin; v1 works without systemd here.\nCgroupPlugin=cgroup/v1\n"


def hosts_file(nodes: list[str], real_host: str) -> str:
    """/etc/hosts for inside the node namespaces: every emulated node is loopback."""
    names = " ".join(dict.fromkeys([*nodes, real_host]))
    return f"127.0.0.1 localhost {names}\n::1 localhost ip6-localhost ip6-loopback\n"
