#!/usr/bin/env python3
"""Fault to first resumed step: in-job restart on a hot spare against the requeue path, in one job.

On a running testbed (``air-hpc testbed up``), one gpt-tiny job with one spare
(``resources.spare_nodes: 1``) loses a rank (``kill -9``) twice: after a checkpoint, and
right after the resume. The first loss restarts the step on the spare inside the job; the second finds no
spare left and takes the requeue path (exit code, ``scontrol requeue`` without the bad nodes,
a new start). For each it prints the seconds from the fault to the step's end being noticed
(detection) and to the first step trained after the resume, the steps trained again, and the
ratio of the in-job restart to the requeue path (target: in-job <= 10 s on an idle testbed), then
where each one's time went, phase by phase, with the same ratio: ``detect`` (fault to the step's
end noticed by the supervisor), ``relaunch`` (to the next step's ``srun``: the probe and the
spare's choice, or the requeue and Slurm's new start), then the slowest rank's start-up phases
from its ``startup`` event (``launch`` ... ``first_step``, ``air_hpc.train.startup.PHASES``);
they add up to the fault-to-resume time but for what lies between the ``srun`` and the ranks'
process creation.

Usage: ``scripts/bench/restart.py --testbed STATE_DIR [--steps 14] [--interval 3]``.
"""

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"


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

    def wait_past(self, kind: str) -> None:
        """Until the running step has a ``kind`` event and has trained a step after it."""
        wait_for("the step to start", lambda: self.events("step_started"))
        started = self.events("step_started")[-1]["time"]

        def ready() -> bool:
            marks = [e["time"] for e in self.events(kind) if e["time"] > started]
            return bool(marks) and any(r["time"] > marks[0] for r in self.metrics())

        wait_for(f"{kind} and a step after it", ready)


def submit_job(args: argparse.Namespace) -> tuple[Any, Any]:
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
            "run.name=restart",
            f"data.path={corpus}",
            f"train.steps={args.steps}",
            f"checkpoint.interval_steps={args.interval}",
            "checkpoint.keep_last=20",
            "health.preflight=false",
            "resources.spare_nodes=1",
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


def kill_a_rank(watch: Watch, after: str) -> tuple[float, float, int, dict[str, float]]:
    """Once ``after`` happened, SIGKILL the running step's last rank: (detection s, first resumed step s, redone,
    phases)."""
    import psutil

    from air_hpc.health.heartbeat import read_beats

    watch.wait_past(after)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--testbed", type=Path, required=True, help="state directory of a running testbed")
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--interval", type=int, default=3, help="checkpoint.interval_steps")
    args = parser.parse_args()

    from air_hpc.records.rundir import RunDir
    from air_hpc.slurm.jobs import JobState

    client, done = submit_job(args)
    run_dir = RunDir(done.run_dir)
    watch = Watch(run_dir)
    # The first crash, after a checkpoint, takes the spare; the second, right after that resume, finds none.
    results = [
        (path, *kill_a_rank(watch, after))
        for path, after in (("in-job restart", "checkpoint_saved"), ("requeue", "resume"))
    ]
    status = client.job_status(done.job_id)
    while status is None or not status.state.terminal:
        time.sleep(1)
        status = client.job_status(done.job_id)
    if status.state != JobState.COMPLETED or not watch.events("spares_exhausted"):
        raise SystemExit(f"bench: job {done.job_id} ended {status.state}; see {run_dir.logs}")
    (_, _, requeue_s, _, requeue_phases) = results[1]
    print(f"gpt-tiny, 2 nodes x 2 ranks + 1 spare, job {done.job_id}, run {run_dir.path}")
    print(f"{'path':<16}{'detect s':>10}{'resume s':>10}{'redone':>8}{'vs requeue':>12}")
    for path, detected, resume_s, redone, _ in results:
        print(f"{path:<16}{detected:>10.1f}{resume_s:>10.1f}{redone:>8d}{resume_s / requeue_s:>11.2f}x")
    in_job_phases = results[0][4]
    print(f"{'phase':<16}{'in-job s':>10}{'requeue s':>10}{'vs requeue':>12}")
    for phase, seconds in in_job_phases.items():
        base = requeue_phases[phase]
        ratio = f"{seconds / base:>11.2f}x" if base > 0 else f"{'-':>12}"
        print(f"{phase:<16}{seconds:>10.2f}{base:>10.2f}{ratio}")
    print(f"{'sum':<16}{sum(in_job_phases.values()):>10.2f}{sum(requeue_phases.values()):>10.2f}")


if __name__ == "__main__":
    main()
