"""Submit a run: choose nodes, render, validate, record, then hand it to sbatch or submitit.

Three executors take the same validated job:

- ``slurm``: our rendered script through ``sbatch`` (via :class:`SlurmClient`);
  the script itself forwards the signal and requeues on the exit-code contract.
- ``submitit``: submitit's SlurmExecutor with the same resources and selection;
  submitit requeues through :class:`~air_hpc.launch.entry.TrainingEntry`'s
  ``checkpoint``, on ``resilience.signal`` like the other two. submitit runs
  ``sbatch`` itself, outside our client, with this process's environment (so
  ``SLURM_CONF`` must be exported).
- ``local``: submitit's LocalExecutor on this machine (one node).

The run directory records the resolved config (job.json), the script
(job.sbatch) and every job id (submissions.jsonl), so status, logs and
resume all start from it.
"""

import contextlib
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from air_hpc.config.models import JobConfig
from air_hpc.errors import AirHpcError, CheckpointError, ConfigError, SlurmError, SlurmUnreachableError, TopologyError
from air_hpc.exitcodes import ExitCode
from air_hpc.health.badnodes import read_bad_nodes
from air_hpc.launch.attempts import sbatch_recorded
from air_hpc.launch.local_job import ProcessIdentity, RecordExit, local_job_status
from air_hpc.launch.owner import Owner, claim
from air_hpc.launch.runs import Executor, record_submission, submissions
from air_hpc.render import NodeRequest, SbatchSpec, build_spec, job_environment, render_script
from air_hpc.render.quoting import shell_quote
from air_hpc.rundir import RunDir
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.jobs import JobState, JobStatus, TestOnlyResult
from air_hpc.topology.treeconf import BlockTopology

log = logging.getLogger(__name__)

#: Builds the picklable callable that submitit runs on every rank.
EntryFactory = Callable[[Path], Callable[[], Any]]


def default_entry(run_dir: Path) -> Callable[[], Any]:
    from air_hpc.launch.entry import TrainingEntry

    return TrainingEntry(run_dir)


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
class Submission:
    job_id: str
    executor: Executor
    run_dir: Path
    plan: Plan
    handle: Any = field(default=None, compare=False)
    """submitit's job object for the local executor."""

    def to_json(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "executor": self.executor,
            "run_dir": str(self.run_dir),
            "script": str(RunDir(self.run_dir).sbatch),
            "nodelist": self.plan.request.nodelist,
            "switches": self.plan.request.switches,
            "segment": self.plan.request.segment,
            "test_only": None
            if self.plan.test_only is None
            else {"start": self.plan.test_only.start, "nodelist": self.plan.test_only.nodelist},
        }


