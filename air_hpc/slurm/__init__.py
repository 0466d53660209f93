"""Everything that talks to Slurm goes through :class:`SlurmClient`."""

from air_hpc.slurm.client import SlurmClient

__all__ = ["SlurmClient"]
