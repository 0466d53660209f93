"""Megatron's TransformerConfig as the job asks for it, on hardware that may lack fused kernels."""

import importlib.util
from pathlib import Path

import pytest

from air_hpc.config.load import load_job
from air_hpc.train.model import transformer_config

TESTBED_JOB = Path(__file__).parents[2] / "configs" / "jobs" / "gpt-tiny-testbed.yaml"


def test_cpu_job_turns_every_fusion_off() -> None:
    config = transformer_config(load_job(TESTBED_JOB))
    assert not config.masked_softmax_fusion
    assert not config.bias_activation_fusion
    assert not config.bias_dropout_fusion


@pytest.mark.skipif(
    importlib.util.find_spec("scaled_masked_softmax_cuda") is not None, reason="Apex's fused softmax is installed"
)
def test_gpu_job_without_apex_keeps_the_unfused_softmax() -> None:
    """The fused softmax would import Apex's kernel at the first bf16 step and fail there."""
    job = load_job(TESTBED_JOB, ["hardware=h200-sxm", "train.precision=bf16", "resources.allow_idle_gpus=true"])
    config = transformer_config(job)
    assert config.bf16
    assert not config.masked_softmax_fusion
    assert config.bias_activation_fusion
