"""What this cluster cannot honour in a job, and what it lacks for resilient training at all.

Pure functions of :class:`ClusterFacts` (and a :class:`JobConfig`), so every
rule is tested with recorded ``scontrol`` text. ``error`` findings are things
Slurm would refuse or silently not do; ``warning`` findings cost time or
work when they bite (a preemption with no grace time, no accounting).
"""

import difflib
from dataclasses import asdict, dataclass
from typing import Literal

from air_hpc.config.fit import partition_fit
from air_hpc.config.models import JobConfig
from air_hpc.errors import InputError, TopologyError
from air_hpc.exitcodes import REQUEUE_WORTHY
from air_hpc.slurm import hostlist
from air_hpc.slurm.cluster import ClusterFacts, Partition
from air_hpc.topology import files

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Finding:
    severity: Severity
    key: str
    """The job key (``resources.nodes``) or cluster setting (``PreemptMode``) it concerns."""
    message: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    def describe(self) -> str:
        return f"{self.severity:<7}  {self.key}: {self.message}"


def _preempt_mode(facts: ClusterFacts, part: Partition | None) -> str:
    mode = (part.preempt_mode if part and part.preempt_mode else None) or facts.settings.preempt_mode
    return mode.upper()


def cluster_findings(facts: ClusterFacts, partition: str | None = None) -> list[Finding]:
    """What the cluster itself lacks for preemption-proof training (no job needed)."""
    return [*_requeue_findings(facts), *_topology_findings(facts), *_preemption_findings(facts, partition)]


def _requeue_findings(facts: ClusterFacts) -> list[Finding]:
    """Accounting (to see a job after it leaves the queue) and exit codes Slurm would requeue a second time."""
    s = facts.settings
    found: list[Finding] = []
    if not facts.accounting.available:
        found.append(
            Finding(
                "warning",
                "AccountingStorageType",
                f"{facts.accounting.detail}; `air-hpc status` loses a job once it leaves the queue, "
                "and --executor submitit cannot tell a cancelled job from a running one",
            )
        )
    for key, codes, what in (
        ("RequeueExit", s.requeue_exit, "requeues it too"),
        ("RequeueExitHold", s.requeue_exit_hold, "requeues it held, until someone releases it"),
    ):
        ours = sorted(set(codes) & {int(c) for c in REQUEUE_WORTHY})
        if ours:
            found.append(
                Finding(
                    "warning",
                    key,
                    f"lists exit code(s) {', '.join(map(str, ours))}, which air-hpc's batch script exits with after "
                    f"requeueing the job itself; Slurm then {what}",
                )
            )
    return found


def _topology_findings(facts: ClusterFacts) -> list[Finding]:
    """A topology file air-hpc cannot read, or no topology plugin at all."""
    found: list[Finding] = []
    if facts.topology.file is not None:
        try:
            files.read_any(facts.topology.file.read_text(), str(facts.topology.file))
        except (OSError, TopologyError) as exc:
            found.append(Finding("warning", "topology file", f"air-hpc cannot use the cluster's: {exc}"))
    if facts.settings.topology_plugin is None:
        found.append(
            Finding(
                "warning",
                "TopologyPlugin",
                "no topology plugin: --switches is ignored, so jobs may span leaf switches",
            )
        )
    return found


def _preemption_findings(facts: ClusterFacts, partition: str | None) -> list[Finding]:
    """Per partition: a preemption mode that cancels, or no grace time to checkpoint in."""
    found: list[Finding] = []
    parts = [p for p in facts.partitions if partition is None or p.name == partition]
    for part in parts:
        mode = _preempt_mode(facts, part)
        if not facts.settings.preemption_enabled or mode == "OFF":
            continue
        where = f"partition {part.name}"
        if "CANCEL" in mode:
            found.append(
                Finding(
                    "warning",
                    "PreemptMode",
                    f"{where}: PreemptMode={mode}: a preempted job is cancelled, not requeued; resubmit to resume",
                )
            )
        if part.grace_time_s == 0 and ("REQUEUE" in mode or "CANCEL" in mode):
            found.append(
                Finding(
                    "warning",
                    "GraceTime",
                    f"{where}: GraceTime=0: a preempted job is killed at once, with no time to checkpoint; "
                    "it resumes from its last periodic checkpoint",
                )
            )
    return found


