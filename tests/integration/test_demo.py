"""README command one: the demo trains across two testbed nodes, survives a real preemption, reports and plots."""

from pathlib import Path
from typing import Any

import pytest

from air_hpc.demo import run_demo
from air_hpc.records.jsonl import read_jsonl
from air_hpc.records.rundir import RunDir

pytestmark = pytest.mark.integration


def test_demo_preempts_resumes_reports_and_plots(testbed: Any, tmp_path: Path) -> None:
    said: list[str] = []
    result = run_demo(testbed.state_dir, tmp_path, said.append, preempt_at_step=6)
    assert result.state == "COMPLETED"
    assert result.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = "\n".join(said)
    assert "on 1 leaf switch(es)" in text, "two nodes fit on one leaf: the selection must use one"
    assert "goodput" in text and "restarts     1" in text
    events = read_jsonl(RunDir(result.run_dir).events)
    kinds = [e["kind"] for e in events]
    assert kinds.count("resume") == 1 and "signal" in kinds and "requeue" in kinds
    steps = [row["step"] for row in read_jsonl(RunDir(result.run_dir).metrics)]
    assert steps == list(range(1, 31)), "every step once, none lost or repeated after the resume"
