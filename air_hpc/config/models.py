"""Typed, frozen job configuration. Every field is documented; units are in the names.

A job file composes a cluster, a hardware profile and a model preset by name
(see ``air_hpc.config.load``); the result validates into :class:`JobConfig`.
Cross-field rules live in :mod:`air_hpc.config.rules`; ``JobConfig`` checks them
all after the sections validate and raises with every broken one, so the CLI
prints one line per problem before anything is submitted.
"""

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from air_hpc.config.layout import ParallelLayout
from air_hpc.config.rules import RulesBroken, problems
from air_hpc.errors import ConfigError

#: A Slurm release as ``--version`` prints it after the package name: 22.05.8, 25.11.0
_RELEASE = re.compile(r"[0-9]{2,4}\.[0-9]{1,2}\.[0-9]{1,3}")

SignalName = Literal["USR1", "USR2", "TERM", "INT", "HUP", "URG"]


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


class SweepMember(Section):
    """Which sweep a run is an element of, written by ``air-hpc sweep`` into the element's job.json."""

    name: str = Field(min_length=1, description="The sweep's name (the job's run.name); elements are NAME-INDEX.")
    index: int = Field(ge=0, description="The element's index: its Slurm array task id.")
    overrides: dict[str, str] = Field(
        default_factory=dict, description="The element's own KEY=VALUE settings (grid and random draws)."
    )


class RunConfig(Section):
    name: str = Field(min_length=1, description="Run name; the run directory is root/name.")
    root: Path = Field(Path("runs"), description="Directory holding run directories (made absolute at load).")
    sweep: SweepMember | None = Field(None, description="Set by ``air-hpc sweep``: the sweep this run belongs to.")

    @field_validator("name")
    @classmethod
    def _one_path_component(cls, name: str) -> str:
        """The run directory is root/name: a name that is a path (``../x``, ``/etc``) would put it elsewhere."""
        bad = next((c for c in ("/", "\0", "\n", "\r") if c in name), None)
        if bad is not None:
            raise ValueError(f"{name!r} contains {bad!r}; a run name is one path component")
        if name in (".", ".."):
            raise ValueError(f"{name!r} is not a directory name; a run name is one path component")
        if name.startswith("-"):
            raise ValueError(f"{name!r} starts with '-', which commands would read as an option")
        return name

    @property
    def dir(self) -> Path:
        return self.root / self.name


#: A cluster name as Slurm knows it (``ClusterName``): what ``-M`` takes.
_SLURM_CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


class SlurmClusterConfig(Section):
    """One Slurm cluster a profile may route jobs to (``submit --clusters``)."""

    name: str = Field(description="The cluster's name as Slurm knows it (its ClusterName; what `-M NAME` takes).")
    slurm_conf: Path | None = Field(
        None,
        description="This cluster's own slurm.conf (SLURM_CONF for its commands and the jobs submitted there); "
        "unset: reached with `-M NAME` through the slurmdbd the clusters share.",
    )
    topology_file: Path | None = Field(
        None, description="This cluster's fabric (topology.conf); unset: the profile's topology_file."
    )

    @field_validator("name")
    @classmethod
    def _a_cluster_name(cls, name: str) -> str:
        if _SLURM_CLUSTER_NAME.fullmatch(name) is None:
            raise ValueError(f"{name!r} is not a Slurm cluster name; expected letters, digits, '_' or '-'")
        return name


