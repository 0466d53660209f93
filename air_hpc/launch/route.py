"""Routing a job across Slurm clusters (``submit --clusters a,b``): ask each, pick one, say why.

Each cluster is asked through the one :class:`~air_hpc.slurm.client.SlurmClient`, aimed at it
(:meth:`~air_hpc.slurm.client.SlurmClient.on_cluster`: ``-M NAME``, with the cluster's own
slurm.conf where the profile names one): the job is planned on that cluster's fabric and live
nodes (:func:`~air_hpc.launch.plan.plan`), and ``sbatch --test-only`` says when it would start
and on which nodes. How good those nodes are is measured on that cluster's topology file
(:func:`quality`). :func:`decide` is pure over the answers; the rule is in its docstring.
"""

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from air_hpc.config.models import JobConfig, SlurmClusterConfig
from air_hpc.errors import AirHpcError, ConfigError, RouteError, TopologyError
from air_hpc.launch.plan import plan
from air_hpc.slurm import hostlist
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.jobs import slurm_epoch
from air_hpc.topology import files
from air_hpc.topology.block_select import select_blocks
from air_hpc.topology.blocks import BlockModel, aggregate_level
from air_hpc.topology.fabric import Fabric
from air_hpc.topology.select import select_nodes
from air_hpc.topology.treeconf import BlockTopology

log = logging.getLogger(__name__)

#: Expected starts this close to the soonest count as the same start: then the better nodes win.
ROUTE_TIE_S = 60.0
#: Longest one cluster's answers may take, retries included: a cluster that does not answer is skipped.
ASK_DEADLINE_S = 10.0


@dataclass(frozen=True)
class Quality:
    """How well the nodes a cluster would give fit its fabric: lower is better."""

    kind: Literal["tree", "block"]
    level: int
    """Tree: level of the lowest switch joining the nodes (0: one leaf switch). Block: the aggregate level
    holding them (0: one base block, an NVLink domain)."""
    units: int
    """Leaf switches (tree) or base blocks (block) the nodes span."""
    best_level: int
    """The lowest ``level`` this job can have on this fabric, every node free."""

    @property
    def acceptable(self) -> bool:
        """No higher in the fabric than the job needs with every node free."""
        return self.level <= self.best_level

    def key(self) -> tuple[int, int]:
        return self.level, self.units

    def describe(self) -> str:
        what = "leaf switch(es)" if self.kind == "tree" else "block(s)"
        return f"{self.units} {what}, level {self.level} (best possible {self.best_level})"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "level": self.level, "units": self.units, "best_level": self.best_level}


@dataclass(frozen=True)
class ClusterAnswer:
    """What one cluster said about the job: when and where it would start, or why it did not answer."""

    cluster: str
    start_s: float | None = None
    """Expected start (epoch seconds) from ``sbatch --test-only``; None: the cluster did not answer."""
    nodelist: str = ""
    quality: Quality | None = None
    """None: not measured (no topology file for the cluster, or nodes outside it)."""
    error: str | None = None

    @property
    def answered(self) -> bool:
        return self.start_s is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "start": None if self.start_s is None else _clock(self.start_s),
            "nodelist": self.nodelist,
            "quality": None if self.quality is None else self.quality.to_json(),
            "error": self.error,
        }


@dataclass(frozen=True)
class RouteDecision:
    cluster: str
    reason: str
    answers: tuple[ClusterAnswer, ...]

    @property
    def skipped(self) -> tuple[ClusterAnswer, ...]:
        return tuple(a for a in self.answers if not a.answered)


def _clock(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch_s))


def decide(answers: Sequence[ClusterAnswer], tie_s: float = ROUTE_TIE_S) -> RouteDecision:
    """The cluster to submit to, and why. Pure.

    The rule: among the clusters that answered, those whose nodes are of acceptable quality
    (:attr:`Quality.acceptable`: no higher in the fabric than the job needs with every node
    free; unmeasured counts as acceptable) are the candidates; when none is, every cluster that
    answered is. The job goes where it starts soonest; starts within ``tie_s`` of the soonest
    count as one, and among those the better nodes win (lower level, then fewer leaves or
    blocks; measured before unmeasured), then the order the clusters were given in.
    :class:`~air_hpc.errors.RouteError` when no cluster answered.
    """
    answered = [a for a in answers if a.answered]
    if not answered:
        why = "; ".join(f"{a.cluster}: {a.error or 'no answer'}" for a in answers)
        raise RouteError(f"--clusters: no cluster answered ({why}); nothing submitted")
    fit = [a for a in answered if a.quality is None or a.quality.acceptable]
    candidates = fit or answered
    soonest = min(a.start_s for a in candidates if a.start_s is not None)
    order = {a.cluster: i for i, a in enumerate(answers)}

    def rank(a: ClusterAnswer) -> tuple[bool, tuple[int, int], int]:
        measured = a.quality is not None
        return not measured, a.quality.key() if a.quality is not None else (0, 0), order[a.cluster]

    tied = [a for a in candidates if a.start_s is not None and a.start_s <= soonest + tie_s]
    chosen = min(tied, key=rank)
    return RouteDecision(chosen.cluster, _reason(chosen, answers, tied, bool(fit), tie_s), tuple(answers))


