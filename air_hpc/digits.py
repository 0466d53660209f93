"""Decimal numbers in text read from Slurm, the environment or disk: ASCII digits only.

``str.isdigit`` accepts superscripts and other scripts' digits (``"²"``, ``"١"``), and ``int``
and regex ``\\d`` accept the latter. Job ids, PIDs, ports, signal numbers and step directory names
are plain ASCII, so anything else is not a number here: one parser, instead of a check per caller.
"""

import re

#: one or more ASCII decimal digits (``\d`` would also match ``"١"``); for patterns that embed a number
DIGITS = "[0-9]+"
_NUMBER = re.compile(DIGITS)


def ascii_int(text: str) -> int | None:
    """``"12"`` and ``" 12 "`` -> 12; anything else (``""``, ``"-1"``, ``"1.5"``, ``"²"``, ``"١"``) -> None."""
    text = text.strip()
    return int(text) if _NUMBER.fullmatch(text) else None