class ClusterConfig(Section):
    name: str = Field(description="Cluster profile name (file name under configs/clusters/).")
    partition: str | None = Field(None, description="Slurm partition (--partition).")
    account: str | None = Field(None, description="Slurm account (--account).")
    qos: str | None = Field(None, description="Slurm QoS (--qos).")
    reservation: str | None = Field(None, description="Slurm reservation (--reservation).")
    constraint: str | None = Field(None, description="Node feature constraint (--constraint).")
    exclusive: bool = Field(True, description="Ask for whole nodes (--exclusive).")
    topology_file: Path | None = Field(
        None, description="topology.conf describing the fabric, for topology-aware selection."
    )
    python: str | None = Field(
        None,
        description="Python interpreter on the compute nodes; unset: the one running air-hpc (shared filesystem).",
    )
    usd_per_node_hour: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="Price of one node-hour on this cluster, for `air-hpc fleet report`'s cost (wins over the "
        "hardware's; a job holding GPUs is priced by usd_per_gpu_hour when one is known).",
    )
    usd_per_gpu_hour: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="Price of one GPU-hour on this cluster, for `air-hpc fleet report` (wins over the hardware's).",
    )
    nccl_env: dict[str, str] = Field(
        default_factory=dict,
        description="This site's NCCL settings (interfaces, HCAs, GID index; `air-hpc cluster init` reads them "
        "off a node); win over the hardware profile's, lose to the job's env.",
    )
    slurm_version: str | None = Field(
        None,
        description="Slurm release of the controller, e.g. 25.05.8 (`cluster init` records it); what a block job "
        "may pin depends on it. Unset: asked with `scontrol --version` when submitting.",
    )

    clusters: tuple[SlurmClusterConfig, ...] = Field(
        (),
        description="The Slurm clusters of this profile that `submit --clusters` may route a job to, each by its "
        "Slurm name (with its own slurm.conf and topology file where they differ); empty: the one cluster "
        "SLURM_CONF names.",
    )

    @field_validator("clusters")
    @classmethod
    def _distinct_clusters(cls, clusters: tuple[SlurmClusterConfig, ...]) -> tuple[SlurmClusterConfig, ...]:
        names = [c.name for c in clusters]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"cluster {twice[0]!r} is listed twice")
        return clusters

    @field_validator("slurm_version")
    @classmethod
    def _a_release(cls, version: str | None) -> str | None:
        if version is not None and _RELEASE.fullmatch(version) is None:
            raise ValueError(f"{version!r} is not a Slurm release; expected e.g. 25.05.8")
        return version


class HardwareConfig(Section):
    name: str = Field(description="Hardware profile name (file name under configs/hardware/).")
    device: Literal["cuda", "cpu"] = Field(description="Accelerator the ranks run on.")
    gpus_per_node: int = Field(ge=0, description="GPUs per node (0 on CPU-only nodes).")
    gpu_mem_gb: int = Field(0, ge=0, description="Memory per GPU, for the pre-flight check.")
    cpus_per_node: int = Field(ge=1, description="CPU cores per node.")
    host_mem_gb: int = Field(
        0, ge=0, description="Host memory per node in GiB, for the in-memory snapshot fit check (0: unknown)."
    )
    nvlink_domain_nodes: int = Field(
        1, ge=1, description="Nodes sharing one NVLink domain (1: NVLink inside a node only; 18 for GB200 NVL72)."
    )
    hcas: tuple[str, ...] = Field((), description="InfiniBand HCAs used for compute traffic (NCCL_IB_HCA).")
    nccl_env: dict[str, str] = Field(
        default_factory=dict, description="NCCL/IB environment defaults for this hardware."
    )
    usd_per_gpu_hour: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="Price of one GPU-hour, for the cost lines of `air-hpc report` and `air-hpc fleet report` "
        "(unset: no cost).",
    )
    usd_per_node_hour: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="Price of one node-hour of this hardware, for `air-hpc fleet report` (jobs without GPUs, or "
        "no GPU-hour price).",
    )


class ModelConfig(Section):
    name: str = Field(description="Model preset name (file name under configs/models/).")
    num_layers: int = Field(ge=1, description="Transformer layers.")
    hidden_size: int = Field(ge=1, description="Model width.")
    num_attention_heads: int = Field(ge=1, description="Attention heads.")
    ffn_hidden_size: int | None = Field(None, ge=1, description="MLP width; 4*hidden_size when unset.")
    vocab_size: int = Field(ge=1, description="Vocabulary size; must match the data's tokenizer.")
    seq_len: int = Field(ge=1, description="Tokens per sample (also the max position embeddings).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Hidden and attention dropout probability.")
    init_std: float = Field(0.02, gt=0, description="Standard deviation of the initial weights.")


