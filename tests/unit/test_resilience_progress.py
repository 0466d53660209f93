"""The crash-loop budget: starts in a row that saved no new checkpoint, from the run's events."""

from typing import Any

import pytest

from air_hpc.observe.records import RunRecords, parse_events, stop_reason
from air_hpc.resilience.progress import check_progress, no_progress_restarts, starts


def history(*starts_saved: tuple[str, list[int]]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for generation, steps in starts_saved:
        events.append({"time": len(events), "kind": "start", "generation": generation})
        events.append({"time": len(events), "kind": "signal"})  # the batch script's: not a start
        events.extend({"time": len(events), "kind": "checkpoint_saved", "step": s} for s in steps)
    return events


def test_starts_collect_the_checkpoints_saved_during_each() -> None:
    records = starts(history(("9-0", [5, 10]), ("9-1", [])))
    assert [(r.generation, r.saved_steps) for r in records] == [("9-0", (5, 10)), ("9-1", ())]


@pytest.mark.parametrize(
    ("runs", "expected"),
    [
        ([], (0, None)),
        ([("9-0", [5])], (0, 5)),
        ([("9-0", [5]), ("9-1", [])], (1, 5)),
        ([("9-0", [5]), ("9-1", []), ("9-2", [])], (2, 5)),
        ([("9-0", []), ("9-1", [])], (2, None)),
        ([("9-0", []), ("9-1", [10]), ("9-2", [])], (1, 10)),
    ],
)
def test_no_progress_restarts_count_trailing_starts_without_a_save(
    runs: list[tuple[str, list[int]]], expected: tuple[int, int | None]
) -> None:
    assert no_progress_restarts(history(*runs), "9-9") == expected


def test_the_current_start_is_not_counted() -> None:
    """Rank 0 may have written this start's event before a slower rank reads the log."""
    events = history(("9-0", [5]), ("9-1", []), ("9-2", []))
    assert no_progress_restarts(events, "9-2") == (1, 5)


def test_check_progress_stops_at_the_limit_and_says_why() -> None:
    events = history(("9-0", [5]), ("9-1", []), ("9-2", []))
    assert check_progress(events, "9-3", limit=3) is None
    why = check_progress(events, "9-3", limit=2)
    assert why == (
        "2 restarts in a row made no progress (no new checkpoint since step 5); "
        "resilience.max_no_progress_restarts is 2: stopping instead of requeueing again"
    )


def test_stop_reason_comes_from_the_last_crash_loop_event() -> None:
    events = parse_events([{"time": 1.0, "kind": "crash_loop", "why": "2 restarts in a row made no progress"}])
    records = RunRecords(steps=(), events=events, starts_s=(), total_steps=None, tokens_per_step=None)
    assert stop_reason(records) == "crash loop: 2 restarts in a row made no progress"
    assert stop_reason(RunRecords((), (), (), None, None)) is None
