"""A stopped or silent controller: refused fails at once, silence within one deadline; a lost sbatch answer is found."""

import logging
import os
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from air_hpc.config import load_job
from air_hpc.errors import ConfigError, SlurmError, SlurmUnreachableError
from air_hpc.launch.submit import submit
from air_hpc.ops.control import cancel_run, run_status
from air_hpc.ownership.attempts import SETTLE_GRACE_S, fence_settled, settle
from air_hpc.ownership.owner import NotOwnerError, RunBusyError, fence, read_owner
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import latest_submission, pending_attempts, submissions
from air_hpc.slurm import client as client_module
from air_hpc.slurm.client import DEADLINE_ENV, NotRun, SlurmClient, deadline_from_env, talks_to_slurmctld
from air_hpc.slurm.controller import controller_addresses, refused_everywhere
from air_hpc.slurm.fake import FakeSlurm
from air_hpc.slurm.jobs import JobState

REPO = Path(__file__).resolve().parents[2]


def job_in(tmp_path: Path):
    return load_job(
        REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml",
        [f"run.root={tmp_path / 'runs'}", "data.path=/nonexistent.h5", "placement.topology_aware=false"],
    )


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_slurm_conf_names_the_controller_addresses() -> None:
    text = "# c\nSlurmctldHost=head(10.0.0.1)\nSlurmctldHost=backup\nSlurmctldPort=7000-7001 # two\nX=1\n"
    assert controller_addresses(text) == [("10.0.0.1", 7000), ("10.0.0.1", 7001), ("backup", 7000), ("backup", 7001)]
    assert controller_addresses("ControlMachine=old\n") == [("old", 6817)]
    assert controller_addresses("SlurmctldPort=²\nSlurmctldHost=h\n") == [("h", 6817)]
    assert controller_addresses("") == []


def test_refused_only_when_every_address_refuses(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"SlurmctldHost=me(127.0.0.1)\nSlurmctldPort={closed_port()}\n")
    assert refused_everywhere({"SLURM_CONF": str(conf)})
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        conf.write_text(f"SlurmctldHost=me(127.0.0.1)\nSlurmctldPort={listening.getsockname()[1]}\n")
        assert refused_everywhere({"SLURM_CONF": str(conf)}) == []
    assert refused_everywhere({"SLURM_CONF": str(tmp_path / "missing.conf")}) == [], "no config: no proof"


class Clock:
    """The client's clock, advanced only by its own waits: the deadline arithmetic is checked exactly, not timed."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Silent(SlurmClient):
    """A controller that never answers: every command runs until its timeout (no process is started)."""

    def __init__(self, deadline_s: float, retries: int = 10, clock: Clock | None = None) -> None:
        super().__init__(env={"SLURM_CONF": "/nonexistent"}, retries=retries, backoff_s=0.05, deadline_s=deadline_s)
        self.timeouts: list[float] = []
        self.clock = clock

    def _run_once(
        self, args: Sequence[str], input_text: str | None, timeout_s: float, *, probe_slow: bool = False
    ) -> subprocess.CompletedProcess[str]:
        self.timeouts.append(timeout_s)
        (self.clock or time).sleep(timeout_s)
        return subprocess.CompletedProcess(list(args), 124, "", f"Socket timed out: {args[0]} gave no answer")


def test_a_silent_controller_costs_one_deadline_with_a_line_per_retry(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(client_module, "time", clock)
    client = Silent(deadline_s=1.0, clock=clock)
    with caplog.at_level(logging.WARNING), pytest.raises(SlurmUnreachableError, match=r"within 1 s") as info:
        client.job_status("5")
    spent = clock.now - 1000.0
    assert spent <= 1.0, f"attempts and waits took {spent:.3f} s of a 1 s deadline: {client.timeouts}"
    assert "\n" not in str(info.value)
    retries = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) == len(client.timeouts) - 1 >= 1, "one warning line per retry"
    attempts = len(client.timeouts)
    with pytest.raises(NotRun):
        client.scancel("5")
    assert (clock.now - 1000.0, len(client.timeouts)) == (spent, attempts), "the rest of the command does not wait"


def test_refused_fails_at_once_without_running_anything(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"SlurmctldHost=me(127.0.0.1)\nSlurmctldPort={closed_port()}\n")
    client = Silent(deadline_s=30.0)
    client.env["SLURM_CONF"] = str(conf)
    with pytest.raises(SlurmUnreachableError, match=r"connection refused at 127\.0\.0\.1:"):
        client.sbatch(conf)
    assert client.timeouts == [], "sbatch was run"


def fake_squeue(tmp_path: Path, body: str) -> dict[str, str]:
    """An environment whose ``squeue`` is a script running ``body``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(f"#!/bin/sh\n{body}\n")
    (bin_dir / "squeue").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_a_quick_answer_never_probes_the_controller(tmp_path: Path) -> None:
    """slurmctld logs every bare TCP probe as an error ("Zero Bytes were transmitted"): a command that answers
    quickly must not cost one, or every status poll writes an error line into the controller's log."""
    with socket.socket() as controller:
        controller.bind(("127.0.0.1", 0))
        controller.listen()
        controller.settimeout(0.3)
        conf = tmp_path / "slurm.conf"
        conf.write_text(f"SlurmctldHost=me(127.0.0.1)\nSlurmctldPort={controller.getsockname()[1]}\n")
        client = SlurmClient(env={"SLURM_CONF": str(conf), **fake_squeue(tmp_path, "exit 0")})
        for _ in range(3):
            assert client.squeue(["5"]) == []
        with pytest.raises(TimeoutError):
            controller.accept()


