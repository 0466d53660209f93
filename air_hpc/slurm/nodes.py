"""Which nodes are free right now: pure parsers of ``scontrol show nodes`` and ``sinfo`` text.

"Available" means a whole node Slurm would hand to an exclusive job now: base
state IDLE without any flag that keeps the scheduler away (drain, maintenance,
reservation, not responding, reboot, power-down in progress, ...). Power-saved
cloud nodes (``IDLE+CLOUD+POWERED_DOWN``, sinfo ``idle~``) count as available:
Slurm resumes them on allocation.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from air_hpc.errors import SlurmError
from air_hpc.slurm.client import SlurmClient

#: scontrol state flags after which Slurm will not start a new job on an IDLE node
BLOCKING_FLAGS = frozenset(
    {
        "DRAIN",
        "DRAINING",
        "DRAINED",
        "FAIL",
        "FAILING",
        "MAINT",
        "MAINTENANCE",
        "NOT_RESPONDING",
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
        "POWERING_DOWN",
        "POWER_DOWN",
        "POWERING_UP",
        "RESERVED",
        "INVALID_REG",
        "COMPLETING",
        "PLANNED",
    }
)

#: sinfo ``%T`` suffixes that still allow a new job (none, or "~" = powered down, resumable)
_SINFO_OK_SUFFIXES = {"", "~"}

SCONTROL_ARGS = ("scontrol", "show", "nodes", "--oneliner")
SINFO_ARGS = ("sinfo", "--Node", "--noheader", "--format=%N %T")

_NODE_NAME = re.compile(r"(?:^|\s)NodeName=(\S+)")
_STATE = re.compile(r"(?:^|\s)State=(\S+)")


#: scontrol base states and flags of a node out of service (not merely busy): no job gets it until someone acts
OUT_OF_SERVICE = frozenset(
    {"DOWN", "FUTURE", "DRAIN", "DRAINING", "DRAINED", "FAIL", "FAILING", "MAINT", "MAINTENANCE", "NOT_RESPONDING"}
    | {"INVALID_REG"}
)


@dataclass(frozen=True)
class NodeStates:
    available: frozenset[str] = frozenset()
    #: every node that is not available, with the state text Slurm printed
    unavailable: Mapping[str, str] = field(default_factory=dict)

    @property
    def all_nodes(self) -> frozenset[str]:
        return self.available | frozenset(self.unavailable)

    @property
    def out_of_service(self) -> frozenset[str]:
        """Unavailable nodes that are drained, down or failing, not just busy (:func:`out_of_service`)."""
        return frozenset(node for node, state in self.unavailable.items() if out_of_service(state))


def out_of_service(state: str) -> bool:
    """``IDLE+DRAIN``, ``ALLOCATED+DRAIN``, ``DOWN+NOT_RESPONDING``, ``drained``, ``down*``: True; ``MIXED``: False.

    A powered-down node (``IDLE+CLOUD+POWERED_DOWN+NOT_RESPONDING``) does not answer because it is
    off: Slurm powers it up for the job that gets it, so it is in service (a 26.05 controller
    placed block jobs on such nodes that excluding them made unplaceable).
    """
    words = set(re.split(r"[+]", state.upper().rstrip("*~#!%$@^-")))
    if "POWERED_DOWN" in words:
        words.discard("NOT_RESPONDING")
    return bool(words & OUT_OF_SERVICE) or state.lower().startswith(("drain", "down", "fail", "maint"))


def scontrol_state_available(state: str) -> bool:
    """``IDLE+CLOUD+POWERED_DOWN`` -> True, ``IDLE+DRAIN`` or ``MIXED`` -> False."""
    base, *flags = state.upper().split("+")
    return base == "IDLE" and not (set(flags) & BLOCKING_FLAGS)


def sinfo_state_available(state: str) -> bool:
    """``idle`` / ``idle~`` -> True; ``idle*``, ``drained``, ``mixed``, ``idle%`` ... -> False."""
    word = state.rstrip("*~#!%$@^-")
    return word.lower() == "idle" and state[len(word) :] in _SINFO_OK_SUFFIXES


def _collect(pairs: list[tuple[str, str, bool]]) -> NodeStates:
    available: set[str] = set()
    unavailable: dict[str, str] = {}
    for node, state, ok in pairs:
        if ok and node not in unavailable:
            available.add(node)
        else:
            available.discard(node)
            unavailable[node] = state
    return NodeStates(available=frozenset(available), unavailable=MappingProxyType(unavailable))


def parse_scontrol_nodes(text: str, source: str = "scontrol show nodes") -> NodeStates:
    """Parse ``scontrol show nodes`` output, one-line (``--oneliner``) or the default multi-line blocks."""
    records = re.split(r"(?=(?:^|\s)NodeName=)", text)
    pairs = []
    for record in records:
        name = _NODE_NAME.search(record)
        if not name:
            if record.strip() and "No nodes in the system" not in record:
                raise SlurmError(f"{source}: cannot parse {record.strip()[:80]!r}; expected 'NodeName=... State=...'")
            continue
        state = _STATE.search(record)
        if not state:
            raise SlurmError(f"{source}: node {name.group(1)} has no State= field")
        pairs.append((name.group(1), state.group(1), scontrol_state_available(state.group(1))))
    return _collect(pairs)


def _sinfo_rows(text: str, source: str) -> list[tuple[str, str]]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2:
            raise SlurmError(f"{source}:{number}: expected 'NODE STATE', got {line.strip()!r}")
        rows.append((fields[0], fields[1]))
    return rows


def parse_sinfo(text: str, source: str = "sinfo") -> NodeStates:
    """Parse ``sinfo --Node --noheader --format='%N %T'``; a node in several partitions may repeat."""
    return _collect([(node, state, sinfo_state_available(state)) for node, state in _sinfo_rows(text, source)])


def parse_sinfo_states(text: str, source: str = "sinfo") -> dict[str, str]:
    """Each node's state as ``sinfo`` prints it (``idle``, ``allocated``, ``down*``), for showing or waiting on.

    A node listed in several partitions has the same state in each; its last line counts.
    """
    return dict(_sinfo_rows(text, source))


def fetch_node_states(client: SlurmClient) -> NodeStates:
    """Ask the controller (``scontrol show nodes --oneliner``) which nodes are free now."""
    return parse_scontrol_nodes(client.run(list(SCONTROL_ARGS)).stdout)


def fetch_sinfo_states(client: SlurmClient) -> dict[str, str]:
    """Every node's state text from ``sinfo`` (:func:`parse_sinfo_states`)."""
    return parse_sinfo_states(client.run(list(SINFO_ARGS)).stdout)
