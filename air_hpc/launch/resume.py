"""Can this job resume its run directory? Compare it with the job that wrote the checkpoints there.

A job file copied with its ``run.name`` and a changed model would otherwise resume the old
run's checkpoints and crash on every start with a shape mismatch (then stop as a crash loop).
The run directory's ``job.json`` records the job that last trained there; against it a change
of the model's shapes, vocabulary or the data's tokenizer cannot resume (:func:`check_resume`
refuses it, naming the keys and the two ways out), while a changed parallel layout or node count
can (``dist_checkpointing`` reshards on load) and is said. ``--fresh`` sets the old directory
aside (:func:`set_aside`) instead of deleting anything.
"""

import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from air_hpc.config.models import DataConfig, JobConfig
from air_hpc.data.blend import tokenizer_of
from air_hpc.errors import ConfigError, InputError
from air_hpc.records.rundir import RunDir
from air_hpc.resilience.store import CheckpointStore

log = logging.getLogger(__name__)

#: Keys whose change alters a saved tensor's shape (or the meaning of its rows): a checkpoint cannot load.
SHAPE_KEYS = (
    "model.num_layers",
    "model.hidden_size",
    "model.num_attention_heads",
    "model.ffn_hidden_size",
    "model.vocab_size",
    "model.seq_len",
)
#: Sections whose change a checkpoint survives: it is resharded to the new layout on load.
RESHARD_SECTIONS = ("parallel", "resources")
TOKENIZER_KEY = "data.path (tokenizer)"


@dataclass(frozen=True)
class Change:
    key: str
    before: object
    after: object

    def __str__(self) -> str:
        return f"{self.key} {self.before} -> {self.after}"


@dataclass(frozen=True)
class ResumeCheck:
    """The newest checkpoint of the run directory and what changed since the job that trained there."""

    run_dir: Path
    step: int
    blocking: tuple[Change, ...]
    """Changes the checkpoints cannot be loaded under."""
    resharding: tuple[Change, ...]
    """Layout changes the checkpoints are resharded for."""

    def note(self) -> str | None:
        """One line for the user when a resumable layout change is allowed, else None."""
        if not self.resharding:
            return None
        return (
            f"resuming {self.run_dir} from step {self.step} under a changed layout "
            f"({', '.join(map(str, self.resharding))}): the checkpoint is resharded on load"
        )


def check_resume(job: JobConfig, fresh: bool = False) -> ResumeCheck | None:
    """What resuming ``job`` from its run directory means; None with nothing to resume (or ``fresh``).

    Raises :class:`ConfigError` (exit 2) when the run directory holds checkpoints that the job cannot
    load, naming the changed keys and the two ways out.
    """
    run = RunDir.of(job)
    recorded = _recorded_job(run)
    steps = CheckpointStore(run.checkpoints, job.checkpoint.keep_last).committed_steps()
    if fresh or recorded is None or not steps:
        return None
    found = list(changes(recorded, job.model_dump(mode="json")))
    tokenizer = _tokenizer_change(recorded, job)
    blocking = tuple(c for c in found if c.key in SHAPE_KEYS) + ((tokenizer,) if tokenizer else ())
    resharding = tuple(c for c in found if c.key.split(".")[0] in RESHARD_SECTIONS)
    check = ResumeCheck(run.path, max(steps), blocking, resharding)
    if blocking:
        raise ConfigError(
            f"{run.path} holds checkpoints (up to step {check.step}) of a different model than this job "
            f"({run.job_json}): {', '.join(map(str, blocking))}; they cannot be resumed. Give the job a new "
            "run.name (--set run.name=NAME), or start this run afresh with --fresh "
            f"(the old run directory is moved aside to {aside_path(run).name}, nothing is deleted)"
        )
    return check


def changes(before: Mapping[str, Any], after: Mapping[str, Any], prefix: str = "") -> Iterator[Change]:
    """Every leaf key whose value differs, dotted (``model.hidden_size``), with effective defaults filled in."""
    before, after = _effective(before, prefix), _effective(after, prefix)
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            yield from changes(old, new, f"{prefix}{key}.")
        elif old != new:
            yield Change(f"{prefix}{key}", old, new)


def _effective(section: Mapping[str, Any], prefix: str) -> Mapping[str, Any]:
    """The MLP width a model really has (unset means 4 x hidden_size), so an explicit 4x is no change."""
    if prefix != "model." or section.get("ffn_hidden_size") is not None:
        return section
    hidden = section.get("hidden_size")
    return {**section, "ffn_hidden_size": 4 * hidden if isinstance(hidden, int) else None}


def _recorded_job(run: RunDir) -> Mapping[str, Any] | None:
    """The raw job record (not validated: an older air-hpc may have written it); None when absent or unreadable."""
    try:
        data = json.loads(run.job_json.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s: cannot compare this job with the run's record: %s", run.job_json, exc)
        return None
    return data if isinstance(data, dict) else None


def _tokenizer_change(recorded: Mapping[str, Any], job: JobConfig) -> Change | None:
    """The data's tokenizer, when the data changed and both say which tokenizer made them."""
    try:
        old_data = DataConfig.model_validate(recorded.get("data"))
    except ValueError:  # pydantic's ValidationError: a record from another release
        return None
    if old_data.sources() == job.data.sources():
        return None
    try:
        old, new = tokenizer_of(old_data), tokenizer_of(job.data)
    except InputError as exc:
        log.info("tokenizers not compared: %s", exc)
        return None
    return None if old == new else Change(TOKENIZER_KEY, old, new)


def aside_path(run: RunDir, now_s: float | None = None) -> Path:
    """Where ``--fresh`` moves a run directory: beside it, named after it and the time."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now_s is None else now_s))
    return run.path.with_name(f"{run.path.name}.replaced-{stamp}")


def set_aside(run: RunDir) -> Path | None:
    """Move an existing run directory aside (nothing deleted); the caller holds its owner lock. None: none there."""
    if not run.path.exists():
        return None
    target = aside_path(run)
    suffix = 1
    while target.exists():
        target = target.with_name(f"{aside_path(run).name}-{suffix}")
        suffix += 1
    run.path.rename(target)
    log.info("moved %s aside to %s", run.path, target)
    return target
