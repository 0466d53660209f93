"""A sweep's record: ``<run.root>/<NAME>.sweep/sweep.json`` beside its elements' run directories ``NAME-<i>``.

The elements are ordinary runs (each its own job.json, with the sweep's name, its index and its
settings under ``run.sweep``); this file only says which runs make up the sweep, how it was
submitted, and holds the array's batch script (``sweep.sbatch``). Read back as data, never trusted:
a malformed file is a :class:`~air_hpc.errors.UserError` naming it.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

from air_hpc.errors import UserError
from air_hpc.records.files import atomic_write

SUFFIX = ".sweep"
RECORD = "sweep.json"
SCRIPT = "sweep.sbatch"


@dataclass(frozen=True)
class SweepElement:
    index: int
    run_dir: Path
    overrides: tuple[tuple[str, str], ...]

    def describe(self) -> str:
        return " ".join(f"{key}={value}" for key, value in self.overrides)


@dataclass(frozen=True)
class SweepRecord:
    name: str
    root: Path
    executor: str
    elements: tuple[SweepElement, ...]
    max_parallel: int | None = None
    job_ids: tuple[str, ...] = field(default=())
    """The array job of each submission (slurm); the latest last."""

    @property
    def path(self) -> Path:
        return sweep_dir(self.root, self.name)

    def element(self, index: int) -> SweepElement:
        for element in self.elements:
            if element.index == index:
                return element
        raise UserError(
            f"sweep {self.name} has no element {index} (elements {self.elements[0].index}-{self.elements[-1].index})"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "root": str(self.root),
            "executor": self.executor,
            "max_parallel": self.max_parallel,
            "job_ids": list(self.job_ids),
            "elements": [
                {"index": e.index, "run_dir": str(e.run_dir), "overrides": dict(e.overrides)} for e in self.elements
            ],
        }


def sweep_dir(root: Path, name: str) -> Path:
    return root / f"{name}{SUFFIX}"


def write_sweep(record: SweepRecord) -> Path:
    record.path.mkdir(parents=True, exist_ok=True)
    path = record.path / RECORD
    atomic_write(path, json.dumps(record.to_json(), indent=2) + "\n")
    return path


def read_sweep(directory: Path) -> SweepRecord:
    """The record in a sweep directory; a missing or malformed one is a one-line error naming the file."""
    path = directory / RECORD
    try:
        data = json.loads(path.read_text())
        elements = tuple(
            SweepElement(
                int(e["index"]),
                Path(str(e["run_dir"])),
                tuple((str(k), str(v)) for k, v in dict(e["overrides"]).items()),
            )
            for e in data["elements"]
        )
        max_parallel = data.get("max_parallel")
        return SweepRecord(
            name=str(data["name"]),
            root=Path(str(data["root"])),
            executor=str(data["executor"]),
            elements=elements,
            max_parallel=None if max_parallel is None else int(max_parallel),
            job_ids=tuple(str(j) for j in data.get("job_ids", ())),
        )
    except FileNotFoundError:
        raise UserError(f"{path}: no sweep record; submit the sweep with `air-hpc sweep` first") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{path}: unreadable sweep record ({exc})") from None
