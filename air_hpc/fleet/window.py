"""``--since`` / ``--until``: a time, an epoch, ``now``, or a span ago (``90m``, ``36h``, ``7d``, ``2w``). Pure."""

import datetime
import re

from air_hpc.errors import UserError
from air_hpc.fleet.jobs import Window

#: A span back from now: ``15m``, ``36h``, ``7d``, ``2w`` (``s`` seconds too).
_AGO = re.compile(r"(?:now-)?([0-9]+)\s*([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: Default window: the last day.
DEFAULT_SINCE = "1d"


def parse_time(text: str, option: str, now_s: float) -> float:
    """Epoch seconds of ``text``: ``now``, ``7d`` (ago), an ISO date or local date-time, or epoch seconds."""
    value = text.strip()
    if value == "now":
        return now_s
    ago = _AGO.fullmatch(value)
    if ago:
        return now_s - int(ago[1]) * _UNIT_S[ago[2]]
    if value.isascii() and value.isdigit() and len(value) >= 9:
        return float(value)
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise UserError(
            f"{option} {text!r}: expected a time such as 2026-12-01, 2026-12-01T08:00, now, "
            "a span ago such as 90m, 36h, 7d or 2w, or epoch seconds"
        ) from None
    return moment.timestamp()


def parse_window(since: str | None, until: str | None, now_s: float) -> Window:
    """The report's window; ``--since`` must come before ``--until``."""
    since_s = parse_time(since or DEFAULT_SINCE, "--since", now_s)
    until_s = parse_time(until or "now", "--until", now_s)
    if since_s >= until_s:
        raise UserError(
            f"--since {since or DEFAULT_SINCE!r} is not before --until {until or 'now'!r}: the window is empty"
        )
    return Window(since_s, until_s)
