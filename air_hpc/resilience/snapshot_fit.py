"""Whether a job's in-memory snapshots fit its nodes' host memory, estimated from the model before anything runs.

A node holds, per rank on it: the rank's reusable capture buffer, and in its holder the rank's own
snapshot and the buddy copy it keeps for a rank on another node, each for the newest
:data:`HELD_STEPS` steps. A snapshot is the rank's share of the model (TP x PP split; DP ranks hold
replicas) with its optimizer state: fp32 weights and two Adam moments (12 bytes a parameter), or
bf16 weights with fp32 main weights and moments (14 bytes).
"""

from dataclasses import dataclass

from air_hpc.config.models import JobConfig
from air_hpc.errors import ConfigError

#: Steps of snapshots a holder keeps per rank (:data:`air_hpc.runtime.snapholder.KEEP_STEPS`).
HELD_STEPS = 2
#: Copies of a shard a node holds per rank on it: capture buffer + (own + buddy's) x held steps.
COPIES_PER_RANK = 1 + 2 * HELD_STEPS
GIB = 1 << 30


def model_parameters(job: JobConfig) -> tuple[int, int]:
    """(transformer layer parameters, embedding parameters) of the GPT the job builds."""
    m = job.model
    h, ffn = m.hidden_size, m.ffn_hidden_size or 4 * m.hidden_size
    per_layer = 4 * h * h + 4 * h + 2 * h * ffn + ffn + h + 4 * h  # attention, MLP, two layer norms
    return m.num_layers * per_layer, (m.vocab_size + m.seq_len) * h + 2 * h


def shard_bytes(job: JobConfig) -> int:
    """The largest rank's snapshot: its layers' share, plus the embedding on the first/last stage."""
    layers, embedding = model_parameters(job)
    tp, pp = job.parallel.tp, job.parallel.pp
    params = layers // (tp * pp) + embedding // tp
    per_param = 14 if job.precision == "bf16" else 12
    return params * per_param


@dataclass(frozen=True)
class SnapshotFit:
    shard_bytes: int
    node_bytes: int
    limit_bytes: int | None
    limit_key: str

    @property
    def fits(self) -> bool:
        return self.limit_bytes is None or self.node_bytes <= self.limit_bytes


def snapshot_fit(job: JobConfig) -> SnapshotFit:
    """The estimate against ``resources.mem_gb`` (else ``hardware.host_mem_gb``; neither set: not checked)."""
    shard = shard_bytes(job)
    node = shard * COPIES_PER_RANK * job.resources.tasks_per_node
    if job.resources.mem_gb:
        return SnapshotFit(shard, node, job.resources.mem_gb * GIB, "resources.mem_gb")
    if job.hardware.host_mem_gb:
        return SnapshotFit(shard, node, job.hardware.host_mem_gb * GIB, "hardware.host_mem_gb")
    return SnapshotFit(shard, node, None, "")


def check_snapshot_fit(job: JobConfig) -> None:
    """Refuse (exit 2) in-memory snapshots that would not fit the nodes' host memory."""
    if not job.checkpoint.memory_interval_steps:
        return
    fit = snapshot_fit(job)
    if fit.fits or fit.limit_bytes is None:
        return
    raise ConfigError(
        f"checkpoint.memory_interval_steps: in-memory snapshots need about {fit.node_bytes / GIB:.1f} GiB of host "
        f"memory per node ({job.resources.tasks_per_node} rank(s) x {fit.shard_bytes / GIB:.2f} GiB shard x "
        f"{COPIES_PER_RANK} copies: capture buffer, own and buddy snapshot of {HELD_STEPS} steps) but "
        f"{fit.limit_key} is {fit.limit_bytes / GIB:g} GiB; set checkpoint.memory_interval_steps=0, "
        "more tensor/pipeline parallelism, or more memory"
    )
