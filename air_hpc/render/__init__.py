"""Batch scripts: a checked spec from the job config, rendered through the templates in ``sbatch/``."""

from air_hpc.render.script import render_script
from air_hpc.render.spec import NodeRequest, SbatchSpec, build_spec, job_environment

__all__ = ["NodeRequest", "SbatchSpec", "build_spec", "job_environment", "render_script"]
