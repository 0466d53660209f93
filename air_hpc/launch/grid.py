"""A sweep's elements from ``--grid`` and ``--random``: each element is the ``KEY=VALUE`` settings it adds. Pure.

``--grid KEY=V1,V2`` multiplies the elements by its values (a cartesian product, the first grid
key varying slowest); ``--random KEY=DIST`` with ``--count N`` draws N values per grid point from a
seeded generator, so the same command line gives the same sweep. Distributions:

==================  ==========================================================
``uniform:LO:HI``   a float in [LO, HI)
``loguniform:LO:HI``  a float whose logarithm is uniform in [log LO, log HI) (learning rates)
``int:LO:HI``       a whole number in [LO, HI], both ends included (seeds)
``choice:A|B|C``    one of the listed values
==================  ==========================================================
"""

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from air_hpc.errors import ConfigError


@dataclass(frozen=True)
class GridAxis:
    key: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class RandomAxis:
    key: str
    kind: str
    """uniform, loguniform, int or choice."""
    low: float = 0.0
    high: float = 0.0
    choices: tuple[str, ...] = ()

    def draw(self, rng: random.Random) -> str:
        if self.kind == "choice":
            return rng.choice(self.choices)
        if self.kind == "int":
            return str(rng.randint(int(self.low), int(self.high)))
        if self.kind == "loguniform":
            return format(math.exp(rng.uniform(math.log(self.low), math.log(self.high))), ".6g")
        return format(rng.uniform(self.low, self.high), ".6g")


def _key_value(item: str, option: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key or not value or any(not part for part in key.split(".")):
        raise ConfigError(f"{option} {item!r}: expected KEY=VALUES with a dotted key, e.g. train.lr=1e-3,3e-3")
    return key, value


def parse_grid(items: Sequence[str]) -> tuple[GridAxis, ...]:
    """``KEY=V1,V2,...`` each; a key given twice, or an empty value, is refused naming it."""
    axes: list[GridAxis] = []
    for item in items:
        key, text = _key_value(item, "--grid")
        values = tuple(v.strip() for v in text.split(","))
        if any(not v for v in values):
            raise ConfigError(f"--grid {item!r}: an empty value; separate values with single commas")
        if len(set(values)) != len(values):
            raise ConfigError(f"--grid {item!r}: a value is listed twice (two elements would be the same run)")
        axes.append(GridAxis(key, values))
    _check_unique([a.key for a in axes])
    return tuple(axes)


def _bounds(item: str, rest: list[str], kind: str) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in rest)
    except ValueError:
        raise ConfigError(f"--random {item!r}: {kind} takes two numbers, {kind}:LO:HI") from None
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        raise ConfigError(f"--random {item!r}: LO must be a number not above HI")
    if kind == "loguniform" and low <= 0:
        raise ConfigError(f"--random {item!r}: loguniform needs LO > 0")
    if kind == "int" and (low != int(low) or high != int(high)):
        raise ConfigError(f"--random {item!r}: int takes whole numbers")
    return low, high


def parse_random(items: Sequence[str]) -> tuple[RandomAxis, ...]:
    """``KEY=DIST`` each (see the module's table)."""
    axes: list[RandomAxis] = []
    for item in items:
        key, text = _key_value(item, "--random")
        kind, _, rest = text.partition(":")
        if kind == "choice":
            choices = tuple(c.strip() for c in rest.split("|"))
            if not rest or any(not c for c in choices):
                raise ConfigError(f"--random {item!r}: choice takes values separated by '|', choice:A|B|C")
            axes.append(RandomAxis(key, kind, choices=choices))
        elif kind in ("uniform", "loguniform", "int"):
            low, high = _bounds(item, rest.split(":"), kind)
            axes.append(RandomAxis(key, kind, low, high))
        else:
            raise ConfigError(
                f"--random {item!r}: unknown distribution {kind!r}; use uniform:LO:HI, loguniform:LO:HI, "
                "int:LO:HI or choice:A|B|C"
            )
    _check_unique([a.key for a in axes])
    return tuple(axes)


def _check_unique(keys: Sequence[str]) -> None:
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ConfigError(f"{twice[0]}: swept twice; give each key once")


def expand(
    grid: Sequence[GridAxis], draws: Sequence[RandomAxis], count: int | None, seed: int
) -> list[tuple[tuple[str, str], ...]]:
    """Every element's ``(key, value)`` settings, in index order."""
    both = {a.key for a in grid} & {a.key for a in draws}
    if both:
        raise ConfigError(f"{sorted(both)[0]}: both in --grid and --random; sweep a key one way")
    if draws and count is None:
        raise ConfigError("--random needs --count N: how many draws (per grid point)")
    if count is not None and not draws:
        raise ConfigError("--count goes with --random: a grid's size is the product of its values")
    if count is not None and count < 1:
        raise ConfigError(f"--count {count}: at least 1")
    if not grid and not draws:
        raise ConfigError("a sweep needs --grid KEY=V1,V2 or --random KEY=DIST --count N")
    rng = random.Random(seed)
    elements = []
    for point in itertools.product(*(a.values for a in grid)):
        fixed = tuple(zip((a.key for a in grid), point, strict=True))
        for _ in range(count or 1):
            elements.append(fixed + tuple((a.key, a.draw(rng)) for a in draws))
    return elements
