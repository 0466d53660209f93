"""Hostlist expressions: expansion through python-hostlist, compression that Slurm can read back.

python-hostlist compresses on any numeric field (``R01-IBSPINE,R02-IBSPINE`` ->
``R[01-02]-IBSPINE``), but Slurm rejects a range followed by a suffix
(``Invalid hostlist``), so compression here only ranges the trailing number of a
name, as ``scontrol show hostlistsorted`` does.
"""

import re
from collections.abc import Iterable

import hostlist

from air_hpc.errors import InputError

_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")


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


def _key(name: str) -> tuple[str, int, int, str]:
    match = _TRAILING_NUMBER.match(name)
    if match is None:
        return (name, -1, 0, "")
    digits = match.group(2)
    return (match.group(1), int(digits), len(digits), digits)


def natural_sorted(names: Iterable[str]) -> list[str]:
    """Names by prefix, then trailing number as a number (n2 before n10): Slurm's usual node order."""
    return sorted(set(names), key=_key)


def compress(names: Iterable[str]) -> str:
    """The sorted, shortest expression ranging only trailing numbers (``n[1-3,7],gpu[01-02]``)."""
    plain: list[tuple[tuple[str, int, int, str], str]] = []
    by_prefix: dict[str, tuple[tuple[str, int, int, str], list[str]]] = {}
    for name in natural_sorted(names):
        key = _key(name)
        prefix, value, _, digits = key
        if value < 0:
            plain.append((key, name))
            continue
        runs = by_prefix.setdefault(prefix, (key, []))[1]
        if runs and _extends(runs[-1], digits):
            runs[-1] = f"{runs[-1].split('-')[0]}-{digits}"
        else:
            runs.append(digits)
    pieces = [
        (key, f"{prefix}{runs[0]}" if len(runs) == 1 and "-" not in runs[0] else f"{prefix}[{','.join(runs)}]")
        for prefix, (key, runs) in by_prefix.items()
    ]
    return ",".join(text for _, text in sorted([*plain, *pieces]))


def _extends(run: str, digits: str) -> bool:
    """Whether ``digits`` continues the range ``run`` ("7" or "07-09") without changing its zero padding."""
    last = run.split("-")[-1]
    if int(digits) != int(last) + 1:
        return False
    padded = last.startswith("0") and len(last) > 1
    return len(digits) == len(last) or (not padded and not (digits.startswith("0") and len(digits) > 1))
