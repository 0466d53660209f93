"""Routing across clusters (``submit --clusters a,b``): the pure decision, the quality measure, the clusters asked
through the one client aimed with ``-M``, the bad inputs, and the commands that follow the job to its cluster."""

import json
from pathlib import Path

import pytest

from air_hpc.cli.main import cli
from air_hpc.config import load_job
from air_hpc.config.models import JobConfig, SlurmClusterConfig
from air_hpc.errors import ConfigError, RouteError
from air_hpc.exitcodes import ExitCode
from air_hpc.launch.grid import expand, parse_grid
from air_hpc.launch.route import (
    ClusterAnswer,
    Quality,
    check_routable,
    decide,
    members,
    planned_start,
    quality,
    route,
    route_job,
)
from air_hpc.launch.sweep import load_elements
from air_hpc.observe.records import load_records
from air_hpc.ops.control import cancel_run, find_job, run_status
from air_hpc.ops.states import run_jobs
from air_hpc.ownership.attempts import settle
from air_hpc.ownership.clusters import run_client
from air_hpc.records.events import EventKind, read_events
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import Attempt, latest_submission, record_attempt
from air_hpc.slurm.client import SlurmClient, strip_cluster_banner, with_cluster
from air_hpc.slurm.fake import FakeSlurm
from air_hpc.slurm.jobs import JobState
from air_hpc.topology import treeconf
from air_hpc.topology.synthetic import fat_tree

REPO = Path(__file__).resolve().parents[2]
TESTBED_JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"
FREE = "IDLE"

GOOD = Quality("tree", 0, 1, 0)
SPREAD = Quality("tree", 1, 2, 0)


def answer(cluster: str, start_s: float | None, q: Quality | None = GOOD, error: str | None = None) -> ClusterAnswer:
    return ClusterAnswer(cluster, start_s, "n[1-2]" if start_s is not None else "", q, error)


# ---- the decision (pure) ---------------------------------------------------------------------


def test_the_soonest_start_wins_and_the_reason_names_the_others() -> None:
    decision = decide([answer("a", 10_000.0), answer("b", 1_000.0)])
    assert decision.cluster == "b"
    assert decision.reason.startswith("b: starts soonest")
    assert "a: starts +9000 s later" in decision.reason


def test_starts_within_the_tie_window_go_to_the_better_nodes_then_the_order_given() -> None:
    assert decide([answer("a", 1_000.0, SPREAD), answer("b", 1_030.0, GOOD)]).cluster == "b"
    assert decide([answer("a", 1_000.0, GOOD), answer("b", 1_000.0, GOOD)]).cluster == "a"
    assert decide([answer("a", 1_000.0, None), answer("b", 1_000.0, GOOD)]).cluster == "b"  # measured first
    assert decide([answer("a", 1_000.0, SPREAD), answer("b", 1_000.0 + 61, GOOD)]).cluster == "b"  # SPREAD: unfit
    two_leaves = Quality("tree", 1, 2, 1)  # level 1 is the best this 2-leaf job can get: acceptable
    assert decide([answer("a", 1_000.0, two_leaves), answer("b", 1_200.0, GOOD)]).cluster == "a"


def test_nodes_higher_in_the_fabric_than_needed_lose_to_a_later_start_at_acceptable_quality() -> None:
    decision = decide([answer("a", 1_000.0, SPREAD), answer("b", 5_000.0, GOOD)])
    assert decision.cluster == "b"
    assert "higher in the fabric than needed" in decision.reason


def test_when_no_cluster_offers_acceptable_nodes_the_soonest_start_decides_and_says_so() -> None:
    decision = decide([answer("a", 5_000.0, SPREAD), answer("b", 1_000.0, SPREAD)])
    assert decision.cluster == "b"
    assert "no cluster offers nodes of acceptable quality" in decision.reason


def test_a_cluster_that_did_not_answer_is_named_skipped_and_none_answering_is_exit_2() -> None:
    decision = decide([answer("a", None, None, "Slurm controller unreachable"), answer("b", 1_000.0)])
    assert decision.cluster == "b" and [a.cluster for a in decision.skipped] == ["a"]
    assert "a: skipped (Slurm controller unreachable)" in decision.reason
    with pytest.raises(RouteError, match=r"no cluster answered \(a: down; b: down\)") as info:
        decide([answer("a", None, None, "down"), answer("b", None, None, "down")])
    assert info.value.exit_code == ExitCode.USAGE == 2