def job_findings(job: JobConfig, facts: ClusterFacts) -> list[Finding]:
    """What in ``job`` this cluster cannot honour, checked before any GPU hour is spent.

    Complements :func:`cluster_findings` for the job's partition (shown beside it).
    """
    found: list[Finding] = []
    wanted = job.cluster.partition
    part = facts.partition(wanted)
    if part is None:
        names = [p.name for p in facts.partitions]
        close = difflib.get_close_matches(wanted or "", names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        what = f"partition {wanted!r} does not exist" if wanted else "no partition given and the cluster has no default"
        found.append(Finding("error", "cluster.partition", f"{what}{hint} (partitions: {', '.join(names) or 'none'})"))
        return [*found, *_cluster_wide(job, facts)]
    found += _partition_fit(job, facts, part)
    return [*found, *_cluster_wide(job, facts), *_preemption_fit(job, facts, part)]


def _partition_fit(job: JobConfig, facts: ClusterFacts, part: Partition) -> list[Finding]:
    """The partition's limits, then (where sinfo described its nodes) whether enough nodes fit one task set."""
    found = _partition_limits(job, part)
    if part.groups:
        found += _node_fit(job, part)
    return found


def _partition_limits(job: JobConfig, part: Partition) -> list[Finding]:
    """State, MaxTime and the node-count limits of the partition."""
    found: list[Finding] = []
    r = job.resources
    name = f"partition {part.name}"
    if part.state.upper() != "UP":
        found.append(Finding("error", "cluster.partition", f"{name} is {part.state}: it starts no jobs"))
    if part.max_time_min is not None and r.time_limit_min > part.max_time_min:
        found.append(
            Finding(
                "error",
                "resources.time_limit_min",
                f"{r.time_limit_min} min is over {name}'s MaxTime of {part.max_time_min} min",
            )
        )
    if r.nodes > part.total_nodes:
        found.append(Finding("error", "resources.nodes", f"{r.nodes} nodes but {name} has {part.total_nodes}"))
    if part.max_nodes is not None and r.nodes > part.max_nodes:
        found.append(
            Finding("error", "resources.nodes", f"{r.nodes} nodes is over {name}'s MaxNodes of {part.max_nodes}")
        )
    if r.nodes < part.min_nodes:
        found.append(
            Finding("error", "resources.nodes", f"{r.nodes} nodes is under {name}'s MinNodes of {part.min_nodes}")
        )
    return found


def _node_fit(job: JobConfig, part: Partition) -> list[Finding]:
    """Whether the partition's nodes have the CPUs, memory and GPUs one node of the job needs, and enough do."""
    return [Finding("error", misfit.key, misfit.message) for misfit in partition_fit(job, part)]


def _cluster_wide(job: JobConfig, facts: ClusterFacts) -> list[Finding]:
    found: list[Finding] = []
    s = facts.settings
    restarts = job.resilience.max_restarts
    if s.max_batch_requeue is not None and restarts > s.max_batch_requeue:
        found.append(
            Finding(
                "error",
                "resilience.max_restarts",
                f"{restarts} requeues allowed, but Slurm holds a job after MaxBatchRequeue={s.max_batch_requeue}",
            )
        )
    account = job.cluster.account
    if (
        account
        and facts.accounting.available
        and facts.accounting.accounts
        and account not in facts.accounting.accounts
    ):
        found.append(
            Finding(
                "error",
                "cluster.account",
                f"{account!r} is not one of {facts.user}'s accounts ({', '.join(facts.accounting.accounts)})",
            )
        )
    part = facts.partition(job.cluster.partition)
    if account and part and part.allow_accounts is not None and account not in part.allow_accounts:
        found.append(
            Finding(
                "error",
                "cluster.account",
                f"partition {part.name} allows only accounts {', '.join(part.allow_accounts)}, not {account!r}",
            )
        )
    if job.placement.topology_aware and job.cluster.topology_file is not None:
        found += _topology_fit(job, part)
    return found


def _topology_fit(job: JobConfig, part: Partition | None) -> list[Finding]:
    """The job's topology file must parse, and the nodes it picks from must be nodes the partition gives."""
    topo = job.cluster.topology_file
    key = "cluster.topology_file"
    if topo is None:
        return []
    try:
        fabric = files.read_any(topo.read_text(), str(topo))
    except OSError as exc:
        return [Finding("error", key, f"{topo}: cannot read: {exc.strerror or exc}")]
    except TopologyError as exc:
        return [Finding("error", key, str(exc))]
    if part is None or not part.nodes or part.nodes.strip().lower() in ("(null)", "none"):
        return []
    try:
        in_partition = set(hostlist.expand(part.nodes, f"partition {part.name} Nodes"))
    except InputError:
        return []
    outside = sorted(set(fabric.nodes) - in_partition)
    usable = len(set(fabric.nodes) & in_partition)
    if usable < job.resources.nodes:
        return [
            Finding(
                "error",
                key,
                f"only {usable} of its {len(fabric.nodes)} nodes are in partition {part.name} "
                f"({job.resources.nodes} needed); is it this cluster's topology?",
            )
        ]
    if outside:
        return [
            Finding(
                "warning",
                key,
                f"{len(outside)} of its nodes are not in partition {part.name} ({hostlist.compress(outside)}): "
                "a selection that picks them is refused by Slurm",
            )
        ]
    return []


def _preemption_fit(job: JobConfig, facts: ClusterFacts, part: Partition) -> list[Finding]:
    s = facts.settings
    mode = _preempt_mode(facts, part)
    if not s.preemption_enabled or mode == "OFF":
        return []
    found: list[Finding] = []
    signal = job.resilience.signal
    lead = job.resilience.signal_lead_s
    name = f"partition {part.name}"
    if "REQUEUE" in mode or "CANCEL" in mode:
        if 0 < part.grace_time_s < lead:
            found.append(
                Finding(
                    "warning",
                    "resilience.signal_lead_s",
                    f"{name}: a preempted job gets GraceTime={part.grace_time_s} s to save, less than the "
                    f"{lead} s this job allows before its time limit",
                )
            )
        if not s.preempt_send_user_signal and signal != "TERM":
            found.append(
                Finding(
                    "warning",
                    "resilience.signal",
                    f"preemption sends SIGTERM, not SIG{signal} (SlurmctldParameters lacks preempt_send_user_signal); "
                    f"the ranks stop and save on SIGTERM too, within {name}'s GraceTime={part.grace_time_s} s",
                )
            )
    return found