def test_a_slow_command_with_the_controller_refusing_is_ended_as_refused(tmp_path: Path) -> None:
    """Not waited out: a wait would end in "gave no answer within 30 s", not in the refusal."""
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"SlurmctldHost=me(127.0.0.1)\nSlurmctldPort={closed_port()}\n")
    client = SlurmClient(env={"SLURM_CONF": str(conf), **fake_squeue(tmp_path, "exec sleep 30")}, deadline_s=30)
    with pytest.raises(SlurmUnreachableError, match=r"connection refused at 127\.0\.0\.1:"):
        client.squeue(["5"])
    with pytest.raises(NotRun):
        client.squeue(["5"])


def test_only_commands_that_need_slurmctld_are_probed() -> None:
    assert talks_to_slurmctld(["squeue", "--noheader"]) and talks_to_slurmctld(["scontrol", "show", "job", "5"])
    assert not talks_to_slurmctld(["sacct", "--jobs=5"]), "accounting is slurmdbd's"
    assert not talks_to_slurmctld(["scontrol", "show", "hostnames", "n[1-2]"])


def test_deadline_from_the_environment() -> None:
    assert deadline_from_env({}) == 20.0
    assert deadline_from_env({DEADLINE_ENV: "2.5"}) == 2.5
    for bad in ("0", "-1", "soon", "inf", "nan"):
        with pytest.raises(ConfigError, match=DEADLINE_ENV):
            deadline_from_env({DEADLINE_ENV: bad})


def test_submit_with_the_controller_stopped_records_no_job_and_fails_fast(tmp_path: Path) -> None:
    fake = FakeSlurm()
    fake.refused = True
    job = job_in(tmp_path)
    with pytest.raises(SlurmUnreachableError, match="connection refused"):
        submit(job, "slurm", fake, step_command=["true"])
    run_dir = RunDir.of(job)
    # Only the release was read (scontrol --version asks no daemon); nothing reached the controller.
    assert fake.calls == [["scontrol", "--version"]] and submissions(run_dir) == [] and pending_attempts(run_dir) == []


def test_a_lost_sbatch_answer_is_found_by_its_comment_and_never_submitted_twice(tmp_path: Path) -> None:
    fake = FakeSlurm()
    fake.lose_sbatch_reply = True
    job = job_in(tmp_path)
    run_dir = RunDir.of(job)
    with pytest.raises(SlurmUnreachableError, match=r"may or may not have been submitted.*attempt is recorded"):
        submit(job, "slurm", fake, step_command=["true"])
    (queued,) = fake.jobs.values()
    assert queued.comment.startswith("air-hpc-")
    assert [a.token for a in pending_attempts(run_dir)] == [queued.comment]
    fake.lose_sbatch_reply = False
    fake.reachable = False
    with pytest.raises(SlurmUnreachableError, match="may have queued a job"):
        submit(job, "slurm", fake, step_command=["true"])
    assert len(fake.jobs) == 1, "not submitted again while the first attempt is unsettled"
    fake.reachable = True
    with pytest.raises(RunBusyError, match=f"job {queued.job_id} \\(slurm\\) still owns this run directory"):
        submit(job, "slurm", fake, step_command=["true"])
    assert len(fake.jobs) == 1, "the found job is live: not submitted again"
    fake.start(queued.job_id, "n[1-2]")
    status = run_status(run_dir, fake)
    assert (status.submission.job_id, status.job.state) == (queued.job_id, JobState.RUNNING)
    with pytest.raises(RunBusyError, match=f"job {queued.job_id} \\(slurm\\) still owns this run directory"):
        submit(job, "slurm", fake, step_command=["true"])
    outcome = cancel_run(run_dir, fake)
    assert (outcome.record.job_id, outcome.cancelled, outcome.state) == (queued.job_id, True, "RUNNING")
    assert fake.jobs[queued.job_id].state is JobState.CANCELLED
    assert [r.job_id for r in submissions(run_dir)] == [queued.job_id] and pending_attempts(run_dir) == []