# ---- quality on a cluster's fabric -----------------------------------------------------------------


def test_quality_is_the_joining_level_and_the_leaves_against_the_best_possible() -> None:
    fabric = fat_tree((2, 4, 2))  # leaf1 n[1-2], leaf2 n[3-6], leaf3 n[7-8]
    assert quality(fabric, "n[3-4]", 2) == Quality("tree", 0, 1, 0)
    assert quality(fabric, "n[2-3]", 2) == Quality("tree", 1, 2, 0)
    assert not Quality("tree", 1, 2, 0).acceptable
    assert quality(fabric, "n[1-6]", 6) == Quality("tree", 1, 2, 1)  # six nodes need the spine anyway
    assert quality(fabric, "x1", 1) is None  # a node the file does not know: not measured


def test_block_quality_counts_blocks_and_the_aggregate_level() -> None:
    blocks = treeconf.parse_block(
        "BlockName=b1 Nodes=g[1-2]\nBlockName=b2 Nodes=g[3-4]\nBlockSizes=2,4\n", "topology.conf"
    )
    assert quality(blocks, "g[1-2]", 2) == Quality("block", 0, 1, 0)
    assert quality(blocks, "g[2-3]", 2) == Quality("block", 1, 2, 0)


# ---- the clusters asked, through the one client --------------------------------------------------------


def two_clusters(tmp_path: Path, corpus: Path, busy: str = "a") -> tuple[JobConfig, FakeSlurm]:
    """A profile listing clusters a and b, each with its own fabric, on a fake slurmdbd that knows both."""
    confs = {}
    for name in ("a", "b"):
        path = tmp_path / f"topology-{name}.conf"
        path.write_text(treeconf.render(fat_tree((2, 2))))
        confs[name] = path
    job = load_job(
        TESTBED_JOB,
        [
            f"run.root={tmp_path / 'runs'}",
            f"data.path={corpus}",
            f"cluster.clusters=[{{name: a, topology_file: {confs['a']}}}, {{name: b, topology_file: {confs['b']}}}]",
        ],
    )
    fake = FakeSlurm()
    for name in ("a", "b"):
        member = fake.add_cluster(name, {f"n{i}": FREE for i in range(1, 5)})
        member.test_only_start = "2026-12-05T12:00:00" if name == busy else "2026-12-05T10:00:00"
    return job, fake


def test_the_cluster_where_the_job_starts_soonest_gets_it_asked_with_minus_m(
    tmp_path: Path, small_corpus: Path
) -> None:
    job, fake = two_clusters(tmp_path, small_corpus, busy="a")
    warnings: list[str] = []
    decision, member = route(job, ["a", "b"], fake, planned_start(), warnings.append)
    assert decision.cluster == member.name == "b" and warnings == []
    for name in ("a", "b"):
        asked = fake.members[name].calls
        assert ["sbatch", f"--clusters={name}", "--test-only"] == asked[-1][:3]
        assert any(c[:2] == ["scontrol", f"--clusters={name}"] for c in asked)  # its own live nodes
    answers = {a.cluster: a for a in decision.answers}
    assert answers["b"].quality == Quality("tree", 0, 1, 0) and answers["b"].nodelist == "n[1-2]"


def test_a_cluster_that_does_not_answer_is_skipped_with_a_warning_and_all_down_is_exit_2(
    tmp_path: Path, small_corpus: Path
) -> None:
    job, fake = two_clusters(tmp_path, small_corpus, busy="a")
    fake.members["b"].reachable = False
    warnings: list[str] = []
    decision, _ = route(job, ["a", "b"], fake, planned_start(), warnings.append)
    assert decision.cluster == "a"
    assert len(warnings) == 1 and warnings[0].startswith("cluster b skipped: ")
    assert "\n" not in warnings[0]
    fake.members["a"].reachable = False
    with pytest.raises(RouteError, match="no cluster answered") as info:
        route(job, ["a", "b"], fake, planned_start(), warnings.append)
    assert info.value.exit_code == 2 and "\n" not in str(info.value)


