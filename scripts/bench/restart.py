#!/usr/bin/env python3
"""Fault to first resumed step: in-job restart on a hot spare, warm and cold, against the requeue path.

On a running testbed (``air-hpc testbed up``), two gpt-tiny jobs with one spare each
(``resources.spare_nodes: 1``) run at once, one with warm standbys (``resilience.warm_standby``:
interpreter started and imports done before any fault) and one without: today's restart, a new
``srun``, is the baseline, measured on the same machine at the same time. Each loses a rank
(``kill -9``) twice: after a checkpoint (the warm job once its standbys are ready), which restarts
the step on the spare inside the job, and right after the resume, which finds no spare left and
takes the requeue path (exit code, ``scontrol requeue`` without the bad nodes, a new start).
For each restart it prints the seconds from the fault to the step's end being noticed (detection)
and to the first step trained after the resume, the steps trained again, the ratio to the cold
in-job restart (target: warm <= 3 s on an idle testbed), and where the time went, phase by phase:
``detect`` (fault to the step's end noticed by the supervisor), ``relaunch`` (to the next step:
the probe and the spare's choice, or the requeue and Slurm's new start), then the slowest rank's
start-up phases from its ``startup`` event (``launch`` ... ``first_step``,
``air_hpc.train.startup.PHASES``; a promoted standby counts from its go, so ``launch`` and
``imports`` are what was left of its warm-up). They add up to the fault-to-resume time but for
what lies between the ``srun`` and the ranks' process creation.

Usage: ``scripts/bench/restart.py --testbed STATE_DIR [--steps 60] [--interval 3]``.
"""

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"
#: gpt-tiny-testbed's 2 nodes and the spare: one warm standby each.
STANDBY_NODES = 3


