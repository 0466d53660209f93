"""What a Slurm cluster offers, as typed values: pure parsers of its read-only queries.

``air-hpc doctor`` and ``air-hpc cluster init`` start here. The parsers turn
``scontrol show config``, ``scontrol show partition --oneliner``, ``sinfo`` and
``sacctmgr`` text into typed values; :func:`air_hpc.slurm.survey.probe_cluster`
runs those commands through the one :class:`~air_hpc.slurm.client.SlurmClient`.
"""

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from air_hpc.digits import DIGITS, ascii_int
from air_hpc.errors import SlurmError

CONFIG_ARGS = ("scontrol", "show", "config")
PARTITION_ARGS = ("scontrol", "show", "partition", "--oneliner")
TOPOLOGY_ARGS = ("scontrol", "show", "topology")
#: partition | nodes | CPUs per node | memory per node (MB) | gres; sinfo groups rows of identical nodes.
SINFO_ARGS = ("sinfo", "--noheader", "--format=%R|%D|%c|%m|%G")
SACCT_PROBE_ARGS = ("sacct", "--noheader", "--parsable2", "--allocations", "--starttime=now", "--format=JobIDRaw")

#: Values Slurm prints for "not set".
_UNSET = frozenset({"", "(null)", "n/a", "none", "(null type)"})
_UNLIMITED = frozenset({"unlimited", "infinite"})
_CONFIG_LINE = re.compile(r"^(\S+)\s*=\s?(.*)$")
_CONTROLLER = re.compile(r"^Slurmctld\((\w+)\) at (\S+) is (\w+)")
_GPU_GRES = re.compile(rf"(?:^|,)gpu(?::([^:,()]+))?:({DIGITS})")
_TIME_LIMIT = re.compile(rf"(?:({DIGITS})-)?({DIGITS})(?::({DIGITS}))?(?::({DIGITS}))?")


def _unset(value: str | None) -> bool:
    return value is None or value.strip().lower() in _UNSET


def _value(raw: Mapping[str, str], key: str) -> str | None:
    value = raw.get(key)
    return None if _unset(value) else value


def parse_minutes(text: str) -> int | None:
    """A Slurm time limit in minutes; None for UNLIMITED/INFINITE.

    Accepts Slurm's forms: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``
    (seconds round up, as Slurm does).
    """
    value = text.strip()
    if value.lower() in _UNLIMITED:
        return None
    match = _TIME_LIMIT.fullmatch(value)
    if not match:
        raise SlurmError(f"cannot read the time limit {text!r}; expected e.g. 30, 2:00:00 or 1-00:00:00")
    days, first, second, third = match.groups()
    numbers = [int(first), int(second or 0), int(third or 0)]
    if days is not None:
        hours, minutes, seconds = numbers
        return int(days) * 1440 + hours * 60 + minutes + (1 if seconds else 0)
    if third is not None:
        hours, minutes, seconds = numbers
        return hours * 60 + minutes + (1 if seconds else 0)
    minutes, seconds = int(first), int(second or 0)
    return minutes + (1 if seconds else 0)


def _seconds(text: str | None) -> int | None:
    """``5 sec`` / ``300`` / ``00:05:00`` -> seconds; None when unset."""
    if text is None or _unset(text):
        return None
    word = text.split()[0]
    if (number := ascii_int(word)) is not None:
        return number
    minutes = parse_minutes(word)
    return None if minutes is None else minutes * 60


def parse_exit_codes(text: str | None) -> tuple[int, ...]:
    """``RequeueExit`` / ``RequeueExitHold`` values: ``1,3,10-12`` -> (1, 3, 10, 11, 12); unset -> ()."""
    if text is None or _unset(text):
        return ()
    codes: list[int] = []
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        low, high = ascii_int(first), ascii_int(last or first)
        if low is None or high is None or not low <= high <= 255:  # exit codes are 0-255
            raise SlurmError(f"scontrol show config: cannot read exit codes {text!r}; expected e.g. 1,3,10-12")
        codes.extend(range(low, high + 1))
    return tuple(codes)


def gpus_in_gres(gres: str) -> int:
    """GPUs per node in a gres string: ``gpu:h100:8(S:0-1)`` -> 8, ``gpu:a100:2,gpu:v100:2`` -> 4, ``(null)`` -> 0."""
    return sum(int(count) for _, count in _GPU_GRES.findall(gres))