def test_route_job_aims_the_job_and_the_client_at_the_cluster_chosen(tmp_path: Path, small_corpus: Path) -> None:
    job, fake = two_clusters(tmp_path, small_corpus, busy="a")
    warnings: list[str] = []
    routed = route_job(job, ["a", "b"], fake, planned_start(), warnings.append)
    assert routed.decision.cluster == routed.member.name == "b" and warnings == []
    assert routed.client is fake.members["b"] and routed.client.cluster_name == "b"
    assert routed.job.cluster.topology_file == job.cluster.clusters[1].topology_file != job.cluster.topology_file
    assert routed.job.model_copy(update={"cluster": job.cluster}) == job  # only the topology file changes
    assert not fake.members["b"].jobs and not fake.members["a"].jobs  # asked with --test-only, nothing submitted


def test_route_job_asks_about_a_sweeps_first_element_and_aims_every_element(tmp_path: Path, small_corpus: Path) -> None:
    job, fake = two_clusters(tmp_path, small_corpus, busy="b")
    overrides = [
        f"run.root={tmp_path / 'runs'}",
        f"data.path={small_corpus}",
        "cluster.clusters=["
        + ", ".join(f"{{name: {c.name}, topology_file: {c.topology_file}}}" for c in job.cluster.clusters)
        + "]",
    ]
    _, elements = load_elements(str(TESTBED_JOB), overrides, expand(parse_grid(["train.seed=1,2"]), (), None, 0))
    warnings: list[str] = []
    routed = route_job(elements[0].job, ["a", "b"], fake, planned_start(), warnings.append)
    assert routed.decision.cluster == "a" and routed.client is fake.members["a"] and warnings == []
    aimed = [routed.aim(e.job) for e in elements]
    assert [j.train.seed for j in aimed] == [1, 2]
    assert all(j.cluster.topology_file == job.cluster.clusters[0].topology_file for j in aimed)
    assert aimed[0] == routed.job


def test_routing_is_refused_before_any_cluster_is_asked_for_another_executor_or_a_dependency() -> None:
    check_routable("slurm", "job")
    for executor, what in (("submitit", "job"), ("local", "sweep")):
        with pytest.raises(
            ConfigError, match=f"only --executor slurm routes a {what} across clusters \\(not {executor}\\)"
        ) as info:
            check_routable(executor, what)  # type: ignore[arg-type]
        assert info.value.exit_code == ExitCode.USAGE
    with pytest.raises(ConfigError, match="a Slurm dependency holds within one cluster only"):
        check_routable("slurm", "job", after="123")
    with pytest.raises(ConfigError, match="only --executor slurm routes a job"):  # the executor is named first
        check_routable("local", "job", after="123")


def test_an_unknown_cluster_name_is_exit_2_naming_it_and_the_known_ones(tmp_path: Path, small_corpus: Path) -> None:
    job, fake = two_clusters(tmp_path, small_corpus)
    with pytest.raises(ConfigError, match=r"unknown cluster 'c'; cluster profile 'testbed' .* knows a, b") as info:
        members(job, ["a", "c"], fake)
    assert info.value.exit_code == 2
    assert not any(c[0] == "sbatch" for m in fake.members.values() for c in m.calls)  # nothing asked
    bare = load_job(TESTBED_JOB, [f"run.root={tmp_path}", f"data.path={small_corpus}"])
    with pytest.raises(ConfigError, match=r"unknown cluster 'z'; slurmdbd \(sacctmgr show clusters\) knows main, a, b"):
        members(bare, ["z"], fake)
    assert members(bare, ["b"], fake) == [SlurmClusterConfig(name="b")]  # any cluster slurmdbd knows, with -M


def test_the_profile_names_the_clusters_once_each(tmp_path: Path, small_corpus: Path) -> None:
    with pytest.raises(ConfigError, match="cluster 'a' is listed twice"):
        load_job(TESTBED_JOB, [f"data.path={small_corpus}", "cluster.clusters=[{name: a}, {name: a}]"])
    with pytest.raises(ConfigError, match="is not a Slurm cluster name"):
        load_job(TESTBED_JOB, [f"data.path={small_corpus}", "cluster.clusters=[{name: 'a b'}]"])


