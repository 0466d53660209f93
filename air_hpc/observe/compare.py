"""Did an interrupted run end exactly like an uninterrupted one? Losses and final weights, bit for bit.

Every loss the run logged (a step trained twice after a restart is logged twice)
must equal the reference's loss of that step, every reference step must have
been logged, and the final checkpoint's shards must have the same sha256 as the
reference's (from the manifests, which the checkpointer wrote after hashing).
"""

from dataclasses import dataclass

from air_hpc.errors import CheckpointError
from air_hpc.records.metrics import read_metrics
from air_hpc.records.rundir import RunDir
from air_hpc.resilience.store import Manifest, step_name

SHARD_SUFFIX = ".distcp"


@dataclass(frozen=True)
class Comparison:
    losses_equal: bool
    weights_equal: bool
    loss_mismatches: tuple[str, ...]
    """``step 7: 3.21 != 3.20 (reference)``, ``step 9: not logged``; empty when equal."""
    weights_note: str
    """Why the weights differ or could not be compared; empty when equal."""

    @property
    def identical(self) -> bool:
        return self.losses_equal and self.weights_equal


def logged_losses(run_dir: RunDir) -> list[tuple[int, float]]:
    """(step, loss) of every metrics line with a numeric loss, in the order written."""
    rows = read_metrics(run_dir.metrics)
    return [(r["step"], float(r["loss"])) for r in rows if isinstance(r.get("loss"), (int, float))]


def loss_mismatches(run: list[tuple[int, float]], reference: list[tuple[int, float]]) -> tuple[str, ...]:
    """Pure: every way ``run``'s logged losses differ from ``reference``'s (compared as exact floats)."""
    expected = dict(reference)
    problems = [
        f"step {step}: {loss!r} != {expected[step]!r} (reference)"
        if step in expected
        else f"step {step}: not in the reference"
        for step, loss in run
        if expected.get(step) != loss
    ]
    seen = {step for step, _ in run}
    problems += [f"step {step}: not logged" for step in sorted(expected) if step not in seen]
    return tuple(problems)


def shard_hashes(run_dir: RunDir, step: int) -> dict[str, str]:
    """sha256 of each model/optimizer shard of the step's committed checkpoint, by path."""
    manifest = Manifest.read(run_dir.checkpoints / step_name(step))
    return {f.path: f.sha256 for f in manifest.files if f.path.endswith(SHARD_SUFFIX)}


def compare_runs(run_dir: RunDir, reference: RunDir, final_step: int) -> Comparison:
    mismatches = loss_mismatches(logged_losses(run_dir), logged_losses(reference))
    try:
        mine, theirs = shard_hashes(run_dir, final_step), shard_hashes(reference, final_step)
    except CheckpointError as exc:
        return Comparison(not mismatches, False, mismatches, str(exc))
    differing = sorted(p for p in mine.keys() | theirs.keys() if mine.get(p) != theirs.get(p))
    note = f"{len(differing)} shard(s) differ, e.g. {differing[0]}" if differing else ""
    if not mine:
        note = f"no shards in the step {final_step} checkpoint"
    return Comparison(not mismatches, not note, mismatches, note)