class ResourcesConfig(Section):
    nodes: int = Field(ge=1, description="Nodes to allocate (the single source of truth for the node count).")
    tasks_per_node: int = Field(ge=1, description="Ranks per node (one per GPU on GPU nodes).")
    cpus_per_task: int | None = Field(
        None, ge=1, description="CPU cores per rank (--cpus-per-task); unset: the node's cores over tasks_per_node."
    )
    mem_gb: int | None = Field(None, ge=1, description="Memory per node in GiB (--mem); unset: Slurm's default.")
    time_limit_min: int = Field(60, ge=1, description="Wall-clock limit in minutes (--time).")
    allow_idle_gpus: bool = Field(
        False,
        description="Allow tasks_per_node below the hardware's gpus_per_node on GPU hardware (the rest sit idle).",
    )
    spare_nodes: int = Field(
        0,
        ge=0,
        description="Hot spares allocated beside the nodes: a step that loses a node restarts in the same job "
        "on a spare (the nearest in the topology) instead of requeueing.",
    )

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node


class ParallelConfig(Section):
    tp: int = Field(1, ge=1, description="Tensor-parallel size; TP groups stay inside a node.")
    pp: int = Field(1, ge=1, description="Pipeline-parallel size.")
    vpp: int | None = Field(None, ge=2, description="Virtual pipeline stages per rank (interleaved schedule).")
    sequence_parallel: bool = Field(False, description="Megatron sequence parallelism (GPU only).")
    distributed_optimizer: bool = Field(False, description="Shard optimizer state across DP (GPU only).")


class TrainConfig(Section):
    steps: int = Field(ge=1, description="Optimizer steps to train in total (across restarts).")
    seed: int = Field(1234, ge=0, description="Seed for weights, data order and dropout.")
    micro_batch_size: int = Field(1, ge=1, description="Samples per micro-batch per DP rank.")
    global_batch_size: int = Field(ge=1, description="Samples per optimizer step across all DP ranks.")
    lr: float = Field(3e-4, gt=0, description="Peak learning rate.")
    min_lr: float = Field(3e-5, ge=0, description="Learning rate at the end of cosine decay.")
    lr_warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps.")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay.")
    adam_beta1: float = Field(0.9, gt=0, lt=1, description="Adam beta1.")
    adam_beta2: float = Field(0.95, gt=0, lt=1, description="Adam beta2.")
    adam_eps: float = Field(1e-8, gt=0, description="Adam epsilon.")
    clip_grad: float = Field(1.0, ge=0, description="Global gradient-norm clip (0 disables).")
    precision: Literal["auto", "fp32", "bf16"] = Field("auto", description="auto: bf16 on GPU, fp32 on CPU.")
    dist_timeout_s: int = Field(600, ge=10, description="Timeout of collective operations.")
    log_interval: int = Field(1, ge=1, description="Steps between log lines (metrics.jsonl gets every step).")


class BlendSource(Section):
    path: Path = Field(
        description="Shards of this source: an HDF5 token file, a Megatron .bin/.idx prefix, a directory of "
        "them, or a glob (made absolute at load)."
    )
    weight: float = Field(ge=0, allow_inf_nan=False, description="Share of the samples drawn from this source.")


class DataConfig(Section):
    path: Path | None = Field(
        None,
        description="Training data: an HDF5 token file made by `air-hpc data prepare`, a Megatron .bin/.idx "
        "prefix, a directory of such shards, or a glob of them (made absolute at load). Or data.blend.",
    )
    blend: tuple[BlendSource, ...] | None = Field(
        None,
        description="Weighted sources ({path, weight}) mixed by a seeded schedule of the global sample index; "
        "instead of data.path.",
    )
    max_open_files: int = Field(
        64,
        ge=1,
        description="Shard files each rank keeps open at once (least recently used "
        "closed first), so many ranks over many shards do not storm a shared file system.",
    )
    read_ahead: bool = Field(True, description="Read the next step's samples in a background thread.")

    @model_validator(mode="after")
    def _path_or_blend(self) -> "DataConfig":
        """Exactly one way to name the data; weights that can draw a sample."""
        if (self.path is None) == (self.blend is None):
            raise ValueError("set exactly one of data.path and data.blend")
        if self.blend is not None:
            if not self.blend:
                raise ValueError("data.blend is empty; give at least one {path, weight} source")
            if sum(source.weight for source in self.blend) <= 0:
                raise ValueError("every data.blend weight is 0; at least one source needs a weight > 0")
        return self

    def sources(self) -> tuple[BlendSource, ...]:
        """The blend, or ``data.path`` as a blend of one."""
        if self.blend is not None:
            return self.blend
        if self.path is None:
            raise ConfigError("data: set data.path or data.blend")
        return (BlendSource(path=self.path, weight=1.0),)