def test_minus_m_goes_where_slurm_takes_it_and_the_banner_goes() -> None:
    assert with_cluster(["squeue", "--noheader"], "b") == ["squeue", "--clusters=b", "--noheader"]
    assert with_cluster(["sacct", "-X"], "b") == ["sacct", "--clusters=b", "-X"]
    assert with_cluster(["scontrol", "--version"], "b") == ["scontrol", "--version"]
    assert with_cluster(["scontrol", "show", "hostnames", "n[1-2]"], "b")[1] == "show"
    assert with_cluster(["srun", "true"], "b") == ["srun", "true"]
    assert with_cluster(["squeue"], None) == ["squeue"]
    assert strip_cluster_banner("CLUSTER: b\n12|RUNNING\n") == "12|RUNNING\n"
    client = SlurmClient(env={"SLURM_CONF": "/nonexistent/slurm.conf"}).on_cluster("b", Path("/etc/b/slurm.conf"))
    assert client.cluster_name == "b" and client.env["SLURM_CONF"] == "/etc/b/slurm.conf" and client.own_conf
    assert SlurmClient().on_cluster("b").controller_refused() is None  # another cluster's address is not ours


# ---- submit, then follow the job on its cluster ------------------------------------------------------


def test_submit_records_the_route_event_and_the_cluster_and_status_cancel_follow_it(
    tmp_path: Path, small_corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job, fake = two_clusters(tmp_path, small_corpus, busy="a")
    cli.main(
        args=["submit", str(TESTBED_JOB), "--clusters", "a,b", *sets(job, tmp_path, small_corpus)],
        standalone_mode=False,
        obj={"slurm_client": fake},
    )
    out, err = capsys.readouterr()
    b = fake.members["b"]
    (job_id,) = b.jobs
    assert out.strip() == job_id and "route: b: starts soonest" in err and "submitted to cluster b" in err
    assert not fake.members["a"].jobs and not fake.jobs
    run = RunDir(job.run.dir)
    assert latest_submission(run).cluster == "b"
    (event,) = [e for e in read_events(run.events) if e["kind"] == EventKind.ROUTE]
    assert event["cluster"] == "b" and event["job_id"] == job_id and "starts soonest" in event["reason"]
    assert [a["cluster"] for a in event["answers"]] == ["a", "b"]
    assert run_client(run, fake) is b
    b.start(job_id, "n[1-2]")
    status = run_status(run, fake)
    assert status.job.state is JobState.RUNNING and status.to_json()["cluster"] == "b"
    assert find_job(job_id, fake)[1] == "b"
    (listed,) = run_jobs([(run, load_records(run))], fake)  # runs and metrics: one squeue per cluster
    assert listed.state is JobState.RUNNING and next(c for c in b.calls if c[0] == "squeue")[:2] == [
        "squeue",
        "--clusters=b",
    ]
    outcome = cancel_run(run, fake)
    assert outcome.cancelled and "on cluster b" in outcome.message()
    assert ["scancel", "--clusters=b", job_id] in b.calls and b.jobs[job_id].state is JobState.CANCELLED


def sets(job: JobConfig, tmp_path: Path, corpus: Path) -> list[str]:
    clusters = ", ".join(f"{{name: {c.name}, topology_file: {c.topology_file}}}" for c in job.cluster.clusters)
    return [
        "--set",
        f"run.root={tmp_path / 'runs'}",
        "--set",
        f"data.path={corpus}",
        "--set",
        f"cluster.clusters=[{clusters}]",
    ]


def test_clusters_need_our_own_sbatch_executor(tmp_path: Path, small_corpus: Path) -> None:
    job, fake = two_clusters(tmp_path, small_corpus)
    with pytest.raises(ConfigError, match="only --executor slurm routes"):
        cli.main(
            args=[
                "submit",
                str(TESTBED_JOB),
                "--executor",
                "submitit",
                "--clusters",
                "a,b",
                *sets(job, tmp_path, small_corpus),
            ],
            standalone_mode=False,
            obj={"slurm_client": fake},
        )


def test_clusters_refuse_a_dependency_on_a_job_of_one_cluster(tmp_path: Path, small_corpus: Path) -> None:
    job, fake = two_clusters(tmp_path, small_corpus)
    earlier = fake.sbatch_wrap("true")
    with pytest.raises(ConfigError, match="a Slurm dependency holds within one cluster only") as info:
        cli.main(
            args=[
                "submit",
                str(TESTBED_JOB),
                "--clusters",
                "a,b",
                "--after",
                earlier,
                *sets(job, tmp_path, small_corpus),
            ],
            standalone_mode=False,
            obj={"slurm_client": fake},
        )
    assert info.value.exit_code == 2 and not any("--test-only" in c for m in fake.members.values() for c in m.calls)


def test_a_bare_job_id_is_found_on_whichever_cluster_holds_it(
    tmp_path: Path, small_corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, fake = two_clusters(tmp_path, small_corpus)
    b = fake.members["b"]
    job_id = b.sbatch_wrap("true")
    cli.main(args=["status", job_id, "--json"], standalone_mode=False, obj={"slurm_client": fake})
    shown = json.loads(capsys.readouterr().out)
    assert shown["cluster"] == "b" and shown["job_id"] == job_id
    assert next(c for c in fake.calls if c[0] == "sacct" and "--clusters=all" in c)[:2] == ["sacct", "--clusters=all"]


def test_a_lost_submit_is_looked_for_on_its_cluster_with_that_clusters_slurm_conf(
    tmp_path: Path, small_corpus: Path
) -> None:
    job, fake = two_clusters(tmp_path, small_corpus)
    conf_b = tmp_path / "b" / "slurm.conf"
    clusters = [c.model_copy(update={"slurm_conf": conf_b if c.name == "b" else None}) for c in job.cluster.clusters]
    job = job.model_copy(update={"cluster": job.cluster.model_copy(update={"clusters": tuple(clusters)})})
    run = RunDir(job.run.dir)
    run.path.mkdir(parents=True)
    run.write_job(job)
    record_attempt(run, Attempt("air-hpc-lost", job.run.name, "slurm", 1.0, "b"))
    assert settle(run, fake) == []  # nothing queued under that token: recorded as not submitted
    assert fake.members["b"].given_conf == conf_b and fake.members["b"].calls and not fake.calls


def test_a_sweep_goes_to_one_cluster_as_one_array_and_its_elements_are_followed_there(
    tmp_path: Path, small_corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job, fake = two_clusters(tmp_path, small_corpus, busy="a")
    cli.main(
        args=[
            "sweep",
            str(TESTBED_JOB),
            "--grid",
            "train.seed=1,2",
            "--clusters",
            "a,b",
            *sets(job, tmp_path, small_corpus),
        ],
        standalone_mode=False,
        obj={"slurm_client": fake},
    )
    out, err = capsys.readouterr()
    b = fake.members["b"]
    (array_submit,) = [c for c in b.calls if c[0] == "sbatch" and "--test-only" not in c]
    assert array_submit[:3] == ["sbatch", "--clusters=b", "--parsable"]
    assert not fake.members["a"].jobs and not fake.jobs and "route: b: starts soonest" in err and "on cluster b" in err
    array = out.strip()
    for index in (0, 1):
        run = RunDir(job.run.root / f"{job.run.name}-{index}")
        assert latest_submission(run).cluster == "b" and latest_submission(run).job_id == f"{array}_{index}"
        (event,) = [e for e in read_events(run.events) if e["kind"] == EventKind.ROUTE]
        assert event["cluster"] == "b" and event["job_id"] == f"{array}_{index}"
        assert run_client(run, fake) is b
        assert run.read_job().cluster.topology_file == job.cluster.clusters[1].topology_file


def test_a_local_sweep_cannot_be_routed(tmp_path: Path, small_corpus: Path) -> None:
    job, fake = two_clusters(tmp_path, small_corpus)
    args = ["sweep", str(TESTBED_JOB), "--grid", "train.seed=1,2", "--clusters", "a,b", "--executor", "local"]
    with pytest.raises(ConfigError, match="only --executor slurm routes a sweep") as info:
        cli.main(args=[*args, *sets(job, tmp_path, small_corpus)], standalone_mode=False, obj={"slurm_client": fake})
    assert info.value.exit_code == ExitCode.USAGE and not fake.calls
