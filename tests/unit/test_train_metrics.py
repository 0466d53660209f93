"""metrics.jsonl records, the resume truncation, and rank-tagged log lines."""

import logging
from pathlib import Path

import pytest

from air_hpc.config.load import load_job
from air_hpc.records.metrics import read_metrics
from air_hpc.train.metrics import MetricsWriter, RankFormatter, StepMetrics, flops_per_token

REPO = Path(__file__).resolve().parents[2]


def record(step: int, loss: float = 1.0) -> StepMetrics:
    return StepMetrics(step=step, loss=loss, lr=1e-3, grad_norm=0.5, tokens_per_s=10.0, step_time_s=0.1)


def test_loss_round_trips_exactly_and_unset_fields_are_left_out(tmp_path: Path) -> None:
    loss = 6.263478755950928 + 1e-15
    writer = MetricsWriter(tmp_path / "metrics.jsonl")
    writer.write(record(1, loss))
    writer.write(StepMetrics(2, loss, 1e-3, 0.5, 10.0, 0.1, resumed_from=1, rng_restored=True))
    writer.close()
    first, second = read_metrics(tmp_path / "metrics.jsonl")
    assert first["loss"] == loss
    assert "mfu" not in first and "resumed_from" not in first
    assert (second["resumed_from"], second["rng_restored"]) == (1, True)


def test_resume_drops_steps_after_the_checkpoint_and_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(record(s).to_json() + "\n" for s in range(1, 6)) + '{"step": 6, "lo')
    writer = MetricsWriter(path, keep_through_step=3)
    writer.write(record(4, 2.0))
    writer.close()
    assert [(r["step"], r["loss"]) for r in read_metrics(path)] == [(1, 1.0), (2, 1.0), (3, 1.0), (4, 2.0)]


def test_resume_drops_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    steps = b"".join(record(s).to_json().encode() + b"\n" for s in (1, 2))
    path.write_bytes(steps + b"\xff\xfe\x80 junk\n")
    MetricsWriter(path, keep_through_step=2).close()
    assert path.read_bytes() == steps


def test_a_fresh_start_keeps_nothing_of_an_old_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(record(1).to_json() + "\n")
    MetricsWriter(path, keep_through_step=0).close()
    assert read_metrics(path) == []


def test_every_line_of_a_record_carries_the_rank() -> None:
    formatter = RankFormatter(7)
    message = logging.LogRecord("x", logging.INFO, __file__, 1, "first\nsecond", None, None)
    lines = formatter.format(message).splitlines()
    assert len(lines) == 2 and all(" rank=7 INFO x: " in line for line in lines)


def test_flops_per_token_of_gpt_125m_follows_the_12_l_h_squared_rule() -> None:
    """With ffn = 4h a layer holds 12 h^2 matmul weights; attention scores add 12 L h s per token."""
    model = load_job(REPO / "configs/jobs/gpt-tiny-local.yaml", ["model=gpt-125m", "parallel.tp=1"]).model
    layers, h, s, vocab = model.num_layers, model.hidden_size, model.seq_len, model.vocab_size
    assert model.ffn_hidden_size == 4 * h
    assert flops_per_token(model) == 6 * (12 * layers * h * h + h * vocab) + 12 * layers * h * s


def test_the_step_line_shows_a_loss_only_where_there_is_one() -> None:
    from air_hpc.train.metrics import step_line

    assert step_line(3, 20, 4.25, 1e-3, 0.5, 1.25, 0.002) == (
        "step 3/20 loss 4.250000 lr 0.001 grad_norm 0.5000 1.250 s (loader 2.0 ms)"
    )
    assert (
        step_line(3, 20, None, 1e-3, 0.5, 1.25, 0.002) == "step 3/20 lr 0.001 grad_norm 0.5000 1.250 s (loader 2.0 ms)"
    )


@pytest.mark.parametrize(("rank", "restart", "shown"), [(0, 0, True), (1, 0, False), (0, 1, False), (3, 2, False)])
def test_the_missing_te_warning_once_per_job(rank: int, restart: int, shown: bool) -> None:
    import warnings

    from air_hpc.train.metrics import warn_once_per_job

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_once_per_job(rank, restart)
        warnings.warn("Transformer Engine and Apex are not installed. Falling back to Torch optimizers.", stacklevel=1)
        warnings.warn("something else", stacklevel=1)
    assert [str(w.message)[:11] for w in caught] == ["Transformer", "something e"][0 if shown else 1 :]


@pytest.mark.parametrize(
    ("rank", "on_cpu", "verbose", "shown"),
    [(0, True, False, False), (2, True, False, False), (0, False, False, True), (1, True, True, True)],
)
def test_missing_te_and_apex_warnings_do_not_apply_on_cpu(rank: int, on_cpu: bool, verbose: bool, shown: bool) -> None:
    """Issue 24 item 8: on CPU hardware no rank prints them (-v keeps them); on GPUs rank 0 of the first start does."""
    import warnings

    from air_hpc.train.metrics import VERBOSE_ENV, warn_once_per_job

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_once_per_job(rank, 0, on_cpu=on_cpu, environ={VERBOSE_ENV: "1"} if verbose else {})
        warnings.warn("Apex is not installed. Falling back to Torch Norm", stacklevel=1)
        warnings.warn("Transformer Engine and Apex are not installed. Falling back to Torch optimizers.", stacklevel=1)
    assert len(caught) == (2 if shown else 0)


@pytest.mark.slow  # imports Megatron in a fresh interpreter
def test_megatrons_own_te_and_apex_warnings_are_silenced_on_cpu() -> None:
    """Megatron's real imports (the optimizer and the model specs), so the patterns keep matching its text."""
    import subprocess
    import sys

    probe = (
        "import warnings; warnings.simplefilter('default')\n"
        "from air_hpc.train.metrics import warn_once_per_job; warn_once_per_job(0, 0, on_cpu=True)\n"
        "import megatron.core.optimizer, megatron.core.models.gpt.gpt_layer_specs\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "not installed" not in result.stderr, result.stderr


@pytest.mark.slow  # builds a Megatron model in a fresh interpreter
def test_megatrons_own_missing_te_warning_is_silenced_on_rank_1() -> None:
    """Megatron's real import, so the pattern keeps matching the text it prints."""
    import subprocess
    import sys

    probe = (
        "import warnings; warnings.simplefilter('default')\n"
        "from air_hpc.train.metrics import warn_once_per_job; warn_once_per_job(1, 0)\n"
        "import megatron.core.optimizer\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Transformer Engine and Apex are not installed" not in result.stderr, result.stderr


def test_minus_v_keeps_the_warnings_in_the_jobs_it_submits(monkeypatch: pytest.MonkeyPatch) -> None:
    """``air-hpc -v`` puts AIR_HPC_VERBOSE in the environment its jobs inherit (sbatch and submitit export it)."""
    import os
    from pathlib import Path

    from click.testing import CliRunner

    from air_hpc.cli.main import cli
    from air_hpc.train.metrics import VERBOSE_ENV

    monkeypatch.setenv(VERBOSE_ENV, "")
    job = Path(__file__).resolve().parents[2] / "configs" / "jobs" / "gpt-tiny-testbed.yaml"
    assert CliRunner().invoke(cli, ["config", "show", str(job)]).exit_code == 0
    assert os.environ[VERBOSE_ENV] == ""
    assert CliRunner().invoke(cli, ["-v", "config", "show", str(job)]).exit_code == 0
    assert os.environ[VERBOSE_ENV] == "1"
