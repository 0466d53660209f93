"""Submission against the fake controller: validation order, run records, topology-aware selection, CLI."""

import json
from pathlib import Path

import pytest

from air_hpc.cli.main import cli
from air_hpc.config import load_job
from air_hpc.errors import ConfigError, SlurmUnreachableError, TopologyError, UserError
from air_hpc.launch.submit import plan, submit
from air_hpc.observe.progress import run_progress
from air_hpc.observe.records import load_records
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import latest_submission, record_submission, submissions
from air_hpc.slurm.fake import FakeClusterText, FakeSlurm
from air_hpc.slurm.jobs import JobState
from tests.conftest import RunMain

REPO = Path(__file__).resolve().parents[2]
TESTBED_JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"
LOCAL_JOB = REPO / "configs" / "jobs" / "gpt-tiny-local.yaml"
TOPOLOGY = """# leaves of 2, 4 and 2 nodes under one spine (the testbed's shape)
SwitchName=leaf1 Nodes=n[1-2]
SwitchName=leaf2 Nodes=n[3-6]
SwitchName=leaf3 Nodes=n[7-8]
SwitchName=spine1 Switches=leaf[1-3]
"""
ALL_IDLE = {f"n{i}": "IDLE" for i in range(1, 9)}


@pytest.fixture
def topo(tmp_path: Path) -> Path:
    path = tmp_path / "topology.conf"
    path.write_text(TOPOLOGY)
    return path


