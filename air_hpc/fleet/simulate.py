"""``air-hpc fleet simulate``: a seeded mixed workload of several tenants on the testbed, and what really happened.

The workload (:func:`plan_workload`, pure) is gpt-tiny trainings of the three tenants at different QOS
(``research`` at ``scavenger``, ``product`` at ``high``, ``ops`` at ``normal``, more drawn from the seed),
a short ``high`` job per ``scavenger`` training, pinned to its nodes, that preempts it (it saves, is
requeued and resumes), short jobs of other users (``nobody``, ``daemon``: really other uids) under the
tenants' accounts, and injected failures: a job that exits non-zero (application) and, from 7 jobs on, one
cancelled by its user while it runs. Every training takes one whole node, and every other job one CPU at
``normal``, so the only preemptions are the planned ones.

The ground truth is what the workload itself saw, never ``sacct`` (which a report is checked against):
submit times from this process's clock as ``sbatch`` returned, starts and ends from the trainings' own
records (``submissions.jsonl``) and from marks the short jobs write themselves, preemptions from the
runs' ``preempted`` events. Each job also carries what was expected of it, and ``ok`` says whether all
of it came true.
"""

import json
import logging
import os
import random
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from air_hpc.errors import SlurmError, UserError, WaitTimeoutError
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.jobs import JobState
from air_hpc.testbed.tenants import QOS_TIERS, SYSTEM_USERS, TENANTS, node_quota

log = logging.getLogger(__name__)

#: Three trainings, a preemptor, a short job of another user and a failing one.
MIN_JOBS = 6
#: At most this many trainings: each holds a node of its own and gpt-tiny ranks share the host's cores.
MAX_TRAININGS = 6
#: Exit code of the injected application failure.
FAILURE_EXIT_CODE = 3
TRAINING_STEPS = 6
#: A scavenger training trains longer, so its preemptor (sent after its first step) finds it still training.
VICTIM_STEPS = 40
#: From this many jobs on, a rank of the ``ops`` training is killed after this step (past its first checkpoint).
CRASH_FROM_JOBS = 8
CRASH_AFTER_STEP = 6

Kind = Literal["training", "preemptor", "short", "failure", "cancelled"]


@dataclass(frozen=True)
class PlannedJob:
    name: str
    kind: Kind
    account: str
    qos: str
    user: str
    """Who submits it: ``""`` for the user running the simulation, else another (system) user."""
    delay_s: float = 0.0
    """Short jobs: seconds after the workload starts (a preemptor goes once its victim trained a step)."""
    duration_s: int = 0
    """Short jobs: how long they run."""
    victim: str | None = None
    """Preemptors: the training they preempt."""
    expected_preemptions: int = 0
    expected_state: str = "COMPLETED"
    crash_after_step: int = 0
    """Trainings: kill a rank (SIGKILL) once this step is trained (0: never); the job requeues and resumes."""

    @property
    def expected_requeues(self) -> int:
        return self.expected_preemptions + (1 if self.crash_after_step else 0)

    @property
    def long(self) -> bool:
        """A training something strikes trains longer, so that it is still training when it is struck."""
        return bool(self.expected_preemptions or self.crash_after_step)


