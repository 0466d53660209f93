"""Plan a run: the node request (from the topology file, live node state and bad nodes), the rendered script.

A plan is what ``render`` prints and what ``submit --dry-run`` checks with
``sbatch --test-only``; nothing here writes the run directory or submits. The
choice of nodes itself is :mod:`air_hpc.topology.request`'s; this module reads
its inputs (the topology file, the run's bad-node list, the controller's node
state) and renders the result.
"""

import contextlib
import logging
import tempfile
from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path

import hostlist

from air_hpc.config.fit import Misfit, job_partition, partition_fit
from air_hpc.config.models import JobConfig
from air_hpc.errors import ConfigError, SlurmError, SlurmUnreachableError
from air_hpc.health.badnodes import read_bad_nodes
from air_hpc.records import names
from air_hpc.records.rundir import RunDir
from air_hpc.render import SbatchSpec, build_spec, render_script
from air_hpc.slurm.client import ONCE, SlurmClient
from air_hpc.slurm.jobs import TestOnlyResult
from air_hpc.slurm.nodes import fetch_node_states
from air_hpc.slurm.survey import partitions_with_nodes
from air_hpc.slurm.version import REQUEUE_EXPEDITE_FROM, SlurmVersion, parse_version
from air_hpc.topology import files
from air_hpc.topology.request import NodeRequest, check_cluster_size, count_only, request_nodes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    """A rendered, not yet submitted job."""

    job: JobConfig
    request: NodeRequest
    spec: SbatchSpec
    script: str
    test_only: TestOnlyResult | None = None
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class LiveCluster:
    """What the controller said that the node request reads: free and out-of-service nodes, its release."""

    available: Set[str] | None = None
    """Nodes free now (None: not asked; every node counts as free)."""
    out_of_service: frozenset[str] = frozenset()
    version: SlurmVersion | None = None
    """The controller's release (``cluster.slurm_version``, else ``scontrol --version``); None: not known."""


def node_request(job: JobConfig, live: LiveCluster | None = None) -> tuple[NodeRequest, tuple[str, ...]]:
    """Nodes and rank order for the job, and notes on what was decided.

    Topology-aware when ``placement.topology_aware`` and the cluster names a
    ``topology_file``: pick nodes on the fewest switches from the available ones
    (default: every node in the file), minus the run's bad nodes, in the ways the
    controller's release accepts. Otherwise only the node count goes to Slurm.
    """
    live = live or LiveCluster(version=profile_version(job))
    bad = read_bad_nodes(RunDir.of(job).bad_nodes)
    topo = job.cluster.topology_file
    if not job.placement.topology_aware or topo is None:
        return count_only(bad, "placement.topology_aware is false" if topo else "the cluster has no topology_file")
    try:
        text = topo.read_text()
    except OSError as exc:
        raise ConfigError(f"cluster.topology_file: cannot read {topo}: {exc.strerror or exc}") from None
    topology = files.read_topology(text, str(topo))
    return request_nodes(
        job, topology, str(topo), live.available, bad, version=live.version, out_of_service=live.out_of_service
    )


def profile_version(job: JobConfig) -> SlurmVersion | None:
    """The release the cluster profile records (``cluster.slurm_version``, checked when the job loaded)."""
    recorded = job.cluster.slurm_version
    return None if recorded is None else parse_version(f"slurm {recorded}", "cluster.slurm_version")


def release(job: JobConfig, client: SlurmClient, notes: list[str]) -> SlurmVersion | None:
    """The controller's release: ``cluster.slurm_version``, else ``scontrol --version``; unknown is a note."""
    version = profile_version(job)
    if version is None:
        try:
            version = client.version(retry=ONCE)
        except SlurmError as exc:
            notes.append(f"Slurm release unknown ({str(exc).splitlines()[0] if str(exc) else exc})")
    return version


def expedite_allowed(version: SlurmVersion | None, client: SlurmClient, notes: list[str]) -> bool:
    """Whether this controller takes ``--requeue=expedite``: 25.11 or later with ``enable_expedited_requeue``."""
    if version is None or version < REQUEUE_EXPEDITE_FROM:
        return False
    try:
        return client.settings(retry=ONCE).expedited_requeue
    except SlurmError as exc:
        notes.append(f"expedited requeue not used: cannot read SlurmctldParameters ({exc})")
        return False


def ask_live(job: JobConfig, client: SlurmClient, notes: list[str]) -> LiveCluster:
    """The node states and release for a topology-aware request; an unreachable controller becomes a note."""
    version = release(job, client, notes)
    try:
        states = fetch_node_states(client)
    except SlurmUnreachableError as exc:
        notes.append(f"live node state unavailable ({exc}); assuming every node is free")
        return LiveCluster(version=version)
    return LiveCluster(set(states.available), states.out_of_service, version)


