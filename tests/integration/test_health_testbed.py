"""Health on the real Slurm testbed: an unhealthy node and a hung rank are blamed, excluded on requeue, and
the run finishes on other nodes.

The batch scripts are the real rendered template. Faults are injected at the
boundary: an ``ibstat`` on PATH that reports a port Down on one node (the step
is a small payload running the real pre-flight through ``rank_guard``), and a
rank of the real trainer that sleeps forever in the middle of a step (through
``sitecustomize`` on the job's PYTHONPATH).
"""

import json
import os
import sys
from pathlib import Path
from typing import Any

import hostlist
import pytest

from air_hpc.config import load_job
from air_hpc.config.models import JobConfig
from air_hpc.health.badnodes import read_bad_nodes
from air_hpc.launch.submit import plan, submit
from air_hpc.records.events import read_events
from air_hpc.records.jsonl import read_jsonl
from air_hpc.records.rundir import RunDir
from air_hpc.slurm.jobs import JobState
from tests.integration.step_injection import step_injection
from tests.integration.waiting import wait_ended

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TESTBED_JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"
IBSTAT = REPO / "tests" / "data" / "ibstat"
STEP_LIMIT_S = 6

#: argv: RUN_DIR MODE. Pre-flight + heartbeat + watchdog through rank_guard, then steps of one gloo
#: all-reduce each. Healthy ranks that cannot start (a bad node failed pre-flight) wait in the
#: rendezvous until srun kills them, as real ones would. MODE freeze: on the first start every rank
#: stops beating in step 2 (as if every process froze).
PAYLOAD = """
import os, sys, time
from pathlib import Path
import torch, torch.distributed as dist
from air_hpc.errors import AirHpcError
from air_hpc.health.guard import rank_guard
from air_hpc.records.rundir import RunDir
from air_hpc.train.metrics import setup_rank_logging

run_dir, mode = RunDir(Path(sys.argv[1])), sys.argv[2]
job = run_dir.read_job()
rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
host, restart = os.environ["SLURMD_NODENAME"], int(os.environ.get("SLURM_RESTART_COUNT", "0"))
setup_rank_logging(run_dir.rank_log(rank), rank)
print(f"rank {rank} on {host} restart {restart}", flush=True)
try:
    with rank_guard(job, run_dir, rank, world, host, os.environ) as heartbeat:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                                rank=rank, world_size=world)
        tensor = torch.ones(2)
        for step in range(1, 6):
            heartbeat.beat("step", step)
            if mode == "freeze" and step == 2 and restart == 0:
                time.sleep(3600)
            dist.all_reduce(tensor)
        dist.destroy_process_group()
except AirHpcError as exc:
    print(f"error: {exc}", file=sys.stderr, flush=True)
    sys.exit(int(exc.exit_code))
"""

#: Reports a port of mlx5_0 Down on the node named in ``bad_file``, all Active elsewhere.
FAKE_IBSTAT = """#!/bin/sh
if [ "$SLURMD_NODENAME" = "$(cat {bad_file})" ]; then cat {down}; else cat {up}; fi
"""


def make_job(testbed: Any, tmp_path: Path, name: str, *overrides: str, hcas: tuple[str, ...] = ()) -> JobConfig:
    job = load_job(
        TESTBED_JOB,
        [
            f"run.root={tmp_path}",
            f"run.name={name}",
            f"cluster.topology_file={testbed.topology_conf}",
            f"data.path={tmp_path / 'corpus.h5'}",
            "resilience.max_restarts=2",
            *overrides,
        ],
    )
    return job.model_copy(update={"hardware": job.hardware.model_copy(update={"hcas": hcas})}) if hcas else job


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    from air_hpc.train import data

    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 200)
    return data.prepare([text], tmp_path / "corpus.h5", data.ByteTokenizer()).path


def run_payload(testbed: Any, tmp_path: Path, job: JobConfig, mode: str = "run") -> tuple[str, list[str]]:
    """Submit, wait for the end; returns the final state and the node list of each start."""
    payload = tmp_path / "payload.py"
    payload.write_text(PAYLOAD)
    done = submit(job, "slurm", testbed.client, step_command=[sys.executable, str(payload), str(job.run.dir), mode])
    status = wait_ended(testbed.client, done.job_id, 300)
    starts = [row["nodelist"] for row in read_jsonl(RunDir.of(job).submissions) if row.get("kind") == "started"]
    return str(status.state), starts