def plan_workload(jobs: int, seed: int) -> tuple[PlannedJob, ...]:
    """The seeded workload of ``jobs`` jobs, in submission order. Pure: the same seed gives the same plan."""
    if jobs < MIN_JOBS:
        raise UserError(
            f"--jobs {jobs}: a mixed workload needs at least {MIN_JOBS} jobs (three tenants' trainings, a preemptor, "
            "another user's job, an injected failure)"
        )
    rng = random.Random(seed)
    tiers = [("research", "scavenger"), ("product", "high"), ("ops", "normal")]
    extra = min(MAX_TRAININGS - 3, (jobs - MIN_JOBS) // 4)
    tiers += [(rng.choice(["research", "product"]), rng.choice([q.name for q in QOS_TIERS])) for _ in range(extra)]
    trainings = [
        PlannedJob(
            f"train-{i}-{account}-{qos}",
            "training",
            account,
            qos,
            "",
            expected_preemptions=1 if qos == "scavenger" else 0,
            crash_after_step=CRASH_AFTER_STEP if i == 2 and jobs >= CRASH_FROM_JOBS else 0,
        )
        for i, (account, qos) in enumerate(tiers)
    ]
    preemptors = [
        PlannedJob(f"preempt-{t.name}", "preemptor", "product", "high", "", 0.0, 2, victim=t.name)
        for t in trainings
        if t.qos == "scavenger"
    ]
    return (*trainings, *preemptors, *_others(jobs - len(trainings) - len(preemptors), rng))


def _others(count: int, rng: random.Random) -> list[PlannedJob]:
    """Short jobs of other users under the tenants' accounts; the first fails, the second (of 3+) is cancelled."""
    members = [(tenant.account, user) for tenant in TENANTS for user in tenant.users if user in SYSTEM_USERS]
    others = []
    for i in range(count):
        account, user = rng.choice(members)
        kind: Kind = "failure" if i == 0 else "cancelled" if i == 1 and count > 2 else "short"
        duration = {"failure": 1, "cancelled": 120}.get(kind) or rng.randint(2, 8)
        state = {"failure": "FAILED", "cancelled": "CANCELLED"}.get(kind, "COMPLETED")
        delay = round(rng.uniform(0, 20), 1)
        others.append(PlannedJob(f"{kind}-{i}-{user}", kind, account, "normal", user, delay, duration, None, 0, state))
    return others


def check_plan_fits(planned: tuple[PlannedJob, ...], nodes: int) -> None:
    """Every training gets a node of its own at once, within its tenant's quota, so none waits to preempt."""
    trainings = [p for p in planned if p.kind == "training"]
    if len(trainings) > nodes:
        raise UserError(f"--jobs: {len(trainings)} trainings need {len(trainings)} nodes; the testbed has {nodes}")
    for tenant in TENANTS:
        mine = sum(1 for p in trainings if p.account == tenant.account)
        if mine > node_quota(tenant, nodes):
            raise UserError(
                f"--jobs: {mine} trainings of {tenant.account} exceed its node quota of {node_quota(tenant, nodes)}"
            )


@dataclass
class Submitted:
    """One job of the workload as it goes: its Slurm id, what it saw, what it was expected to do."""

    planned: PlannedJob
    job_id: str = ""
    submit_s: float | None = None
    run_dir: Path | None = None
    state: str = ""
    nodes: str = ""
    """Preemptors: the nodes they were pinned to (their victim's)."""
    cancelled_s: float | None = None
    crashed: str = ""
    """Trainings: the rank the simulation killed, and when (``SIGKILL rank 0 pid 123 on n2 at T``)."""


class Workload:
    """Submits a planned workload on a tenants testbed and follows it until every job has ended."""

    def __init__(
        self, planned: tuple[PlannedJob, ...], client: SlurmClient, root: Path, corpus: Path, nodes: int, cluster: str
    ) -> None:
        self.jobs = {p.name: Submitted(p) for p in planned}
        self.client = client
        self.root = root
        self.corpus = corpus
        self.nodes = nodes
        self.cluster = cluster
        self.marks = Path(tempfile.mkdtemp(prefix="air-hpc-sim-"))
        self.marks.chmod(0o1777)  # other users' jobs write their start and end here
        self.started_s = 0.0

    def run(self, timeout_s: float, say: Callable[[str], None]) -> None:
        """Submit everything at its moment, preempt and cancel as planned, and wait until all ended."""
        self.started_s = time.time()
        deadline = time.monotonic() + timeout_s
        for job in self._of("training"):
            self._submit_training(job)
            say(f"{job.planned.name}: job {job.job_id} ({job.planned.account}/{job.planned.qos})")
        try:
            while not self._all_ended():
                if time.monotonic() > deadline:
                    raise WaitTimeoutError(f"fleet simulate: the workload did not end in {timeout_s:g} s")
                self._step(say)
                time.sleep(1.0)
        except BaseException:
            self._cancel_all()
            raise

    def _of(self, *kinds: str) -> list[Submitted]:
        return [j for j in self.jobs.values() if j.planned.kind in kinds]

    def _step(self, say: Callable[[str], None]) -> None:
        now = time.time() - self.started_s
        for job in self._of("short", "failure", "cancelled"):
            if not job.job_id and now >= job.planned.delay_s:
                self._submit_short(job)
                say(f"{job.planned.name}: job {job.job_id} as {job.planned.user} ({job.planned.account})")
        for job in self._of("preemptor"):
            victim = self.jobs[job.planned.victim or ""]
            if not job.job_id and victim.job_id and _trained(victim.run_dir) >= 1:
                self._submit_preemptor(job, victim)
                say(f"{job.planned.name}: job {job.job_id} preempts job {victim.job_id} on {job.nodes}")
        for job in self._of("training"):
            if (
                job.planned.crash_after_step
                and not job.crashed
                and _trained(job.run_dir) >= job.planned.crash_after_step
            ):
                self._crash(job, say)
        for job in self._of("cancelled"):
            if job.job_id and job.cancelled_s is None and self._state(job) == JobState.RUNNING:
                self.client.as_user(job.planned.user).scancel(job.job_id)  # its user cancels it
                job.cancelled_s = time.time()
                say(f"{job.planned.name}: cancelled job {job.job_id} while it ran")

    def _crash(self, job: Submitted, say: Callable[[str], None]) -> None:
        """SIGKILL one rank of the training (proved to be the job's by its environment, PID and start time)."""
        from air_hpc.chaos.inject import rank_processes

        ranks = rank_processes(job.job_id)
        if not ranks:
            return  # between starts: try again at the next poll
        ranks[0].signal(signal.SIGKILL)
        job.crashed = f"SIGKILL rank {ranks[0].rank} pid {ranks[0].pid} on {ranks[0].node} at {time.time():.3f}"
        say(f"{job.planned.name}: {job.crashed}")

    def _submit_training(self, job: Submitted) -> None:
        from air_hpc.config.load import load_job
        from air_hpc.launch.submit import submit

        overrides = [
            f"run.name={job.planned.name}",
            f"run.root={self.root}",
            f"data.path={self.corpus}",
            f"train.steps={VICTIM_STEPS if job.planned.long else TRAINING_STEPS}",
            "checkpoint.interval_steps=5",
            "resources.nodes=1",
            "resources.tasks_per_node=1",
            "parallel.tp=1",
            "parallel.pp=1",
            "cluster.exclusive=true",
            f"cluster.account={job.planned.account}",
            f"cluster.qos={job.planned.qos}",
            "health.preflight=false",
        ]
        done = submit(load_job("gpt-tiny-testbed", overrides), "slurm", self.client)
        job.job_id, job.submit_s, job.run_dir = done.job_id, time.time(), done.run_dir

    def _submit_short(self, job: Submitted) -> None:
        code = FAILURE_EXIT_CODE if job.planned.kind == "failure" else 0
        args = [
            f"--job-name={job.planned.name}",
            f"--account={job.planned.account}",
            f"--qos={job.planned.qos}",
            "--ntasks=1",
            "--output=/dev/null",
            f"--chdir={self.marks}",
        ]
        job.job_id = self.client.as_user(job.planned.user).sbatch_wrap(self._marked(job, code), args)
        job.submit_s = time.time()

    def _submit_preemptor(self, job: Submitted, victim: Submitted) -> None:
        job.nodes = (self.client.show_job(victim.job_id) or {}).get("NodeList", "")
        args = [
            f"--job-name={job.planned.name}",
            f"--account={job.planned.account}",
            f"--qos={job.planned.qos}",
            f"--nodelist={job.nodes}",
            "--exclusive",
            "--output=/dev/null",
            f"--chdir={self.marks}",
        ]
        job.job_id = self.client.sbatch_wrap(self._marked(job, 0), args)
        job.submit_s = time.time()

    def _marked(self, job: Submitted, exit_code: int) -> str:
        """The job's command: it writes its own start and end times (the ground truth), sleeps, exits."""
        mark = self.marks / job.planned.name
        return f"date +%s.%N > {mark}.start; sleep {job.planned.duration_s}; date +%s.%N > {mark}.end; exit {exit_code}"

    def _state(self, job: Submitted) -> JobState | None:
        status = self.client.job_status(job.job_id)
        return status.state if status else None

    def _all_ended(self) -> bool:
        if any(not j.job_id for j in self.jobs.values()):
            return False
        for job in self.jobs.values():
            if not job.state:
                state = self._state(job)
                if state is None or not state.terminal:
                    return False
                job.state = str(state)
        return True

    def _cancel_all(self) -> None:
        for job in self.jobs.values():
            if job.job_id and not job.state:
                try:
                    self.client.scancel(job.job_id)
                except SlurmError as exc:
                    log.warning("could not cancel job %s: %s", job.job_id, exc)

    def close(self) -> None:
        shutil.rmtree(self.marks, ignore_errors=True)


def _trained(run_dir: Path | None) -> int:
    """The last step the run recorded (0 before any)."""
    from air_hpc.records.metrics import read_metrics
    from air_hpc.records.rundir import RunDir

    if run_dir is None:
        return 0
    return max((int(r.get("step", 0)) for r in read_metrics(RunDir(run_dir).metrics)), default=0)


def simulate(
    jobs: int,
    seed: int,
    client: SlurmClient,
    root: Path,
    nodes: int,
    cluster: str,
    timeout_s: float,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Run the seeded workload on the tenants testbed ``client`` talks to; returns its ground truth."""
    from air_hpc.fleet.truth import ground_truth
    from air_hpc.train import data

    planned = plan_workload(jobs, seed)
    check_plan_fits(planned, nodes)
    root.mkdir(parents=True, exist_ok=True)
    corpus = root / "corpus.h5"
    if not corpus.is_file():
        data.prepare(data.project_sources(), corpus, data.ByteTokenizer())
    workload = Workload(planned, client, root.resolve(), corpus.resolve(), nodes, cluster)
    try:
        workload.run(timeout_s, say)
        return ground_truth(workload, seed, time.time())
    finally:
        workload.close()


def write_truth(truth: dict[str, Any], out: Path) -> None:
    """The ground truth as indented JSON, written whole (tmp + rename)."""
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(truth, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, out)
