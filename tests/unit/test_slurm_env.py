"""``SLURM_*`` read once: typed values from any mapping, unset as None, a malformed count named."""

from pathlib import Path

import pytest

from air_hpc.errors import ConfigError
from air_hpc.slurm.env import SlurmEnv

TASK = {
    "SLURM_JOB_ID": "77",
    "SLURM_RESTART_COUNT": "2",
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_JOB_NODELIST": "n[3-4]",
    "SLURM_NODELIST": "ignored[1-2]",
    "SLURMD_NODENAME": "n4",
    "SLURM_HOSTFILE": "/run/hostfile",
    "SLURM_JOB_START_TIME": "1000",
    "SLURM_JOB_END_TIME": "4600",
}


def test_a_task_environment() -> None:
    assert SlurmEnv.from_environ(TASK) == SlurmEnv(
        job_id="77",
        restart_count=2,
        procid=3,
        ntasks=4,
        localid=1,
        step_id=0,
        nodelist=("n3", "n4"),
        nodename="n4",
        hostfile=Path("/run/hostfile"),
        job_start_time_s=1000.0,
        job_end_time_s=4600.0,
    )


def test_outside_slurm_everything_is_unset() -> None:
    assert SlurmEnv.from_environ({}) == SlurmEnv()
    assert SlurmEnv.from_environ({"SLURM_JOB_ID": "", "SLURM_RESTART_COUNT": " "}) == SlurmEnv()


def test_the_older_nodelist_name_is_read_when_the_newer_is_unset() -> None:
    assert SlurmEnv.from_environ({"SLURM_NODELIST": "a1,b[07-08]"}).nodelist == ("a1", "b07", "b08")


@pytest.mark.parametrize("var", ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_RESTART_COUNT"])
@pytest.mark.parametrize("value", ["x", "-1", "١"])
def test_a_malformed_count_is_a_config_error_naming_it(var: str, value: str) -> None:
    with pytest.raises(ConfigError, match=rf"\${var}=.*expected a whole number"):
        SlurmEnv.from_environ({**TASK, var: value})


def test_a_time_that_is_not_epoch_seconds_is_unset_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    env = SlurmEnv.from_environ({"SLURM_JOB_START_TIME": "soon", "SLURM_JOB_END_TIME": "0"})
    assert (env.job_start_time_s, env.job_end_time_s) == (None, None)
    assert "SLURM_JOB_START_TIME='soon'" in caplog.text


@pytest.mark.parametrize(
    ("value", "step_id"),
    [("0", 0), ("12", 12), ("-5", None), ("4294967291", None), ("-4", None), ("", None)],
    ids=["first-step", "step-12", "26.05-batch-signed", "batch-unsigned", "extern-signed", "unset"],
)
def test_the_batch_and_extern_steps_are_no_job_step(value: str, step_id: int | None) -> None:
    """26.05 sets SLURM_STEP_ID=-5 (SLURM_BATCH_SCRIPT, printed signed) in the batch shell; 25.05 left it unset."""
    assert SlurmEnv.from_environ({**TASK, "SLURM_STEP_ID": value}).step_id == step_id


@pytest.mark.parametrize("value", ["x", "-", "--5", "-x", "-99999999999", "١"])
def test_a_malformed_step_id_is_a_config_error_naming_it(value: str) -> None:
    with pytest.raises(ConfigError, match=r"\$SLURM_STEP_ID=.*expected a whole number"):
        SlurmEnv.from_environ({**TASK, "SLURM_STEP_ID": value})
