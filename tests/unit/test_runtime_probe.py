"""The dead-node probe's verdict: as soon as the live nodes' answers say a node is overdue, never later than the
timeout, and never before a live node's answer was given room."""

import threading
import time
from collections.abc import Callable, Iterator, Mapping

import pytest

from air_hpc.runtime.probe import PROBE_FACTOR, PROBE_MIN_S, deadline_after, probe_dead
from air_hpc.slurm.client import SlurmClient


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end: frees the probes of dead nodes, which in a real probe end by srun's own timeout."""
    event = threading.Event()
    yield event
    event.set()


def answering(after_s: Mapping[str, float | None], release: threading.Event) -> Callable[[str], bool]:
    """Each host answers (True) after its delay; None never answers; a negative delay fails at once."""

    def answers(host: str) -> bool:
        delay = after_s[host]
        if delay is None:
            release.wait(30)
            return False
        if delay < 0:
            return False
        time.sleep(delay)
        return True

    return answers


def timed(hosts: list[str], answers: Callable[[str], bool], timeout_s: float = 3.0) -> tuple[tuple[str, ...], float]:
    started = time.monotonic()
    dead = probe_dead(SlurmClient(), "7", hosts, timeout_s, answers=answers)
    return dead, time.monotonic() - started


def test_a_node_that_does_not_answer_is_dead_once_the_live_ones_answers_say_so(release: threading.Event) -> None:
    answers = answering({"n1": 0.02, "n2": None, "n3": 0.03}, release)
    dead, took = timed(["n1", "n2", "n3"], answers)
    assert dead == ("n2",)
    assert PROBE_MIN_S <= took < PROBE_MIN_S + 0.8  # not the whole 3 s timeout


def test_the_slowest_live_answer_sets_the_verdict(release: threading.Event) -> None:
    """A busy controller slows every answer: n3's 0.45 s gives the silent n2 5 x 0.45 s, not n1's 5 x 0.3 s."""
    answers = answering({"n1": 0.3, "n2": None, "n3": 0.45}, release)
    dead, took = timed(["n1", "n2", "n3"], answers, timeout_s=6.0)
    assert dead == ("n2",)
    assert PROBE_FACTOR * 0.45 <= took < PROBE_FACTOR * 0.45 + 0.8


def test_without_any_live_answer_the_timeout_decides(release: threading.Event) -> None:
    dead, took = timed(["n1", "n2"], answering({"n1": None, "n2": None}, release), timeout_s=0.5)
    assert dead == ("n1", "n2")
    assert 0.5 <= took < 1.3


def test_a_probe_that_fails_is_dead_and_the_verdict_never_exceeds_the_timeout(release: threading.Event) -> None:
    dead, took = timed(["n1", "n2", "n3"], answering({"n1": 0.01, "n2": -1, "n3": 0.01}, release))
    assert dead == ("n2",) and took < 0.5  # everyone answered: no waiting at all
    assert deadline_after(0.01) == PROBE_MIN_S
    assert deadline_after(10.0) == 3.0
    assert probe_dead(SlurmClient(), "7", [], answers=lambda host: True) == ()
