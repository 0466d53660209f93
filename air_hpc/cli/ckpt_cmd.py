"""``air-hpc ckpt list|verify|prune``: inspect and tidy a run's checkpoints."""

import sys
from pathlib import Path

import click

from air_hpc.cli.options import echo_json, json_option, run_argument
from air_hpc.errors import CheckpointError, UserError
from air_hpc.ops.runs import resolve_run
from air_hpc.resilience.store import Check, CheckpointInfo, CheckpointStore

#: What each check compares, in the words ``ckpt list`` prints.
CHECK_WORDS: dict[Check, str] = {
    "size": "file sizes match the manifest (contents not read; --sha256 reads and hashes every file)",
    "sha256": "sha256 of every file matches the manifest (contents read in full)",
}
CHECK_SHORT: dict[Check, str] = {"size": "sizes ok", "sha256": "sha256 ok"}


def open_store(run: str) -> CheckpointStore:
    """RUN as every command takes it (directory, name or job file); retention comes from its job.json."""
    rundir = resolve_run(run)
    if not rundir.path.is_dir():
        raise UserError(f"{run}: run directory {rundir.path} does not exist yet (nothing submitted?)")
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
def list_(run: str, deep: bool, as_json: bool) -> None:
    """List RUN's checkpoints: step, size, complete?, and what was checked (sizes, or sha256 with --sha256)."""
    store = open_store(run)
    check: Check = "sha256" if deep else "size"
    infos = store.list(check=check)
    if as_json:
        echo_json(
            {
                "latest": store.latest_pointer(),
                "check": check,
                "checked": CHECK_WORDS[check],
                "checkpoints": [_info_json(i) for i in infos],
            }
        )
        return
    if not infos:
        click.echo(f"no checkpoints in {store.root}")
        return
    latest = store.latest_pointer()
    click.echo(f"{'step':>8}  {'size':>10}  {'complete':>8}  {'checked':>9}  note")
    for info in infos:
        checked = CHECK_SHORT[check] if info.verified else "FAILED" if info.complete else "-"
        note = "latest" if info.complete and info.step == latest else ""
        note = info.problem or note
        click.echo(
            f"{info.step:>8}  {_human(info.bytes):>10}  {'yes' if info.complete else 'no':>8}  {checked:>9}  {note}"
        )
    click.echo(f"checked: {CHECK_WORDS[check]}")


@ckpt.command()
@run_argument
@click.argument("step", type=int, required=False)
@json_option
def verify(run: str, step: int | None, as_json: bool) -> None:
    """Check sha256 of every file of STEP (default: every committed checkpoint); exit 1 if corrupt."""
    store = open_store(run)
    committed = store.committed_steps()
    if step is not None and step not in committed:
        unfinished = {path.name for path in store.partial()}
        partial = " (an unfinished save of it exists)" if f".tmp-{store.path(step).name}" in unfinished else ""
        have = ", ".join(map(str, committed)) or "none"
        raise UserError(f"{store.root}: no such checkpoint: step {step}{partial}; committed steps: {have}")
    steps = [step] if step is not None else committed
    if not steps:
        raise CheckpointError(f"{store.root}: no committed checkpoints to verify")
    failures = []
    results: list[dict[str, object]] = []
    for s in steps:
        try:
            manifest = store.verify(s, check="sha256")
        except CheckpointError as exc:
            failures.append(str(exc))
            results.append({"step": s, "ok": False, "problem": str(exc)})
            if not as_json:
                click.echo(f"step {s}: CORRUPT: {exc}")
        else:
            results.append({"step": s, "ok": True, "files": len(manifest.files), "bytes": manifest.bytes})
            if not as_json:
                click.echo(f"step {s}: ok ({len(manifest.files)} files, {_human(manifest.bytes)})")
    if as_json:
        echo_json({"check": "sha256", "checkpoints": results})
    if failures:
        raise CheckpointError(f"{len(failures)} of {len(steps)} checkpoint(s) failed verification: {failures[0]}")


@ckpt.command()
@run_argument
@click.option("--keep", "keep_last", type=click.IntRange(min=1), required=True, help="Keep the newest K checkpoints.")
@click.option("--every", "keep_every", type=click.IntRange(min=0), default=0, help="Also keep every M-th step.")
@click.option("--partial", is_flag=True, help="Also delete unfinished saves (only when no job is running).")
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; delete nothing.")
@click.option("-y", "--yes", is_flag=True, help="Delete without asking (needed when not on a terminal).")
def prune(run: str, keep_last: int, keep_every: int, partial: bool, dry_run: bool, yes: bool) -> None:
    """Delete checkpoints beyond the newest K (and every M-th step), after asking on a terminal.

    Without --yes it asks first on a terminal and refuses elsewhere, since a
    deleted checkpoint cannot be brought back; --dry-run only lists.
    """
    store = open_store(run)
    steps = store.retention_victims(keep_last=keep_last, keep_every=keep_every)
    unfinished = store.partial() if partial else []
    if not steps and not unfinished:
        click.echo(f"nothing to remove in {store.root} (kept: {_steps_text(store.committed_steps())})")
        return
    plan = _prune_plan(store, steps, unfinished)
    if dry_run:
        click.echo(f"would remove {plan}; nothing removed (--dry-run)")
        return
    if not yes and not _confirmed(f"remove {plan}?"):
        click.echo("nothing removed")
        return
    removed = store.apply_retention(keep_last=keep_last, keep_every=keep_every, only=steps)
    for path in store.remove_partial() if partial else []:
        click.echo(f"removed unfinished {path.name}")
    click.echo(f"removed {len(removed)} checkpoint(s){': ' + ', '.join(map(str, removed)) if removed else ''}")


def _steps_text(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) or "none"


def _prune_plan(store: CheckpointStore, steps: list[int], unfinished: list[Path]) -> str:
    kept = [s for s in store.committed_steps() if s not in steps]
    what = f"{len(steps)} checkpoint(s) of {store.root}: step(s) {_steps_text(steps)}, keeping {_steps_text(kept)}"
    if unfinished:
        what += f", and the unfinished save(s) {', '.join(p.name for p in unfinished)}"
    return what


def _confirmed(question: str) -> bool:
    """Ask on a terminal; anywhere else (a script, cron, a pipe) refuse, naming --yes and --dry-run."""
    if not sys.stdin.isatty():
        raise UserError(
            f"ckpt prune would {question.rstrip('?')}: not on a terminal to confirm; "
            "pass --yes to delete, or --dry-run to only list"
        )
    return click.confirm(question, default=False)


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