def node_request(job: JobConfig, available: set[str] | None = None) -> tuple[NodeRequest, tuple[str, ...]]:
    """Nodes and rank order for the job, and notes on what was decided.

    Topology-aware when ``placement.topology_aware`` and the cluster names a
    ``topology_file``: pick nodes on the fewest switches from ``available``
    (default: every node in the file), minus the run's bad nodes.
    Otherwise only the node count goes to Slurm.
    """
    from air_hpc.topology import hostlists

    run_dir = RunDir.of(job)
    bad = read_bad_nodes(run_dir.bad_nodes)
    exclude = hostlists.compress(bad) if bad else None
    topo = job.cluster.topology_file
    if not job.placement.topology_aware or topo is None:
        reason = "placement.topology_aware is false" if topo else "the cluster has no topology_file"
        return NodeRequest(exclude=exclude), (f"node count only: {reason}",)
    from air_hpc.topology import files
    from air_hpc.topology.place import place_selection
    from air_hpc.topology.select import select_nodes, select_spares

    try:
        text = topo.read_text()
    except OSError as exc:
        raise ConfigError(f"cluster.topology_file: cannot read {topo}: {exc.strerror or exc}") from None
    fabric = files.read_topology(text, str(topo))
    if isinstance(fabric, BlockTopology):
        if job.resources.spare_nodes:
            raise ConfigError(
                f"resources.spare_nodes: hot spares need a tree topology_file; {topo} is a topology/block file "
                "(set resources.spare_nodes: 0, or placement.topology_aware: false)"
            )
        return _block_request(job, fabric, available, set(bad), exclude)
    check_cluster_size(job, len(fabric.nodes), f"cluster.topology_file {topo}")
    everything = set(fabric.nodes) - set(bad)
    candidates = everything if available is None else set(available) - set(bad)
    notes: list[str] = []
    try:
        selection = select_nodes(fabric, candidates, job.resources.nodes)
        if job.resources.spare_nodes:
            # The spares belong in the same switch tree: choose them together, then the nodes among them.
            group = select_nodes(fabric, candidates, job.resources.nodes + job.resources.spare_nodes)
            selection = select_nodes(fabric, set(group.nodes), job.resources.nodes)
    except TopologyError as exc:
        if candidates == everything:
            raise
        selection = select_nodes(fabric, everything, job.resources.nodes)
        notes.append(f"not enough free nodes now ({exc}); letting Slurm wait for --switches={selection.switches_hint}")
        return NodeRequest(switches=selection.switches_hint, exclude=exclude), tuple(notes)
    notes.append(
        f"selected {selection.nodelist} on {len(selection.leaves)} leaf switch(es) "
        f"(lower bound {selection.lower_bound_leaves})"
    )
    if not job.placement.pin_nodes:
        return NodeRequest(switches=selection.switches_hint, exclude=exclude), (
            *notes,
            f"not pinned: asking Slurm for --switches={selection.switches_hint}",
        )
    placement = place_selection(
        fabric, selection, job.layout, job.resources.tasks_per_node, job.hardware.nvlink_domain_nodes
    )
    if placement.fallback:
        notes.append(f"rank order: switch order ({placement.fallback})")
    spares = select_spares(fabric, selection.nodes, candidates, job.resources.spare_nodes)
    if spares:
        notes.append(f"hot spare(s) {hostlists.compress(spares)}")
    nodelist = hostlists.compress([*selection.nodes, *spares]) if spares else selection.nodelist
    return NodeRequest(nodelist=nodelist, rank_hosts=placement.ranks, exclude=exclude, spares=spares), tuple(notes)


def check_cluster_size(job: JobConfig, cluster_nodes: int, source: str) -> None:
    """The nodes plus the hot spares must fit in the cluster at all (a bad config, not a long wait)."""
    res = job.resources
    if res.spare_nodes and res.nodes + res.spare_nodes > cluster_nodes:
        raise ConfigError(
            f"resources.spare_nodes: {res.nodes} node(s) + {res.spare_nodes} spare(s) exceed the "
            f"{cluster_nodes} node(s) of the cluster ({source}); expected at most {max(cluster_nodes - res.nodes, 0)}"
        )


def _block_request(
    job: JobConfig, topology: BlockTopology, available: set[str] | None, bad: set[str], exclude: str | None
) -> tuple[NodeRequest, tuple[str, ...]]:
    """Under topology/block: a set Slurm accepts, ``--segment`` (no ``--switches``), TP groups inside one block.

    The segment defaults to the nodes of one TP group, so every block holds whole
    TP groups and the NVLink domain map can keep each group inside its domain.
    """
    from air_hpc.topology.block_select import select_blocks
    from air_hpc.topology.blocks import BlockModel
    from air_hpc.topology.place import place

    model = BlockModel(topology)
    segment = job.placement.segment or _tp_nodes(job)
    everything = set(model.block_of) - bad
    candidates = everything if available is None else set(available) - bad
    nodes = job.resources.nodes
    try:
        selection = select_blocks(model, candidates, nodes, segment)
    except TopologyError as exc:
        if candidates == everything:
            raise
        waiting = select_blocks(model, everything, nodes, segment)
        return NodeRequest(segment=waiting.segment, exclude=exclude), (
            f"not enough free nodes now ({exc}); letting Slurm place the job under its block rules",
        )
    notes = [
        f"selected {selection.nodelist} in {len(selection.blocks)} block(s) ({','.join(selection.blocks)}) "
        f"inside an aggregate of {selection.aggregate_nodes} nodes"
    ]
    if not job.placement.pin_nodes:
        return NodeRequest(segment=selection.segment, exclude=exclude), (
            *notes,
            "not pinned: Slurm places the job under its block rules",
        )
    domains = {node: model.names[model.block_of[node]] for node in selection.nodes}
    placement = place(
        topology.to_fabric(),
        selection.nodes,
        job.layout,
        job.resources.tasks_per_node,
        job.hardware.nvlink_domain_nodes,
        nvlink_domains=domains,
    )
    if placement.fallback:
        notes.append(f"rank order: block order ({placement.fallback})")
    request = NodeRequest(
        nodelist=selection.nodelist, segment=selection.segment, rank_hosts=placement.ranks, exclude=exclude
    )
    return request, tuple(notes)