class CheckpointConfig(Section):
    interval_steps: int | Literal["auto"] = Field(
        description="Steps between periodic checkpoints; auto: the Young/Daly interval from the measured save cost "
        "and resilience.mtbf_h."
    )
    keep_last: int = Field(3, ge=1, description="Keep the newest K complete checkpoints.")
    keep_every: int = Field(0, ge=0, description="Also keep every M-th step's checkpoint (0: none).")
    async_save: bool = Field(True, description="Write periodic checkpoints in the background.")
    async_wait_s: int = Field(
        600,
        ge=1,
        description="Longest a save waits for the previous async save's writers before abandoning that save "
        "(the newest complete checkpoint stays the one to resume from).",
    )
    memory_interval_steps: int = Field(
        0,
        ge=0,
        description="Steps between in-memory snapshots (0: off; 1: every step): each rank's state is copied to a "
        "holder process on its node and to a buddy rank's holder on another node; an in-job restart resumes from "
        "the newest snapshot complete across ranks, else from the newest checkpoint.",
    )
    verify: Literal["size", "sha256"] = Field(
        "sha256",
        description="Check before resuming from a checkpoint: sha256 of every file (re-reads it once) or sizes only.",
    )
    allow_fresh_start: bool = Field(
        False,
        description="Train from step 0 when checkpoints exist but none verifies (by default the run refuses to "
        "start; the failing checkpoints are kept either way).",
    )

    @field_validator("interval_steps", mode="before")
    @classmethod
    def _steps_or_auto(cls, value: Any) -> int | str:
        """One message for both spellings (a union would report each alternative's error)."""
        if value == "auto":
            return "auto"
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        if isinstance(value, str) and value.strip().isdigit() and int(value) >= 1:
            return int(value)
        raise PydanticCustomError(
            "steps_or_auto", "expected a whole number of steps >= 1 or auto, got {value}", {"value": repr(value)}
        )


class ResilienceConfig(Section):
    signal: SignalName = Field(
        "USR2", description="Signal Slurm sends before the time limit; USR1 can be swallowed by NCCL."
    )
    signal_lead_s: int = Field(120, ge=1, description="Seconds before the time limit the signal arrives.")
    max_restarts: int = Field(3, ge=0, description="Requeues allowed (compared with SLURM_RESTART_COUNT).")
    time_margin_s: int = Field(
        60, ge=0, description="Stop and checkpoint this long before the time limit, even without a signal."
    )
    mtbf_h: float | None = Field(
        None,
        gt=0,
        description="Mean time between failures of this job's nodes, in hours, for checkpoint.interval_steps: auto.",
    )
    max_no_progress_restarts: int = Field(
        3,
        ge=1,
        description="Stop (exit code CRASH_LOOP, never requeued) after this many restarts in a row that saved "
        "no new checkpoint.",
    )
    warm_standby: bool = Field(
        True,
        description="With resources.spare_nodes: from the step's start keep a standby process on every healthy node "
        "(interpreter started, torch and megatron-core imported at the lowest CPU priority) that forks the node's "
        "ranks for an in-job restart.",
    )


