"""Live node state parsers on text recorded from a real slurmctld 22.05 (tests/data/topology)."""

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from air_hpc.errors import SlurmError
from air_hpc.slurm.nodes import (
    SCONTROL_ARGS,
    fetch_node_states,
    parse_scontrol_nodes,
    parse_sinfo,
    parse_sinfo_states,
    scontrol_state_available,
    sinfo_state_available,
)

DATA = Path(__file__).parent.parent / "data" / "topology"
# recorded: n3 drained, n4 down, n6 in a maintenance reservation, n7-n8 allocated (powering up)
EXPECTED_AVAILABLE = {"n1", "n2", "n5"}


@pytest.mark.parametrize("name", ["scontrol_show_nodes_oneliner.txt", "scontrol_show_nodes.txt"])
def test_recorded_scontrol_output(name: str) -> None:
    states = parse_scontrol_nodes((DATA / name).read_text())
    assert states.available == EXPECTED_AVAILABLE
    assert set(states.unavailable) == {"n3", "n4", "n6", "n7", "n8"}
    assert states.unavailable["n4"] == "DOWN+CLOUD+POWERED_DOWN"
    assert states.all_nodes == {f"n{i}" for i in range(1, 9)}


def test_recorded_sinfo_output() -> None:
    states = parse_sinfo((DATA / "sinfo_node_states.txt").read_text())
    assert states.available == EXPECTED_AVAILABLE
    assert states.unavailable["n7"] == "allocated#"


@pytest.mark.parametrize(
    ("state", "ok"),
    [
        ("IDLE", True),
        ("IDLE+CLOUD+POWERED_DOWN", True),
        ("IDLE+DRAIN", False),
        ("IDLE+NOT_RESPONDING", False),
        ("IDLE+COMPLETING", False),
        ("IDLE+RESERVED", False),
        ("IDLE+POWERING_DOWN", False),
        ("MIXED", False),
        ("ALLOCATED", False),
        ("DOWN", False),
        ("FUTURE", False),
        ("idle", True),
    ],
)
def test_scontrol_states(state: str, ok: bool) -> None:
    assert scontrol_state_available(state) is ok


@pytest.mark.parametrize(
    ("state", "ok"),
    [
        ("idle", True),
        ("idle~", True),
        ("idle*", False),
        ("idle%", False),
        ("idle#", False),
        ("idle!", False),
        ("drained", False),
        ("draining", False),
        ("mixed", False),
        ("planned", False),
        ("down*", False),
    ],
)
def test_sinfo_states(state: str, ok: bool) -> None:
    assert sinfo_state_available(state) is ok


def test_node_in_two_partitions_is_unavailable_if_any_line_says_so() -> None:
    states = parse_sinfo("n1 idle\nn1 idle\nn2 idle\nn2 drained\nn3 mixed\nn3 idle\n")
    assert states.available == {"n1"}
    assert set(states.unavailable) == {"n2", "n3"}


def test_empty_cluster() -> None:
    assert parse_scontrol_nodes("No nodes in the system\n").all_nodes == frozenset()
    assert parse_sinfo("").all_nodes == frozenset()


@pytest.mark.parametrize(
    ("text", "parser", "message"),
    [
        ("n1 idle extra\n", parse_sinfo, "sinfo:1: expected 'NODE STATE'"),
        ("garbage\n", parse_scontrol_nodes, "cannot parse 'garbage'"),
        ("NodeName=n1 Arch=x86_64\n", parse_scontrol_nodes, "node n1 has no State= field"),
    ],
)
def test_bad_text(text: str, parser, message: str) -> None:
    with pytest.raises(SlurmError, match=message):
        parser(text)


class RecordedClient:
    """Answers like SlurmClient.run from recorded output; records what was asked."""

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout
        self.calls: list[list[str]] = []

    def run(self, args: Sequence[str], **_: object) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(args))
        return subprocess.CompletedProcess(list(args), 0, self.stdout, "")


def test_fetch_goes_through_the_client() -> None:
    client = RecordedClient((DATA / "scontrol_show_nodes_oneliner.txt").read_text())
    states = fetch_node_states(client)  # type: ignore[arg-type]
    assert client.calls == [list(SCONTROL_ARGS)]
    assert states.available == EXPECTED_AVAILABLE


def test_sinfo_state_texts_for_the_testbed() -> None:
    text = "n1 idle\nn2 allocated\nn1 idle\nn2 allocated\nn3 down*\n"  # every node in batch and urgent
    assert parse_sinfo_states(text) == {"n1": "idle", "n2": "allocated", "n3": "down*"}
    with pytest.raises(SlurmError, match=r"sinfo:2: expected 'NODE STATE'"):
        parse_sinfo_states("n1 idle\nn2\n")
