"""Whether a job's ``container.image`` can run: pyxis in Slurm, enroot on the node.

pyxis is a SPANK plugin: where slurmd and srun load it, ``srun --help`` lists ``--container-image``;
without it srun rejects the option and the job fails at its first step, after the wait in the
queue. pyxis starts containers through enroot, which must be installed on every compute node.
"""

import shutil

from air_hpc.config.models import JobConfig
from air_hpc.doctor.checks import Finding
from air_hpc.doctor.node import node_label
from air_hpc.slurm.client import SlurmClient


def pyxis_loaded(client: SlurmClient) -> bool:
    """Whether srun here offers pyxis's options (read-only: ``srun --help`` submits nothing)."""
    return "--container-image" in client.srun_help()


def enroot_installed() -> bool:
    return shutil.which("enroot") is not None


def container_findings(job: JobConfig, pyxis: bool, enroot: bool, host: str, on_compute_node: bool) -> list[Finding]:
    """Errors for a container job Slurm cannot start; enroot is checked on the node doctor runs on."""
    if job.container is None:
        return []
    found = []
    if not pyxis:
        found.append(
            Finding(
                "error",
                "container.image",
                "srun here has no --container-image: the pyxis SPANK plugin is not loaded "
                "(plugstack.conf needs `required /usr/lib/pyxis/spank_pyxis.so`); unset container to run without one",
            )
        )
    if not enroot:
        found.append(
            Finding(
                "error" if on_compute_node else "warning",
                "container.image",
                f"enroot, which pyxis starts containers with, is not installed on {node_label(host, on_compute_node)}",
            )
        )
    return found
