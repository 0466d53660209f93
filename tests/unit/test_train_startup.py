"""Start-up phases: the rank's clock, the ``startup`` event, and megatron-core imported without Inductor."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from air_hpc.backend.megatron_compat import (
    EVIDENCE,
    EVIDENCE_MODULE,
    UNUSED_EVIDENCE,
    UNUSED_EVIDENCE_MODULE,
    UNUSED_MODULE,
    hidden,
    lazy_compile,
)
from air_hpc.train.startup import PHASES, StartupClock, pause_gc, resume_gc, startup_event

REPO = Path(__file__).resolve().parents[2]


def test_clock_closes_each_phase_at_its_mark() -> None:
    now = iter([101.5, 104.0, 104.25])
    cpu = iter([0.5, 2.0, 2.125])
    clock = StartupClock(100.0, clock=lambda: next(now), cpu_clock=lambda: next(cpu))
    clock.mark("launch")
    clock.mark("imports")
    clock.mark("preflight")
    assert clock.phases_s == {"launch": 1.5, "imports": 2.5, "preflight": 0.25}
    assert clock.cpu_phases_s == {"launch": 0.5, "imports": 1.5, "preflight": 0.125}
    rest = [0.0] * (len(PHASES) - 3)
    assert clock.vector() == [1.5, 2.5, 0.25, *rest, 0.5, 1.5, 0.125, *rest, 0.0]


def test_clock_takes_the_cpu_time_when_the_first_step_begins() -> None:
    cpu = iter([0.5] * (len(PHASES) - 2) + [2.5, 9.0])
    clock = StartupClock(0.0, clock=lambda: 1.0, cpu_clock=lambda: next(cpu))
    for phase in PHASES:
        clock.mark(phase)
    assert clock.cpu_to_first_step_s == 2.5
    assert clock.cpu_phases_s["data"] == 2.0 and clock.cpu_phases_s["first_step"] == 6.5
    assert clock.vector()[-1] == 2.5


def test_clock_refuses_an_unknown_phase() -> None:
    with pytest.raises(ValueError, match="not one of"):
        StartupClock(0.0, clock=lambda: 1.0).mark("lunch")


def test_event_names_the_slowest_rank_and_leaves_the_first_step_out_of_the_total() -> None:
    fast_cpu = [0.5, 1.5, 0.0, 0.25, 0.25, 0.0, 0.0, 1.0]
    slow_cpu = [0.5, 2.0, 0.0, 0.25, 0.25, 0.25, 0.0, 0.5]
    fast = [1.0, 2.0, 0.0, 0.5, 0.25, 0.0, 0.0, 9.0, *fast_cpu, 3.5]
    slow = [1.0, 5.0, 0.0, 0.5, 0.25, 0.25, 0.0, 0.5, *slow_cpu, 4.0]
    event = startup_event([fast, slow], first_step=7)
    assert event.step == 7 and event.ranks == 2
    assert event.cpu_to_first_step_s == [3.5, 4.0]
    assert event.cpu_phases_s["imports"] == [1.5, 2.0]
    assert list(event.cpu_phases_s) == list(PHASES)
    assert event.to_first_step_s == 7.0
    assert event.slowest_rank == 1
    assert event.phases_s["imports"] == [2.0, 5.0]
    assert event.median_s["imports"] == 3.5
    assert list(event.phases_s) == list(PHASES)


def test_lazy_compile_compiles_on_the_first_call_only() -> None:
    compiled: list[str] = []

    def fake_compile(fn=None, **options):
        compiled.append(fn.__name__ if fn is not None else f"options {sorted(options)}")
        return (lambda *a: ("compiled", fn(*a))) if fn is not None else (lambda f: f)

    deferred = lazy_compile(fake_compile)

    @deferred
    def double(x: int) -> int:
        return 2 * x

    assert compiled == [] and double.__name__ == "double"
    assert double(3) == ("compiled", 6)
    assert double(4) == ("compiled", 8)
    assert compiled == ["double"]
    deferred(mode="max-autotune")
    assert compiled[-1] == "options ['mode']"


def test_megatron_still_binds_torch_compile_at_import() -> None:
    """The evidence for the deferred compile: when megatron-core stops doing this, drop the patch."""
    import importlib.util

    spec = importlib.util.find_spec(EVIDENCE_MODULE)
    assert spec is not None and spec.origin is not None
    assert EVIDENCE in Path(spec.origin).read_text()


def test_megatron_still_imports_tensorboard_only_if_it_can() -> None:
    """The evidence for hiding TensorBoard: megatron-core's timers import it in a try; if that try goes, so must we."""
    import importlib.util

    spec = importlib.util.find_spec(UNUSED_EVIDENCE_MODULE)
    assert spec is not None and spec.origin is not None
    assert UNUSED_EVIDENCE in Path(spec.origin).read_text()


def test_a_hidden_module_cannot_be_imported_inside_the_block_only() -> None:
    import sys

    name = "air_hpc_never_imported_module"
    with hidden(name), pytest.raises(ImportError):
        __import__(name)
    assert name not in sys.modules
    with hidden("json"):  # imported already: left as it is
        import json

        assert json.dumps([]) == "[]"


def _modules_after(code: str) -> set[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=300,
    ).stdout
    return set(out.split())


@pytest.mark.slow  # imports megatron-core in a fresh interpreter
def test_training_imports_of_megatron_leave_inductor_out() -> None:
    """A plain ``import megatron.core`` imports Inductor (seconds per rank) and TensorBoard; ours does not."""
    plain = _modules_after("import megatron.core")
    ours = _modules_after(
        "from air_hpc.backend import megatron_compat; megatron_compat.import_megatron()\n"
        f"import sys; print('' if {UNUSED_MODULE!r} in sys.modules else 'imported-without-it')\n"
        "from torch.utils.tensorboard import SummaryWriter  # observe.tensorboard: importable after"
    )
    assert "torch._inductor.compile_fx" in plain
    assert "torch._inductor.compile_fx" not in ours
    assert UNUSED_MODULE in plain and "imported-without-it" in ours and UNUSED_MODULE in ours
    assert {"megatron.core.models.gpt", "megatron.core.optimizer"} <= ours


def test_gc_paused_for_the_start_then_frozen_and_resumed() -> None:
    import gc

    assert gc.isenabled()
    try:
        pause_gc()
        pause_gc()  # idempotent: the entry pauses again under ``python -m air_hpc.runtime``
        assert not gc.isenabled()
        resume_gc()
        assert gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.enable()
        gc.unfreeze()


def test_gc_resume_leaves_a_collector_it_did_not_pause_alone() -> None:
    import gc

    gc.disable()
    try:
        pause_gc()
        resume_gc()
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.enable()
