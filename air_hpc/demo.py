"""The README's first command, end to end on the embedded testbed.

Bring up the testbed, build the corpus, pick nodes from the testbed's own
topology, render and submit gpt-tiny TP2xPP2 across two emulated nodes through
our batch script, preempt it once with a real Slurm signal, watch it requeue
and resume, wait for the end, then print the report and write the plot.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from air_hpc.config import JobConfig, load_job
from air_hpc.config.load import PRESETS_DIR
from air_hpc.errors import AirHpcError
from air_hpc.launch.submit import Submission, submit
from air_hpc.observe.plot import plot_run
from air_hpc.observe.records import load_records
from air_hpc.observe.report import build_report, format_report
from air_hpc.ops.control import run_status, watch_run
from air_hpc.ops.waiting import describe_failure, wait_deadline_s, wait_slurm
from air_hpc.records.events import EventKind, read_events
from air_hpc.records.metrics import read_metrics
from air_hpc.records.rundir import RunDir
from air_hpc.slurm.client import ONCE, SlurmClient
from air_hpc.slurm.jobs import JobStatus
from air_hpc.testbed import Testbed
from air_hpc.train import data

if TYPE_CHECKING:
    from rich.console import Console

log = logging.getLogger(__name__)

#: Shipped with the presets, so the demo runs from a wheel too (it overrides every path the job file sets).
#: The events the demo prints after the preemption: the story of a stop, a save, a requeue and a resume.
SHOWN_KINDS = frozenset(
    {EventKind.SIGNAL, EventKind.STOP, EventKind.CHECKPOINT_SAVED, EventKind.REQUEUE, EventKind.RESUME}
)
DEMO_JOB = PRESETS_DIR / "jobs" / "gpt-tiny-testbed.yaml"


@dataclass(frozen=True)
class DemoResult:
    job_id: str
    state: str
    run_dir: Path
    plot: Path


def ensure_corpus(path: Path, echo: Callable[[str], None]) -> None:
    """Build the demo corpus from the project's own text once; the same tree gives the same file."""
    if path.exists():
        return
    info = data.prepare(data.project_sources(), path, data.ByteTokenizer())
    echo(f"corpus: {path} ({info.tokens} tokens, {info.documents} documents)")


def wait_for_step(run_dir: RunDir, step: int, client: SlurmClient, job_id: str, timeout_s: float) -> int:
    """Block until metrics.jsonl reports ``step`` (or later); fail if the job ends first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = read_metrics(run_dir.metrics)
        if rows and int(rows[-1]["step"]) >= step:
            return int(rows[-1]["step"])
        status = client.job_status(job_id)
        if status is not None and status.state.terminal:
            raise AirHpcError(f"job {job_id} ended {status.state} before step {step}; see {run_dir.logs}")
        time.sleep(0.5)
    raise AirHpcError(f"job {job_id} did not reach step {step} within {timeout_s:.0f} s; see {run_dir.logs}")


def run_demo(
    state_dir: Path | None,
    run_root: Path,
    echo: Callable[[str], None],
    preempt_at_step: int = 8,
    console: "Console | None" = None,
) -> DemoResult:
    """The demo; with a ``console``, the wait for the end is the live view (``air-hpc status --watch``)."""
    bed = Testbed(state_dir)
    status = bed.up()
    echo(f"testbed up: {len(status['nodes'])} nodes on leaves {status['leaves']} ({bed.layout.root})")
    echo(f"  use it from a shell: export SLURM_CONF={bed.layout.slurm_conf}")
    client = bed.client()
    job, submission = _submit_demo(bed, client, run_root, echo)
    run_dir = RunDir(submission.run_dir)
    final = _preempt_and_wait(job, run_dir, client, submission.job_id, preempt_at_step, echo, console)
    plot = _report_and_plot(run_dir, job.run.name, echo)
    echo(f"the testbed stays up; stop it with: air-hpc testbed down --state-dir {bed.layout.root}")
    return DemoResult(submission.job_id, final.state.value, run_dir.path, plot)


def _submit_demo(
    bed: Testbed, client: SlurmClient, run_root: Path, echo: Callable[[str], None]
) -> tuple[JobConfig, Submission]:
    """Write the corpus if missing and submit the demo job onto the testbed's topology."""
    corpus = run_root / "data" / "corpus.h5"
    ensure_corpus(corpus, echo)
    name = time.strftime("gpt-tiny-demo-%Y%m%d-%H%M%S")
    job = load_job(
        DEMO_JOB,
        [
            f"run.name={name}",
            f"run.root={run_root}",
            f"data.path={corpus}",
            f"cluster.topology_file={bed.layout.topology_conf}",
        ],
    )
    submission = submit(job, "slurm", client)
    for note in submission.plan.notes:
        echo(f"placement: {note}")
    echo(
        f"submitted job {submission.job_id}: gpt-tiny TP{job.layout.tp}xPP{job.layout.pp}xDP{job.layout.dp} "
        f"on {job.resources.nodes} nodes; script {RunDir(submission.run_dir).sbatch}"
    )
    return job, submission


def _preempt_and_wait(
    job: JobConfig,
    run_dir: RunDir,
    client: SlurmClient,
    job_id: str,
    preempt_at_step: int,
    echo: Callable[[str], None],
    console: "Console | None",
) -> JobStatus:
    """Signal the job as a preemption would at ``preempt_at_step``, wait for its end, and show its events."""
    reached = wait_for_step(run_dir, preempt_at_step, client, job_id, timeout_s=300)
    client.scancel(job_id, signal=job.resilience.signal, batch=True, retry=ONCE)
    echo(f"preempting at step {reached}: scancel --signal={job.resilience.signal} --batch {job_id}")

    def show(change: JobStatus) -> None:
        echo(f"  job {job_id}: {change.state}, restarts {change.restarts}")

    if console is None:
        final = wait_slurm(client, job_id, timeout_s=wait_deadline_s(job), poll_s=1.0, on_change=show)
    else:
        final = watch_run(lambda: run_status(run_dir, client), console, timeout_s=wait_deadline_s(job), poll_s=1.0).job
    for event in read_events(run_dir.events):
        if event.get("kind") in SHOWN_KINDS:
            shown = ("step", "reason", "seconds", "signal", "exit_code")
            details = ", ".join(f"{k}={event[k]}" for k in shown if k in event)
            echo(f"  {event['kind']}: {details}")
    if final.state.value != "COMPLETED":
        raise AirHpcError(describe_failure(final) + f"; see {run_dir.logs}")
    return final


def _report_and_plot(run_dir: RunDir, name: str, echo: Callable[[str], None]) -> Path:
    """Print the goodput report and write ``run.png``; returns the plot's path."""
    records = load_records(run_dir)
    report = build_report(records)
    if report is None:
        raise AirHpcError(f"{run_dir.metrics}: the run wrote no steps")
    echo(format_report(report))
    plot = plot_run(records, report, run_dir.path / "run.png", name)
    echo(f"plot: {plot}")
    return plot
