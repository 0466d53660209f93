"""Job configuration: typed models, the cross-field rules (``rules``) and the loader that composes profiles."""

from air_hpc.config.layout import ParallelLayout
from air_hpc.config.load import load_job
from air_hpc.config.models import JobConfig

__all__ = ["JobConfig", "ParallelLayout", "load_job"]
