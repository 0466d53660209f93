"""TensorBoard event files: a resumed start hides what the previous one logged after its checkpoint."""

import importlib.util
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from air_hpc.errors import ConfigError
from air_hpc.train.tb_log import TensorBoardLog, check_available


def test_a_resumed_start_purges_the_steps_trained_again(tmp_path: Path) -> None:
    first = TensorBoardLog(tmp_path, first_step=1, resumed_from=None)
    for step in range(1, 6):
        first.step(step, loss=10.0 + step, lr=0.1, tokens_per_s=100.0, grad_norm=1.0, step_time_s=0.5)
    first.checkpoint(3, "interval")
    first.close()  # killed after step 5; the checkpoint of step 3 is the newest complete one
    second = TensorBoardLog(tmp_path, first_step=4, resumed_from=3)
    for step in range(4, 7):
        second.step(step, loss=float(step), lr=0.1, tokens_per_s=100.0, grad_norm=1.0, step_time_s=0.5)
    second.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [
        (1, 11.0),
        (2, 12.0),
        (3, 13.0),
        (4, 4.0),
        (5, 5.0),
        (6, 6.0),
    ]
    assert [(e.step, e.value) for e in events.Scalars("markers/resumed_from_step")] == [(4, 3.0)]
    assert [(e.step, e.value) for e in events.Scalars("markers/checkpoint_step")] == [(3, 3.0)]


def test_missing_package_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"observe.tensorboard: true needs the tensorboard package") as info:
        check_available()
    assert info.value.exit_code == 2