def test_a_finished_job_is_found_in_accounting(tmp_path: Path) -> None:
    fake = FakeSlurm()
    fake.lose_sbatch_reply = True
    job = job_in(tmp_path)
    run_dir = RunDir.of(job)
    with pytest.raises(SlurmUnreachableError):
        submit(job, "slurm", fake, step_command=["true"])
    (queued,) = fake.jobs.values()
    fake.finish(queued.job_id)
    fake.reachable = True  # the controller answers again
    settle(run_dir, fake)
    assert latest_submission(run_dir).job_id == queued.job_id
    assert any(c[0] == "sacct" for c in fake.calls), "no longer in the queue: found in accounting"


def test_an_attempt_that_never_reached_slurm_is_settled_after_the_grace(tmp_path: Path) -> None:
    fake = FakeSlurm()
    fake.lose_sbatch_reply = True
    job = job_in(tmp_path)
    run_dir = RunDir.of(job)
    with pytest.raises(SlurmUnreachableError):
        submit(job, "slurm", fake, step_command=["true"])
    fake.jobs.clear()
    fake.reachable = True
    with pytest.raises(SlurmError, match="may still reach it"):
        settle(run_dir, fake)
    (attempt,) = pending_attempts(run_dir)
    settle(run_dir, fake, now_s=attempt.time_s + SETTLE_GRACE_S + 1)
    assert pending_attempts(run_dir) == [] and submissions(run_dir) == []
    fake.lose_sbatch_reply = False
    assert submit(job, "slurm", fake, step_command=["true"]).job_id in fake.jobs


def test_a_job_found_by_its_comment_becomes_the_owner_so_its_ranks_pass_the_fence(tmp_path: Path) -> None:
    fake = FakeSlurm()
    job = job_in(tmp_path)
    run_dir = RunDir.of(job)
    first = submit(job, "slurm", fake, step_command=["true"]).job_id
    fake.finish(first)  # ended: the next submit takes the run over
    fake.lose_sbatch_reply = True
    with pytest.raises(SlurmUnreachableError):
        submit(job, "slurm", fake, step_command=["true"])
    fake.lose_sbatch_reply = False
    fake.reachable = True  # the controller answers again
    (found,) = (j for j in fake.jobs.values() if j.job_id != first)
    run_status(run_dir, fake)  # any later command settles the attempt
    owner = read_owner(run_dir)
    assert owner is not None and (owner.job_id, owner.executor) == (found.job_id, "slurm")
    fence(run_dir, {"SLURM_JOB_ID": found.job_id})  # the found job's ranks may write
    with pytest.raises(NotOwnerError):
        fence(run_dir, {"SLURM_JOB_ID": first})
    with pytest.raises(RunBusyError, match=f"job {found.job_id} \\(slurm\\) still owns this run directory"):
        submit(job, "slurm", fake, step_command=["true"])


def test_an_unsettled_attempt_refuses_every_executor(tmp_path: Path) -> None:
    """One refusal path: a local submit must not start beside a Slurm job whose sbatch answer was lost."""
    fake = FakeSlurm()
    fake.lose_sbatch_reply = True
    job = job_in(tmp_path)
    with pytest.raises(SlurmUnreachableError):
        submit(job, "slurm", fake, step_command=["true"])
    (queued,) = fake.jobs.values()
    fake.lose_sbatch_reply = False
    fake.reachable = True
    local = job.model_copy(update={"resources": job.resources.model_copy(update={"nodes": 1})})
    with pytest.raises(RunBusyError, match=f"job {queued.job_id} \\(slurm\\) still owns this run directory"):
        submit(local, "local", fake, step_command=["true"])
    assert len(fake.jobs) == 1 and [r.job_id for r in submissions(RunDir.of(job))] == [queued.job_id]


def test_the_ranks_of_a_job_found_by_its_comment_settle_it_and_pass_the_fence(tmp_path: Path) -> None:
    """Nobody ran status before the found job started: its first rank settles the attempt instead of exiting."""
    fake = FakeSlurm()
    job = job_in(tmp_path)
    run_dir = RunDir.of(job)
    first = submit(job, "slurm", fake, step_command=["true"]).job_id
    fake.finish(first)
    fake.lose_sbatch_reply = True
    with pytest.raises(SlurmUnreachableError):
        submit(job, "slurm", fake, step_command=["true"])
    fake.lose_sbatch_reply = False
    fake.reachable = True
    (found,) = (j for j in fake.jobs.values() if j.job_id != first)
    fake.start(found.job_id, "n[1-2]")
    with pytest.raises(NotOwnerError):
        fence_settled(run_dir, {"SLURM_JOB_ID": "999"}, fake)  # a stranger stays a stranger, attempt settled or not
    fence_settled(run_dir, {"SLURM_JOB_ID": found.job_id}, fake)
    owner = read_owner(run_dir)
    assert owner is not None and owner.job_id == found.job_id and pending_attempts(run_dir) == []
    with pytest.raises(NotOwnerError):
        fence_settled(run_dir, {"SLURM_JOB_ID": first}, fake)