def _tp_nodes(job: JobConfig) -> int | None:
    """Nodes one TP group spans when it spans several (None otherwise)."""
    tp, per_node = job.layout.tp, job.resources.tasks_per_node
    return tp // per_node if tp > per_node and tp % per_node == 0 else None


def available_nodes(client: SlurmClient) -> set[str]:
    """Nodes the controller would allocate now."""
    from air_hpc.slurm.nodes import fetch_node_states

    return set(fetch_node_states(client).available)


def plan(
    job: JobConfig,
    client: SlurmClient | None = None,
    *,
    python: str | None = None,
    test_only: bool = False,
    step_command: Sequence[str] | None = None,
) -> Plan:
    """Choose nodes (live state when a client is given), render, and optionally ``sbatch --test-only`` it.

    ``test_only`` is skipped with a note when the controller does not answer:
    the render itself needs no cluster. ``step_command`` replaces the training
    step (tests run small payloads through the same script).
    """
    available = None
    notes: list[str] = []
    if client is not None and job.placement.topology_aware and job.cluster.topology_file:
        try:
            available = available_nodes(client)
        except SlurmUnreachableError as exc:
            notes.append(f"live node state unavailable ({exc}); assuming every node is free")
    elif client is not None and job.resources.spare_nodes:
        from air_hpc.slurm.nodes import fetch_node_states

        with contextlib.suppress(SlurmUnreachableError):
            check_cluster_size(job, len(fetch_node_states(client).all_nodes), "sinfo")
    request, request_notes = node_request(job, available)
    notes.extend(request_notes)
    spec = build_spec(job, request, python=python, step_command=step_command)
    script = render_script(spec)
    checked = None
    if test_only and client is not None:
        with tempfile.TemporaryDirectory(prefix="air-hpc-") as tmp:
            path = Path(tmp) / "job.sbatch"
            path.write_text(script)
            try:
                checked = client.sbatch_test_only(path)
            except SlurmUnreachableError as exc:
                notes.append(f"sbatch --test-only skipped: {exc}")
            except SlurmError as exc:
                waiting = waiting_for_nodes(job, request, client) if "not available" in str(exc) else None
                if waiting is None:
                    raise
                notes.append(
                    f"sbatch --test-only: cannot start now; submitting anyway, the job waits in the queue "
                    f"(ReqNodeNotAvail) until {waiting} (see `sinfo -R`)"
                )
    return Plan(job, request, spec, script, checked, tuple(notes))


def waiting_for_nodes(job: JobConfig, request: NodeRequest, client: SlurmClient) -> str | None:
    """Why a refused ``--test-only`` is only a wait: nodes it needs are drained or down, not missing.

    slurmctld answers the same "Requested node configuration is not available"
    for a drained node as for an impossible request, while ``sbatch`` queues the
    former (ReqNodeNotAvail). None when the node states do not explain the refusal.
    """
    import hostlist

    from air_hpc.slurm.nodes import fetch_node_states

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


def check_data(job: JobConfig) -> None:
    """The training data against the model, so a missing or short corpus is one line now, not a failed job."""
    from air_hpc.train.data import check_for_training

    check_for_training(job.data.path, job.model.seq_len, job.model.vocab_size)


def check_grace(job: JobConfig, client: SlurmClient) -> None:
    """Refuse a run whose measured preemption save (from its earlier starts) outlasts the partition's GraceTime."""
    from air_hpc.observe.records import load_records, longest_sync_save_s

    run_dir = RunDir.of(job)
    measured_s = longest_sync_save_s(load_records(run_dir).events)
    if measured_s is None:
        return
    from air_hpc.slurm.cluster import PARTITION_ARGS, parse_partitions

    try:
        partitions = parse_partitions(client.run(list(PARTITION_ARGS)).stdout)
    except SlurmUnreachableError as exc:
        log.warning("cannot compare the save time with the partition's GraceTime: %s", exc)
        return
    wanted = job.cluster.partition
    grace_s = next((p.grace_time_s for p in partitions if (p.name == wanted if wanted else p.default)), None)
    if grace_s and grace_s < measured_s:
        name = job.cluster.partition or "(the default partition)"
        raise ConfigError(
            f"cluster.partition: {name} gives a preempted job a GraceTime of {grace_s} s, shorter than this run's "
            f"measured checkpoint save of {measured_s:.1f} s ({run_dir.events}): a preemption would kill the save; "
            "use a partition with a longer GraceTime or make the save faster"
        )


