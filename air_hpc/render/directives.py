"""A run's one Slurm request: its sbatch options, in order, built once from the job and the nodes chosen for it.

Both executors that go through Slurm read this list, so they cannot ask for different things:
the batch template writes each option as an ``#SBATCH`` line (``sbatch/job/directives.j2``) and
the submitit executor hands the same options to submitit (:mod:`air_hpc.launch.executors`),
refusing the ones it cannot honour by the config key they came from. Every value is checked
here, once, when its :class:`Directive` is made.

It lives in ``render/`` rather than ``slurm/``: it reads the job config and the topology's node
request, and ``topology/`` imports ``slurm/``, so a builder there would close a package cycle;
``render/`` already sits above both and below ``launch/``.
"""

from dataclasses import dataclass, field

from air_hpc.config.models import JobConfig
from air_hpc.errors import ConfigError
from air_hpc.records import names
from air_hpc.records.rundir import RunDir
from air_hpc.render.quoting import sbatch_value, slurm_filename
from air_hpc.slurm.version import REQUEUE_EXPEDITE_FROM, SlurmVersion
from air_hpc.topology.request import NodeRequest

#: The sbatch option that lets a job outlive one of its nodes: hot spares need it.
NO_KILL = "no-kill"


@dataclass(frozen=True)
class Directive:
    """One sbatch option: ``--option=value``, or the flag ``--option`` alone when ``value`` is None.

    Made only from a valid value: one sbatch cannot read back verbatim (a newline, an empty or
    over-long value) is a :class:`~air_hpc.errors.ConfigError` naming ``key``.
    """

    option: str
    value: str | None
    """Verbatim, as Slurm should read it."""
    key: str
    """The config key the value comes from: errors name it, and so does an executor that cannot honour it."""
    argument: str = field(init=False, repr=False, compare=False)
    """The option as an ``#SBATCH`` line carries it, the value quoted for sbatch's own parser."""

    def __post_init__(self) -> None:
        argument = f"--{self.option}" if self.value is None else f"--{self.option}={sbatch_value(self.value, self.key)}"
        object.__setattr__(self, "argument", argument)


def slurm_duration(minutes: int) -> str:
    """Minutes as Slurm's ``D-HH:MM:SS`` (days only when needed)."""
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    clock = f"{hours:02d}:{mins:02d}:00"
    return f"{days}-{clock}" if days else clock


def _log_dir(job: JobConfig) -> str:
    """The run's log directory as a Slurm filename pattern, refusing a path Slurm cannot write to as given.

    Slurm reads a backslash anywhere in an ``--output``/``--error`` path as "no replacement
    symbols" (sbatch(1), FILENAME PATTERN) and drops it: 22.05-25.05 slurmstepd strips single
    backslashes (``remove_path_slashes``), 26.05 every one (``expand_stdio_fields``), and neither
    expands ``%j``. The batch log would land in a twin directory without the backslash, as a
    literal ``slurm-%j.out``, so such a run directory is refused by the key that holds it.
    """
    for key, value in (("run.name", job.run.name), ("run.root", str(job.run.root))):
        if "\\" in value:
            raise ConfigError(
                f"{key}: {value!r} holds a backslash, which Slurm drops from a log path "
                "(it means 'no %j patterns' there): choose a name without one"
            )
    return slurm_filename(str(RunDir.of(job).logs))


def _optional(option: str, value: str | int | None, key: str) -> list[Directive]:
    return [] if not value else [Directive(option, str(value), key)]


def _placement(job: JobConfig, request: NodeRequest) -> list[Directive]:
    """Where the nodes come from: a pinned list, else at most ``--switches`` leaves (waiting a while for them)."""
    found: list[Directive] = []
    if request.nodelist:
        found.append(Directive("nodelist", request.nodelist, "placement"))
    elif request.switches:
        wait = slurm_duration(job.placement.switches_wait_min)
        found.append(Directive("switches", f"{request.switches}@{wait}", "placement"))
    found += _optional("segment", request.segment, "placement.segment")
    found += _optional("exclude", request.exclude, "bad nodes")
    return found


def requeue_directive(version: SlurmVersion | None, enabled: bool = False) -> Directive:
    """``--requeue=expedite`` where the release has it (25.11 and later: a requeue after a failure restarts
    first, on held nodes) and the controller allows it (``enabled``: ``SlurmctldParameters=enable_expedited_requeue``;
    slurmctld refuses the job otherwise), else ``--requeue``, which every release reads."""
    if enabled and version is not None and version >= REQUEUE_EXPEDITE_FROM:
        return Directive("requeue", "expedite", "resilience.max_restarts")
    return Directive("requeue", None, "resilience.max_restarts")


def slurm_directives(
    job: JobConfig,
    request: NodeRequest | None = None,
    dependency: str | None = None,
    version: SlurmVersion | None = None,
    expedite: bool = False,
) -> tuple[Directive, ...]:
    """The job's sbatch options in the order the batch script writes them. Pure.

    ``--nodes`` counts the hot spares too; ``--no-kill`` keeps the job alive for them when a node
    dies. The stop signal goes to the batch shell (``B:``), which forwards it to the ranks.
    ``dependency``: ``submit --after`` / ``--chain`` (``afterok:12``, ``singleton``); ``version`` and
    ``expedite``: the controller's release and whether it allows expedited requeues (:func:`requeue_directive`).
    """
    request = request or NodeRequest()
    res, cluster, resil = job.resources, job.cluster, job.resilience
    gpus = job.hardware.gpus_per_node if job.hardware.device == "cuda" else 0
    logs = _log_dir(job)
    return (
        Directive("job-name", job.run.name, "run.name"),
        *_optional("partition", cluster.partition, "cluster.partition"),
        *_optional("account", cluster.account, "cluster.account"),
        *_optional("qos", cluster.qos, "cluster.qos"),
        *_optional("reservation", cluster.reservation, "cluster.reservation"),
        Directive("nodes", str(res.nodes + res.spare_nodes), "resources.nodes"),
        Directive("ntasks-per-node", str(res.tasks_per_node), "resources.tasks_per_node"),
        *_optional("gpus-per-node", gpus, "hardware.gpus_per_node"),
        Directive("cpus-per-task", str(job.cpus_per_task), "resources.cpus_per_task"),
        *_optional("mem", f"{res.mem_gb}G" if res.mem_gb else None, "resources.mem_gb"),
        Directive("time", slurm_duration(res.time_limit_min), "resources.time_limit_min"),
        *([Directive("exclusive", None, "cluster.exclusive")] if cluster.exclusive else []),
        *_optional("constraint", cluster.constraint, "cluster.constraint"),
        *_placement(job, request),
        requeue_directive(version, expedite),
        *_optional("dependency", dependency, "--after/--chain"),
        *([Directive(NO_KILL, None, "resources.spare_nodes")] if res.spare_nodes else []),
        Directive("open-mode", "append", "run.root"),
        Directive("signal", f"B:{resil.signal}@{resil.signal_lead_s}", "resilience.signal"),
        Directive("chdir", str(job.run.dir), "run.root"),
        Directive("output", f"{logs}/{names.BATCH_STDOUT}", "run.root"),
        Directive("error", f"{logs}/{names.BATCH_STDERR}", "run.root"),
    )
