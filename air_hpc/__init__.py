"""air-hpc: topology-aware, preemption-proof Megatron-core training on Slurm."""

__version__ = "0.1.0"