class HealthConfig(Section):
    heartbeat_setup_s: int = Field(600, ge=1, description="Max seconds without progress during setup.")
    heartbeat_step_s: int = Field(300, ge=1, description="Max seconds without progress inside a step.")
    heartbeat_checkpoint_s: int = Field(900, ge=1, description="Max seconds without progress in a checkpoint.")
    watchdog: bool = Field(True, description="Run the hang watchdog in every rank (heartbeat_* limits).")
    learn_limits: bool = Field(
        True,
        description="Learn each phase's hang limit from the run (setup, load, step, save): after a warm-up, "
        "max(learned_limit_floor_s, learned_limit_factor x the learned_limit_percentile of its observed times), "
        "kept across restarts in the run directory, never above the heartbeat_*_s values, which cap it.",
    )
    learned_limit_factor: float = Field(5.0, ge=1, description="Headroom of a learned limit over the percentile.")
    learned_limit_percentile: float = Field(
        99.0, gt=0, le=100, description="The high percentile of a phase's observed times that a limit is learned from."
    )
    learned_limit_floor_s: int = Field(30, ge=1, description="No learned limit is shorter than this.")
    learned_limit_warmup_steps: int = Field(
        5, ge=0, description="First steps of each start: no step samples; their limit is learned from earlier warm-ups."
    )
    preflight: bool = Field(True, description="Run the pre-flight health check on each node before training.")
    min_free_disk_gb: float = Field(1.0, ge=0, description="Free space required in the checkpoint directory.")
    min_ib_rate_gbps: float = Field(
        0, ge=0, description="Slowest acceptable rate of each hardware.hcas port in ibstat (0: state only)."
    )
    straggler_window_steps: int = Field(
        20, ge=0, description="Steps per straggler check (each rank's median busy time over them); 0: no checks."
    )
    straggler_ratio: float = Field(
        1.5, gt=1, description="A node busier per step than this many times the other nodes' median is a straggler."
    )
    straggler_windows: int = Field(
        2, ge=1, description="Consecutive straggler checks a node must fail before it is reported (persistence)."
    )
    straggler_noise_sigmas: float = Field(
        4.0,
        ge=0,
        description="A straggler must also be slower than the other nodes by this many times their step-to-step "
        "noise (a robust standard deviation of each rank's busy times in the window).",
    )
    exclude_stragglers: bool = Field(
        False, description="Put straggler nodes on the bad-node list, so the next start of the job avoids them."
    )


class PlacementConfig(Section):
    topology_aware: bool = Field(
        True, description="Pick nodes from the cluster's topology_file; otherwise only the node count."
    )
    switches_wait_min: int = Field(
        10, ge=0, description="How long Slurm may wait for the --switches count before relaxing it."
    )
    pin_nodes: bool = Field(
        True,
        description="Pin the selected nodes with --nodelist and order ranks on them; "
        "false: ask only for --switches=K@switches_wait_min and let Slurm pick.",
    )
    segment: int | None = Field(
        None,
        ge=1,
        description="Block topologies (topology/block): nodes per segment, each kept inside one base block "
        "(sbatch --segment); default: the nodes of one TP group when it spans several nodes.",
    )


class ObserveConfig(Section):
    tensorboard: bool = Field(
        False,
        description="Write TensorBoard event files (loss, lr, tokens/s, checkpoint and restart markers) "
        "under the run directory's tensorboard/, from the rank that writes metrics.jsonl.",
    )


class ContainerConfig(Section):
    image: str = Field(description="pyxis --container-image.")
    mounts: tuple[str, ...] = Field((), description="pyxis --container-mounts entries (src:dst[:flags]).")
    python: str = Field("python", description="Python interpreter inside the container.")


class JobConfig(Section):
    run: RunConfig
    cluster: ClusterConfig
    hardware: HardwareConfig
    model: ModelConfig
    resources: ResourcesConfig
    parallel: ParallelConfig = ParallelConfig()
    train: TrainConfig
    data: DataConfig
    checkpoint: CheckpointConfig
    resilience: ResilienceConfig = ResilienceConfig()
    health: HealthConfig = HealthConfig()
    placement: PlacementConfig = PlacementConfig()
    observe: ObserveConfig = ObserveConfig()
    container: ContainerConfig | None = None
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment; wins over profiles.")

    @property
    def layout(self) -> ParallelLayout:
        p = self.parallel
        return ParallelLayout.from_world(self.resources.world_size, p.tp, p.pp, p.vpp)

    @property
    def precision(self) -> Literal["fp32", "bf16"]:
        if self.train.precision != "auto":
            return self.train.precision
        return "bf16" if self.hardware.device == "cuda" else "fp32"

    @property
    def cpus_per_task(self) -> int:
        """Each rank's share of the node's cores unless set: data loading and NCCL's proxy threads need them."""
        if self.resources.cpus_per_task is not None:
            return self.resources.cpus_per_task
        return max(1, self.hardware.cpus_per_node // self.resources.tasks_per_node)

    @model_validator(mode="after")
    def _check_cross_fields(self) -> "JobConfig":
        broken = problems(self)
        if broken:
            raise RulesBroken(broken)
        return self
