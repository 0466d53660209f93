"""sacct's fleet lines: whatever the text, the parser counts what it cannot read and the report is built, never a
traceback (characters that broke parsers before: non-ASCII digits, separators, odd times)."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from air_hpc.fleet.jobs import Window
from air_hpc.fleet.report import Prices, build_fleet_report
from air_hpc.slurm.accounting import FLEET_FIELDS, iter_lines, parse_accounting

#: Outside the fast tier, like the other parser fuzzers.
pytestmark = pytest.mark.slow

TRICKY = "0123456789²١|:-T \t\r\x00\x85\u2028abcN"
value = st.one_of(
    st.text(alphabet=TRICKY, max_size=20),
    st.sampled_from(
        [
            "2026-12-04T17:47:52",
            "2026-12-04T17:4x:07",
            "2026-02-30T10:00:00",
            "Unknown",
            "None",
            "0:0",
            "1:²",
            "PREEMPTED",
            "REQUEUED",
            "CANCELLED by 0",
            "RUNNING",
            "PENDING",
            "gres/gpu=8,node=1",
            "8",
            "١٢",
            "-1",
        ]
    ),
)
line = st.lists(value, min_size=len(FLEET_FIELDS) - 2, max_size=len(FLEET_FIELDS) + 1).map("|".join)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(line, max_size=6))
def test_any_sacct_text_is_parsed_or_counted_and_reported(lines: list[str]) -> None:
    text = "\n".join(lines)
    parsed = parse_accounting(iter_lines(text))
    assert len(parsed.rows) + parsed.malformed == sum(1 for x in iter_lines(text) if x.strip())
    report = build_fleet_report(parsed, Window(0.0, 4e9), {}, Prices(1.0, 2.0))
    assert report.total.jobs == len({row.job_id for row in parsed.rows})
