"""SbatchSpec: everything the batch script template needs, as one checked, frozen value.

Built from a resolved :class:`JobConfig` plus an optional :class:`NodeRequest`
(the topology selection and rank order). The template only formats this value;
every decision (which environment, which nodes, which command) is made here.
"""

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from air_hpc.config.models import JobConfig, SignalName
from air_hpc.errors import ConfigError
from air_hpc.exitcodes import ExitCode
from air_hpc.records import names
from air_hpc.render.directives import NO_KILL, Directive, slurm_directives
from air_hpc.render.quoting import check_env_name, check_one_line
from air_hpc.runtime.stop_signals import STOP_SIGNALS
from air_hpc.slurm import hostlist
from air_hpc.slurm.version import SlurmVersion
from air_hpc.topology.request import NodeRequest


@dataclass(frozen=True)
class SbatchSpec:
    run_dir: Path
    directives: tuple[Directive, ...]
    """What the job asks of Slurm, the ``#SBATCH`` lines (:mod:`air_hpc.render.directives`)."""
    nodes: int
    """Training nodes, without the spares: the hosts of the step's rank order (``SLURM_HOSTFILE``)."""
    tasks_per_node: int
    cpus_per_task: int
    signal: SignalName
    max_restarts: int
    step_command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    """Sorted (name, value) pairs exported before the step starts."""
    request: NodeRequest = field(default_factory=NodeRequest)
    container_image: str | None = None
    container_mounts: tuple[str, ...] = ()
    supervisor_command: tuple[str, ...] = ()
    """The in-job supervisor that runs the ``srun`` step: dead-node probe, hang backstop, restarts on spares."""
    batch_command: tuple[str, ...] = ()
    """The batch script's Python half (``air_hpc.runtime.batch``): start, events, requeue decision."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def has_spares(self) -> bool:
        """Hot spares are allocated beside the nodes (the request keeps the job alive when a node dies)."""
        return any(d.option == NO_KILL for d in self.directives)

    @property
    def exports_master(self) -> bool:
        """MASTER_ADDR/PORT are derived in the script unless the user set them."""
        exported = {name for name, _ in self.env}
        return not exported & {"MASTER_ADDR", "MASTER_PORT"}

    @property
    def context(self) -> dict[str, object]:
        """The template's variables: exit codes from ``air_hpc.exitcodes``, file names from ``air_hpc.records``."""
        return {
            "spec": self,
            "no_kill": NO_KILL,
            "exit_failure": int(ExitCode.FAILURE),
            "hostfile_name": names.HOSTFILE,
            "armed_prefix": names.ARMED_FILE_PREFIX,
            "stop_requested_file": names.STOP_REQUESTED_FILE,
            "supervisor_armed_file": names.SUPERVISOR_ARMED_FILE,
            "stop_signals": tuple(dict.fromkeys((self.signal, *STOP_SIGNALS))),
        }


def job_environment(job: JobConfig) -> dict[str, str]:
    """Environment per hardware profile, the site's NCCL settings, derived ones, then the job's ``env:`` (wins)."""
    hw = job.hardware
    env: dict[str, str] = {}
    if hw.hcas:
        env["NCCL_IB_HCA"] = "=" + ",".join(hw.hcas)
    env.update(hw.nccl_env)
    env.update(job.cluster.nccl_env)
    if hw.device == "cuda":
        env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        if job.parallel.tp > 1:
            # Megatron's TP communication overlap needs kernels queued in issue order.
            env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    env["OMP_NUM_THREADS"] = str(job.cpus_per_task)
    env.update(job.env)
    for name, value in env.items():
        check_env_name(name, f"env.{name}")
        check_one_line(value, f"env.{name}")
    return env


def default_python(job: JobConfig) -> str:
    if job.container is not None:
        return job.container.python
    return job.cluster.python or sys.executable


def training_command(python: str, run_dir: Path) -> tuple[str, ...]:
    return (python, "-m", "air_hpc.runtime", str(run_dir))


def host_python(job: JobConfig, python: str | None = None) -> str:
    """The interpreter beside the batch shell, outside any container: the container's python is not there."""
    return python if python and job.container is None else job.cluster.python or sys.executable


def supervisor_command(job: JobConfig, run_dir: Path, python: str | None = None) -> tuple[str, ...]:
    return (host_python(job, python), "-m", "air_hpc.runtime.supervisor", str(run_dir))


def batch_command(job: JobConfig, python: str | None = None) -> tuple[str, ...]:
    return (host_python(job, python), "-m", "air_hpc.runtime.batch")


