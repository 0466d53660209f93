"""Sweeps: grid and random expansion, the array's script, submission as one array against the fake controller."""

import json
from pathlib import Path

import pytest

from air_hpc.cli.main import cli
from air_hpc.errors import ConfigError
from air_hpc.launch.grid import expand, parse_grid, parse_random
from air_hpc.launch.sweep import check_array_size, load_elements, submit_sweep
from air_hpc.ownership.owner import fence, read_owner
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import latest_submission
from air_hpc.records.sweeps import read_sweep, sweep_dir
from air_hpc.render.array import array_spec
from air_hpc.slurm.fake import FakeSlurm
from air_hpc.slurm.jobs import JobState
from tests.conftest import RunMain

REPO = Path(__file__).resolve().parents[2]
TESTBED_JOB = str(REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml")


def base(tmp_path: Path, corpus: Path) -> list[str]:
    return [f"run.root={tmp_path / 'runs'}", f"data.path={corpus}", "run.name=sw"]


def test_grid_is_a_product_first_key_slowest_and_random_draws_repeat_per_seed() -> None:
    grid = parse_grid(["train.lr=1e-3,2e-3", "train.seed=1,2,3"])
    elements = expand(grid, (), None, 0)
    assert [dict(e) for e in elements][:4] == [
        {"train.lr": "1e-3", "train.seed": "1"},
        {"train.lr": "1e-3", "train.seed": "2"},
        {"train.lr": "1e-3", "train.seed": "3"},
        {"train.lr": "2e-3", "train.seed": "1"},
    ]
    assert len(elements) == 6
    draws = parse_random(["train.lr=loguniform:1e-4:1e-2", "train.seed=int:1:9", "train.precision=choice:fp32|auto"])
    first, again, other = (expand((), draws, 6, seed) for seed in (7, 7, 8))
    assert first == again != other and len(first) == 6
    for element in first:
        values = dict(element)
        assert 1e-4 <= float(values["train.lr"]) < 1e-2 and 1 <= int(values["train.seed"]) <= 9
        assert values["train.precision"] in ("fp32", "auto")


@pytest.mark.parametrize(
    ("grid", "draws", "count", "words"),
    [
        (["train.lr"], [], None, "expected KEY=VALUES"),
        (["train.lr=1,,2"], [], None, "an empty value"),
        (["train.lr=1,1"], [], None, "listed twice"),
        (["train.lr=1", "train.lr=2"], [], None, "swept twice"),
        ([], ["train.lr=normal:0:1"], 2, "unknown distribution 'normal'"),
        ([], ["train.lr=loguniform:0:1"], 2, "LO > 0"),
        ([], ["train.lr=uniform:2:1"], 2, "not above HI"),
        ([], ["train.seed=int:1.5:3"], 2, "whole numbers"),
        ([], ["train.lr=uniform:0:1"], None, "--random needs --count"),
        (["train.lr=1,2"], [], 3, "--count goes with --random"),
        (["train.lr=1,2"], ["train.lr=uniform:0:1"], 1, "both in --grid and --random"),
        ([], [], None, "a sweep needs"),
    ],
)
def test_bad_sweep_arguments_name_what_is_wrong(
    grid: list[str], draws: list[str], count: int | None, words: str
) -> None:
    with pytest.raises(ConfigError, match=words):
        expand(parse_grid(grid), parse_random(draws), count, 0)


def test_array_spec_compresses_ranges_and_limits_only_when_it_limits() -> None:
    assert array_spec([0, 1, 2, 3], 2) == "0-3%2"
    assert array_spec([1, 3, 4, 5, 9], None) == "1,3-5,9"
    assert array_spec([0, 1], 4) == "0-1"


def test_an_unknown_grid_key_exits_2_with_a_did_you_mean_before_anything_is_submitted(
    tmp_path: Path, small_corpus: Path, run_main: RunMain
) -> None:
    args = ["sweep", TESTBED_JOB, *(f"--set={s}" for s in base(tmp_path, small_corpus)), "--grid", "train.lrr=1,2"]
    code, _, err = run_main(args)
    assert code == 2 and err.count("\n") == 1
    assert "unknown key 'train.lrr'; did you mean 'train.lr'?" in err and "--set" not in err
    assert not (tmp_path / "runs").exists()


def test_a_key_that_changes_the_slurm_request_cannot_be_one_array(tmp_path: Path, small_corpus: Path) -> None:
    settings = expand(parse_grid(["resources.time_limit_min=10,20"]), (), None, 0)
    name, elements = load_elements(TESTBED_JOB, base(tmp_path, small_corpus), settings)
    fake = FakeSlurm()
    with pytest.raises(ConfigError, match=r"resources.time_limit_min: the sweep changes the Slurm request \(--time\)"):
        submit_sweep(name, elements, "slurm", fake)
    assert not any(c[:2] == ["sbatch", "--parsable"] for c in fake.calls)


def test_a_sweep_larger_than_max_array_size_is_refused_naming_the_limit() -> None:
    fake = FakeSlurm()
    fake.max_array_size = 4
    check_array_size([0, 1, 2, 3], fake)
    with pytest.raises(ConfigError, match=r"5 elements but this cluster's MaxArraySize is 4 \(array indices 0-3\)"):
        check_array_size([0, 1, 2, 3, 4], fake)


def test_a_sweep_is_one_array_whose_tasks_own_their_elements(tmp_path: Path, small_corpus: Path) -> None:
    settings = expand(parse_grid(["train.lr=0.001,0.002", "train.seed=1,2"]), (), None, 0)
    name, elements = load_elements(TESTBED_JOB, base(tmp_path, small_corpus), settings)
    fake = FakeSlurm()
    done = submit_sweep(name, elements, "slurm", fake, max_parallel=2)
    submits = [c for c in fake.calls if c[:2] == ["sbatch", "--parsable"]]
    assert len(submits) == 1 and done.job_id == "100"
    script = Path(submits[0][-1]).read_text()
    assert "#SBATCH --array=0-3%2\n" in script and "#SBATCH --job-name=sw\n" in script
    assert f"#SBATCH --output={tmp_path}/runs/sw-%a/logs/slurm-%A_%a.out\n" in script
    for element in elements:
        run = RunDir.of(element.job)
        task = f"100_{element.index}"
        assert latest_submission(run).job_id == task and read_owner(run).job_id == task  # type: ignore[union-attr]
        job = run.read_job()
        assert job.run.name == f"sw-{element.index}" and job.run.sweep is not None
        assert job.run.sweep.overrides == dict(element.settings)
        assert f"{element.index}) cd {run.path} && exec /bin/bash job.sbatch ;;" in script
        # The task's ranks pass the owner fence as ARRAY_INDEX; another task's do not.
        fence(run, {"SLURM_JOB_ID": "107", "SLURM_ARRAY_JOB_ID": "100", "SLURM_ARRAY_TASK_ID": str(element.index)})
    record = read_sweep(sweep_dir(tmp_path / "runs", "sw"))
    assert record.job_ids == ("100",) and [e.index for e in record.elements] == [0, 1, 2, 3]


def test_a_run_of_another_sweep_under_an_element_name_is_refused(tmp_path: Path, small_corpus: Path) -> None:
    fake = FakeSlurm()
    first = expand(parse_grid(["train.lr=0.001,0.002"]), (), None, 0)
    name, elements = load_elements(TESTBED_JOB, base(tmp_path, small_corpus), first)
    submit_sweep(name, elements, "slurm", fake)
    for job_id in ("100_0", "100_1"):
        fake.finish(job_id, JobState.FAILED, 1)
    other = expand(parse_grid(["train.lr=0.003,0.004"]), (), None, 0)
    name, elements = load_elements(TESTBED_JOB, base(tmp_path, small_corpus), other)
    with pytest.raises(
        ConfigError, match=r"is element 0 of sweep sw with train\.lr=0\.001, not this sweep's element 0"
    ):
        submit_sweep(name, elements, "slurm", fake)


def test_runs_status_and_cancel_work_on_the_whole_sweep_and_one_element(
    tmp_path: Path, small_corpus: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = expand(parse_grid(["train.lr=0.001,0.002,0.003"]), (), None, 0)
    name, elements = load_elements(TESTBED_JOB, base(tmp_path, small_corpus), settings)
    fake = FakeSlurm()
    submit_sweep(name, elements, "slurm", fake, max_parallel=1)
    fake.start("100_0", "n1")
    monkeypatch.setenv("AIR_HPC_RUNS_ROOT", str(tmp_path / "runs"))

    def invoke(*args: str) -> str:
        cli.main(args=list(args), standalone_mode=False, obj={"slurm_client": fake})
        return capsys.readouterr().out

    listed = json.loads(invoke("runs", "--sweep", "sw", "--json"))
    assert [(e["index"], e["overrides"], e["state"]) for e in listed["elements"]] == [
        (0, {"train.lr": "0.001"}, "RUNNING"),
        (1, {"train.lr": "0.002"}, "PENDING"),
        (2, {"train.lr": "0.003"}, "PENDING"),
    ]
    assert "train.lr=0.002" in invoke("status", "sw")
    assert invoke("cancel", "sw/1") == "cancelled job 100_1 (slurm), which was PENDING\n"
    assert ["scancel", "100_1"] in fake.calls and fake.jobs["100_1"].state is JobState.CANCELLED
    out = json.loads(invoke("cancel", "sw", "--json"))
    assert [e["cancelled"] for e in out["elements"]] == [True, False, True]
    assert all(job.state is JobState.CANCELLED for job in fake.jobs.values())