@dataclass(frozen=True)
class SlurmSettings:
    """The controller-wide settings that decide whether a job can be placed, signalled and requeued."""

    version: str
    cluster_name: str | None
    conf_path: Path | None
    select_type: str | None
    select_type_parameters: str | None
    topology_plugin: str | None
    """None when no topology plugin is active (``topology/none``, 23.11+ ``topology/default``)."""
    topology_param: str | None
    job_requeue: bool
    """``JobRequeue=1``: jobs are requeueable unless they say ``--no-requeue`` (our script says ``--requeue``)."""
    max_batch_requeue: int | None
    """Requeues of a batch job before Slurm holds it (newer Slurm); None when this Slurm has no such limit."""
    requeue_exit: tuple[int, ...]
    """Exit codes after which Slurm itself requeues a batch job (``RequeueExit``)."""
    requeue_exit_hold: tuple[int, ...]
    """Exit codes after which Slurm requeues a batch job held (``RequeueExitHold``)."""
    preempt_type: str | None
    preempt_mode: str
    preempt_send_user_signal: bool
    """``SlurmctldParameters=preempt_send_user_signal``: preemption also sends the job's ``--signal``."""
    accounting_storage: str | None
    gres_types: tuple[str, ...]
    kill_wait_s: int | None
    controllers: tuple[tuple[str, str], ...] = ()
    """(controller role, ``UP``/``DOWN``) as ``scontrol show config`` reports them."""
    max_array_size: int | None = None
    """``MaxArraySize``: array task ids must be below it (None when not reported)."""
    expedited_requeue: bool = False
    """``SlurmctldParameters=enable_expedited_requeue`` (25.11+): else slurmctld refuses ``--requeue=expedite``."""

    @property
    def preemption_enabled(self) -> bool:
        return self.preempt_type is not None and self.preempt_mode.upper() != "OFF"

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["conf_path"] = str(self.conf_path) if self.conf_path else None
        data["controllers"] = dict(self.controllers)
        data["preemption_enabled"] = self.preemption_enabled
        return data


def parse_show_config(text: str) -> SlurmSettings:
    """Parse ``scontrol show config`` (its first section of ``Key = Value`` lines, and the controller status)."""
    raw: dict[str, str] = {}
    controllers: dict[str, str] = {}
    in_main = True
    for line in text.splitlines():
        controller = _CONTROLLER.match(line.strip())
        if controller:
            controllers[controller.group(1)] = controller.group(3)
            continue
        if not line.strip():
            in_main = in_main and not raw  # the first blank line after the settings ends the main section
            continue
        match = _CONFIG_LINE.match(line)
        if in_main and match:
            raw[match.group(1)] = match.group(2).strip()
    version = _value(raw, "SLURM_VERSION")
    if version is None:
        raise SlurmError("scontrol show config: no SLURM_VERSION line; is this the output of `scontrol show config`?")
    topology = _value(raw, "TopologyPlugin")
    if topology in ("topology/none", "topology/default"):
        topology = None
    preempt_type = _value(raw, "PreemptType")
    if preempt_type == "preempt/none":
        preempt_type = None
    params = [p.strip() for p in (_value(raw, "SlurmctldParameters") or "").split(",")]
    accounting = _value(raw, "AccountingStorageType")
    max_requeue = _value(raw, "MaxBatchRequeue")
    conf = _value(raw, "SLURM_CONF")
    return SlurmSettings(
        max_array_size=ascii_int(_value(raw, "MaxArraySize") or ""),
        version=version,
        cluster_name=_value(raw, "ClusterName"),
        conf_path=Path(conf) if conf else None,
        select_type=_value(raw, "SelectType"),
        select_type_parameters=_value(raw, "SelectTypeParameters"),
        topology_plugin=topology,
        topology_param=_value(raw, "TopologyParam"),
        job_requeue=(_value(raw, "JobRequeue") or "1") != "0",
        max_batch_requeue=ascii_int(max_requeue) if max_requeue else None,
        requeue_exit=parse_exit_codes(raw.get("RequeueExit")),
        requeue_exit_hold=parse_exit_codes(raw.get("RequeueExitHold")),
        preempt_type=preempt_type,
        preempt_mode=_value(raw, "PreemptMode") or "OFF",
        preempt_send_user_signal="preempt_send_user_signal" in params,
        expedited_requeue="enable_expedited_requeue" in params,
        accounting_storage=None if accounting == "accounting_storage/none" else accounting,
        gres_types=tuple(t for t in (_value(raw, "GresTypes") or "").split(",") if t),
        kill_wait_s=_seconds(raw.get("KillWait")),
        controllers=tuple(controllers.items()),
    )


@dataclass(frozen=True)
class NodeGroup:
    """Nodes of one partition that sinfo reports alike (same CPUs, memory and gres)."""

    nodes: int
    cpus: int
    mem_mb: int
    gres: str | None
    gpus: int


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    state: str
    max_time_min: int | None
    """None: no limit."""
    max_nodes: int | None
    min_nodes: int
    total_nodes: int
    nodes: str
    preempt_mode: str | None
    """The partition's own PreemptMode; None when it follows the cluster's."""
    grace_time_s: int
    allow_accounts: tuple[str, ...] | None
    """None: every account may use it."""
    groups: tuple[NodeGroup, ...] = ()

    @property
    def max_gpus_per_node(self) -> int:
        return max((g.gpus for g in self.groups), default=0)

    @property
    def max_cpus_per_node(self) -> int | None:
        return max((g.cpus for g in self.groups), default=None)

    @property
    def max_mem_mb(self) -> int | None:
        return max((g.mem_mb for g in self.groups), default=None)

    def nodes_with(self, gpus: int = 0, cpus: int = 0, mem_mb: int = 0) -> int:
        """How many of its nodes have at least this much of each."""
        return sum(g.nodes for g in self.groups if g.gpus >= gpus and g.cpus >= cpus and g.mem_mb >= mem_mb)

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["max_gpus_per_node"] = self.max_gpus_per_node
        return data


