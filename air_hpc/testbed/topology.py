"""The testbed's fabric: one leaf switch per entry of ``--leaves`` under one spine."""

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TestbedFabric:
    leaves: dict[str, tuple[str, ...]]
    spine: str = "spine1"

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(n for members in self.leaves.values() for n in members)


def fabric_for(leaves: Sequence[int]) -> TestbedFabric:
    members: dict[str, tuple[str, ...]] = {}
    first = 1
    for i, count in enumerate(leaves, start=1):
        members[f"leaf{i}"] = tuple(f"n{k}" for k in range(first, first + count))
        first += count
    return TestbedFabric(members)


def render_topology(fabric: TestbedFabric) -> str:
    lines = ["# Written by air-hpc testbed up."]
    for leaf, nodes in fabric.leaves.items():
        lines.append(f"SwitchName={leaf} Nodes={','.join(nodes)}")
    lines.append(f"SwitchName={fabric.spine} Switches={','.join(fabric.leaves)}")
    return "\n".join(lines) + "\n"
