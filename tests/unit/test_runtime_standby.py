"""Warm standby ranks: the go protocol, who is promoted, a standby's srun, and a group of sruns as one step."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from air_hpc.runtime.standby import (
    RANK_GRACE_S,
    STANDBY_ENV,
    STARTED_AT_ENV,
    WARM_UP_NICE,
    rank_slots,
    read_go,
    wait_for_go,
    warm_up_in_background,
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


def test_a_standby_srun_is_one_task_with_the_cpus_of_a_node_s_rank_slots_beside_the_step() -> None:
    assert standby_argv(SRUN, "n3", 2) == [
        "srun",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        "--nodelist=n3",
        "--cpus-per-task=2",
        "--kill-on-bad-exit=1",
        "--label",
        "python",
        "-m",
        "air_hpc.runtime",
        "/runs/x",
    ]
    bare = [a for a in SRUN if not a.startswith("--cpus-per-task=")]
    assert "--cpus-per-task" not in " ".join(standby_argv(bare, "n3", 2))  # Slurm's default, as the step had


def test_go_carries_an_environment_and_nothing_else(tmp_path: Path) -> None:
    assert read_go(tmp_path) is None
    write_go(tmp_path, {"MASTER_ADDR": "n1", "AIR_HPC_STEP_ATTEMPT": "1"}, clock=lambda: 12.5)
    go = {"MASTER_ADDR": "n1", "AIR_HPC_STEP_ATTEMPT": "1", STARTED_AT_ENV: "12.5"}
    assert read_go(tmp_path) == go and wait_for_go(tmp_path) == go
    (tmp_path / "go.json").write_text(json.dumps({"env": {"MASTER_PORT": 29500}}))
    with pytest.raises(ValueError, match="not an environment"):
        read_go(tmp_path)


def test_a_standby_forks_as_many_ranks_as_the_new_order_gives_its_node(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("n1\nn1\nn3\nn3\n")  # n2 failed, the spare n3 took its ranks
    go = {"SLURM_HOSTFILE": str(hostfile)}

    def slots(node: str) -> int:
        return rank_slots({"SLURMD_NODENAME": node}, go)

    assert (slots("n1"), slots("n2"), slots("n3"), slots("n4")) == (2, 0, 2, 0)
    assert rank_slots({"SLURMD_NODENAME": "n1"}, {}) == 0


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


STANDBY_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    from air_hpc.runtime import standby
    standby.warm_up = lambda: None  # the imports are the real ones' business; this checks the protocol

    def rank():
        local = os.environ["SLURM_LOCALID"]
        os.write(1, f"rank {local} {os.environ.get('MARK')}\\n".encode())  # one write: lines do not interleave
        how = os.environ.get("RANKS", "exit")
        if how == "exit":
            return 7
        if how == "stop":  # as the trainer: handle the stop, then leave with the requeue code
            signal.signal(signal.SIGUSR1, lambda *_: sys.exit(85))
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR1])
            open(os.path.join(os.environ["OUT"], "armed-" + local), "w").close()
            time.sleep(60)
        if how == "die" and local == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "verdict" and local == "0":
            return 86
        time.sleep(60)

    def leave(code):
        sys.stdout.flush()
        os._exit(code)

    sys.exit(standby.main(rank, leave))
    """
)


def _standby(tmp_path: Path, node: str, **env: str) -> "subprocess.Popen[str]":
    environ = {**os.environ, STANDBY_ENV: str(tmp_path), "SLURMD_NODENAME": node, "OUT": str(tmp_path), **env}
    return subprocess.Popen([sys.executable, "-c", STANDBY_SCRIPT], env=environ, stdout=subprocess.PIPE, text=True)


def _wait_for(what: str, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not ready():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_standby_leaves_on_a_stop_and_forks_the_ranks_once_told(tmp_path: Path) -> None:
    """In a process of its own, as srun starts it: warm up, wait, leave on SIGTERM; a second one forks the node's
    two ranks with the go's environment; a third, on a node the new order leaves out, leaves."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("n1\nn1\n")
    leaving = _standby(tmp_path, "n1")
    _wait_for("the standby to get ready", lambda: (tmp_path / "ready-n1").exists())
    leaving.send_signal(signal.SIGTERM)
    assert leaving.wait(timeout=20) == 0
    standby = _standby(tmp_path, "n1")
    write_go(tmp_path, {"SLURM_HOSTFILE": str(hostfile), "MARK": "go"})
    out, _ = standby.communicate(timeout=20)
    assert standby.returncode == 7 and sorted(out.splitlines()) == ["rank 0 go", "rank 1 go"]
    spare = _standby(tmp_path, "n9")
    out, _ = spare.communicate(timeout=20)
    assert spare.returncode == 0 and out == ""


def test_a_standby_passes_a_stop_to_its_ranks_and_fails_as_its_first_failed_rank(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("n1\nn1\n")
    write_go(tmp_path, {"SLURM_HOSTFILE": str(hostfile)})
    stopped = _standby(tmp_path, "n1", RANKS="stop")
    _wait_for("both ranks to arm", lambda: len(list(tmp_path.glob("armed-*"))) == 2)
    stopped.send_signal(signal.SIGUSR1)
    assert stopped.wait(timeout=20) == 85  # each rank took the stop itself
    # A rank killed outright: the other is ended, and srun sees the node's task killed as that rank was.
    dying = _standby(tmp_path, "n1", RANKS="die")
    assert dying.wait(timeout=20) == -signal.SIGKILL
    _wait_for("no rank left behind", lambda: not _children_of(dying.pid))
    # A rank that exited with a code: the other, frozen, is ended after the grace, and the code goes on.
    started = time.monotonic()
    verdict = _standby(tmp_path, "n1", RANKS="verdict")
    assert verdict.wait(timeout=20) == 86
    assert time.monotonic() - started >= RANK_GRACE_S


def _children_of(pid: int) -> list[int]:
    import psutil

    return [p.pid for p in psutil.process_iter(["ppid"]) if p.info["ppid"] == pid]


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


def test_the_warm_up_imports_at_the_lowest_priority_and_the_ranks_keep_theirs() -> None:
    """The imports' thread is niced (it takes only the CPU the step beside it leaves); the main thread, which forks
    the ranks, is not, and an import's error reaches it."""
    seen: dict[str, int] = {}

    def imports() -> None:
        seen["thread"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    before = os.getpriority(os.PRIO_PROCESS, 0)
    warm_up_in_background(imports)
    assert seen["thread"] == WARM_UP_NICE and os.getpriority(os.PRIO_PROCESS, 0) == before

    def broken() -> None:
        raise ImportError("no module named megatron")

    with pytest.raises(ImportError, match="megatron"):
        warm_up_in_background(broken)
