"""Chains and dependencies: ``submit --after`` and ``--chain N`` against the fake controller, and each link's
batch-side hand-over (ownership as it starts, no self-requeue while a next link waits, the rest cancelled)."""

import json
from pathlib import Path

import pytest

from air_hpc.config import load_job
from air_hpc.config.models import JobConfig
from air_hpc.errors import ConfigError, UserError
from air_hpc.exitcodes import ExitCode
from air_hpc.launch.chain import dependency, parse_after
from air_hpc.launch.submit import submit
from air_hpc.ops.control import cancel_run, run_status
from air_hpc.ownership.owner import fence, read_owner
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import latest_submission
from air_hpc.runtime.batch import BatchError, JobStart, finish, start
from air_hpc.slurm.fake import FakeClusterText, FakeSlurm
from air_hpc.slurm.jobs import JobState

REPO = Path(__file__).resolve().parents[2]
TESTBED_JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"


def job_in(tmp_path: Path, corpus: Path, *overrides: str) -> JobConfig:
    return load_job(TESTBED_JOB, [f"run.root={tmp_path / 'runs'}", f"data.path={corpus}", *overrides])


def link(job_id: str, restarts: int = 0) -> tuple[JobStart, dict[str, str]]:
    return JobStart(job_id, restarts, "n1", ("n1",), int(job_id)), {"SLURM_JOB_ID": job_id}


def test_after_parses_its_kind_and_the_dependency_joins_singleton() -> None:
    assert parse_after("123") == parse_after("123:ok")
    assert parse_after("123:any").kind == "afterany" and parse_after("my-run:notok").kind == "afternotok"
    with pytest.raises(UserError, match="unknown kind 'later'"):
        parse_after("123:later")
    assert dependency("afterok:12", 3) == "afterok:12,singleton"
    assert dependency(None, 1) is None and dependency("afterany:7", 1) == "afterany:7"


def test_a_chain_is_n_singleton_links_of_one_run_and_the_first_owns_it(tmp_path: Path, small_corpus: Path) -> None:
    fake = FakeSlurm()
    done = submit(job_in(tmp_path, small_corpus), "slurm", fake, chain=3)
    assert done.chain == ("100", "101", "102") and done.job_id == "100"
    run = RunDir(done.run_dir)
    assert "#SBATCH --dependency=singleton\n" in run.sbatch.read_text()
    assert [c[-1] for c in fake.calls if c[:2] == ["sbatch", "--parsable"]] == [str(run.sbatch)] * 3
    owner = read_owner(run)
    assert owner is not None and (owner.job_id, owner.chain) == ("100", ("100", "101", "102"))
    assert latest_submission(run).job_id == "100"


def test_each_link_takes_over_as_it_starts_hands_over_at_a_stop_and_ends_the_rest(
    tmp_path: Path, small_corpus: Path
) -> None:
    fake = FakeSlurm()
    done = submit(job_in(tmp_path, small_corpus), "slurm", fake, chain=3)
    run = RunDir(done.run_dir)
    fake.start("100", "n1")
    first, env = link("100")
    start(run, first, env, [], master=False, client=fake)
    # The time limit's stop: no requeue of this link, the next one resumes the run.
    assert finish(run, run.path, first, ExitCode.REQUEUE, 3, fake) == (ExitCode.REQUEUE, False)
    assert not any(c[:2] == ["scontrol", "requeue"] for c in fake.calls)
    fake.finish("100", JobState.FAILED, ExitCode.REQUEUE)
    assert not run_status(run, fake).ended  # the run goes on in its queued links
    fake.start("101", "n2")
    second, env = link("101")
    start(run, second, env, [], master=False, client=fake)
    assert read_owner(run).job_id == "101" and latest_submission(run).job_id == "101"  # type: ignore[union-attr]
    with pytest.raises(Exception, match="belongs to job 101"):
        fence(run, {"SLURM_JOB_ID": "100"})
    assert finish(run, run.path, second, ExitCode.OK, 3, fake) == (ExitCode.OK, False)
    assert ["scancel", "102"] in fake.calls and fake.jobs["102"].state is JobState.CANCELLED


