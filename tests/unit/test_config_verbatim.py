"""Hostile config values: a run name stays one path component; ``--set`` text reaches its field verbatim."""

from pathlib import Path

import pytest

from air_hpc.config import load_job
from air_hpc.errors import ConfigError
from tests.conftest import RunMain

REPO = Path(__file__).resolve().parents[2]
TESTBED_JOB = str(REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml")


@pytest.mark.parametrize("name", ["../../x", "/etc", "a/b", "..", ".", "a\nb", "a\rb", "a\0b", "-x", "--help"])
def test_run_name_that_is_not_one_path_component_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=r"--set run.name: .*(path component|option|directory name)"):
        load_job(TESTBED_JOB, [f"run.name={name}"])


@pytest.mark.parametrize("name", ["../../x", "/etc", "-rf"])
def test_cli_refuses_a_path_as_run_name_with_one_line(name: str, run_main: RunMain) -> None:
    code, out, err = run_main(["render", TESTBED_JOB, "--set", f"run.name={name}"])
    assert (code, out, err.count("\n")) == (2, "", 1)
    assert "run.name" in err and "--chdir" not in err


def test_run_name_from_the_file_is_checked_too(tmp_path: Path) -> None:
    bad = tmp_path / "configs" / "jobs" / "bad.yaml"
    bad.parent.mkdir(parents=True)
    bad.write_text(Path(TESTBED_JOB).read_text().replace("name: gpt-tiny-testbed", "name: ../escape"))
    with pytest.raises(ConfigError, match=r"bad.yaml:\d+: run.name: '../escape' contains '/'"):
        load_job(bad)


@pytest.mark.parametrize(
    ("item", "key", "expected"),
    [
        ("env.FOO=abc #c", ("env", "FOO"), "abc #c"),
        ("env.FOO=0x10", ("env", "FOO"), "0x10"),
        ("env.FOO= padded ", ("env", "FOO"), " padded "),
        ("env.FOO=true", ("env", "FOO"), "true"),
        ("env.FOO=[1, 2]", ("env", "FOO"), "[1, 2]"),
        ("env.FOO=", ("env", "FOO"), ""),
        ("run.name=0x10", ("run", "name"), "0x10"),
        ("run.name=007", ("run", "name"), "007"),
        ("cluster.partition=abc #c", ("cluster", "partition"), "abc #c"),
        ("cluster.account=1e3", ("cluster", "account"), "1e3"),
        ("hardware.nccl_env.NCCL_X=a: b", ("hardware", "nccl_env"), {"NCCL_X": "a: b"}),
    ],
)
def test_a_string_field_takes_the_text_verbatim(item: str, key: tuple[str, str], expected: object) -> None:
    job = load_job(TESTBED_JOB, [item]).model_dump()
    value = job[key[0]][key[1]]
    if isinstance(expected, dict):
        assert {k: value[k] for k in expected} == expected
    else:
        assert value == expected


def test_non_string_fields_still_parse_as_yaml_scalars() -> None:
    job = load_job(TESTBED_JOB, ["train.steps=0x10", "train.lr=5e-1", "health.watchdog=false"])
    assert (job.train.steps, job.train.lr, job.health.watchdog) == (16, 0.5, False)


def test_newline_in_env_value_is_kept_by_config_but_refused_by_render(run_main: RunMain) -> None:
    assert load_job(TESTBED_JOB, ["env.FOO=a\nb"]).env["FOO"] == "a\nb", "not folded into 'a b' by YAML"
    code, out, err = run_main(["render", TESTBED_JOB, "--set", "env.FOO=a\nb"])
    assert (code, out, err.count("\n")) == (2, "", 1)
    assert "env.FOO" in err and "line break" in err


@pytest.mark.parametrize(
    "item",
    [
        "cluster.partition=debug\n#SBATCH --uid=0",
        "cluster.python=/usr/bin/python3\ntouch /tmp/pwned",
        "run.root=/tmp/a\nb",
        "env.FOO=a\rb",
    ],
)
def test_newline_in_any_value_that_reaches_the_script_exits_2(item: str, run_main: RunMain) -> None:
    code, out, err = run_main(["render", TESTBED_JOB, "--set", item])
    assert (code, out, err.count("\n")) == (2, "", 1), err
    assert item.split("=", 1)[0] in err