def _reason(
    chosen: ClusterAnswer, answers: Sequence[ClusterAnswer], tied: Sequence[ClusterAnswer], any_fit: bool, tie_s: float
) -> str:
    """One sentence: why ``chosen``, and what each other cluster offered."""
    assert chosen.start_s is not None
    nodes = chosen.quality.describe() if chosen.quality is not None else "topology not measured"
    head = f"{chosen.cluster}: starts soonest ({_clock(chosen.start_s)} on {chosen.nodelist}; {nodes})"
    if len(tied) > 1:
        head = f"{chosen.cluster}: best nodes among those starting within {tie_s:g} s of the soonest " + head[
            len(chosen.cluster) + 2 :
        ].replace("starts soonest ", "")
    if not any_fit:
        head += "; no cluster offers nodes of acceptable quality, so the soonest start decides"
    others = []
    for a in answers:
        if a.cluster == chosen.cluster:
            continue
        if a.start_s is None:
            others.append(f"{a.cluster}: skipped ({a.error or 'no answer'})")
            continue
        later = a.start_s - chosen.start_s
        when = f"starts {later:+.0f} s later" if later > 0 else f"starts {_clock(a.start_s)}"
        worse = "" if a.quality is None else f"; {a.quality.describe()}"
        unfit = "" if a.quality is None or a.quality.acceptable else " (nodes higher in the fabric than needed)"
        others.append(f"{a.cluster}: {when}{worse}{unfit}")
    return head + ("; " + "; ".join(others) if others else "")


def quality(topology: Fabric | BlockTopology, nodelist: str, count: int) -> Quality | None:
    """How well ``nodelist`` fits ``topology``, for a job of ``count`` nodes; None when a node is not in it."""
    try:
        nodes = hostlist.expand(nodelist, "sbatch --test-only nodes")
    except AirHpcError:
        return None
    if not nodes:
        return None
    if isinstance(topology, BlockTopology):
        model = BlockModel(topology)
        if any(n not in model.block_of for n in nodes):
            return None
        blocks = {model.block_of[n] for n in nodes}
        try:
            best = select_blocks(model, set(model.block_of), count)
            best_level = aggregate_level([model.names.index(b) for b in best.blocks])
        except TopologyError:
            best_level = model.top_level
        return Quality("block", aggregate_level(blocks), len(blocks), best_level)
    leaf_of = {node: leaf for leaf in topology.leaves for node in topology.switches[leaf].nodes}
    if any(n not in leaf_of for n in nodes):
        return None
    leaves = list(dict.fromkeys(leaf_of[n] for n in nodes))
    try:
        best_selection = select_nodes(topology, set(topology.nodes), count)
        best_level = topology.switches[best_selection.top_switch].level
    except TopologyError:
        best_level = topology.height
    return Quality("tree", _joining_level(topology, leaves), len(leaves), best_level)


def _joining_level(fabric: Fabric, leaves: Sequence[str]) -> int:
    """Level of the lowest switch above every leaf in ``leaves``; the fabric's height when none joins them."""
    common = set(fabric.ancestors(leaves[0]))
    for leaf in leaves[1:]:
        common &= set(fabric.ancestors(leaf))
    return min((fabric.switches[s].level for s in common), default=fabric.height)


def members(job: JobConfig, names: Sequence[str], client: SlurmClient) -> list[SlurmClusterConfig]:
    """The clusters ``--clusters`` names, as the profile lists them; an unknown name is a ConfigError naming the known.

    A profile that lists no clusters reaches any cluster its slurmdbd knows (``sacctmgr show clusters``) with ``-M``.
    """
    wanted = list(dict.fromkeys(n.strip() for n in names if n.strip()))
    if not wanted:
        raise ConfigError("--clusters: expected cluster names, e.g. --clusters a,b")
    listed = {c.name: c for c in job.cluster.clusters}
    if listed:
        known, where = list(listed), f"cluster profile {job.cluster.name!r} (cluster.clusters)"
    else:
        known, where = list(client.cluster_names()), "slurmdbd (sacctmgr show clusters)"
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ConfigError(f"--clusters: unknown cluster {unknown[0]!r}; {where} knows {', '.join(known) or 'none'}")
    return [listed.get(n) or SlurmClusterConfig(name=n) for n in wanted]


def for_cluster(job: JobConfig, member: SlurmClusterConfig) -> JobConfig:
    """The job as submitted to ``member``: that cluster's topology file where it has its own."""
    if member.topology_file is None:
        return job
    return job.model_copy(update={"cluster": job.cluster.model_copy(update={"topology_file": member.topology_file})})


