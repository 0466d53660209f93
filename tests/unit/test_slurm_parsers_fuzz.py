"""Every Slurm and ibstat parser the CLI reaches raises only air-hpc errors, whatever text it is given.

Inputs mix plain text with lines shaped like the real formats, built from
characters that broke parsers before: non-ASCII digits that pass
``str.isdigit`` (``²``, ``١``), separators, ``=``, ``:`` and line breaks.
"""

import subprocess
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from air_hpc.errors import AirHpcError
from air_hpc.health.ibstat import parse_ibstat, select_ports
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.cluster import (
    gpus_in_gres,
    parse_minutes,
    parse_partitions,
    parse_show_config,
    parse_sinfo_groups,
    parse_topology,
)
from air_hpc.slurm.jobs import (
    parse_exit_code,
    parse_sacct,
    parse_sbatch_parsable,
    parse_scontrol_job,
    parse_squeue,
    parse_state,
    parse_test_only,
)
from air_hpc.slurm.nodes import parse_scontrol_nodes, parse_sinfo

#: Outside the fast tier (scripts/test.sh --fast): thousands of generated inputs per parser (~5 min on 2 cores).
pytestmark = pytest.mark.slow

CASES = settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: characters that matter to these parsers, plus a few that do not
TRICKY = "0123456789²³¹١٣߀𝟘|:=;+*~#'.-_ \t\r\n\x00\x85\u2028abcNRUIPDdleLinkUpActive"
field = st.text(alphabet=TRICKY, max_size=8)
word = st.sampled_from(
    [
        "RUNNING",
        "PENDING",
        "CANCELLED by 0",
        "COMPLETED",
        "None",
        "None assigned",
        "0:0",
        "²",
        "1:²",
        "١",
        "IDLE",
        "IDLE+DRAIN",
        "idle~",
        "",
        "-1",
        "4294967295",
    ]
)
cell = st.one_of(field, word)


def lines_of(fields: int, sep: str = "|") -> st.SearchStrategy[str]:
    """Text of lines with about ``fields`` cells (one fewer to one more), joined by ``sep``."""
    line = st.lists(cell, min_size=fields - 1, max_size=fields + 1).map(sep.join)
    return st.lists(line, max_size=4).map("\n".join)


def keyed(keys: Sequence[str]) -> st.SearchStrategy[str]:
    """``Key=value`` words in random order and number, as scontrol prints them."""
    pair = st.tuples(st.sampled_from(keys), cell).map(lambda kv: f"{kv[0]}={kv[1]}")
    return st.lists(st.one_of(pair, field), max_size=10).map(" ".join)


def only_project_errors(parse: Callable[[str], Any], text: str) -> Any:
    try:
        return parse(text)
    except AirHpcError:
        return None


@CASES
@given(st.one_of(st.text(), lines_of(8)))
@example("1|RUNNING|²|n1|None|0|0|x")
def test_squeue(text: str) -> None:
    for record in only_project_errors(parse_squeue, text) or []:
        assert isinstance(record.nodes, int) and record.nodes >= 0


@CASES
@given(st.one_of(st.text(), lines_of(8)))
@example("1|COMPLETED|²:0|²|n1|0|0|x")
@example("1|FAILED|1:²|1|n1|0|0|x")
def test_sacct(text: str) -> None:
    for record in only_project_errors(parse_sacct, text) or []:
        assert record.exit_code is None or isinstance(record.exit_code, int)
        assert record.exit_signal is None or isinstance(record.exit_signal, int)


@CASES
@given(st.one_of(st.text(), cell))
def test_state_and_exit_code(text: str) -> None:
    parse_state(text)
    code, signal = parse_exit_code(text)
    assert code is None or code >= 0
    assert signal is None or signal >= 0


@CASES
@given(st.one_of(st.text(), keyed(["JobId", "JobState", "Restarts", "NumNodes", "NodeList", "ExitCode", "JobName"])))
def test_scontrol_job(text: str) -> None:
    assert all(isinstance(v, str) for v in parse_scontrol_job(text).values())


@CASES
@given(st.one_of(st.text(), field, st.from_regex(r"\A[0-9²١]{1,6}(;[a-z²]{0,4})?\n?\Z")))
@example("١٢")
def test_sbatch_parsable(text: str) -> None:
    job_id = only_project_errors(parse_sbatch_parsable, text)
    assert job_id is None or (job_id.isascii() and job_id.isdigit())


@CASES
@given(
    st.one_of(st.text(), st.builds("sbatch: Job {} to start at {} using {} processors on nodes {}".format, *[cell] * 4))
)
def test_sbatch_test_only(text: str) -> None:
    only_project_errors(parse_test_only, text)