def test_unhealthy_node_is_recorded_and_excluded_on_requeue(testbed: Any, tmp_path: Path, corpus: Path) -> None:
    probe = make_job(testbed, tmp_path, "probe")
    pinned = hostlist.expand_hostlist(plan(probe).request.nodelist)
    bad = pinned[-1]
    fake = tmp_path / "bin"
    fake.mkdir()
    (tmp_path / "bad-node").write_text(bad)
    ibstat = fake / "ibstat"
    ibstat.write_text(
        FAKE_IBSTAT.format(
            bad_file=tmp_path / "bad-node",
            down=IBSTAT / "dual_port_with_roce.txt",
            up=IBSTAT / "single_active_hdr200.txt",
        )
    )
    ibstat.chmod(0o755)
    job = make_job(testbed, tmp_path, "unhealthy", f"env.PATH={fake}:{os.environ['PATH']}", hcas=("mlx5_0",))
    # The healthy node's ranks wait in the rendezvous until srun kills them: srun then exits 143, not 87.
    state, starts = run_payload(testbed, tmp_path, job)
    run_dir = RunDir.of(job)
    assert state == str(JobState.COMPLETED), starts
    assert len(starts) == 2 and bad in hostlist.expand_hostlist(starts[0]), starts
    assert bad not in hostlist.expand_hostlist(starts[1]), starts
    assert read_bad_nodes(run_dir.bad_nodes) == (bad,)
    assert "unhealthy: node" in run_dir.bad_nodes.read_text()
    unhealthy = [e for e in read_events(run_dir.events) if e["kind"] == "unhealthy"]
    assert [(e["node"], e["failed"]) for e in unhealthy] == [(bad, {"infiniband": "mlx5_0:2 is Down/Disabled"})]
    batch_err = "".join(p.read_text() for p in run_dir.logs.glob("slurm-*.err"))
    assert "step exited 87 (requeue-worthy); requeue 1 of 2" in batch_err and f"avoids bad node(s) {bad}" in batch_err
    assert "not in this allocation; its ranks run on" in batch_err
    # Later runs of the same config leave it out too.
    later = plan(job).request
    assert later.exclude == bad and bad not in hostlist.expand_hostlist(later.nodelist)


def test_batch_script_stops_a_step_whose_ranks_all_froze(testbed: Any, tmp_path: Path, corpus: Path) -> None:
    limits = ("health.heartbeat_setup_s=3", "health.heartbeat_step_s=2", "health.heartbeat_checkpoint_s=3")
    job = make_job(testbed, tmp_path, "frozen", "health.watchdog=false", *limits)
    state, starts = run_payload(testbed, tmp_path, job, "freeze")
    run_dir = RunDir.of(job)
    assert state == str(JobState.COMPLETED) and len(starts) == 2, starts
    batch_err = "".join(p.read_text() for p in run_dir.logs.glob("slurm-*.err"))
    assert "no rank made progress for 6 s; stopping the step as hung" in batch_err
    assert "step exited 86 (requeue-worthy); requeue 1 of 2" in batch_err
    # Nobody could say which node froze: none is blamed.
    assert read_bad_nodes(run_dir.bad_nodes) == ()


#: Injected through PYTHONPATH into the real trainer: on the first start, rank 3 sleeps forever in
#: the middle of its 8th step (after the step-6 checkpoint).
HANG_STEP = """
def step(self, consumed):
    # The step number from the samples consumed, not from a count of calls: under load this thread
    # may patch the class after the first steps ran.
    if consumed // self.job.train.global_batch_size + 1 == 8:
        while True:
            time.sleep(3600)
    return original(self, consumed)
"""
HANG_RANK = 'os.environ.get("SLURM_PROCID") == "3" and os.environ.get("SLURM_RESTART_COUNT", "0") == "0"'


def test_hung_rank_in_the_real_trainer_is_detected_excluded_and_the_run_finishes(
    testbed: Any, tmp_path: Path, corpus: Path
) -> None:
    job = make_job(
        testbed,
        tmp_path,
        "hung",
        "train.steps=12",
        "train.lr_warmup_steps=1",
        "checkpoint.interval_steps=3",
        f"health.heartbeat_step_s={STEP_LIMIT_S}",
        step_injection(tmp_path / "inject", HANG_STEP, when=HANG_RANK),
    )
    hang_rank = 3
    done = submit(job, "slurm", testbed.client)
    status = wait_ended(testbed.client, done.job_id, 400, poll_s=1)
    run_dir = RunDir.of(job)
    starts = [row["nodelist"] for row in read_jsonl(run_dir.submissions) if row.get("kind") == "started"]
    assert str(status.state) == str(JobState.COMPLETED), starts
    first_start = run_dir.heartbeat / f"{done.job_id}-0.0"  # the supervisor's first step attempt
    hung_beat = json.loads((first_start / f"rank-{hang_rank:05d}.json").read_text())
    events = read_events(run_dir.events)
    (hang,) = [e for e in events if e["kind"] == "hang"]
    assert (hang["step"], hang["suspect_ranks"], hang["suspect_nodes"]) == (8, [hang_rank], [hung_beat["host"]])
    assert hang["time"] - hung_beat["time_s"] < 2 * STEP_LIMIT_S, (hang, hung_beat)
    assert read_bad_nodes(run_dir.bad_nodes) == (hung_beat["host"],)
    assert len(starts) == 2 and hung_beat["host"] not in hostlist.expand_hostlist(starts[1]), starts
    hung_log = run_dir.rank_log(hang_rank).read_text()
    assert f"Python stacks of all threads of rank {hang_rank}" in hung_log and "sitecustomize.py" in hung_log
    # Resumed from the newest committed checkpoint (the async step-6 save may still be committing at the hang).
    assert [e["step"] for e in events if e["kind"] == "resume"] in ([6], [3])
    records = read_jsonl(run_dir.metrics)
    assert [r["step"] for r in records] == list(range(1, 13))
    batch_err = "".join(p.read_text() for p in run_dir.logs.glob("slurm-*.err"))
    assert "the ranks' verdict is 86" in batch_err or "step exited 86" in batch_err