def client_for(client: SlurmClient, member: SlurmClusterConfig) -> SlurmClient:
    return client.on_cluster(member.name, member.slurm_conf)


Asker = Callable[[JobConfig, SlurmClient], tuple[str, str]]
"""Plans the job on a cluster and returns (expected start, nodelist) from ``sbatch --test-only``."""


def planned_start(python: str | None = None, dependency: str | None = None) -> Asker:
    """What ``submit`` asks each cluster: the job planned there (its fabric, its free nodes), then
    ``sbatch --test-only`` of the rendered script."""

    def asker(job: JobConfig, client: SlurmClient) -> tuple[str, str]:
        planned = plan(job, client, python=python, test_only=True, dependency=dependency)
        if planned.test_only is None:
            raise RouteError(planned.notes[-1] if planned.notes else "sbatch --test-only gave no answer")
        return planned.test_only.start, planned.test_only.nodelist

    return asker


def ask(job: JobConfig, member: SlurmClusterConfig, client: SlurmClient, test_only: Asker) -> ClusterAnswer:
    """One cluster's answer; a cluster that does not answer (or refuses the job) is an answer with its error."""
    bound = client_for(client, member)
    bound.deadline_s = min(bound.deadline_s, ASK_DEADLINE_S)
    there = for_cluster(job, member)
    try:
        start, nodelist = test_only(there, bound)
    except AirHpcError as exc:
        return ClusterAnswer(member.name, error=_first_line(exc))
    start_s = slurm_epoch(start)
    if start_s is None:
        return ClusterAnswer(member.name, error=f"sbatch --test-only gave no start time ({start!r})")
    measured = None
    topo = there.cluster.topology_file if there.placement.topology_aware else None
    if topo is not None:
        measured = _measure(topo, nodelist, job.resources.nodes + job.resources.spare_nodes)
    return ClusterAnswer(member.name, float(start_s), nodelist, measured)


def _measure(topo: Path, nodelist: str, count: int) -> Quality | None:
    try:
        topology = files.read_topology(topo.read_text(), str(topo))
    except (OSError, AirHpcError) as exc:
        log.warning("cannot measure the nodes against %s: %s", topo, exc)
        return None
    return quality(topology, nodelist, count)


def _first_line(exc: BaseException) -> str:
    """Slurm's own words for why a cluster did not answer, on one line, without our command line
    (``sbatch --clusters=b ... failed (exit 1): sbatch: error: 'b' can't be reached now, ...``)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    last = lines[-1] if lines else type(exc).__name__
    words = last.rpartition("error: ")[2] or last
    return " ".join(words.split())


def route(
    job: JobConfig, names: Sequence[str], client: SlurmClient, test_only: Asker, warn: Callable[[str], None]
) -> tuple[RouteDecision, SlurmClusterConfig]:
    """Ask every named cluster, skip (with ``warn``) those that do not answer, and decide."""
    chosen_from = members(job, names, client)
    answers = [ask(job, member, client, test_only) for member in chosen_from]
    for answer in answers:
        if not answer.answered:
            warn(f"cluster {answer.cluster} skipped: {answer.error}")
    decision = decide(answers)
    return decision, next(m for m in chosen_from if m.name == decision.cluster)


def check_routable(executor: str, what: Literal["job", "sweep"], after: str | None = None) -> None:
    """Refuse ``--clusters`` where a route cannot hold (ConfigError, exit 2), before any cluster is asked: only our
    own ``sbatch`` executor routes (submitit and local jobs do not take ``-M``), and a Slurm dependency (``--after``,
    the job id it waits for) holds within one cluster only."""
    if executor != "slurm":
        raise ConfigError(f"--clusters: only --executor slurm routes a {what} across clusters (not {executor})")
    if after is not None:
        raise ConfigError(
            "--clusters with --after: a Slurm dependency holds within one cluster only; submit to the cluster of the "
            "job it waits for (--clusters NAME) or drop --after"
        )


@dataclass(frozen=True)
class Routed:
    """Where ``--clusters`` sends a job (or a sweep's one array): the decision, the cluster chosen and the client
    aimed at it, and the job asked about as submitted there."""

    decision: RouteDecision
    member: SlurmClusterConfig
    client: SlurmClient
    job: JobConfig

    def aim(self, job: JobConfig) -> JobConfig:
        """Another job (a sweep's other elements) as submitted to the chosen cluster."""
        return for_cluster(job, self.member)


def route_job(
    job: JobConfig, names: Sequence[str], client: SlurmClient, test_only: Asker, warn: Callable[[str], None]
) -> Routed:
    """``submit --clusters`` and ``sweep --clusters``: ask every named cluster about ``job`` (:func:`route`), then aim
    the job and the client at the cluster chosen. Check :func:`check_routable` first."""
    decision, member = route(job, names, client, test_only, warn)
    return Routed(decision, member, client_for(client, member), for_cluster(job, member))
