"""Cross-field rules of a job as a table: each names its key, when it is broken, and why.

A rule is checked only after every section validated on its own, so a
predicate may read any field. :func:`problems` checks them all, so one run of
``air-hpc config show`` names every broken rule instead of the first.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from air_hpc.config.models import JobConfig


@dataclass(frozen=True)
class Rule:
    """One cross-field rule: ``broken(job)`` true means ``message(job)`` is reported against ``key``."""

    name: str
    key: str
    broken: Callable[["JobConfig"], bool]
    message: Callable[["JobConfig"], str]


@dataclass(frozen=True)
class Problem:
    """A broken rule: the dotted key whose file line the error names, and what is wrong."""

    rule: str
    key: str
    message: str


def _tiles_world(job: "JobConfig") -> bool:
    return job.resources.world_size % (job.parallel.tp * job.parallel.pp) == 0


def _dp(job: "JobConfig") -> int:
    """Data-parallel size; only meaningful where :func:`_tiles_world` holds."""
    return job.resources.world_size // (job.parallel.tp * job.parallel.pp)


def _micro_batches(job: "JobConfig") -> int:
    return job.train.global_batch_size // (job.train.micro_batch_size * _dp(job))


def _batch_tiles_dp(job: "JobConfig") -> bool:
    return job.train.global_batch_size % (job.train.micro_batch_size * _dp(job)) == 0


def _domain_ranks(job: "JobConfig") -> int:
    """Ranks in one NVLink domain, the largest a TP group may be."""
    return job.resources.tasks_per_node * job.hardware.nvlink_domain_nodes


def _on_cpu(job: "JobConfig") -> bool:
    return job.hardware.device == "cpu"


def _stages(job: "JobConfig") -> int:
    return job.parallel.pp * (job.parallel.vpp or 1)


def _stages_text(job: "JobConfig") -> str:
    p = job.parallel
    return f"pp*vpp = {p.pp}*{p.vpp}" if p.vpp else f"pp = {p.pp}"


RULES: tuple[Rule, ...] = (
    Rule(
        "world-tiles-tp-pp",
        "parallel.tp",
        lambda j: not _tiles_world(j),
        lambda j: (
            f"world size {j.resources.world_size} (resources.nodes {j.resources.nodes} x tasks_per_node "
            f"{j.resources.tasks_per_node}) is not divisible by tp*pp = {j.parallel.tp}*{j.parallel.pp}"
        ),
    ),
    Rule(
        "layers-tile-stages",
        "model.num_layers",
        lambda j: j.model.num_layers % _stages(j) != 0,
        lambda j: f"{j.model.num_layers} layers are not divisible by {_stages_text(j)}",
    ),
    Rule(
        "vpp-needs-pp",
        "parallel.vpp",
        lambda j: bool(j.parallel.vpp) and j.parallel.pp < 2,
        lambda j: "virtual pipeline stages need pp >= 2",
    ),
    Rule(
        "heads-tile-tp",
        "model.num_attention_heads",
        lambda j: j.model.num_attention_heads % j.parallel.tp != 0,
        lambda j: f"{j.model.num_attention_heads} heads are not divisible by tp = {j.parallel.tp}",
    ),
    Rule(
        "vocab-tiles-tp",
        "model.vocab_size",
        lambda j: j.model.vocab_size % j.parallel.tp != 0,
        lambda j: f"{j.model.vocab_size} is not divisible by tp = {j.parallel.tp}",
    ),
    Rule(
        "hidden-tiles-heads",
        "model.hidden_size",
        lambda j: j.model.hidden_size % j.model.num_attention_heads != 0,
        lambda j: f"{j.model.hidden_size} is not divisible by num_attention_heads = {j.model.num_attention_heads}",
    ),
    Rule(
        "batch-tiles-micro-dp",
        "train.global_batch_size",
        lambda j: _tiles_world(j) and not _batch_tiles_dp(j),
        lambda j: (
            f"{j.train.global_batch_size} is not divisible by micro_batch_size*dp = {j.train.micro_batch_size}*{_dp(j)}"
        ),
    ),
    Rule(
        "interleaved-micro-batches-tile-pp",
        "train.global_batch_size",
        lambda j: (
            bool(j.parallel.vpp) and _tiles_world(j) and _batch_tiles_dp(j) and _micro_batches(j) % j.parallel.pp != 0
        ),
        lambda j: (
            f"the interleaved schedule needs the micro-batch count {_micro_batches(j)} "
            f"to be a multiple of pp = {j.parallel.pp}"
        ),
    ),
    Rule(
        "min-lr-below-lr",
        "train.min_lr",
        lambda j: j.train.min_lr > j.train.lr,
        lambda j: f"{j.train.min_lr} is above train.lr = {j.train.lr}",
    ),
    Rule(
        "warmup-below-steps",
        "train.lr_warmup_steps",
        lambda j: bool(j.train.lr_warmup_steps) and j.train.lr_warmup_steps >= j.train.steps,
        lambda j: (
            f"{j.train.lr_warmup_steps} must be less than train.steps = {j.train.steps} "
            "(Megatron's schedule needs decay steps after warm-up; as many or more than train.steps leave none)"
        ),
    ),
    Rule(
        "sequence-parallel-needs-gpus",
        "parallel.sequence_parallel",
        lambda j: _on_cpu(j) and j.parallel.sequence_parallel,
        lambda j: "needs GPUs (Transformer Engine/Apex); set it false on CPU hardware",
    ),
    Rule(
        "distributed-optimizer-needs-gpus",
        "parallel.distributed_optimizer",
        lambda j: _on_cpu(j) and j.parallel.distributed_optimizer,
        lambda j: "its checkpoints need CUDA; set it false on CPU hardware",
    ),
    Rule(
        "bf16-needs-gpus",
        "train.precision",
        lambda j: _on_cpu(j) and j.precision == "bf16",
        lambda j: "bf16 is for GPUs; use fp32 or auto on CPU hardware",
    ),
    Rule(
        "ranks-fit-gpus",
        "resources.tasks_per_node",
        lambda j: not _on_cpu(j) and j.resources.tasks_per_node > j.hardware.gpus_per_node,
        lambda j: (
            f"{j.resources.tasks_per_node} ranks per node but hardware {j.hardware.name} "
            f"has {j.hardware.gpus_per_node} GPUs"
        ),
    ),
    Rule(
        "no-idle-gpus",
        "resources.tasks_per_node",
        lambda j: (
            not _on_cpu(j) and j.resources.tasks_per_node < j.hardware.gpus_per_node and not j.resources.allow_idle_gpus
        ),
        lambda j: (
            f"{j.resources.tasks_per_node} ranks per node would leave "
            f"{j.hardware.gpus_per_node - j.resources.tasks_per_node} of hardware {j.hardware.name}'s "
            f"{j.hardware.gpus_per_node} GPUs idle; set it to {j.hardware.gpus_per_node}, or "
            "resources.allow_idle_gpus: true if that is what you want"
        ),
    ),
    Rule(
        "tp-tiles-nvlink-domain",
        "parallel.tp",
        lambda j: not _on_cpu(j) and _domain_ranks(j) % j.parallel.tp != 0 and j.parallel.tp % _domain_ranks(j) != 0,
        lambda j: f"tp = {j.parallel.tp} does not tile the NVLink domain of {_domain_ranks(j)} ranks",
    ),
    Rule(
        "tp-inside-nvlink-domain",
        "parallel.tp",
        lambda j: j.parallel.tp > _domain_ranks(j),
        lambda j: (
            f"tp = {j.parallel.tp} is larger than the {_domain_ranks(j)} ranks of one NVLink domain; "
            "TP groups must not cross it"
        ),
    ),
    Rule(
        "memory-snapshots-need-whole-optimizer-state",
        "checkpoint.memory_interval_steps",
        lambda j: j.checkpoint.memory_interval_steps > 0 and j.parallel.distributed_optimizer,
        lambda j: (
            "in-memory snapshots hold each rank's optimizer state_dict, which Megatron's distributed optimizer "
            "keeps apart; set parallel.distributed_optimizer=false or checkpoint.memory_interval_steps=0"
        ),
    ),
    Rule(
        "auto-interval-needs-mtbf",
        "checkpoint.interval_steps",
        lambda j: j.checkpoint.interval_steps == "auto" and j.resilience.mtbf_h is None,
        lambda j: "auto needs resilience.mtbf_h (the mean time between failures of this job's nodes, in hours)",
    ),
    Rule(
        "signal-lead-inside-time-limit",
        "resilience.signal_lead_s",
        lambda j: j.resilience.signal_lead_s >= j.resources.time_limit_min * 60,
        lambda j: (
            f"{j.resilience.signal_lead_s} s is not shorter than the time limit ({j.resources.time_limit_min} min)"
        ),
    ),
    Rule(
        "heartbeat-inside-dist-timeout",
        "health.heartbeat_step_s",
        lambda j: j.health.watchdog and j.health.heartbeat_step_s >= j.train.dist_timeout_s,
        lambda j: (
            f"{j.health.heartbeat_step_s} s is not shorter than train.dist_timeout_s = "
            f"{j.train.dist_timeout_s}: a hung collective would fail the job before the watchdog could requeue it"
        ),
    ),
    Rule(
        "async-wait-inside-checkpoint-heartbeat",
        "checkpoint.async_wait_s",
        lambda j: (
            j.health.watchdog
            and j.checkpoint.async_save
            and j.checkpoint.async_wait_s >= j.health.heartbeat_checkpoint_s
        ),
        lambda j: (
            f"{j.checkpoint.async_wait_s} s is not shorter than health.heartbeat_checkpoint_s = "
            f"{j.health.heartbeat_checkpoint_s}: the watchdog would end the job before a stuck writer is abandoned"
        ),
    ),
)


def problems(job: "JobConfig", rules: tuple[Rule, ...] = RULES) -> list[Problem]:
    """Every rule ``job`` breaks, in table order."""
    return [Problem(rule.name, rule.key, rule.message(job)) for rule in rules if rule.broken(job)]


class RulesBroken(ValueError):
    """Raised from the model validator with every broken rule, so the loader can name each one's line."""

    def __init__(self, broken: list[Problem]) -> None:
        super().__init__("; ".join(f"@{p.key}: {p.message}" for p in broken))
        self.problems = broken
