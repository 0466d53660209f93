"""``air-hpc ckpt list|verify|prune``: inspect and tidy a run's checkpoints."""

import json
from pathlib import Path

import click

from air_hpc.cli.options import json_option
from air_hpc.errors import CheckpointError, UserError
from air_hpc.resilience.store import CheckpointInfo, CheckpointStore
from air_hpc.rundir import RunDir

run_argument = click.argument("run", type=click.Path(exists=False, path_type=Path))


def open_store(run: Path) -> CheckpointStore:
    """RUN is a run directory, or a job config file naming one; retention comes from its job.json."""
    if run.is_file():
        from air_hpc.config import load_job

        rundir = RunDir.of(load_job(str(run), ()))
    else:
        rundir = RunDir(run)
    if not rundir.path.is_dir():
        raise UserError(f"{run}: no such run directory (give a run directory or the job's config file)")
    keep_last, keep_every = 1, 0
    if rundir.job_json.is_file():
        ckpt = rundir.read_job().checkpoint
        keep_last, keep_every = ckpt.keep_last, ckpt.keep_every
    return CheckpointStore(rundir.checkpoints, keep_last=keep_last, keep_every=keep_every)


@click.group()
def ckpt() -> None:
    """Inspect, verify and prune a run's checkpoints."""


@ckpt.command("list")
@run_argument
@click.option("--sha256", "deep", is_flag=True, help="Verify sha256 of every file, not only sizes.")
@json_option
def list_(run: Path, deep: bool, as_json: bool) -> None:
    """List RUN's checkpoints: step, size, complete?, verified?"""
    store = open_store(run)
    infos = store.list(check="sha256" if deep else "size")
    if as_json:
        click.echo(json.dumps({"latest": store.latest_pointer(), "checkpoints": [_info_json(i) for i in infos]}))
        return
    if not infos:
        click.echo(f"no checkpoints in {store.root}")
        return
    latest = store.latest_pointer()
    click.echo(f"{'step':>8}  {'size':>10}  {'complete':>8}  {'verified':>8}  note")
    for info in infos:
        verified = f"{info.check}" if info.verified else "no"
        note = "latest" if info.complete and info.step == latest else ""
        note = info.problem or note
        click.echo(
            f"{info.step:>8}  {_human(info.bytes):>10}  {'yes' if info.complete else 'no':>8}  {verified:>8}  {note}"
        )


@ckpt.command()
@run_argument
@click.argument("step", type=int, required=False)
def verify(run: Path, step: int | None) -> None:
    """Check sha256 of every file of STEP (default: every committed checkpoint); exit 1 if corrupt."""
    store = open_store(run)
    steps = [step] if step is not None else store.committed_steps()
    if not steps:
        raise CheckpointError(f"{store.root}: no committed checkpoints to verify")
    failures = []
    for s in steps:
        try:
            manifest = store.verify(s, check="sha256")
        except CheckpointError as exc:
            failures.append(str(exc))
            click.echo(f"step {s}: CORRUPT: {exc}")
        else:
            click.echo(f"step {s}: ok ({len(manifest.files)} files, {_human(manifest.bytes)})")
    if failures:
        raise CheckpointError(f"{len(failures)} of {len(steps)} checkpoint(s) failed verification: {failures[0]}")


@ckpt.command()
@run_argument
@click.option("--keep", "keep_last", type=click.IntRange(min=1), required=True, help="Keep the newest K checkpoints.")
@click.option("--every", "keep_every", type=click.IntRange(min=0), default=0, help="Also keep every M-th step.")
@click.option("--partial", is_flag=True, help="Also delete unfinished saves (only when no job is running).")
def prune(run: Path, keep_last: int, keep_every: int, partial: bool) -> None:
    """Delete checkpoints beyond the newest K (and every M-th step)."""
    store = open_store(run)
    removed = store.apply_retention(keep_last=keep_last, keep_every=keep_every)
    if partial:
        removed_partial = store.remove_partial()
        for path in removed_partial:
            click.echo(f"removed unfinished {path.name}")
    click.echo(f"removed {len(removed)} checkpoint(s){': ' + ', '.join(map(str, removed)) if removed else ''}")


def _info_json(info: CheckpointInfo) -> dict[str, object]:
    return {
        "step": info.step,
        "path": str(info.path),
        "bytes": info.bytes,
        "complete": info.complete,
        "verified": info.verified,
        "check": info.check,
        "problem": info.problem,
    }


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