def plan(
    job: JobConfig,
    client: SlurmClient | None = None,
    *,
    python: str | None = None,
    test_only: bool = False,
    step_command: Sequence[str] | None = None,
    dependency: str | None = None,
    version: SlurmVersion | None = None,
    expedite: bool | None = None,
) -> Plan:
    """Choose nodes (live state when a client is given), render, and optionally ``sbatch --test-only`` it.

    ``test_only`` is skipped with a note when the controller does not answer:
    the render itself needs no cluster. ``step_command`` replaces the training
    step (tests run small payloads through the same script). ``version`` and
    ``expedite``: the controller's release and whether it takes ``--requeue=expedite``
    when the caller knows them (else asked, with a client).
    """
    live = None
    notes: list[str] = []
    if client is not None and job.placement.topology_aware and job.cluster.topology_file:
        live = ask_live(job, client, notes)
    elif client is not None and job.resources.spare_nodes:
        with contextlib.suppress(SlurmUnreachableError):
            check_cluster_size(job, len(fetch_node_states(client).all_nodes), "sinfo")
    request, request_notes = node_request(job, live)
    notes.extend(request_notes)
    if version is None:
        version = live.version if live is not None else release(job, client, notes) if client else profile_version(job)
    spec = build_spec(
        job,
        request,
        python=python,
        step_command=step_command,
        dependency=dependency,
        slurm_version=version,
        expedite=expedite if expedite is not None else client is not None and expedite_allowed(version, client, notes),
    )
    script = render_script(spec)
    checked = None
    if test_only and client is not None:
        checked = _test_only(job, request, script, client, notes)
    return Plan(job, request, spec, script, checked, tuple(notes))


def _test_only(
    job: JobConfig, request: NodeRequest, script: str, client: SlurmClient, notes: list[str]
) -> TestOnlyResult | None:
    """``sbatch --test-only`` the script; a refusal that is only a wait for drained nodes becomes a note."""
    with tempfile.TemporaryDirectory(prefix="air-hpc-") as tmp:
        path = Path(tmp) / names.SBATCH
        path.write_text(script)
        try:
            return client.sbatch_test_only(path)
        except SlurmUnreachableError as exc:
            notes.append(f"sbatch --test-only skipped: {exc}")
        except SlurmError as exc:
            waiting = waiting_for_nodes(job, request, client) if "not available" in str(exc) else None
            if waiting is None:
                misfits = partition_misfits(job, client)
                if misfits:
                    words = "\n".join(map(str, misfits))
                    raise ConfigError(f"{words}\nsbatch --test-only refused the job: {_slurm_words(exc)}") from None
                raise
            notes.append(
                f"sbatch --test-only: cannot start now; submitting anyway, the job waits in the queue "
                f"(ReqNodeNotAvail) until {waiting} (see `sinfo -R`)"
            )
    return None


def _slurm_words(exc: Exception) -> str:
    """Slurm's own reason, without our command line (``... failed (exit 1): sbatch: error: REASON``)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    last = lines[-1] if lines else type(exc).__name__
    return last.rpartition("error: ")[2] or last


def partition_misfits(job: JobConfig, client: SlurmClient) -> list[Misfit]:
    """Why the job's partition cannot hold it, in ``doctor``'s words (empty when that does not explain a refusal)."""
    try:
        part = job_partition(job, partitions_with_nodes(client))
    except SlurmError as exc:
        log.info("partitions not read to explain the refusal: %s", exc)
        return []
    return [] if part is None else partition_fit(job, part)


def waiting_for_nodes(job: JobConfig, request: NodeRequest, client: SlurmClient) -> str | None:
    """Why a refused ``--test-only`` is only a wait: nodes it needs are drained or down, not missing.

    slurmctld answers the same "Requested node configuration is not available"
    for a drained node as for an impossible request, while ``sbatch`` queues the
    former (ReqNodeNotAvail). None when the node states do not explain the refusal.
    """
    try:
        states = fetch_node_states(client)
    except SlurmError:
        return None
    if request.nodelist:
        pinned = hostlist.expand_hostlist(request.nodelist)
        held = {node: states.unavailable[node] for node in pinned if node in states.unavailable}
        if not held or not set(pinned) <= states.all_nodes:
            return None
        return f"pinned node(s) {_describe(held)} return to service"
    wanted = job.resources.nodes
    if wanted > len(states.all_nodes) or wanted <= len(states.available):
        return None
    missing = wanted - len(states.available)
    return f"{missing} more node(s) return to service (unavailable now: {_describe(dict(states.unavailable))})"


def _describe(held: dict[str, str]) -> str:
    shown = ", ".join(f"{node} ({state.lower()})" for node, state in sorted(held.items())[:8])
    return shown + (f" and {len(held) - 8} more" if len(held) > 8 else "")