def write_run(plan_: Plan) -> RunDir:
    """Create the run directory with the resolved config and the script (logs/ must exist before sbatch)."""
    run_dir = RunDir.of(plan_.job)
    run_dir.logs.mkdir(parents=True, exist_ok=True)
    run_dir.write_job(plan_.job)
    run_dir.sbatch.write_text(plan_.script)
    run_dir.sbatch.chmod(0o755)
    return run_dir


def submit(
    job: JobConfig,
    executor: Executor,
    client: SlurmClient,
    *,
    python: str | None = None,
    entry: EntryFactory = default_entry,
    step_command: Sequence[str] | None = None,
    force: bool = False,
) -> Submission:
    """Validate, record and submit; returns once the job has an id (use :func:`wait` to follow it).

    Refuses a run that is complete (:class:`RunComplete`, unless ``force``) and a run directory
    that another live job owns (:class:`~air_hpc.launch.owner.RunBusyError`).
    """
    if executor == "local" and job.resources.nodes != 1:
        raise ConfigError(
            f"resources.nodes: the local executor runs on one node, the job asks for {job.resources.nodes}"
        )
    final = completed_step(job)
    if final is not None and not force:
        raise RunComplete(
            f"{RunDir.of(job).path} is complete: its final checkpoint (step {final}) exists for "
            f"train.steps={job.train.steps}; nothing submitted. --force submits anyway; "
            "a higher train.steps (--set train.steps=N) continues the run"
        )
    if step_command is None:
        check_data(job)
    if executor != "local":
        check_grace(job, client)
    plan_ = plan(
        job,
        None if executor == "local" else client,
        python=python,
        test_only=executor != "local",
        step_command=step_command,
    )
    for note in plan_.notes:
        log.info("%s", note)
    with claim(RunDir.of(job), lambda owner: owner_is_live(owner, client)) as take_ownership:
        run_dir = write_run(plan_)
        handle = None
        started_s = None
        if executor == "slurm":
            job_id = sbatch_recorded(client, run_dir, plan_.spec.job_name)
        elif executor == "submitit":
            job_id = _submit_submitit_slurm(plan_, entry(run_dir.path))
        else:
            handle = _submit_local(plan_, RecordExit(entry(run_dir.path), run_dir.path))
            job_id = str(handle.job_id)
            started_s = ProcessIdentity.of(int(job_id)).started_s
        take_ownership(job_id, executor)
    if executor != "slurm":  # sbatch_recorded records its own attempt and outcome
        record_submission(run_dir, job_id, executor, pid_started_s=started_s)
    log.info("submitted job %s (%s) for run %s", job_id, executor, run_dir.path)
    return Submission(job_id, executor, run_dir.path, plan_, handle)


class RunComplete(AirHpcError):
    """The run's final checkpoint exists: there is nothing left to train."""

    exit_code = ExitCode.OK


def completed_step(job: JobConfig) -> int | None:
    """The step of the run's final checkpoint (``train.steps`` or later, passing the size check), else None."""
    from air_hpc.resilience.store import CheckpointStore

    store = CheckpointStore(RunDir.of(job).checkpoints, job.checkpoint.keep_last)
    for step in sorted(store.committed_steps(), reverse=True):
        if step < job.train.steps:
            return None
        try:
            store.verify(step, check="size")
        except CheckpointError:
            continue
        return step
    return None


def owner_is_live(owner: Owner, client: SlurmClient) -> bool:
    """The job that owns a run still runs (a requeued, pending job counts): local by its process, else Slurm."""
    if owner.executor == "local":
        return owner.local_process_alive()
    status = client.job_status(owner.job_id)
    return status is not None and not status.state.terminal


def _exports(env: dict[str, str]) -> list[str]:
    return [f"export {name}={shell_quote(value)}" for name, value in sorted(env.items())]


#: submitit reads its preemption signal from this variable when it is imported (USR2 without it).
SUBMITIT_SIGNAL_ENV = "SUBMITIT_PREEMPT_SIGNAL"


def _submitit_env(job: JobConfig, env: dict[str, str]) -> dict[str, str]:
    """The job's environment plus ``resilience.signal`` as submitit's own preemption signal on every rank."""
    return {**env, SUBMITIT_SIGNAL_ENV: job.resilience.signal}


