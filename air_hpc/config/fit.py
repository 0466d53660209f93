"""Whether one node of a partition can hold one node of a job: CPUs, memory, GPUs, and enough such nodes.

Shared by ``air-hpc doctor`` (its partition findings) and submission (a refused ``sbatch --test-only``
is explained in these words instead of Slurm's own, such as "Invalid generic resource (gres)
specification" for a GPU job on a CPU partition).
"""

from dataclasses import dataclass

from air_hpc.config.models import JobConfig
from air_hpc.slurm.cluster import Partition


@dataclass(frozen=True)
class Misfit:
    key: str
    """The job key that asks too much (``hardware.gpus_per_node``)."""
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


def partition_fit(job: JobConfig, part: Partition) -> list[Misfit]:
    """What one node of ``job`` needs that ``part``'s nodes do not have (empty: it fits)."""
    found: list[Misfit] = []
    r, hw = job.resources, job.hardware
    name = f"partition {part.name}"
    cpus = r.tasks_per_node * job.cpus_per_task
    mem_mb = (r.mem_gb or 0) * 1024
    gpus = hw.gpus_per_node if hw.device == "cuda" else 0
    if part.max_cpus_per_node is not None and cpus > part.max_cpus_per_node:
        found.append(
            Misfit(
                "resources.cpus_per_task",
                f"tasks_per_node {r.tasks_per_node} x cpus_per_task {job.cpus_per_task} = {cpus} CPUs per node; "
                f"{name}'s largest node has {part.max_cpus_per_node}",
            )
        )
    if mem_mb and part.max_mem_mb is not None and mem_mb > part.max_mem_mb:
        found.append(
            Misfit("resources.mem_gb", f"{r.mem_gb} GiB per node; {name}'s largest node has {part.max_mem_mb} MB")
        )
    if gpus and part.max_gpus_per_node == 0:
        found.append(
            Misfit(
                "hardware.gpus_per_node",
                f"hardware {hw.name} uses {gpus} GPUs per node but {name} has no GPU gres "
                "(sinfo %G shows none); pick a GPU partition",
            )
        )
    elif gpus > part.max_gpus_per_node:
        found.append(
            Misfit(
                "hardware.gpus_per_node",
                f"hardware {hw.name} uses {gpus} GPUs per node; {name}'s nodes have at most {part.max_gpus_per_node}",
            )
        )
    fitting = part.nodes_with(gpus=gpus, cpus=cpus, mem_mb=mem_mb)
    if r.nodes <= part.total_nodes and fitting < r.nodes and (gpus <= part.max_gpus_per_node):
        found.append(
            Misfit(
                "resources.nodes",
                f"{r.nodes} nodes wanted but only {fitting} of {name}'s {part.total_nodes} have "
                f"{gpus} GPUs, {cpus} CPUs and {mem_mb} MB",
            )
        )
    return found


def job_partition(job: JobConfig, partitions: tuple[Partition, ...]) -> Partition | None:
    """The partition the job asks for (``cluster.partition``), else the cluster's default; None if neither exists."""
    wanted = job.cluster.partition
    return next((p for p in partitions if (p.name == wanted if wanted else p.default)), None)
