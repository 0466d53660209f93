"""A weighted blend of sharded sources trains for real (gpt-tiny, 4 CPU ranks, Megatron-core), resumes bit for
bit after a preemption, and resumes onto another data-parallel size reading the same samples."""

import itertools
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from air_hpc.config.load import load_job
from air_hpc.exitcodes import ExitCode
from air_hpc.records.metrics import read_metrics
from air_hpc.records.rundir import RunDir
from air_hpc.resilience.store import LATEST, step_name
from air_hpc.train import data
from tests.integration.local_run import submit_local

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
STEPS = 6


@pytest.fixture(scope="module")
def blend(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The project's sources as three sources: 4 shards of Python, 2 of the README halves' text, one small file."""
    root = tmp_path_factory.mktemp("blend")
    sources = data.project_sources()
    python = [p for p in sources if p.suffix == ".py"]
    for i in range(4):
        data.prepare(python[i::4], root / "code" / f"part-{i}.h5", data.ByteTokenizer())
    readme = sources[0].read_text()
    halves = [readme[: len(readme) // 2], readme[len(readme) // 2 :]]
    for i, half in enumerate(halves):
        text = root / f"readme-{i}.txt"
        text.write_text(half)
        data.prepare([text], root / "docs" / f"part-{i}.h5", data.ByteTokenizer())
    data.prepare([REPO / "air_hpc" / "errors.py"], root / "small.h5", data.ByteTokenizer())
    return [
        f"data.blend=[{{path: {root}/code/*.h5, weight: 0.6}}, {{path: {root}/docs, weight: 0.3}}, "
        f"{{path: {root}/small.h5, weight: 0.1}}]"
    ]


def submit(root: Path, blend: list[str], name: str, *overrides: str) -> tuple[RunDir, Any]:
    job = load_job(
        REPO / "configs/jobs/gpt-tiny-local.yaml",
        [
            f"run.name={name}",
            f"run.root={root}",
            f"train.steps={STEPS}",
            "checkpoint.interval_steps=4",
            "health.preflight=false",
            *blend,
            *overrides,
        ],
    )
    return submit_local(job, timeout_min=5)


def losses(run_dir: RunDir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir.metrics)}


@pytest.fixture(scope="module")
def reference(blend: list[str], tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    run_dir, handle = submit(tmp_path_factory.mktemp("reference"), blend, "reference")
    assert [r.exit_code for r in handle.results()] == [ExitCode.OK] * 4
    return run_dir


def test_a_blend_learns_and_logs_its_sources(reference: RunDir) -> None:
    got = losses(reference)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert got[STEPS] < got[1] - 0.3, got
    log = reference.rank_log(0).read_text()
    assert "data starting with data.blend.0.path 0 samples, data.blend.1.path 0 samples, data.blend.2.path 0" in log
    total = STEPS * 8  # gpt-tiny-local: global batch 8
    after = next(line for line in log.splitlines() if f"data after step {STEPS}:" in line)
    drawn = [int(part.split()[1]) for part in after.split(f"after step {STEPS}: ")[1].split(", ")]
    assert sum(drawn) == total and abs(drawn[0] - 0.6 * total) < 1 and abs(drawn[2] - 0.1 * total) < 1


def test_a_preempted_blend_resumes_bit_for_bit(reference: RunDir, blend: list[str], tmp_path: Path) -> None:
    run_dir, handle = submit(tmp_path, blend, "preempted")
    deadline = time.monotonic() + 120
    while len(read_metrics(run_dir.metrics)) < 2:
        assert time.monotonic() < deadline, "the run never reached step 2"
        time.sleep(0.1)
    for task in psutil.Process(int(handle.job_id)).children():
        task.send_signal(signal.SIGUSR2)
    assert [r.exit_code for r in handle.results()] == [ExitCode.OK] * 4
    assert any(r.get("resumed_from") for r in read_metrics(run_dir.metrics)), "it was stopped and resumed"
    assert losses(run_dir) == losses(reference)


def test_a_blend_resumed_on_another_data_parallel_size_reads_the_same_samples(
    reference: RunDir, blend: list[str], tmp_path: Path
) -> None:
    """The reference's step-4 checkpoint (TP2xPP2, dp 1) resumed as TP2 x dp 2: step 5's loss is the forward
    pass of the same weights on the same global batch, so it matches to float tolerance (one other sample in
    a batch of 8 would move it by far more), and step 6 after a resharded update too."""
    steps = tmp_path / "regrown" / "checkpoints"
    shutil.copytree(reference.checkpoints / step_name(4), steps / step_name(4))
    (steps / LATEST).write_text(step_name(4) + "\n")
    run_dir, handle = submit(tmp_path, blend, "regrown", "parallel.pp=1")
    assert [r.exit_code for r in handle.results()] == [ExitCode.OK] * 4
    got, want = losses(run_dir), losses(reference)
    assert sorted(got) == [5, 6]
    for step in (5, 6):
        assert got[step] == pytest.approx(want[step], rel=1e-4), (step, got, want)
    log = run_dir.rank_log(0).read_text()
    assert "data starting with data.blend.0.path 19 samples, data.blend.1.path 10 samples, data.blend.2.path 3" in log


def test_a_megatron_corpus_trains_like_its_hdf5_conversion_bit_for_bit(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The project's text tokenized once, written by megatron-core's own IndexedDatasetBuilder (one
    document per file, EOD last, as its preprocess_data writes them), read in place; its conversion by
    `air-hpc data convert` holds the same tokens, and the two train to the same losses bit for bit."""
    import h5py
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from air_hpc.cli.main import main

    corpus = data.prepare(data.project_sources(), tmp_path / "corpus.h5", data.ByteTokenizer()).path
    with h5py.File(corpus, "r") as fh:
        tokens, offsets = fh["tokens"][:], fh["doc_offsets"][:]
    prefix = tmp_path / "megatron" / "corpus"
    prefix.parent.mkdir()
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for start, end in itertools.pairwise(offsets):
        builder.add_document(torch.from_numpy(tokens[start:end].astype(np.int64)), [int(end - start)])
    builder.finalize(f"{prefix}.idx")
    converted = tmp_path / "converted.h5"
    argv = ["data", "convert", f"{prefix}.idx", "-o", str(converted), "--tokenizer-name", "byte"]
    main([*argv, "--vocab-size", "257", "--eod-id", "256"])
    with h5py.File(converted, "r") as fh:
        assert fh["tokens"][:].tobytes() == Path(f"{prefix}.bin").read_bytes() == tokens.tobytes()
        assert np.array_equal(fh["doc_offsets"][:], offsets)
    root = tmp_path_factory.mktemp("indexed")
    indexed_run, handle = submit(root, [f"data.path={prefix}"], "indexed", "train.steps=4")
    assert [r.exit_code for r in handle.results()] == [ExitCode.OK] * 4
    hdf5_run, handle = submit(root, [f"data.path={converted}"], "converted", "train.steps=4")
    assert [r.exit_code for r in handle.results()] == [ExitCode.OK] * 4
    assert sorted(losses(indexed_run)) == [1, 2, 3, 4]
    assert losses(indexed_run) == losses(hdf5_run)
