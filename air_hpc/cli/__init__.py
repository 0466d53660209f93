"""The ``air-hpc`` command line: thin click commands over the library.

Only :mod:`air_hpc.cli.main` is an entry point; ``python -m`` on any other module of this package would
define its commands and exit 0 having done nothing, so it says which to run instead.
"""

import sys

ENTRY_POINT = "air_hpc.cli.main"


def _refuse_module_run(orig_argv: list[str]) -> None:
    """Exit 2 naming the entry points when ``python -m air_hpc.cli.<not main>`` is running."""
    try:
        module = orig_argv[orig_argv.index("-m") + 1]
    except (ValueError, IndexError):
        return
    if module.startswith(f"{__name__}.") and module != ENTRY_POINT:
        sys.stderr.write(
            f"error: {module} is not an entry point; run `air-hpc ...`, `python -m air_hpc ...` "
            f"or `python -m {ENTRY_POINT} ...`\n"
        )
        sys.exit(2)


_refuse_module_run(list(getattr(sys, "orig_argv", ())))