@CASES
@given(
    st.one_of(
        st.text(),
        keyed(["NodeName", "State", "Arch", "Partitions"]),
        st.lists(keyed(["NodeName", "State"]), max_size=4).map("\n".join),
    )
)
@example("NodeName= State=")
@example("NodeName=n1\nState=IDLE NodeName=n2")
def test_scontrol_nodes(text: str) -> None:
    states = only_project_errors(parse_scontrol_nodes, text)
    assert states is None or not (states.available & set(states.unavailable))


@CASES
@given(st.one_of(st.text(), lines_of(2, sep=" ")))
def test_sinfo(text: str) -> None:
    states = only_project_errors(parse_sinfo, text)
    assert states is None or not (states.available & set(states.unavailable))


def ibstat_block() -> st.SearchStrategy[str]:
    header = st.one_of(cell.map("CA '{}'".format), cell.map("Port {}:".format))
    fields = st.sampled_from(["State", "Physical state", "Rate", "Link layer", "Base lid", "Port"])
    line = st.one_of(header, st.tuples(fields, cell).map(lambda kv: f"\t{kv[0]}: {kv[1]}"), field)
    return st.lists(line, max_size=10).map("\n".join)


@CASES
@given(st.one_of(st.text(), ibstat_block()))
@example("CA 'mlx5_0'\nPort ١:\nState: Active\nPhysical state: LinkUp\nRate: ²")
@example("CA 'mlx5_0'\nPort 1:\nState: Active\nPhysical state: LinkUp\nRate: 1e999")
def test_ibstat(text: str) -> None:
    ports = only_project_errors(parse_ibstat, text)
    if ports is not None:
        assert all(port.rate_gbps >= 0 and port.port >= 0 for port in ports)
        select_ports(ports, ("mlx5_0",))


class CannedSlurm(SlurmClient):
    """Answers every command with the same stdout: the client's own handling of parsed fields runs."""

    def __init__(self, stdout: str) -> None:
        super().__init__(env={}, retries=0)
        self.stdout = stdout

    def _run_once(
        self, args: Sequence[str], input_text: str | None, timeout_s: float, *, probe_slow: bool = False
    ) -> subprocess.CompletedProcess[str]:
        out = self.stdout if args[0] != "squeue" else "7|RUNNING|1|n1|None|0:01|1:00|x\n"
        return subprocess.CompletedProcess(list(args), 0, out, "")


@CASES
@given(keyed(["JobId", "Restarts", "JobState"]))
@example("JobId=7 Restarts=²")
def test_client_job_status_on_any_scontrol_answer(text: str) -> None:
    status = only_project_errors(CannedSlurm(text).job_status, "7")
    assert status is None or status.restarts >= 0


@pytest.mark.parametrize("digit", ["²", "١", "߀"])
def test_unicode_digits_are_not_numbers(digit: str) -> None:
    """The issue's cases: str.isdigit accepts these, int() then fails or reads them as numbers."""
    assert parse_squeue(f"1|RUNNING|{digit}|n1|None|0|0|x")[0].nodes == 0
    assert parse_sacct(f"1|FAILED|{digit}:{digit}|1|n1|0|0|x")[0].exit_code is None


CONFIG_KEYS = [
    "SLURM_VERSION",
    "MaxBatchRequeue",
    "MessageTimeout",
    "KillWait",
    "SlurmctldParameters",
    "SLURM_CONF",
    "RequeueExit",
    "RequeueExitHold",
]


@CASES
@given(
    st.one_of(
        st.text(),
        st.lists(st.tuples(st.sampled_from(CONFIG_KEYS), cell).map(" = ".join), max_size=8).map("\n".join),
    )
)
@example("SLURM_VERSION = 22.05\nMaxBatchRequeue = ²")
@example("SLURM_VERSION = 22.05\nMessageTimeout = ² sec")
@example("SLURM_VERSION = 22.05\nRequeueExit = ²")
@example("SLURM_VERSION = 22.05\nRequeueExitHold = 1-99999999999")
def test_cluster_show_config(text: str) -> None:
    only_project_errors(parse_show_config, text)


@CASES
@given(st.one_of(st.text(), keyed(["PartitionName", "MaxTime", "MaxNodes", "TotalNodes", "GraceTime", "Default"])))
@example("PartitionName=p MaxNodes=² TotalNodes=²")
def test_cluster_partitions(text: str) -> None:
    only_project_errors(parse_partitions, text)


@CASES
@given(st.one_of(st.text(), lines_of(5)))
@example("p|²|1|1|gpu:²")
def test_cluster_sinfo_groups_topology_and_time(text: str) -> None:
    only_project_errors(parse_sinfo_groups, text)
    only_project_errors(parse_minutes, text)
    parse_topology(text)
    gpus_in_gres(text)