def _submit_submitit_slurm(plan_: Plan, entry: Callable[[], Any]) -> str:
    import submitit

    spec, job = plan_.spec, plan_.job
    run_dir = RunDir(spec.run_dir)
    setup = _exports(_submitit_env(job, dict(spec.env)))
    srun_args = ["--kill-on-bad-exit=1"]
    if spec.request.rank_hosts:
        hostfile = run_dir.path / "hostfile"
        hostfile.write_text("".join(f"{h}\n" for h in spec.request.rank_hosts))
        setup.append(f"export SLURM_HOSTFILE={shell_quote(str(hostfile))}")
        srun_args.append("--distribution=arbitrary")
    additional: dict[str, Any] = {
        "requeue": True,
        "open-mode": "append",
        "signal": f"{job.resilience.signal}@{spec.signal_lead_s}",  # submitit's own default is USR2
    }
    if spec.switches:
        additional["switches"] = spec.switches
    if spec.request.segment:
        additional["segment"] = spec.request.segment
    if spec.reservation:
        additional["reservation"] = spec.reservation
    params: dict[str, Any] = {
        "job_name": spec.job_name,
        "nodes": spec.nodes,
        "ntasks_per_node": spec.tasks_per_node,
        "cpus_per_task": spec.cpus_per_task,
        "time": spec.time_limit_min,
        "setup": setup,
        "srun_args": srun_args,
        "additional_parameters": additional,
    }
    optional = {
        "partition": spec.partition,
        "account": spec.account,
        "qos": spec.qos,
        "constraint": spec.constraint,
        "nodelist": spec.request.nodelist,
        "exclude": spec.request.exclude,
        "mem": f"{spec.mem_gb}GB" if spec.mem_gb else None,
        "gpus_per_node": spec.gpus_per_node or None,
        "exclusive": True if spec.exclusive else None,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    executor = submitit.SlurmExecutor(folder=run_dir.path / "submitit", max_num_timeout=job.resilience.max_restarts)
    executor.update_parameters(**params)
    return str(executor.submit(entry).job_id)


def _submit_local(plan_: Plan, entry: Callable[[], Any]) -> Any:
    import submitit

    job = plan_.job
    run_dir = RunDir.of(job)
    executor = submitit.LocalExecutor(folder=run_dir.path / "submitit", max_num_timeout=job.resilience.max_restarts)
    executor.update_parameters(
        nodes=1,
        tasks_per_node=job.resources.tasks_per_node,
        gpus_per_node=job.hardware.gpus_per_node if job.hardware.device == "cuda" else 0,
        timeout_min=job.resources.time_limit_min,
        signal_delay_s=job.resilience.signal_lead_s,
        setup=_exports(_submitit_env(job, job_environment(job))),
    )
    return executor.submit(entry)


def wait_slurm(
    client: SlurmClient, job_id: str, poll_s: float = 2.0, on_change: Callable[[JobStatus], None] | None = None
) -> JobStatus:
    """Poll until the job reaches a final state (a requeued job goes back to PENDING and keeps going)."""
    last: JobStatus | None = None
    while True:
        status = client.job_status(job_id)
        if status is not None:
            if on_change is not None and (
                last is None or (status.state, status.restarts) != (last.state, last.restarts)
            ):
                on_change(status)
            last = status
            if status.state.terminal:
                return status
        time.sleep(poll_s)


def wait_local(submission: Submission, poll_s: float = 1.0) -> JobStatus:
    """Block until a LocalExecutor job ends; raise if it did not complete.

    Its state comes from the run's records (see :mod:`air_hpc.launch.local_job`),
    never from submitit's result pickles.
    """
    run_dir = RunDir(submission.run_dir)
    while True:
        record = next((r for r in submissions(run_dir) if r.job_id == submission.job_id), None)
        if record is None:
            raise ConfigError(f"--wait: {run_dir.submissions} has no record of local job {submission.job_id}")
        status = local_job_status(run_dir, record)
        if status.state is not JobState.RUNNING:
            break
        time.sleep(poll_s)
    if not status.state.succeeded:
        raise TrainingFailed(
            f"local job {submission.job_id} failed ({status.state}: {status.reason}); "
            f"logs: {submission.run_dir}/submitit"
        )
    return status


class TrainingFailed(AirHpcError):
    """The submitted job ended without completing."""

    exit_code = ExitCode.FAILURE


def describe_failure(status: JobStatus) -> str:
    code = f", exit code {status.exit_code}" if status.exit_code is not None else ""
    return f"job {status.job_id} ended {status.state}{code} after {status.restarts} restart(s)"
