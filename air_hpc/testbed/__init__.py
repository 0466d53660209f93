"""The embedded multi-node Slurm testbed used by the demo and the integration tests."""

from air_hpc.testbed.cluster import Testbed, default_state_dir

__all__ = ["Testbed", "default_state_dir"]