def test_a_link_that_finds_the_run_complete_cancels_itself_and_the_rest(tmp_path: Path, small_corpus: Path) -> None:
    fake = FakeSlurm()
    job = job_in(tmp_path, small_corpus, "train.steps=4")
    done = submit(job, "slurm", fake, chain=3)
    run = RunDir(done.run_dir)
    run.events.write_text(json.dumps({"time": 1.0, "kind": "checkpoint_saved", "step": 4, "reason": "final"}) + "\n")
    fake.start("101", "n1")
    second, env = link("101")
    with pytest.raises(BatchError, match="the run is complete"):
        start(run, second, env, [], master=False, client=fake)
    assert fake.jobs["101"].state is JobState.CANCELLED and fake.jobs["102"].state is JobState.CANCELLED


def test_cancel_ends_the_current_link_and_the_queued_ones(tmp_path: Path, small_corpus: Path) -> None:
    fake = FakeSlurm()
    done = submit(job_in(tmp_path, small_corpus), "slurm", fake, chain=3)
    fake.start("100", "n1")
    outcome = cancel_run(RunDir(done.run_dir), fake)
    assert outcome.cancelled and "also cancelled the chain's queued link(s) 101, 102" in outcome.message()
    assert all(j.state is JobState.CANCELLED for j in fake.jobs.values())


def test_a_chain_needs_our_batch_script(tmp_path: Path, small_corpus: Path) -> None:
    with pytest.raises(ConfigError, match=r"--chain: .* use --executor slurm, not submitit"):
        submit(job_in(tmp_path, small_corpus), "submitit", FakeSlurm(), chain=2)


def test_after_an_unknown_job_exits_2_and_a_known_one_is_a_dependency(
    tmp_path: Path, small_corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from air_hpc.cli.main import cli

    sets = ["--set", f"run.root={tmp_path / 'runs'}", "--set", f"data.path={small_corpus}"]
    fake = FakeSlurm()
    with pytest.raises(UserError, match="--after 999: no such job") as raised:
        cli.main(
            args=["submit", str(TESTBED_JOB), *sets, "--after", "999"],
            standalone_mode=False,
            obj={"slurm_client": fake},
        )
    assert raised.value.exit_code == 2 and not (tmp_path / "runs").exists()
    before = fake.sbatch_wrap("true")
    cli.main(
        args=["submit", str(TESTBED_JOB), *sets, "--after", f"{before}:any"],
        standalone_mode=False,
        obj={"slurm_client": fake},
    )
    job_id = capsys.readouterr().out.strip()
    assert f"#SBATCH --dependency=afterany:{before}\n" in fake.jobs[job_id].script


def test_a_chain_on_a_partition_without_a_time_limit_warns_that_it_is_not_needed(
    tmp_path: Path, small_corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from air_hpc.cli.main import cli

    line = (
        "PartitionName=batch AllowGroups=ALL Default=YES GraceTime=0 MaxNodes=UNLIMITED MaxTime=UNLIMITED "
        "MinNodes=0 Nodes=n[1-8] PreemptMode=REQUEUE State=UP TotalNodes=8\n"
    )
    fake = FakeSlurm(cluster=FakeClusterText(config="", partitions=line, sinfo=""))
    sets = [
        "--set",
        f"run.root={tmp_path / 'runs'}",
        "--set",
        f"data.path={small_corpus}",
        "--set",
        "cluster.partition=batch",
    ]
    cli.main(
        args=["submit", str(TESTBED_JOB), *sets, "--chain", "2"], standalone_mode=False, obj={"slurm_client": fake}
    )
    out, err = capsys.readouterr()
    assert "warning: partition batch has no time limit" in err and out.split() == ["100", "101"]