def _pairs(record: str) -> dict[str, str]:
    return dict(word.partition("=")[::2] for word in record.split() if "=" in word)


def _limit(text: str | None) -> int | None:
    if text is None or text.strip().lower() in _UNLIMITED or _unset(text):
        return None
    return int(text)


def parse_partitions(text: str, source: str = "scontrol show partition") -> tuple[Partition, ...]:
    """Parse ``scontrol show partition --oneliner`` (one partition per line)."""
    partitions = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("No partitions"):
            continue
        pairs = _pairs(line)
        name = pairs.get("PartitionName")
        if not name:
            raise SlurmError(f"{source}:{number}: expected 'PartitionName=...', got {line.strip()[:80]!r}")
        try:
            max_time = parse_minutes(pairs.get("MaxTime", "UNLIMITED"))
            accounts = pairs.get("AllowAccounts", "ALL")
            partitions.append(
                Partition(
                    name=name,
                    default=pairs.get("Default", "NO").upper() == "YES",
                    state=pairs.get("State", "UNKNOWN"),
                    max_time_min=max_time,
                    max_nodes=_limit(pairs.get("MaxNodes")),
                    min_nodes=_limit(pairs.get("MinNodes")) or 0,
                    total_nodes=int(pairs.get("TotalNodes", "0")),
                    nodes=pairs.get("Nodes", ""),
                    preempt_mode=None if _unset(pairs.get("PreemptMode")) else pairs["PreemptMode"],
                    grace_time_s=int(pairs.get("GraceTime", "0")),
                    allow_accounts=None if accounts.upper() == "ALL" else tuple(accounts.split(",")),
                )
            )
        except ValueError as exc:
            raise SlurmError(f"{source}:{number}: partition {name}: {exc}") from None
    return tuple(partitions)


def parse_sinfo_groups(text: str, source: str = "sinfo") -> dict[str, tuple[NodeGroup, ...]]:
    """Parse ``sinfo --noheader --format=%R|%D|%c|%m|%G`` into node groups per partition."""
    groups: dict[str, list[NodeGroup]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.strip().split("|")
        if len(fields) != 5:
            raise SlurmError(f"{source}:{number}: expected 'PARTITION|NODES|CPUS|MEMORY|GRES', got {line.strip()!r}")
        name, nodes, cpus, mem, gres = fields
        try:
            group = NodeGroup(
                nodes=int(nodes),
                cpus=int(cpus.rstrip("+")),
                mem_mb=int(mem.rstrip("+")),
                gres=None if _unset(gres) else gres,
                gpus=gpus_in_gres(gres),
            )
        except ValueError:
            raise SlurmError(
                f"{source}:{number}: expected numbers of nodes, CPUs and MB, got {line.strip()!r}"
            ) from None
        groups.setdefault(name, []).append(group)
    return {name: tuple(found) for name, found in groups.items()}


def parse_default_account(text: str) -> str | None:
    """``sacctmgr --noheader --parsable2 show user NAME format=User,DefaultAccount`` -> the default account."""
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) >= 2 and fields[1]:
            return fields[1]
    return None


def parse_accounts(text: str) -> tuple[str, ...]:
    """``sacctmgr --noheader --parsable2 show assoc where user=NAME format=Account`` -> the accounts, once each."""
    found = [line.strip().split("|")[0] for line in text.splitlines() if line.strip()]
    return tuple(dict.fromkeys(a for a in found if a))


def parse_topology(text: str) -> tuple[int, int]:
    """``scontrol show topology`` -> (leaf switches or base blocks, all switches or blocks)."""
    names = [line for line in text.splitlines() if re.match(r"\s*(SwitchName|BlockName)=", line)]
    leaves = [line for line in names if "BlockName=" in line or re.search(r"\bLevel=0\b", line)]
    return len(leaves), len(names)


@dataclass(frozen=True)
class Accounting:
    available: bool
    """``sacct`` answers: status after a job left the queue, and submitit's executor, depend on it."""
    detail: str
    default_account: str | None = None
    accounts: tuple[str, ...] = ()


@dataclass(frozen=True)
class TopologyInfo:
    plugin: str | None
    file: Path | None
    """The topology.conf beside slurm.conf when this machine can read it."""
    leaves: int
    switches: int
    detail: str


@dataclass(frozen=True)
class ClusterFacts:
    settings: SlurmSettings
    partitions: tuple[Partition, ...]
    accounting: Accounting
    topology: TopologyInfo
    user: str

    def partition(self, name: str | None) -> Partition | None:
        """The named partition, or the default one when ``name`` is None."""
        for part in self.partitions:
            if (part.name == name) if name else part.default:
                return part
        return None

    def to_json(self) -> dict[str, object]:
        return {
            "user": self.user,
            "slurm": self.settings.to_json(),
            "partitions": [p.to_json() for p in self.partitions],
            "accounting": asdict(self.accounting),
            "topology": {**asdict(self.topology), "file": str(self.topology.file) if self.topology.file else None},
        }
