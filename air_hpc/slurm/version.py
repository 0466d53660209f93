"""Which Slurm answers: the version ``scontrol --version`` (or any Slurm command's ``--version``) prints, as a value.

Requests and parsers that differ between releases compare against it (``version >= SlurmVersion(24, 5)``).
"""

import re
from dataclasses import dataclass

from air_hpc.errors import SlurmError

#: ``slurm 25.05.8``, ``slurm-wlm 22.05.8`` (Debian), ``slurm 25.11.0-0rc1``: the package, then the release.
_VERSION = re.compile(r"^slurm(?:-wlm)? ([0-9]{2,4})\.([0-9]{1,2})\.([0-9]{1,3})\b")


@dataclass(frozen=True, order=True)
class SlurmVersion:
    """A Slurm release, ordered as releases are (``22.05.8 < 24.11.5 < 25.05.0``)."""

    major: int
    minor: int
    micro: int = 0

    def __str__(self) -> str:
        return f"{self.major:02d}.{self.minor:02d}.{self.micro}"


def parse_version(text: str, source: str = "scontrol --version") -> SlurmVersion:
    """The version on the first line of ``--version`` output; :class:`SlurmError` quoting it when there is none."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    match = _VERSION.match(first)
    if match is None:
        raise SlurmError(f"{source}: cannot read a Slurm version from {first!r}; expected e.g. 'slurm 25.05.8'")
    return SlurmVersion(*(int(part) for part in match.groups()))


#: The releases air-hpc knows (SchedMD's May and November releases from 22.05 on, and 23.02): anything else
#: is refused where a version is chosen (``testbed up --slurm-prefix``) rather than guessed at.
KNOWN_RELEASES = tuple(
    SlurmVersion(major, minor)
    for major, minor in ((22, 5), (23, 2), (23, 11), (24, 5), (24, 11), (25, 5), (25, 11), (26, 5))
)


def is_known(version: SlurmVersion) -> bool:
    """Whether the release (its major.minor; any micro) is one of :data:`KNOWN_RELEASES`."""
    return SlurmVersion(version.major, version.minor) in KNOWN_RELEASES


#: ``--segment`` (topology/block keeps each segment inside one base block) exists from 24.05 (sbatch, CHANGELOG).
SEGMENTS_FROM = SlurmVersion(24, 5)
#: A required node list beside more than one segment: 25.05 refuses it ("requires nodes with segment are not
#: supported"); 25.11 added "limited support", a list that covers the whole job (checked on a 26.05 controller).
PINNED_SEGMENTS_FROM = SlurmVersion(25, 11)
#: A ``--segment`` larger than a base block: 24.05-25.05 refuse it ("segment > bblock_node_cnt is not supported");
#: 25.11 ("Allow --segment to be bigger than base block size", CHANGELOG) puts each segment inside the smallest
#: enabled aggregate of base blocks that holds it (``_get_block_level``; checked on a 26.05 controller).
WIDE_SEGMENTS_FROM = SlurmVersion(25, 11)


@dataclass(frozen=True)
class BlockRequestRules:
    """What a release accepts in a topology/block job's request (``eval_nodes_block.c`` of each release)."""

    version: SlurmVersion | None
    """None: the release is not known here; the rules then hold for every release from 24.05."""
    segments: bool
    """``--segment`` exists."""
    pinned_segments: bool
    """``--nodelist`` covering the whole job is accepted beside ``--segment`` when it splits the job."""
    wide_segments: bool = False
    """A segment may be larger than a base block (it then spans an aggregate of blocks)."""

    @property
    def release(self) -> str:
        return f"Slurm {self.version}" if self.version else "a Slurm release not known here"


def block_request_rules(version: SlurmVersion | None) -> BlockRequestRules:
    """The rules of ``version``; an unknown version gets what every release from 24.05 accepts (no pinned segments)."""
    if version is None:
        return BlockRequestRules(None, segments=True, pinned_segments=False)
    return BlockRequestRules(
        version,
        segments=version >= SEGMENTS_FROM,
        pinned_segments=version >= PINNED_SEGMENTS_FROM,
        wide_segments=version >= WIDE_SEGMENTS_FROM,
    )


#: ``sbatch --requeue=expedite`` (25.11): a job that fails on a bad node is requeued at once, first in line, with its
#: nodes kept from other work until its epilog has judged them; earlier releases know only ``--requeue``.
REQUEUE_EXPEDITE_FROM = SlurmVersion(25, 11)