def wait_for(what: str, condition: Any, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out waiting for {what}")
        time.sleep(0.05)


class Watch:
    """What one run's files say so far: its events and the steps it trained."""

    def __init__(self, run_dir: Any) -> None:
        self.run_dir = run_dir

    def events(self, kind: str) -> list[dict[str, Any]]:
        from air_hpc.records.events import read_events

        path = self.run_dir.events
        return [e for e in read_events(path) if e["kind"] == kind] if path.exists() else []

    def metrics(self) -> list[dict[str, Any]]:
        from air_hpc.records.metrics import read_metrics

        return list(read_metrics(self.run_dir.metrics))

    def last_step(self) -> int:
        return max((int(r["step"]) for r in self.metrics()), default=0)

    def standby_ready(self) -> bool:
        """Every node of the step and the spare has a warm standby (``runtime.standby``)."""
        from air_hpc.runtime.standby import READY_PREFIX

        ready = [len(list(d.glob(f"{READY_PREFIX}*"))) for d in self.run_dir.heartbeat.glob("*/standby-*")]
        return max(ready, default=0) >= STANDBY_NODES

    def wait_past(self, kind: str) -> None:
        """Until the running step has a ``kind`` event and has trained a step after it."""
        wait_for("the step to start", lambda: self.events("step_started"))
        started = self.events("step_started")[-1]["time"]

        def ready() -> bool:
            marks = [e["time"] for e in self.events(kind) if e["time"] > started]
            return bool(marks) and any(r["time"] > marks[0] for r in self.metrics())

        wait_for(f"{kind} and a step after it", ready)


def submit_job(args: argparse.Namespace, name: str, warm: bool) -> tuple[Any, Any]:
    """The gpt-tiny job with one spare, submitted to the running testbed: (client, submission)."""
    from air_hpc.config.load import load_job
    from air_hpc.launch.submit import submit
    from air_hpc.testbed import Testbed
    from air_hpc.train import data

    bed = Testbed(args.testbed)
    if not bed.status()["up"]:
        raise SystemExit(f"bench: no testbed running in {args.testbed}; run `air-hpc testbed up` first")
    os.environ.update(bed.env)
    work = Path(tempfile.mkdtemp(prefix="air-hpc-bench-restart-"))
    corpus = data.prepare(data.project_sources(), work / "corpus.h5", data.ByteTokenizer()).path
    job = load_job(
        JOB,
        [
            f"run.root={work}",
            f"run.name={name}",
            f"data.path={corpus}",
            f"train.steps={args.steps}",
            f"checkpoint.interval_steps={args.interval}",
            "checkpoint.keep_last=20",
            "health.preflight=false",
            "resources.spare_nodes=1",
            f"resilience.warm_standby={str(warm).lower()}",
            f"cluster.topology_file={bed.layout.topology_conf}",
        ],
    )
    client = bed.client()
    return client, submit(job, "slurm", client)


def phases_after(watch: Watch, faulted: float) -> dict[str, float]:
    """Where the time from the fault to the first resumed step went (see the module docstring)."""
    from air_hpc.train.startup import PHASES

    ended = next(e["time"] for e in watch.events("step_ended") if e["time"] > faulted)
    relaunched = next(e["time"] for e in watch.events("step_started") if e["time"] > ended)
    startup = next(e for e in watch.events("startup") if e["time"] > relaunched)
    slowest = int(startup["slowest_rank"])
    phases = {"detect": ended - faulted, "relaunch": relaunched - ended}
    phases.update({phase: float(startup["phases_s"][phase][slowest]) for phase in PHASES})
    return phases


def kill_a_rank(watch: Watch, after: str, warm: bool) -> tuple[float, float, int, dict[str, float]]:
    """Once ``after`` happened (and, ``warm``, every standby is ready), SIGKILL the running step's last rank:
    (detection s, first resumed step s, redone, phases)."""
    import psutil

    from air_hpc.health.heartbeat import read_beats

    watch.wait_past(after)
    if warm:
        wait_for("the warm standby", watch.standby_ready, 180)
    ended = len(watch.events("step_ended"))
    started = watch.events("step_started")[-1]["generation"]
    beats = read_beats(watch.run_dir.heartbeat / started)
    victim = psutil.Process(beats[max(beats)].pid)
    if str(watch.run_dir.path) not in victim.cmdline():
        raise SystemExit(f"bench: pid {victim.pid} is not a rank of this run")
    trained = watch.last_step()
    faulted = time.time()
    victim.kill()
    resumes = len(watch.events("resume"))
    wait_for("the resume", lambda: len(watch.events("resume")) > resumes)
    resumed = watch.events("resume")[-1]["step"]

    def first_resumed() -> list[dict[str, Any]]:
        return [r for r in watch.metrics() if r["step"] == resumed + 1 and r["time"] > faulted]

    wait_for("the first resumed step", first_resumed)
    wait_for("the start-up record", lambda: any(e["time"] > faulted for e in watch.events("startup")))
    detected = watch.events("step_ended")[ended]["time"] - faulted
    return detected, first_resumed()[0]["time"] - faulted, trained - resumed, phases_after(watch, faulted)


Result = tuple[str, float, float, int, dict[str, float]]
"""(path, detection s, fault to first resumed step s, steps redone, phases)."""


def one_job(args: argparse.Namespace, warm: bool, results: dict[bool, list[Result]]) -> None:
    """One job: a crash after a checkpoint (in-job, on the spare), then one right after the resume (requeue)."""
    from air_hpc.records.rundir import RunDir
    from air_hpc.slurm.jobs import JobState

    client, done = submit_job(args, "warm" if warm else "cold", warm)
    watch = Watch(RunDir(done.run_dir))
    found = [
        (path, *kill_a_rank(watch, after, wait_warm))
        for path, after, wait_warm in (("in-job", "checkpoint_saved", warm), ("requeue", "resume", False))
    ]
    status = client.job_status(done.job_id)
    while status is None or not status.state.terminal:
        time.sleep(1)
        status = client.job_status(done.job_id)
    if status.state != JobState.COMPLETED or not watch.events("spares_exhausted"):
        raise SystemExit(f"bench: job {done.job_id} ended {status.state}; see {watch.run_dir.logs}")
    print(f"{'warm' if warm else 'cold'}: job {done.job_id}, run {watch.run_dir.path}", flush=True)
    results[warm] = found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--testbed", type=Path, required=True, help="state directory of a running testbed")
    parser.add_argument("--steps", type=int, default=60, help="long enough for a busy machine")
    parser.add_argument("--interval", type=int, default=3, help="checkpoint.interval_steps")
    args = parser.parse_args()

    # Both jobs at once, so both paths meet the same machine: warm standbys, and today's new srun.
    results: dict[bool, list[Result]] = {}
    errors: list[str] = []

    def run(warm: bool) -> None:
        try:
            one_job(args, warm, results)
        except BaseException as exc:  # a thread's SystemExit would vanish silently
            errors.append(f"{'warm' if warm else 'cold'} job: {exc!r}")

    threads = [threading.Thread(target=run, args=(warm,)) for warm in (True, False)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors or len(results) != 2:
        raise SystemExit("bench: " + "; ".join(errors or ["a job did not finish its faults"]))
    rows = {"warm in-job": results[True][0], "cold in-job": results[False][0], "requeue": results[False][1]}
    cold_s = rows["cold in-job"][2]
    print("gpt-tiny, 2 nodes x 2 ranks + 1 spare; baseline: the cold in-job restart (a new srun), same run")
    print(f"{'path':<14}{'detect s':>10}{'resume s':>10}{'redone':>8}{'vs cold':>10}")
    for path, (_, detected, resume_s, redone, _) in rows.items():
        print(f"{path:<14}{detected:>10.1f}{resume_s:>10.1f}{redone:>8d}{resume_s / cold_s:>9.2f}x")
    phases = {path: row[4] for path, row in rows.items()}
    print(f"{'phase':<14}{'warm s':>10}{'cold s':>10}{'requeue s':>10}{'warm/cold':>11}")
    for phase, warm_s in phases["warm in-job"].items():
        base = phases["cold in-job"][phase]
        ratio = f"{warm_s / base:>10.2f}x" if base > 0 else f"{'-':>11}"
        print(f"{phase:<14}{warm_s:>10.2f}{base:>10.2f}{phases['requeue'][phase]:>10.2f}{ratio}")
    sums = [sum(p.values()) for p in phases.values()]
    print(f"{'sum':<14}{sums[0]:>10.2f}{sums[1]:>10.2f}{sums[2]:>10.2f}")


if __name__ == "__main__":
    main()
