"""Config loading, composition, overrides and every cross-field rule."""

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from air_hpc.config import load_job
from air_hpc.config.load import parse_override
from air_hpc.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
JOBS = sorted((REPO / "configs" / "jobs").glob("*.yaml"))
TESTBED_JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"


def write_job(tmp_path: Path, mutate) -> Path:
    data = yaml.safe_load(TESTBED_JOB.read_text())
    mutate(data)
    jobs = tmp_path / "configs" / "jobs"
    jobs.mkdir(parents=True)
    path = jobs / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("job_file", JOBS, ids=lambda p: p.stem)
def test_every_example_job_validates(job_file: Path) -> None:
    job = load_job(job_file)
    assert job.run.dir.is_absolute()
    assert job.layout.world_size == job.resources.world_size


def test_profiles_are_composed_by_name() -> None:
    job = load_job(TESTBED_JOB)
    assert job.hardware.name == "cpu-testbed" and job.hardware.device == "cpu"
    assert job.model.name == "gpt-tiny" and job.model.num_layers == 4
    assert job.cluster.partition == "batch"
    assert (job.layout.tp, job.layout.pp, job.layout.dp) == (2, 2, 1)
    assert job.precision == "fp32"


def test_overrides_are_typed_and_win() -> None:
    job = load_job(
        TESTBED_JOB, ["train.steps=7", "model.num_layers=8", "train.lr=0.5", "env.FOO=bar baz", "run.name=123"]
    )
    assert job.train.steps == 7
    assert job.model.num_layers == 8
    assert job.train.lr == 0.5
    assert job.env["FOO"] == "bar baz"
    assert job.run.name == "123"


def test_override_can_swap_a_profile() -> None:
    job = load_job(TESTBED_JOB, ["model=gpt-125m", "model.num_layers=4", "model.vocab_size=512"])
    assert job.model.name == "gpt-125m"
    assert job.model.hidden_size == 768 and job.model.num_layers == 4


def test_hostile_run_name_is_kept_verbatim() -> None:
    name = 'x"; touch pwned; echo "'
    assert load_job(TESTBED_JOB, [f"run.name={name}"]).run.name == name


def test_config_is_frozen() -> None:
    job = load_job(TESTBED_JOB)
    with pytest.raises(ValidationError):
        job.train.steps = 3  # type: ignore[misc]


@pytest.mark.parametrize("bad", ["train.steps", "=3", "a..b=1", ".a=1"])
def test_malformed_override(bad: str) -> None:
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        parse_override(bad)


def test_unknown_key_names_file_line_and_suggestion(tmp_path: Path) -> None:
    path = write_job(tmp_path, lambda d: d["train"].update(stpes=d["train"].pop("steps")))
    with pytest.raises(ConfigError) as info:
        load_job(path)
    message = str(info.value)
    assert message.startswith(f"{path}:")
    assert "unknown key 'train.stpes'" in message
    assert "did you mean 'train.steps'?" in message
    assert "\n" not in message


def test_unknown_top_level_key_suggests(tmp_path: Path) -> None:
    path = write_job(tmp_path, lambda d: d.update(paralel={"tp": 2}))
    with pytest.raises(ConfigError, match="did you mean 'parallel'"):
        load_job(path)


def test_unknown_override_key_suggests() -> None:
    with pytest.raises(ConfigError, match=r"--set train.step: unknown key .*did you mean 'train.steps'"):
        load_job(TESTBED_JOB, ["train.step=3"])


