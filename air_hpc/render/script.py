"""Render an :class:`SbatchSpec` through the Jinja2 templates in ``sbatch/``.

The templates are package data: ``air_hpc/templates`` links to ``sbatch/`` in a checkout and is a
copy of it in a wheel, found through the package's import machinery, so an installed wheel renders
what a checkout does; any file there can be rendered or included by name.

Pure: the same spec gives byte-identical text. Undefined template variables are
errors (StrictUndefined), never empty strings in a script.
"""

from functools import cache

import jinja2

from air_hpc.render.quoting import sbatch_value, shell_quote
from air_hpc.render.spec import SbatchSpec

JOB_TEMPLATE = "job.sbatch.j2"


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("air_hpc", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["sh"] = shell_quote
    env.filters["sbatch"] = lambda value, key: sbatch_value(str(value), key)
    return env


def render_script(spec: SbatchSpec, template: str = JOB_TEMPLATE) -> str:
    return _environment().get_template(template).render(spec.context)
