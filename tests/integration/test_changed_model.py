"""A copied job with a changed model, against real checkpoints of the real trainer (issue 24 item 1).

Submit refuses it (exit 2) before anything runs, naming the keys; when a changed model reaches the
ranks anyway (a record written by an air-hpc without the check), the crash names Megatron's exception
in ``status``'s and ``report``'s records instead of ``unknown``.
"""

import json
from pathlib import Path

import pytest

from air_hpc.config import load_job
from air_hpc.errors import ConfigError
from air_hpc.launch.resume import check_resume
from air_hpc.observe.records import last_crash, load_records
from air_hpc.records.events import read_events
from air_hpc.resilience.store import CheckpointStore
from tests.integration.local_run import submit_local

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_a_changed_model_is_refused_and_its_crash_is_named(tmp_path: Path, small_corpus: Path) -> None:
    base = [
        f"run.root={tmp_path}",
        "run.name=copied",
        f"data.path={small_corpus}",
        "train.steps=2",
        "train.lr_warmup_steps=0",
        "checkpoint.interval_steps=2",
        "health.preflight=false",
        "resources.tasks_per_node=2",
        "parallel.pp=1",
    ]
    job = load_job(REPO / "configs/jobs/gpt-tiny-local.yaml", base)
    run_dir, handle = submit_local(job, timeout_min=5)
    handle.results()
    assert CheckpointStore(run_dir.checkpoints, 2).committed_steps() == [2]

    changed = load_job(REPO / "configs/jobs/gpt-tiny-local.yaml", [*base, "model.hidden_size=96", "train.steps=4"])
    with pytest.raises(ConfigError, match=r"model.hidden_size 64 -> 96.*run.name.*--fresh"):
        check_resume(changed)
    check = check_resume(load_job(REPO / "configs/jobs/gpt-tiny-local.yaml", [*base, "train.steps=4", "parallel.tp=1"]))
    assert check is not None and "parallel.tp 2 -> 1" in (check.note() or "")

    run_dir.write_job(changed)  # what submit wrote before it compared: the ranks meet the old checkpoint
    _, handle = submit_local(changed, timeout_min=5)
    with pytest.raises(Exception):  # noqa: B017 - submitit re-raises the rank's failure as its own type
        handle.results()
    crashes = [e for e in read_events(run_dir.events) if e["kind"] == "rank_failed"]
    assert crashes and all(e["error"].startswith("CheckpointingException: Global shape mismatch") for e in crashes), (
        json.dumps(crashes)
    )
    named = last_crash(load_records(run_dir))
    assert named is not None and "CheckpointingException: Global shape mismatch" in named
