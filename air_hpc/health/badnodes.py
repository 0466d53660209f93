"""The run's bad-node list (``bad_nodes.txt``): nodes found hung or unhealthy.

One node per line, with the reason after ``#``::

    n3  # hung: rank 5 made no progress in step 812 for 301 s (2026-12-02T13:40:07Z)

The batch script reads it with ``sed``/``paste`` before a requeue
(``scontrol update ExcNodeList=``) and ``air-hpc submit`` adds it to
``--exclude``; so the format stays this plain. Several ranks may append at
once: each line is one ``O_APPEND`` write, and readers de-duplicate. Deleting a line
(once the node is repaired) lets the run use that node again.
"""

import time
from collections.abc import Iterable
from pathlib import Path

from air_hpc.records.files import append_bytes
from air_hpc.slurm.hostlist import compress, natural_sorted


def read_bad_nodes(path: Path) -> tuple[str, ...]:
    """The listed nodes in hostlist order, each once; a missing file is an empty list."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return ()
    names = {line.split("#", 1)[0].strip() for line in lines} - {""}
    return tuple(natural_sorted(names))


def merge_bad_nodes(*lists: Iterable[str]) -> tuple[str, ...]:
    """The union of several lists, in hostlist order."""
    names = {name.strip() for names in lists for name in names} - {""}
    return tuple(natural_sorted(names))


def exclude_expression(nodes: Iterable[str]) -> str | None:
    """A hostlist expression for ``--exclude`` / ``ExcNodeList``, or None when there is nothing to exclude."""
    names = merge_bad_nodes(nodes)
    return compress(names) if names else None


def append_bad_nodes(path: Path, nodes: Iterable[str], reason: str, now_s: float | None = None) -> tuple[str, ...]:
    """Add the nodes not yet listed, each with ``reason``; returns the ones added."""
    listed = set(read_bad_nodes(path))
    new = [name for name in merge_bad_nodes(nodes) if name not in listed]
    if not new:
        return ()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now_s is None else now_s))
    text = "".join(f"{name}  # {' '.join(reason.split())} ({stamp})\n" for name in new)
    append_bytes(path, text.encode(), durable=True)
    return tuple(new)
