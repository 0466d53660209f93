"""Warm standby ranks: the go protocol, who is promoted, a standby's srun, and a group of sruns as one step."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from air_hpc.runtime.standby import (
    STANDBY_ENV,
    STARTED_AT_ENV,
    promoted,
    read_go,
    wait_for_go,
    write_go,
)
from air_hpc.runtime.step_group import StepGroup
from air_hpc.runtime.supervisor import standby_argv

SRUN = [
    "srun",
    "--ntasks=4",
    "--distribution=arbitrary",
    "--cpus-per-task=1",
    "--kill-on-bad-exit=1",
    "--label",
    "python",
    "-m",
    "air_hpc.runtime",
    "/runs/x",
]


def test_a_standby_srun_holds_one_node_s_rank_slots_beside_the_step() -> None:
    assert standby_argv(SRUN, "n3", 2) == [
        "srun",
        "--overlap",
        "--nodes=1",
        "--ntasks=2",
        "--nodelist=n3",
        "--cpus-per-task=1",
        "--kill-on-bad-exit=1",
        "--label",
        "python",
        "-m",
        "air_hpc.runtime",
        "/runs/x",
    ]


def test_go_carries_an_environment_and_nothing_else(tmp_path: Path) -> None:
    assert read_go(tmp_path) is None
    write_go(tmp_path, {"MASTER_ADDR": "n1", "AIR_HPC_STEP_ATTEMPT": "1"}, clock=lambda: 12.5)
    go = {"MASTER_ADDR": "n1", "AIR_HPC_STEP_ATTEMPT": "1", STARTED_AT_ENV: "12.5"}
    assert read_go(tmp_path) == go and wait_for_go(tmp_path) == go
    (tmp_path / "go.json").write_text(json.dumps({"env": {"MASTER_PORT": 29500}}))
    with pytest.raises(ValueError, match="not an environment"):
        read_go(tmp_path)


def test_a_standby_becomes_a_rank_only_where_the_new_order_has_its_slot(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("n1\nn1\nn3\nn3\n")  # n2 failed, the spare n3 took its ranks
    go = {"SLURM_HOSTFILE": str(hostfile)}

    def on(node: str, local: int) -> bool:
        return promoted({"SLURMD_NODENAME": node, "SLURM_LOCALID": str(local)}, go)

    assert on("n1", 0) and on("n1", 1) and on("n3", 1)
    assert not on("n2", 0) and not on("n4", 0) and not on("n1", 2)
    assert not promoted({"SLURMD_NODENAME": "n1", "SLURM_LOCALID": "0"}, {})


def _sh(code: str) -> "subprocess.Popen[str]":
    return subprocess.Popen(["sh", "-c", code], stderr=subprocess.PIPE, text=True)


def test_a_group_fails_when_one_srun_fails_and_ends_the_others() -> None:
    lines: list[str] = []
    group = StepGroup(
        {"n1": _sh("echo 'srun: error: n1: task 0: Killed' >&2; exit 9"), "n2": _sh("sleep 60")}, lines.append
    )
    deadline = time.monotonic() + 20
    while (code := group.poll()) is None:
        assert time.monotonic() < deadline, "the group did not end"
        time.sleep(0.05)
    assert code == 9 and group.procs["n2"].returncode == -signal.SIGTERM
    group.join_readers(5)
    assert lines == ["srun: error: n1: task 0: Killed\n"]


def test_a_group_ends_when_all_end_and_keeps_only_the_nodes_asked_for() -> None:
    group = StepGroup({"n1": _sh("exit 0"), "n2": _sh("sleep 0.2"), "n3": _sh("sleep 60")}, lambda _: None)
    gone = group.keep({"n1", "n2"})
    assert [p.args for p in gone] == [["sh", "-c", "sleep 60"]]
    assert gone[0].wait(timeout=10) == -signal.SIGTERM
    assert group.wait(timeout=10) == 0 and group.poll() == 0
    assert group.alive("n1") is False and group.alive("n3") is False


def test_a_standby_process_leaves_on_a_stop_and_runs_as_a_rank_once_told(tmp_path: Path) -> None:
    """In a process of its own, as srun starts it: warm up, wait, leave on SIGTERM; a second one is promoted."""
    script = textwrap.dedent(
        """
        import sys
        from air_hpc.runtime import standby
        standby.warm_up = lambda: None  # the imports are the real ones' business; this checks the protocol
        sys.exit(standby.main(lambda: print("rank", flush=True) or 7))
        """
    )
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("n1\n")
    env = {**os.environ, STANDBY_ENV: str(tmp_path), "SLURMD_NODENAME": "n1", "SLURM_LOCALID": "0"}
    leaving = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready-n1-0").exists():
        assert leaving.poll() is None and time.monotonic() < deadline, "the standby never got ready"
        time.sleep(0.05)
    leaving.send_signal(signal.SIGTERM)
    assert leaving.wait(timeout=20) == 0
    rank = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    write_go(tmp_path, {"SLURM_HOSTFILE": str(hostfile)})
    out, _ = rank.communicate(timeout=20)
    assert rank.returncode == 7 and out == "rank\n"
    spare = subprocess.run(
        [sys.executable, "-c", script], env={**env, "SLURMD_NODENAME": "n9"}, capture_output=True, text=True
    )
    assert spare.returncode == 0 and spare.stdout == ""


def test_a_warm_standby_builds_its_model_and_optimizer_without_importing_anything() -> None:
    """What the warm-up leaves out, every restart pays: Megatron's optimizer imports TorchDynamo on its first
    construction (~0.5 s of the model phase on the testbed) unless the standby imported it while it waited."""
    job = Path(__file__).resolve().parents[2] / "configs" / "jobs" / "gpt-tiny-local.yaml"
    script = textwrap.dedent(
        f"""
        import contextlib, json, socket, sys
        from air_hpc.runtime.standby import warm_up
        warm_up()
        from air_hpc.backend import megatron_compat
        from air_hpc.config import load_job
        from air_hpc.train import model, parallel
        job = load_job({str(job)!r}, ("parallel.tp=1", "parallel.pp=1", "resources.tasks_per_node=1"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = parallel.DistEnv(0, 1, 0, "127.0.0.1", port, "localhost")
        with contextlib.ExitStack() as stack:
            stack.enter_context(megatron_compat.cpu_patched())
            ctx = stack.enter_context(parallel.distributed(env, job.layout, "gloo", 60))
            before = set(sys.modules)
            parallel.seed(ctx, 1)
            model.build(job, ctx)
            print(json.dumps(sorted(set(sys.modules) - before)))
        """
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