def build_spec(
    job: JobConfig,
    request: NodeRequest | None = None,
    *,
    python: str | None = None,
    step_command: Sequence[str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    dependency: str | None = None,
    slurm_version: SlurmVersion | None = None,
    expedite: bool = False,
) -> SbatchSpec:
    """Turn a resolved job (and the nodes chosen for it) into a spec.

    ``python`` overrides the interpreter (default: the container's, the
    cluster's, else this one); ``step_command`` replaces the training step
    (tests run small payloads through the same script).
    """
    request = request or NodeRequest()
    _check_request(job, request)
    run_dir = job.run.dir
    interpreter = check_one_line(python or default_python(job), "cluster.python")
    command = tuple(step_command) if step_command else training_command(interpreter, run_dir)
    for name, value in (extra_env or {}).items():
        check_env_name(name, f"env.{name}")
        check_one_line(value, f"env.{name}")
    env = {**job_environment(job), **(extra_env or {})}
    res, container = job.resources, job.container
    return SbatchSpec(
        run_dir=run_dir,
        directives=slurm_directives(job, request, dependency, slurm_version, expedite),
        nodes=res.nodes,
        tasks_per_node=res.tasks_per_node,
        cpus_per_task=job.cpus_per_task,
        signal=job.resilience.signal,
        max_restarts=job.resilience.max_restarts,
        step_command=command,
        env=tuple(sorted(env.items())),
        request=request,
        container_image=container.image if container else None,
        container_mounts=_container_mounts(job, run_dir),
        supervisor_command=supervisor_command(job, run_dir, python),
        batch_command=batch_command(job, python),
    )


def _container_mounts(job: JobConfig, run_dir: Path) -> tuple[str, ...]:
    """The pyxis mounts (the run directory at its own path, always); none without a container."""
    container = job.container
    if container is None:
        return ()
    for bad in (",", ":"):
        if bad in str(run_dir):
            raise ConfigError(f"run.root/run.name: {str(run_dir)!r} contains {bad!r}, which pyxis mounts cannot hold")
    check_one_line(container.image, "container.image")
    for mount in container.mounts:
        check_one_line(mount, "container.mounts")
        if "," in mount:
            raise ConfigError(f"container.mounts: {mount!r} contains ',', which separates pyxis mounts")
    return tuple(sorted({*container.mounts, f"{run_dir}:{run_dir}"}))


def _check_request(job: JobConfig, request: NodeRequest) -> None:
    """A selection must agree with resources.nodes, the single source of truth for the node count."""
    res = job.resources
    if request.rank_hosts:
        if len(request.rank_hosts) != res.world_size:
            raise ConfigError(
                f"placement: rank order has {len(request.rank_hosts)} ranks, "
                f"resources give {res.world_size} ({res.nodes} nodes x {res.tasks_per_node})"
            )
        per_host: dict[str, int] = {}
        for host in request.rank_hosts:
            per_host[host] = per_host.get(host, 0) + 1
        if len(per_host) != res.nodes or set(per_host.values()) != {res.tasks_per_node}:
            raise ConfigError(
                f"placement: rank order must put {res.tasks_per_node} ranks on each of {res.nodes} nodes, "
                f"got {dict(sorted(per_host.items()))}"
            )
        if not request.nodelist:
            raise ConfigError("placement: a rank order needs pinned nodes (placement.pin_nodes: true)")
        pinned = set(hostlist.expand(request.nodelist, "placement nodelist")) - set(request.spares)
        if set(per_host) != pinned:
            raise ConfigError(
                f"placement: rank order hosts {sorted(per_host)} differ from the pinned nodes {request.nodelist}"
            )
    wanted = res.nodes + res.spare_nodes
    if request.nodelist and len(hostlist.expand(request.nodelist, "placement nodelist")) != wanted:
        spares = f" + spare_nodes = {res.spare_nodes}" if res.spare_nodes else ""
        raise ConfigError(
            f"placement: nodelist {request.nodelist} does not have resources.nodes = {res.nodes}{spares} nodes"
        )
    if len(request.spares) not in (0, res.spare_nodes):
        raise ConfigError(f"placement: {len(request.spares)} spares chosen, resources.spare_nodes = {res.spare_nodes}")
    if request.switches is not None and not 1 <= request.switches <= wanted:
        raise ConfigError(f"placement: --switches={request.switches} must be between 1 and {wanted}")
    if request.segment is not None and (request.segment < 1 or res.nodes % request.segment):
        raise ConfigError(f"placement.segment: --segment={request.segment} must divide resources.nodes = {res.nodes}")