@pytest.fixture(autouse=True)
def _corpus(small_corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Submission checks the training data first: point every job at a real corpus."""
    monkeypatch.setitem(CORPUS, "path", small_corpus)


CORPUS: dict[str, Path] = {}


def sets(tmp_path: Path) -> list[str]:
    return ["--set", f"run.root={tmp_path}", "--set", f"data.path={CORPUS['path']}"]


def job_in(tmp_path: Path, *overrides: str, job_file: Path = TESTBED_JOB):
    return load_job(job_file, [f"run.root={tmp_path / 'runs'}", f"data.path={CORPUS['path']}", *overrides])


def test_slurm_submission_validates_records_and_submits_once(tmp_path: Path) -> None:
    fake = FakeSlurm()
    job = job_in(tmp_path)
    done = submit(job, "slurm", fake, python="/venv/bin/python")
    run = RunDir(done.run_dir)
    # The release decides the requeue option (scontrol --version asks no daemon).
    assert [c[:2] for c in fake.calls] == [
        ["scontrol", "--version"],
        ["sbatch", "--test-only"],
        ["sbatch", "--parsable"],
    ]
    assert run.read_job() == job
    assert run.sbatch.read_text() == done.plan.script
    assert run.logs.is_dir()
    record = latest_submission(run)
    assert (record.job_id, record.executor, record.starts) == (done.job_id, "slurm", 0)
    assert fake.jobs[done.job_id].script == done.plan.script
    assert done.plan.test_only is not None


def test_second_submission_of_a_run_appends(tmp_path: Path) -> None:
    fake = FakeSlurm()
    job = job_in(tmp_path)
    first = submit(job, "slurm", fake).job_id
    fake.finish(first, JobState.FAILED, 1)  # ended: its claim on the run directory is stale
    second = submit(job, "slurm", fake).job_id
    assert [r.job_id for r in submissions(RunDir.of(job))] == [first, second]


def test_unreachable_controller_records_no_submission(tmp_path: Path) -> None:
    fake = FakeSlurm(retries=1)
    fake.reachable = False
    job = job_in(tmp_path)
    with pytest.raises(SlurmUnreachableError, match="sbatch not run"):
        submit(job, "slurm", fake)
    assert [c[0] for c in fake.calls].count("sbatch") == 2, (
        "test-only retried once; then, the controller known down, no sbatch"
    )
    assert submissions(RunDir.of(job)) == []


def test_dry_run_plan_writes_nothing(tmp_path: Path) -> None:
    fake = FakeSlurm()
    job = job_in(tmp_path)
    planned = plan(job, fake, test_only=True)
    assert planned.test_only is not None and "#SBATCH --nodes=2" in planned.script
    assert not (tmp_path / "runs").exists()
    assert fake.jobs == {}


def test_local_executor_needs_one_node(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^resources\.nodes: the local executor runs on one node"):
        submit(job_in(tmp_path), "local", FakeSlurm())


def test_topology_aware_pins_one_leaf_and_orders_ranks(tmp_path: Path, topo: Path) -> None:
    fake = FakeSlurm(nodes=ALL_IDLE)
    planned = plan(job_in(tmp_path, f"cluster.topology_file={topo}"), fake)
    request = planned.request
    assert request.nodelist in {"n[1-2]", "n[7-8]"}, "two nodes fit on one of the two-node leaves"
    assert len(request.rank_hosts) == 4 and set(request.rank_hosts) <= {"n1", "n2", "n7", "n8"}
    assert f"#SBATCH --nodelist={request.nodelist}" in planned.script
    assert "--distribution=arbitrary" in planned.script


def test_selection_uses_live_state_and_skips_bad_nodes(tmp_path: Path, topo: Path) -> None:
    busy = {**ALL_IDLE, "n1": "ALLOCATED", "n7": "IDLE+DRAIN"}
    job = job_in(tmp_path, f"cluster.topology_file={topo}", "resources.nodes=2")
    run = RunDir.of(job)
    run.path.mkdir(parents=True)
    run.bad_nodes.write_text("n3  # hung at step 12\nn4\n")
    planned = plan(job, FakeSlurm(nodes=busy))
    assert planned.request.nodelist == "n[5-6]"
    assert planned.request.exclude == "n[3-4]"
    assert "#SBATCH --exclude=n[3-4]" in planned.script


def test_not_pinned_asks_for_switches(tmp_path: Path, topo: Path) -> None:
    planned = plan(job_in(tmp_path, f"cluster.topology_file={topo}", "placement.pin_nodes=false"), None)
    assert planned.request.nodelist is None and planned.request.switches == 1
    assert "#SBATCH --switches=1@00:10:00" in planned.script


def test_busy_cluster_falls_back_to_switches(tmp_path: Path, topo: Path) -> None:
    busy = {name: "ALLOCATED" for name in ALL_IDLE}
    planned = plan(job_in(tmp_path, f"cluster.topology_file={topo}"), FakeSlurm(nodes=busy))
    assert planned.request.switches == 1 and planned.request.nodelist is None
    assert any("not enough free nodes" in note for note in planned.notes)


BLOCKS = "".join(f"BlockName=b{i} Nodes=n[{4 * i - 3}-{4 * i}]\n" for i in range(1, 5)) + "BlockSizes=4,8,16\n"


def block_job(tmp_path: Path, *overrides: str):
    path = tmp_path / "block.conf"
    path.write_text(BLOCKS)
    sizes = ["resources.nodes=4", "resources.tasks_per_node=1", "parallel.tp=2", "parallel.pp=2"]
    sizes.append("hardware.nvlink_domain_nodes=4")
    return job_in(tmp_path, f"cluster.topology_file={path}", *sizes, *overrides)


def test_block_topology_pins_a_valid_set_with_segments_and_keeps_tp_in_a_block(tmp_path: Path) -> None:
    from air_hpc.topology import treeconf
    from air_hpc.topology.blocks import BlockModel, violation

    busy = {**{f"n{i}": "IDLE" for i in range(1, 17)}, "n1": "ALLOCATED", "n5": "DRAIN", "n9": "MIXED+DRAIN"}
    busy["n13"] = "DOWN"
    fake = FakeSlurm(nodes=busy)
    fake.version_line = "slurm 26.05.3"  # accepts a node list covering the whole job beside --segment
    planned = plan(block_job(tmp_path), fake)
    request = planned.request
    assert request.segment == 2, "the segment defaults to one TP group (tp 2 on 1 task per node)"
    assert request.nodelist == "n[2-3,6-7]" and request.switches is None
    model = BlockModel(treeconf.parse_block(BLOCKS, "b"))
    assert violation(model, [f"n{i}" for i in (2, 3, 6, 7)], 2) is None
    ranks = request.rank_hosts
    for group in range(0, len(ranks), 2):  # tp is fastest: ranks 2k, 2k+1 form a TP group
        assert model.block_of[ranks[group]] == model.block_of[ranks[group + 1]]
    assert "#SBATCH --segment=2" in planned.script and "--switches" not in planned.script


def test_on_25_05_slurm_places_the_segments_and_drained_nodes_are_excluded(tmp_path: Path) -> None:
    busy = {**{f"n{i}": "IDLE" for i in range(1, 17)}, "n1": "ALLOCATED", "n5": "DRAIN", "n9": "MIXED+DRAIN"}
    busy["n13"] = "DOWN"
    fake = FakeSlurm(nodes=busy)
    fake.version_line = "slurm 25.05.8"
    planned = plan(block_job(tmp_path), fake)
    request = planned.request
    assert (request.nodelist, request.segment, request.rank_hosts) == (None, 2, ())
    assert request.exclude == "n[5,9,13]", "drained and down nodes are kept out by name; the busy n1 is not"
    assert any("requires nodes with segment are not supported" in note for note in planned.notes)
    assert "#SBATCH --segment=2" in planned.script and "#SBATCH --exclude=n[5,9,13]" in planned.script
    assert "--nodelist" not in planned.script


def test_the_profiles_slurm_version_wins_over_the_commands(tmp_path: Path) -> None:
    fake = FakeSlurm(nodes={f"n{i}": "IDLE" for i in range(1, 17)})
    fake.version_line = "slurm 25.05.8"
    planned = plan(block_job(tmp_path, "cluster.slurm_version=26.05.3"), fake)
    assert planned.request.nodelist is not None and planned.request.segment == 2
    assert ["scontrol", "--version"] not in fake.calls, "the profile's release is not asked again"


def test_block_topology_not_pinned_asks_only_for_segments(tmp_path: Path) -> None:
    planned = plan(block_job(tmp_path, "placement.pin_nodes=false", "placement.segment=1"), None)
    assert planned.request.nodelist is None and planned.request.segment == 1
    assert "#SBATCH --segment=1" in planned.script and "--switches" not in planned.script


def test_segment_larger_than_a_block_is_a_topology_error(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match=r"placement\.segment=8 is larger than the base block size 4; a Slurm"):
        plan(block_job(tmp_path, "resources.nodes=16", "placement.segment=8", "train.global_batch_size=32"), None)


def test_too_many_nodes_for_the_fabric_is_a_topology_error(tmp_path: Path, topo: Path) -> None:
    job = job_in(tmp_path, f"cluster.topology_file={topo}", "resources.nodes=10", "train.global_batch_size=40")
    with pytest.raises(TopologyError, match="10 nodes requested"):
        plan(job, None)


def test_missing_topology_file_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^cluster\.topology_file: cannot read"):
        plan(job_in(tmp_path, f"cluster.topology_file={tmp_path / 'nope.conf'}"), None)


def test_topology_unaware_sends_only_the_count(tmp_path: Path, topo: Path) -> None:
    planned = plan(job_in(tmp_path, f"cluster.topology_file={topo}", "placement.topology_aware=false"), None)
    assert planned.request.nodelist is None and planned.request.switches is None
    assert "--nodelist" not in planned.script and "--switches" not in planned.script


def invoke(fake: FakeSlurm, args: list[str]) -> None:
    cli.main(args=args, prog_name="air-hpc", standalone_mode=False, obj={"slurm_client": fake})


def test_cli_submit_status_logs_cancel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeSlurm()
    invoke(fake, ["submit", str(TESTBED_JOB), *sets(tmp_path), "--json"])
    out = json.loads(capsys.readouterr().out)
    job_id, run = out["job_id"], Path(out["run_dir"])
    assert out["executor"] == "slurm" and fake.jobs[job_id].state is JobState.PENDING

    fake.start(job_id, "n[1-2]")
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 9.5}\n{"step": 2, "loss": 8.25, "tokens_per_s": 1000}\n')
    (run / "logs" / f"slurm-{job_id}.out").write_text("0: rank 0 on n1\n1: rank 1 on n1\n2: rank 2 on n2\n")
    invoke(fake, ["status", str(run), "--json"])
    status = json.loads(capsys.readouterr().out)
    assert (status["state"], status["nodelist"], status["progress"]["step"], status["progress"]["total_steps"]) == (
        "RUNNING",
        "n[1-2]",
        2,
        30,
    )
    invoke(fake, ["status", str(run)])
    text = capsys.readouterr().out
    assert "RUNNING" in text and "step 2/30, loss 8.2500" in text

    invoke(fake, ["logs", str(run), "--rank", "2"])
    assert capsys.readouterr().out == f"==> logs/slurm-{job_id}.out <==\n2: rank 2 on n2\n"
    invoke(fake, ["logs", str(run)])
    assert "rank 1 on n1" in capsys.readouterr().out

    invoke(fake, ["cancel", str(run)])
    assert capsys.readouterr().out == f"cancelled job {job_id} (slurm), which was RUNNING\n"
    assert fake.jobs[job_id].state is JobState.CANCELLED
    invoke(fake, ["cancel", str(run)])
    assert capsys.readouterr().out == f"job {job_id} (slurm) had already ended: CANCELLED; nothing to cancel\n"
    invoke(fake, ["status", job_id, "--json"])
    assert json.loads(capsys.readouterr().out)["state"] == "CANCELLED"


def test_cli_status_of_unknown_job_and_non_run(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="neither squeue nor sacct knows it"):
        invoke(FakeSlurm(), ["status", "4242"])
    with pytest.raises(UserError, match="not a run directory"):
        invoke(FakeSlurm(), ["status", str(tmp_path)])


def test_cli_logs_before_any_output(tmp_path: Path) -> None:
    fake = FakeSlurm()
    done = submit(job_in(tmp_path), "slurm", fake)
    with pytest.raises(UserError, match="no output yet"):
        invoke(fake, ["logs", str(done.run_dir)])


def test_cli_status_with_controller_down_is_one_error(tmp_path: Path) -> None:
    fake = FakeSlurm()
    done = submit(job_in(tmp_path), "slurm", fake)
    fake.reachable = False
    with pytest.raises(SlurmUnreachableError, match="Slurm controller unreachable: squeue gave no answer"):
        invoke(fake, ["status", str(done.run_dir)])


def test_cli_dry_run_submits_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeSlurm()
    invoke(fake, ["submit", str(TESTBED_JOB), *sets(tmp_path), "--dry-run"])
    out, err = capsys.readouterr()
    assert out.startswith("#!/bin/bash\n") and "#SBATCH --nodes=2" in out
    assert "sbatch --test-only: would start" in err and "nothing submitted" in err
    assert fake.jobs == {} and not (tmp_path / "gpt-tiny-testbed").exists()


def test_cli_status_without_target_lists_queued_jobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeSlurm()
    first = submit(job_in(tmp_path), "slurm", fake).job_id
    second = submit(job_in(tmp_path, "run.name=other"), "slurm", fake).job_id
    fake.start(second, "n[3-4]")
    fake.finish(first)
    invoke(fake, ["status", "--json"])
    listed = json.loads(capsys.readouterr().out)
    assert [(j["job_id"], j["state"], j["nodelist"]) for j in listed] == [(second, "RUNNING", "n[3-4]")]


def test_cli_logs_follow_stops_when_the_job_ends(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeSlurm()
    done = submit(job_in(tmp_path), "slurm", fake)
    fake.start(done.job_id, "n[1-2]")
    fake.finish(done.job_id, JobState.FAILED, 1)
    (done.run_dir / "logs" / f"slurm-{done.job_id}.err").write_text("air-hpc: step failed with exit code 1\npartial")
    invoke(fake, ["logs", str(done.run_dir), "-f"])
    out = capsys.readouterr().out
    assert out == f"==> logs/slurm-{done.job_id}.err <==\nair-hpc: step failed with exit code 1\npartial\n"


def test_run_records_survive_a_torn_last_line(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    record_submission(run, "7", "slurm", now_s=1.0)
    with run.submissions.open("a") as out:
        out.write('{"event": "started", "job_id": "7", "restart_count": 0}\n{"event": "sta')
    run.metrics.write_text('{"step": 3, "loss": 1.5}\n{"step": 4, "lo')
    (record,) = submissions(run)
    assert (record.job_id, record.starts) == ("7", 1)
    progress = run_progress(load_records(run), now_s=10.0)
    assert progress is not None and (progress.step, progress.loss) == (3, 1.5)


def test_missing_corpus_is_one_line_at_submit_time(tmp_path: Path) -> None:
    fake = FakeSlurm()
    job = job_in(tmp_path, f"data.path={tmp_path / 'missing.h5'}")
    with pytest.raises(UserError, match=r"missing\.h5: no such HDF5 token file"):
        submit(job, "slurm", fake)
    assert fake.calls == []
    assert not (tmp_path / "runs").exists()


DRAINED = {"n1": "IDLE+DRAIN", "n2": "DOWN+NOT_RESPONDING", "n3": "IDLE"}


def test_drained_nodes_queue_the_job_with_a_note(tmp_path: Path) -> None:
    """--test-only refuses while the nodes are drained; sbatch would queue the job, so submit does, and says why."""
    fake = FakeSlurm(nodes=DRAINED)
    done = submit(job_in(tmp_path, "placement.topology_aware=false"), "slurm", fake)
    assert fake.jobs[done.job_id].state is JobState.PENDING and done.plan.test_only is None
    assert done.plan.notes[-1] == (
        "sbatch --test-only: cannot start now; submitting anyway, the job waits in the queue (ReqNodeNotAvail) "
        "until 1 more node(s) return to service (unavailable now: n1 (idle+drain), n2 (down+not_responding)) "
        "(see `sinfo -R`)"
    )


def test_a_request_no_node_state_explains_still_fails(tmp_path: Path) -> None:
    from air_hpc.errors import SlurmError

    fake = FakeSlurm(nodes=DRAINED)
    job = job_in(tmp_path, "placement.topology_aware=false", "resources.nodes=4", "parallel.pp=4", "model.num_layers=4")
    with pytest.raises(SlurmError, match="Requested node configuration is not available"):
        submit(job, "slurm", fake)
    assert fake.jobs == {}


def with_partitions(grace_s: dict[str, int]) -> FakeSlurm:
    """A controller with these partitions (the first is the default) and their GraceTime."""
    lines = [
        f"PartitionName={name} AllowGroups=ALL Default={'YES' if i == 0 else 'NO'} GraceTime={grace} "
        "MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 Nodes=n[1-8] PreemptMode=REQUEUE State=UP TotalNodes=8"
        for i, (name, grace) in enumerate(grace_s.items())
    ]
    return FakeSlurm(cluster=FakeClusterText(config="", partitions="\n".join(lines) + "\n", sinfo=""))


def previous_sync_save(tmp_path: Path, seconds: float) -> None:
    """A run directory whose earlier start saved synchronously (a preemption's or the final save)."""
    run = RunDir(tmp_path / "runs" / "gpt-tiny-testbed")
    run.path.mkdir(parents=True)
    rows = [
        {"time": 1.0, "kind": "checkpoint_saved", "step": 5, "seconds": 30.0, "async": True},
        {"time": 2.0, "kind": "checkpoint_saved", "step": 7, "seconds": seconds, "async": False},
    ]
    run.events.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_grace_time_shorter_than_the_measured_save_is_one_line_exit_2(tmp_path: Path) -> None:
    fake = with_partitions({"debug": 0, "batch": 5})
    previous_sync_save(tmp_path, 12.0)
    with pytest.raises(ConfigError) as raised:
        invoke(fake, ["submit", str(TESTBED_JOB), "--set", f"run.root={tmp_path / 'runs'}", *sets(tmp_path)[2:]])
    assert raised.value.exit_code == 2 and "\n" not in str(raised.value)
    assert str(raised.value).startswith(
        "cluster.partition: batch gives a preempted job a GraceTime of 5 s, shorter than this run's measured "
        "checkpoint save of 12.0 s"
    )
    assert not [c for c in fake.calls if c[0] == "sbatch"]


@pytest.mark.parametrize(("grace_s", "partition"), [(30, "batch"), (0, "batch"), (5, None)])
def test_a_save_that_fits_or_no_grace_time_submits(tmp_path: Path, grace_s: int, partition: str | None) -> None:
    """GraceTime 0 is the cluster's choice to kill at once, not a mistake in the job; None: the default partition."""
    fake = with_partitions({"debug": 30, "batch": grace_s})
    previous_sync_save(tmp_path, 12.0)
    overrides = [] if partition else ["cluster.partition=null"]
    submit(job_in(tmp_path, *overrides), "slurm", fake)
    assert any(c[:2] == ["sbatch", "--parsable"] for c in fake.calls)


def test_snapshots_that_do_not_fit_host_memory_are_one_line_at_submit(tmp_path: Path, run_main: RunMain) -> None:
    big = ["--set", "model=gpt-1.3b", "--set", "resources.mem_gb=16", "--set", "checkpoint.memory_interval_steps=1"]
    code, out, err = run_main(["submit", str(TESTBED_JOB), *sets(tmp_path), *big, "--dry-run"])
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("error: checkpoint.memory_interval_steps: in-memory snapshots need about 39.8 GiB")
    assert "resources.mem_gb is 16 GiB" in err
    fake = FakeSlurm()
    tiny = job_in(tmp_path, "resources.mem_gb=16", "checkpoint.memory_interval_steps=1")
    submit(tiny, "slurm", fake)  # gpt-tiny fits
    assert len(fake.jobs) == 1


def test_executors_without_the_supervisor_refuse_snapshots(tmp_path: Path) -> None:
    job = job_in(tmp_path, "checkpoint.memory_interval_steps=1", job_file=LOCAL_JOB)
    with pytest.raises(ConfigError, match=r"^checkpoint\.memory_interval_steps: the local executor cannot keep"):
        submit(job, "local", FakeSlurm())
