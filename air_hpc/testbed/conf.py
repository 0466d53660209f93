"""Pure renderers of the testbed's Slurm, slurmdbd and cgroup configuration."""

from dataclasses import dataclass
from pathlib import Path

from air_hpc.render.spec import MASTER_PORT_SPAN

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


@dataclass(frozen=True)
class Ports:
    slurmctld: int
    slurmdbd: int
    mariadb: int
    slurmd: tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """Every path the testbed writes, all under one state directory."""

    root: Path

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
        return self.etc / "hosts"

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
        return self.root / "munge"

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


def slurm_conf(
    layout: Layout, ports: Ports, nodes: list[str], ctld_host: str, cluster: str, settings: Settings | None = None
) -> str:
    settings = settings or Settings()
    auth = f"socket={layout.munge_socket},cred_expire={CRED_EXPIRE_S}"
    lines = [
        "# Written by air-hpc testbed up; every daemon listens on loopback only.",
        f"ClusterName={cluster}",
        f"SlurmctldHost={ctld_host}(127.0.0.1)",
        f"SlurmctldPort={ports.slurmctld}",
        # Testbeds side by side start at different job ids, so ports derived from the job id
        # (MASTER_PORT) do not collide between their jobs on this one host.
        f"FirstJobId={first_job_id(ports.slurmctld)}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"AuthInfo={auth}",
        "CredType=cred/munge",
        "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny",
        f"StateSaveLocation={layout.ctld_state}",
        f"SlurmdSpoolDir={layout.spool}/%n",
        f"SlurmctldPidFile={layout.pid_file('slurmctld-own')}",
        f"SlurmdPidFile={layout.run}/slurmd-%n-own.pid",
        f"SlurmctldLogFile={layout.log}/slurmctld.log",
        f"SlurmdLogFile={layout.log}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=sched_interval=2,bf_interval=2",
        "TopologyPlugin=topology/tree",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "JobRequeue=1",
        # A job in `urgent` preempts jobs in `batch`: SIGCONT+SIGTERM, GraceTime, kill, and Slurm requeues it.
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        *(["SlurmctldParameters=preempt_send_user_signal"] if settings.preempt_send_user_signal else []),
        "MinJobAge=300",
        "KillWait=5",
        "UnkillableStepTimeout=30",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=60",
        "MessageTimeout=10",
        "InactiveLimit=0",
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=127.0.0.1",
        f"AccountingStoragePort={ports.slurmdbd}",
        f"AccountingStoragePass={layout.munge_socket}",
        "JobCompType=jobcomp/none",
        "MailProg=/bin/true",
    ]
    for name, port in zip(nodes, ports.slurmd, strict=True):
        lines.append(
            f"NodeName={name} NodeHostname={ctld_host} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={NODE_CPUS} RealMemory={NODE_MEMORY_MB} State=UNKNOWN"
        )
    lines.append(
        f"PartitionName={BATCH_PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 "
        f"PreemptMode=REQUEUE GraceTime={settings.preempt_grace_s}"
    )
    lines.append(
        f"PartitionName={URGENT_PARTITION} Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF"
    )
    return "\n".join(lines) + "\n"


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
