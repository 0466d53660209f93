"""Slurm's hostlist syntax (``n[1-3,7],gpu01``): the one place in air-hpc that uses python-hostlist.

Expansion goes through python-hostlist after checking what Slurm would refuse. Compression is our
own: python-hostlist compresses on any numeric field (``R01-IBSPINE,R02-IBSPINE`` ->
``R[01-02]-IBSPINE``), but Slurm rejects a range followed by a suffix (``Invalid hostlist``), so
compression here only ranges the trailing number of a name, as ``scontrol show hostlistsorted`` does.
Pure: no Slurm daemon or command is involved.
"""

import re
from collections.abc import Iterable

import hostlist

from air_hpc.digits import DIGITS
from air_hpc.errors import InputError

#: what a hostlist expression may contain: printable ASCII without blanks (Slurm node names are plain ASCII)
_EXPRESSION = re.compile(r"[!-~]+")
_RANGE = re.compile(rf"({DIGITS})-({DIGITS})")
#: the widest single range we expand; more is a typo, and expanding it would exhaust memory first
MAX_RANGE = 1_000_000


def expand(expr: str, where: str) -> list[str]:
    """Expand ``n[1-3,7]``-style expressions, keeping order; duplicates and bad ranges are errors."""
    if not expr.strip():
        raise InputError(f"{where}: empty hostlist; expected names like n[1-4],gpu7")
    if not _EXPRESSION.fullmatch(expr):
        raise InputError(
            f"{where}: bad hostlist {expr!r} (blank, control or non-ASCII character); expected names like n[1-4],gpu7"
        )
    for first, last in _RANGE.findall(expr):
        if len(first) > 9 or len(last) > 9 or int(last) - int(first) > MAX_RANGE:
            raise InputError(f"{where}: hostlist {expr!r} has a range wider than {MAX_RANGE} names")
    try:
        names: list[str] = hostlist.expand_hostlist(expr, allow_duplicates=True)
    except hostlist.BadHostlist as exc:
        raise InputError(f"{where}: bad hostlist {expr!r} ({exc}); expected names like n[1-4],gpu7") from None
    except RecursionError:
        raise InputError(f"{where}: bad hostlist {expr!r} (brackets nested or unbalanced)") from None
    if not names:
        raise InputError(f"{where}: hostlist {expr!r} names no host; expected names like n[1-4],gpu7")
    seen: set[str] = set()
    for name in names:
        if not name:
            raise InputError(f"{where}: bad hostlist {expr!r} (empty name); expected names like n[1-4],gpu7")
        if name in seen:
            raise InputError(f"{where}: hostlist {expr!r} names {name!r} twice")
        seen.add(name)
    return names


def _key(name: str) -> tuple[str, int, int, str]:
    prefix = name.rstrip("0123456789")
    digits = name[len(prefix) :]
    if not digits:
        return (name, -1, 0, "")
    return (prefix, int(digits), len(digits), digits)


def natural_sorted(names: Iterable[str]) -> list[str]:
    """Names by prefix, then trailing number as a number (n2 before n10): Slurm's usual node order."""
    return sorted(set(names), key=_key)


def compress(names: Iterable[str]) -> str:
    """The sorted, shortest expression ranging only trailing numbers (``n[1-3,7],gpu[01-02]``)."""
    pieces: list[tuple[tuple[str, int, int, str], str]] = []
    prefix_key: tuple[str, int, int, str] | None = None
    runs: list[list[str]] = []  # [first digits, last digits]
    last_value = -2

    def flush() -> None:
        if prefix_key is None:
            return
        texts = [first if first == last else f"{first}-{last}" for first, last in runs]
        body = texts[0] if len(texts) == 1 and "-" not in texts[0] else f"[{','.join(texts)}]"
        pieces.append((prefix_key, prefix_key[0] + body))

    for key in sorted({_key(name) for name in names}):
        prefix, value, _, digits = key
        if value < 0:
            pieces.append((key, prefix))
            continue
        if prefix_key is None or prefix != prefix_key[0]:
            flush()
            prefix_key, runs, last_value = key, [], -2
        if runs and value == last_value + 1 and _same_padding(runs[-1][1], digits):
            runs[-1][1] = digits
        else:
            runs.append([digits, digits])
        last_value = value
    flush()
    return ",".join(text for _, text in sorted(pieces))


def _same_padding(last: str, digits: str) -> bool:
    """Whether ``digits`` may continue a range ending in ``last`` ("07-08" + "09", "9" + "10", not "9" + "010")."""
    return len(digits) == len(last) or not (_padded(last) or _padded(digits))


def _padded(digits: str) -> bool:
    return len(digits) > 1 and digits[0] == "0"
