"""gpt-tiny across two emulated nodes of the Slurm testbed: sbatch, srun, ``python -m air_hpc.launch``.

The rendered batch script runs the real trainer on 2 nodes x 2 tasks (TP2 x PP2, gloo
over loopback); the run must finish on its own with a decreasing loss.
"""

import time
from pathlib import Path
from typing import Any

import pytest

from air_hpc.config import load_job
from air_hpc.launch.submit import submit
from air_hpc.rundir import RunDir
from air_hpc.train import data
from air_hpc.train.metrics import read_metrics

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
STEPS = 4


def test_gpt_tiny_trains_across_two_testbed_nodes(testbed: Any, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.h5"
    data.prepare(data.project_sources(), corpus, data.ByteTokenizer())
    job = load_job(
        REPO / "configs/jobs/gpt-tiny-testbed.yaml",
        [
            f"run.root={tmp_path}",
            f"data.path={corpus}",
            f"train.steps={STEPS}",
            f"cluster.topology_file={testbed.topology_conf}",
            "health.preflight=false",
        ],
    )
    done = submit(job, "slurm", testbed.client)
    run_dir = RunDir(done.run_dir)
    deadline = time.monotonic() + 240
    while True:
        status = testbed.client.job_status(done.job_id)
        if status is not None and status.state.terminal:
            break
        assert time.monotonic() < deadline, f"job {done.job_id} still {status}"
        time.sleep(1)
    logs = "\n".join(p.read_text()[-2000:] for p in sorted(run_dir.logs.glob("*")))
    assert str(status.state) == "COMPLETED", logs
    records = read_metrics(run_dir.metrics)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1)), logs
    assert records[-1]["loss"] < records[0]["loss"] - 0.2
    hosts = set()
    for rank in range(4):
        first = run_dir.rank_log(rank).read_text().splitlines()[0]
        assert f"rank={rank} " in first and f"rank {rank} of 4 on " in first, first
        hosts.add(first.split(" of 4 on ")[1].split()[0])
    assert len(hosts) == 2, hosts
