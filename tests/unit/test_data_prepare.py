"""`data prepare` over many inputs: groups, shards, worker processes, progress (real processes, real HDF5)."""

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from air_hpc.cli.main import main
from air_hpc.errors import InputError
from air_hpc.train import data
from air_hpc.train.prepare import plan_groups, prepare_sharded


@pytest.fixture()
def inputs(tmp_path: Path) -> list[Path]:
    """Six inputs of a few KB each: text files and JSONL."""
    made = []
    for i in range(6):
        if i % 2:
            path = tmp_path / "in" / f"{i}.jsonl"
            path.parent.mkdir(exist_ok=True)
            path.write_text("\n".join(json.dumps({"text": f"doc {i}.{j} " * (20 + j)}) for j in range(30)) + "\n")
        else:
            path = tmp_path / "in" / f"{i}.txt"
            path.parent.mkdir(exist_ok=True)
            path.write_text(f"file {i}\n" * (300 + 50 * i))
        made.append(path)
    return made


def tokens_of(paths: list[Path]) -> list[int]:
    out: list[int] = []
    for path in paths:
        with h5py.File(path, "r") as fh:
            out.extend(fh["tokens"][:].tolist())
    return out


def test_groups_depend_on_the_inputs_only(inputs: list[Path]) -> None:
    sizes = [p.stat().st_size for p in inputs]
    groups = plan_groups(inputs, group_bytes=sizes[0] + sizes[1])
    assert groups[0].inputs == (inputs[0], inputs[1])
    assert [p for g in groups for p in g.inputs] == inputs
    assert all(sum(p.stat().st_size for p in g.inputs) >= sizes[0] + sizes[1] for g in groups[:-1])


def test_shards_are_the_same_for_any_number_of_workers_and_hold_the_single_file_tokens(
    inputs: list[Path], tmp_path: Path
) -> None:
    seen: list[tuple[int, int]] = []
    one = prepare_sharded(inputs, tmp_path / "one", "byte", shard_tokens=3000, workers=1, group_bytes=6000)
    two = prepare_sharded(
        inputs,
        tmp_path / "two",
        "byte",
        3000,
        workers=2,
        group_bytes=6000,
        on_progress=lambda d, t: seen.append((d, t)),
    )
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(i.path.name for i in one)
    assert len({n.split("-")[1] for n in names}) > 1 and len(names) > len({n.split("-")[1] for n in names})
    for name in names:
        with h5py.File(tmp_path / "one" / name, "r") as a, h5py.File(tmp_path / "two" / name, "r") as b:
            assert np.array_equal(a["tokens"][:], b["tokens"][:])
            assert np.array_equal(a["doc_offsets"][:], b["doc_offsets"][:])
    single = data.prepare(inputs, tmp_path / "single.h5", data.ByteTokenizer())
    assert tokens_of(sorted((tmp_path / "two").iterdir())) == tokens_of([single.path])
    assert sum(i.documents for i in two) == single.documents
    assert all(i.tokens < 3000 + 2000 for i in two), "a shard closes at the first document end past the size"
    total = sum(p.stat().st_size for p in inputs)
    assert seen[-1] == (total, total)


def test_a_directory_with_shards_already_is_refused(inputs: list[Path], tmp_path: Path) -> None:
    prepare_sharded(inputs[:1], tmp_path / "out", "byte", 10**6, workers=1)
    with pytest.raises(InputError, match="holds shards"):
        prepare_sharded(inputs[:1], tmp_path / "out", "byte", 10**6, workers=1)


def test_cli_prepare_sharded(inputs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "shards"
    main(["data", "prepare", *map(str, inputs), "-o", str(out), "--shard-tokens", "4000", "--workers", "2"])
    assert capsys.readouterr().out.startswith(f"{out}: ")
    main(["data", "inspect", str(out), "--json"])
    described = json.loads(capsys.readouterr().out)
    assert described["sources"][0]["shards"] == len(list(out.iterdir()))
    with pytest.raises(SystemExit) as info:
        main(["data", "prepare", str(tmp_path / "missing.txt"), "-o", str(tmp_path / "x"), "--shard-tokens", "9"])
    assert info.value.code == 2 and "missing.txt: no such input file" in capsys.readouterr().err
