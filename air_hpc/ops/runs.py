"""Finding runs: a run directory, a run name under the runs root, or the job file that names it.

What a run's files hold is ``air_hpc.records``; this module only finds the directory.
"""

import difflib
import os
from pathlib import Path

from air_hpc.errors import UserError
from air_hpc.records.names import CHECKPOINTS, JOB_JSON, SUBMISSIONS
from air_hpc.records.rundir import RunDir

#: Where run names are looked up (``air-hpc status NAME``); default ``./runs``.
RUNS_ROOT_ENV = "AIR_HPC_RUNS_ROOT"


def runs_root(root: Path | str | None = None) -> Path:
    """The directory holding run directories: ``root``, else $AIR_HPC_RUNS_ROOT, else ./runs."""
    chosen = root if root is not None else os.environ.get(RUNS_ROOT_ENV) or "runs"
    return Path(chosen).expanduser().resolve()


def existing_runs_root(root: Path | str | None = None) -> Path:
    """The runs root, which must exist: exporting an empty fleet from a mistyped root would look like success."""
    base = runs_root(root)
    if not base.is_dir():
        given = "--root" if root is not None else f"${RUNS_ROOT_ENV}" if os.environ.get(RUNS_ROOT_ENV) else "./runs"
        raise UserError(
            f"runs root {base} ({given}): no such directory; give the directory holding the run directories "
            f"(--root DIR, or ${RUNS_ROOT_ENV})"
        )
    return base


def is_run_dir(path: Path) -> bool:
    """A directory air-hpc made for a run: it holds the resolved job, the submissions or checkpoints."""
    run_dir = RunDir(path)
    return run_dir.job_json.is_file() or run_dir.submissions.is_file() or run_dir.checkpoints.is_dir()


def find_runs(root: Path | str | None = None) -> list[RunDir]:
    """The run directories directly under the runs root, by name."""
    base = runs_root(root)
    if not base.is_dir():
        return []
    return [RunDir(p) for p in sorted(base.iterdir()) if p.is_dir() and is_run_dir(p)]


def resolve_run(target: str, root: Path | str | None = None) -> RunDir:
    """The one way every command finds a run: a run directory, a run name under the runs root, or a job file.

    A job file names its run (``run.root``/``run.name``), so the file a run was
    submitted with finds it again.
    """
    path = Path(target).expanduser()
    if path.is_file():
        from air_hpc.config import load_job

        return RunDir.of(load_job(path))
    if path.is_dir():
        if is_run_dir(path):
            return RunDir(path.resolve())
        raise UserError(
            f"{target}: not a run directory (no {JOB_JSON}, {SUBMISSIONS} or {CHECKPOINTS}/); "
            "give a run directory, a run name or a job file"
        )
    base = runs_root(root)
    if path.name == target and is_run_dir(base / target):
        return RunDir(base / target)
    preset = _preset_run(target)
    if preset is not None:
        return preset
    names = [r.path.name for r in find_runs(base)]
    close = difflib.get_close_matches(target, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise UserError(
        f"{target}: no such run: not a run directory, a job file, or a run name under {base}{hint} "
        f"(`air-hpc runs --root DIR` lists them; ${RUNS_ROOT_ENV} sets the root)"
    )


def _preset_run(name: str) -> RunDir | None:
    """The run of the shipped preset job called ``name``, when it has one (its run.root may be elsewhere)."""
    from air_hpc.config.load import PRESETS_DIR, load_job

    preset = PRESETS_DIR / "jobs" / f"{name}.yaml"
    if Path(name).name != name or not preset.is_file():
        return None
    run = RunDir.of(load_job(preset))
    return run if is_run_dir(run.path) else None
