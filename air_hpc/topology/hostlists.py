"""Hostlist expressions through python-hostlist, with errors that name the file and line."""

from collections.abc import Iterable

import hostlist

from air_hpc.errors import InputError


def expand(expr: str, where: str) -> list[str]:
    """Expand ``n[1-3,7]``-style expressions, keeping order; duplicates and bad ranges are errors."""
    if not expr.strip():
        raise InputError(f"{where}: empty hostlist; expected names like n[1-4],gpu7")
    try:
        names: list[str] = hostlist.expand_hostlist(expr, allow_duplicates=True)
    except hostlist.BadHostlist as exc:
        raise InputError(f"{where}: bad hostlist {expr!r} ({exc}); expected names like n[1-4],gpu7") from None
    seen: set[str] = set()
    for name in names:
        if not name:
            raise InputError(f"{where}: bad hostlist {expr!r} (empty name); expected names like n[1-4],gpu7")
        if name in seen:
            raise InputError(f"{where}: hostlist {expr!r} names {name!r} twice")
        seen.add(name)
    return names


def compress(names: Iterable[str]) -> str:
    """The shortest sorted expression for ``names``, as ``scontrol show hostlistsorted`` would write it."""
    return str(hostlist.collect_hostlist(list(names)))


def natural_sorted(names: Iterable[str]) -> list[str]:
    """Names in hostlist order (numeric parts compared as numbers): Slurm's default node order."""
    return list(hostlist.expand_hostlist(compress(names)))