def test_missing_profile_suggests() -> None:
    with pytest.raises(ConfigError, match=r"model profile 'gpt-tinny' not found.*did you mean 'gpt-tiny'"):
        load_job(TESTBED_JOB, ["model=gpt-tinny"])


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        (["parallel.tp=3"], "parallel.tp", "not divisible by tp*pp"),
        (["model.num_layers=5"], "model.num_layers", "not divisible by pp = 2"),
        (["model.num_layers=6", "parallel.vpp=2"], "model.num_layers", "pp*vpp"),
        (["parallel.pp=1", "parallel.tp=1", "parallel.vpp=2"], "parallel.vpp", "need pp >= 2"),
        (
            ["model.num_attention_heads=3", "model.hidden_size=63"],
            "model.num_attention_heads",
            "not divisible by tp = 2",
        ),
        (["model.vocab_size=511"], "model.vocab_size", "not divisible by tp = 2"),
        (["model.hidden_size=66"], "model.hidden_size", "not divisible by num_attention_heads"),
        (["train.global_batch_size=7"], "train.global_batch_size", "micro_batch_size*dp"),
        (
            ["parallel.vpp=2", "train.global_batch_size=6", "train.micro_batch_size=2"],
            "train.global_batch_size",
            "multiple of pp",
        ),
        (["train.min_lr=1.0"], "train.min_lr", "above train.lr"),
        (["train.lr_warmup_steps=100"], "train.lr_warmup_steps", "more than train.steps"),
        (["parallel.sequence_parallel=true"], "parallel.sequence_parallel", "needs GPUs"),
        (["parallel.distributed_optimizer=true"], "parallel.distributed_optimizer", "need CUDA"),
        (["train.precision=bf16"], "train.precision", "bf16 is for GPUs"),
        (
            ["parallel.tp=4", "parallel.pp=1", "model.num_layers=4"],
            "parallel.tp",
            "larger than the 2 ranks of one NVLink domain",
        ),
        (["resilience.signal_lead_s=1800"], "resilience.signal_lead_s", "not shorter than the time limit"),
        (["checkpoint.async_wait_s=900"], "checkpoint.async_wait_s", "not shorter than health.heartbeat_checkpoint_s"),
        (
            ["hardware=h100-sxm", "resources.tasks_per_node=16", "train.global_batch_size=64"],
            "resources.tasks_per_node",
            "has 8 GPUs",
        ),
        (
            ["hardware=h100-sxm", "resources.tasks_per_node=2"],
            "resources.tasks_per_node",
            "2 ranks per node would leave 6 of hardware h100-sxm's 8 GPUs idle",
        ),
    ],
)
def test_cross_field_errors_name_the_key(overrides: list[str], key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_job(TESTBED_JOB, overrides)
    line = next(line for line in str(info.value).splitlines() if fragment in line)
    assert key in line


def test_two_independent_problems_in_one_job_file_are_both_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from air_hpc.cli.main import main

    def mutate(data: dict) -> None:
        data["train"]["min_lr"] = 0.5
        data["resilience"]["signal_lead_s"] = 1800

    job_file = write_job(tmp_path, mutate)
    lines = job_file.read_text().splitlines()
    min_lr_line = next(n for n, text in enumerate(lines, 1) if "min_lr" in text)
    lead_line = next(n for n, text in enumerate(lines, 1) if "signal_lead_s" in text)
    with pytest.raises(SystemExit) as info:
        main(["config", "show", str(job_file)])
    err = capsys.readouterr().err.splitlines()
    assert info.value.code == 2
    assert err == [
        f"error: {job_file}:{min_lr_line}: train.min_lr: 0.5 is above train.lr = 0.001",
        f"error: {job_file}:{lead_line}: resilience.signal_lead_s: 1800 s is not shorter than the time limit (30 min)",
    ]


def test_a_world_size_that_tp_pp_do_not_tile_still_reports_the_other_problems() -> None:
    with pytest.raises(ConfigError) as info:
        load_job(TESTBED_JOB, ["parallel.tp=3", "train.min_lr=1.0"])
    keys = [line.split(":")[0] for line in str(info.value).splitlines()]
    assert keys[0] == "--set parallel.tp" and "--set train.min_lr" in keys
    assert "micro_batch_size*dp" not in str(info.value)  # dp is undefined: the batch rules wait


def test_every_rule_has_a_unique_name_and_names_a_real_key() -> None:
    from air_hpc.config.models import JobConfig
    from air_hpc.config.rules import RULES

    assert len({rule.name for rule in RULES}) == len(RULES)
    for rule in RULES:
        section, field = rule.key.split(".")
        section_model = JobConfig.model_fields[section].annotation
        assert isinstance(section_model, type) and field in section_model.model_fields, rule.key


def test_idle_gpus_only_when_asked_for() -> None:
    job = load_job(TESTBED_JOB, ["hardware=h100-sxm", "resources.tasks_per_node=2", "resources.allow_idle_gpus=true"])
    assert (job.resources.tasks_per_node, job.hardware.gpus_per_node) == (2, 8)


def test_idle_gpus_from_a_job_file_exit_2_naming_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from air_hpc.cli.main import main

    job_file = tmp_path / "job.yaml"
    job_file.write_text(Path(TESTBED_JOB).read_text().replace("hardware: cpu-testbed", "hardware: h100-sxm"))
    with pytest.raises(SystemExit) as info:
        main(["config", "show", str(job_file)])
    err = capsys.readouterr().err
    line = next(n for n, text in enumerate(job_file.read_text().splitlines(), 1) if "tasks_per_node" in text)
    assert info.value.code == 2 and err.count("\n") == 1
    assert f"{job_file}:{line}: resources.tasks_per_node: 2 ranks per node would leave 6" in err


def test_gpu_profile_accepts_full_node_tp() -> None:
    job = load_job(
        TESTBED_JOB,
        [
            "hardware=h100-sxm",
            "resources.tasks_per_node=8",
            "parallel.tp=8",
            "parallel.pp=2",
            "model.num_attention_heads=8",
            "model.vocab_size=512",
        ],
    )
    assert job.precision == "bf16"
    assert job.layout.dp == 1


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("", "file is empty"),
        ("- a\n- b\n", "expected a mapping"),
        ("run: {name: [\n", "invalid YAML"),
    ],
)
def test_bad_yaml_files(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=fragment):
        load_job(path)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_job("does/not/exist.yaml")


def test_relative_paths_resolve_against_the_file_that_sets_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = tmp_path / "project" / "configs" / "jobs"
    jobs.mkdir(parents=True)
    text = TESTBED_JOB.read_text().replace("root: ../../runs", "root: out").replace("../../runs/data", "data")
    (jobs / "job.yaml").write_text(text)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    job = load_job(jobs / "job.yaml")
    assert job.run.root == jobs / "out"
    assert job.data.path == jobs / "data" / "corpus.h5"
    # A --set value is typed at the shell: it is relative to the current directory.
    job = load_job(jobs / "job.yaml", ["data.path=c.h5", "cluster.topology_file=topo.conf"])
    assert (job.data.path, job.cluster.topology_file) == (elsewhere / "c.h5", elsewhere / "topo.conf")
    assert job.run.root == jobs / "out"


def test_the_example_jobs_find_the_repository_runs_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    job = load_job(TESTBED_JOB)
    assert (job.run.root, job.data.path) == (REPO / "runs", REPO / "runs" / "data" / "corpus.h5")
