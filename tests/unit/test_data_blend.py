"""Shards and weighted blends: the schedule, the samples, the checks and `data inspect` (real HDF5 files)."""

import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import yaml

from air_hpc.cli.main import main
from air_hpc.config import load_job
from air_hpc.config.models import DataConfig
from air_hpc.data.blend import BlendedSamples, check_for_training, plan
from air_hpc.data.schedule import BlendSchedule
from air_hpc.data.shards import FilePool, describe
from air_hpc.errors import InputError
from air_hpc.train.data import micro_batch_indices

REPO = Path(__file__).resolve().parents[2]
TESTBED_JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"
SEQ = 8


def write_shard(path: Path, tokens: np.ndarray, tokenizer: str = "byte", vocab: int = 257) -> Path:
    """An air-hpc HDF5 token file holding ``tokens`` as one document."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as fh:
        fh.create_dataset("tokens", data=tokens.astype(np.uint16))
        fh.create_dataset("doc_offsets", data=np.array([0, len(tokens)], dtype=np.uint64))
        fh.attrs.update(format=1, tokenizer=tokenizer, vocab_size=vocab, eod_id=vocab - 1)
    return path


def shards(root: Path, name: str, count: int, tokens_each: int, first_id: int) -> Path:
    """``count`` shards under root/name whose token ids are all ``first_id``, ``first_id + 1``, ... (one per shard)."""
    for i in range(count):
        write_shard(root / name / f"part-{i:03d}.h5", np.full(tokens_each, first_id + i))
    return root / name


@pytest.fixture()
def three(tmp_path: Path) -> DataConfig:
    """Web (4 shards), code (2) and math (1 file) with 70/20/10 weights; each shard's tokens say which it is."""
    web = shards(tmp_path, "web", 4, 8 * SEQ + 1, 10)
    code = shards(tmp_path, "code", 2, 5 * SEQ + 1, 50)
    math = write_shard(tmp_path / "math.h5", np.full(3 * SEQ + 1, 90))
    return DataConfig(
        blend=(
            {"path": web / "*.h5", "weight": 0.7},
            {"path": code, "weight": 0.2},
            {"path": math, "weight": 0.1},
        )
    )


def brute_force(weights: list[float], n: int) -> tuple[list[int], list[int]]:
    """The definition: the n first events (k + 0.5) * total / w_d, ordered by (time, source)."""
    w = np.asarray(weights)
    events = sorted(((k + 0.5) * (w.sum() / w[d]), d, k) for d in range(len(w)) if w[d] > 0 for k in range(n + 1))
    return [e[1] for e in events[:n]], [e[2] for e in events[:n]]


@pytest.mark.parametrize("weights", [[0.7, 0.2, 0.1], [1, 1, 1], [3, 0, 1], [1e-3, 1, 2, 7, 0.5], [5.0]])
def test_the_schedule_is_its_definition_computed_block_by_block(weights: list[float]) -> None:
    schedule = BlendSchedule(weights, block=97)  # blocks far smaller than the range: every boundary is crossed
    sources, samples = schedule.assign(np.arange(3000))
    expected_sources, expected_samples = brute_force(weights, 3000)
    assert sources.tolist() == expected_sources and samples.tolist() == expected_samples
    for n in (0, 1, 96, 97, 1000, 2999):
        assert schedule.counts_before(n).tolist() == np.bincount(sources[:n], minlength=len(weights)).tolist()
    share = np.asarray(weights) / sum(weights)
    running = np.cumsum(np.eye(len(weights))[sources], axis=0)
    assert np.abs(running - np.outer(np.arange(1, 3001), share)).max() < 1, "every prefix within one sample per source"


def test_the_schedule_far_into_a_run_needs_no_replay() -> None:
    """Block 10^9 / 16384 is computed from closed-form counts: the same answer as a fresh schedule's."""
    start = 10**12
    a = BlendSchedule([0.7, 0.2, 0.1]).assign(np.arange(start, start + 50))
    counts = BlendSchedule([0.7, 0.2, 0.1]).counts_before(start)
    assert np.abs(counts - start * np.array([0.7, 0.2, 0.1])).max() < 1
    assert a[1][a[0] == 0][0] == counts[0], "source 0's next sample is the count before"


@pytest.mark.parametrize("weights", [[-1, 2], [0, 0], [float("nan"), 1]])
def test_bad_weights_are_refused_by_the_schedule(weights: list[float]) -> None:
    with pytest.raises(ValueError):
        BlendSchedule(weights)


def test_a_blend_draws_by_weight_and_each_source_visits_every_sample_once_per_epoch(three: DataConfig) -> None:
    samples = BlendedSamples(check_for_training(three, SEQ, 512), seed=3)
    n = 1000
    sources, positions = samples.locate(np.arange(n))
    counts = np.bincount(sources, minlength=3)
    assert np.abs(counts - n * np.array([0.7, 0.2, 0.1])).max() < 1
    assert samples.source_counts(n) == {"data.blend.0.path": 700, "data.blend.1.path": 200, "data.blend.2.path": 100}
    web = positions[sources == 0]
    assert sorted(web[:32].tolist()) == list(range(32)) == sorted(web[32:64].tolist())
    assert web[:32].tolist() != web[32:64].tolist(), "each epoch reshuffled"
    batch = samples.batch(np.arange(n))
    assert batch.shape == (n, SEQ + 1)
    ids = batch[:, 0]
    assert ((ids >= 10) & (ids < 14)).sum() == 700 and ((ids >= 50) & (ids < 52)).sum() == 200
    assert (ids == 90).sum() == 100
    assert all(len(set(row.tolist())) == 1 for row in batch), "a sample never crosses shards"


def test_the_order_is_the_same_for_every_data_parallel_size_and_after_a_restart(three: DataConfig) -> None:
    """Global batches of 12 (micro-batch 2): dp 1, 2 and 3 read the same samples in the same global order,
    and a reader started afresh at step 5 (a resume) continues exactly where the first left off."""
    found = check_for_training(three, SEQ, 512)
    gbs, mbs = 12, 2

    def run(dp: int, first_step: int, steps: int) -> list[list[int]]:
        readers = [BlendedSamples(found, seed=9) for _ in range(dp)]
        rows: list[list[int]] = []
        for step in range(first_step, first_step + steps):
            consumed = step * gbs
            per_rank: list[list[Any]] = [[] for _ in range(dp)]
            for micro in range(gbs // (mbs * dp)):
                for r in range(dp):
                    indices = micro_batch_indices(consumed, micro, mbs, r, dp)
                    per_rank[r].append((indices, readers[r].batch(indices)))
            flat = [(int(i), row.tolist()) for r in per_rank for idx, b in r for i, row in zip(idx, b, strict=True)]
            rows.extend(row for _, row in sorted(flat))
        return rows

    whole = run(1, 0, 10)
    assert run(2, 0, 10) == whole == run(3, 0, 10)
    assert run(1, 0, 5) + run(2, 5, 5) == whole


def test_inspect_describes_a_blend_with_epochs_for_the_steps(
    three: DataConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = yaml.safe_load(TESTBED_JOB.read_text())
    job["data"] = {"blend": [{"path": str(s.path), "weight": s.weight} for s in three.sources()]}
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    main(["data", "inspect", "--job", str(job_file), "--set", "model.seq_len=8", "--steps", "10", "--json"])
    described = json.loads(capsys.readouterr().out)
    drawn = [s["drawn"] for s in described["sources"]]
    assert described["samples"] == 10 * load_job(job_file).train.global_batch_size == sum(drawn)
    assert [s["shards"] for s in described["sources"]] == [4, 2, 1]
    assert [s["samples"] for s in described["sources"]] == [32, 10, 3]
    assert [s["epochs"] for s in described["sources"]] == [d / n for d, n in zip(drawn, [32, 10, 3], strict=True)]
    assert described["tokenizer"] == "byte" and described["vocab_size"] == 257
    main(["data", "inspect", "--job", str(job_file), "--set", "model.seq_len=8", "--steps", "10"])
    table = capsys.readouterr().out
    assert "data.blend.0.path" in table and "epochs" in table and "tokenizer: byte (vocab 257)" in table


def shown(tmp_path: Path, data: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """``config show`` of the testbed job with this data section: exit code and stderr lines."""
    job = yaml.safe_load(TESTBED_JOB.read_text())
    job["data"] = data
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job, sort_keys=False))
    try:
        main(["config", "show", str(job_file)])
        code = 0
    except SystemExit as exit_info:
        code = int(exit_info.code or 0)
    return code, capsys.readouterr().err.splitlines()


def test_negative_weight_is_one_line_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_shard(tmp_path / "a.h5", np.arange(100))
    code, err = shown(tmp_path, {"blend": [{"path": str(a), "weight": 1}, {"path": str(a), "weight": -0.5}]}, capsys)
    assert code == 2 and len(err) == 1
    assert "data.blend.1.weight: Input should be greater than or equal to 0" in err[0]
    assert err[0].startswith(f"error: {tmp_path / 'job.yaml'}:"), err


def test_all_zero_weights_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_shard(tmp_path / "a.h5", np.arange(100))
    code, err = shown(tmp_path, {"blend": [{"path": str(a), "weight": 0}, {"path": str(a), "weight": 0.0}]}, capsys)
    assert code == 2 and len(err) == 1 and "every data.blend weight is 0" in err[0]


def test_path_and_blend_together_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_shard(tmp_path / "a.h5", np.arange(100))
    code, err = shown(tmp_path, {"path": str(a), "blend": [{"path": str(a), "weight": 1}]}, capsys)
    assert code == 2 and len(err) == 1 and "set exactly one of data.path and data.blend" in err[0]


def test_a_glob_matching_nothing_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_shard(tmp_path / "a.h5", np.arange(100))
    blend = [{"path": str(a), "weight": 1}, {"path": str(tmp_path / "code" / "*.h5"), "weight": 1}]
    code, err = shown(tmp_path, {"blend": blend}, capsys)
    assert (code, err) == (
        2,
        [f"error: data.blend.1.path: {tmp_path}/code/*.h5 matches no HDF5 (.h5, .hdf5) or Megatron (.bin/.idx) shard"],
    )


def test_a_source_with_no_tokens_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_shard(tmp_path / "a.h5", np.arange(100))
    empty = write_shard(tmp_path / "empty" / "e.h5", np.arange(0))
    code, err = shown(
        tmp_path, {"blend": [{"path": str(a), "weight": 1}, {"path": str(empty.parent), "weight": 1}]}, capsys
    )
    assert (code, err) == (2, [f"error: data.blend.1.path: {empty.parent} holds no tokens (1 shard(s))"])


@pytest.mark.parametrize(("tokenizer", "vocab"), [("hf-gpt2", 257), ("byte", 50257)])
def test_shards_of_different_tokenizers_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer: str, vocab: int
) -> None:
    a = write_shard(tmp_path / "web" / "a.h5", np.arange(100))
    b = write_shard(tmp_path / "web" / "b.h5", np.arange(100), tokenizer, vocab)
    code, err = shown(tmp_path, {"path": str(tmp_path / "web")}, capsys)
    assert code == 2 and len(err) == 1
    assert err[0] == (
        f"error: data.path: {b} was made with tokenizer {tokenizer} (vocab {vocab}), {a} with byte (vocab 257); "
        "every shard of a run needs the same tokenizer"
    )


def test_config_show_waits_for_a_single_file_not_built_yet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = shown(tmp_path, {"path": str(tmp_path / "corpus.h5")}, capsys)
    assert (code, err) == (0, [])
    with pytest.raises(InputError, match="no such HDF5 token file"):
        plan(DataConfig(path=tmp_path / "corpus.h5"), SEQ)


def test_blend_paths_are_relative_to_the_job_file(tmp_path: Path) -> None:
    write_shard(tmp_path / "data" / "a.h5", np.arange(100))
    job = yaml.safe_load(TESTBED_JOB.read_text())
    job["data"] = {"blend": [{"path": "data/*.h5", "weight": 2}, {"path": "data/a.h5", "weight": 1}]}
    (tmp_path / "jobs").mkdir()
    job_file = tmp_path / "jobs" / "job.yaml"
    job_file.write_text(yaml.safe_dump(job).replace("../../runs", str(tmp_path / "runs")))
    loaded = load_job(job_file)
    assert loaded.data.blend is not None
    assert [s.path for s in loaded.data.blend] == [tmp_path / "jobs" / "data" / "*.h5", tmp_path / "jobs" / "data/a.h5"]


def test_a_shard_truncated_or_removed_mid_run_is_an_error_naming_it(tmp_path: Path) -> None:
    root = shards(tmp_path, "web", 3, 8 * SEQ + 1, 10)
    found = check_for_training(DataConfig(path=root), SEQ, 512)
    samples = BlendedSamples(found, seed=1, max_open_files=1)
    samples.batch(np.arange(24))
    victim = root / "part-001.h5"
    offset = describe(victim).offset
    assert offset is not None
    with victim.open("r+b") as fh:
        fh.truncate(offset + 10)  # the tokens cut after five
    with pytest.raises(InputError, match=f"{victim}: (shard truncated during the run|short read)"):
        samples.batch(np.arange(24, 48))
    other = shards(tmp_path, "code", 3, 8 * SEQ + 1, 50)
    fresh = BlendedSamples(check_for_training(DataConfig(path=other), SEQ, 512), seed=1, max_open_files=1)
    gone = other / "part-002.h5"
    gone.unlink()
    with pytest.raises(InputError, match=f"{gone}: shard disappeared during the run"):
        fresh.batch(np.arange(24))


def test_the_pool_keeps_at_most_max_open_files(tmp_path: Path) -> None:
    root = shards(tmp_path, "web", 6, 2 * SEQ + 1, 10)
    infos = [describe(p) for p in sorted(root.iterdir())]
    pool = FilePool(max_open=2)
    for info in infos * 2:
        assert pool.read(info, np.array([0, SEQ]), SEQ + 1)[0, 0] == 10 + infos.index(info)
        assert pool.open_files <= 2
    assert pool.opened == 12, "six files, each evicted before its turn came back"
    pool.close()
    assert pool.open_files == 0


def test_token_ids_beyond_the_model_vocabulary_are_an_error_naming_the_source(tmp_path: Path) -> None:
    a = write_shard(tmp_path / "a.h5", np.full(100, 300), vocab=257)  # a file that lies about its vocabulary
    samples = BlendedSamples(check_for_training(DataConfig(path=a), SEQ, 512), seed=1, vocab_size=257)
    with pytest.raises(InputError, match=r"data.path: token id 300 is outside model.vocab_size 257"):
        samples.batch(np.arange(4))


def test_read_ahead_gives_the_same_batches_read_before_they_are_asked_for(three: DataConfig, tmp_path: Path) -> None:
    found = check_for_training(three, SEQ, 512)
    plain = BlendedSamples(found, seed=4)
    ahead = BlendedSamples(found, seed=4, read_ahead=True)
    step = [np.arange(k, k + 4) for k in range(40, 52, 4)]
    ahead.prefetch(step, done_before=40)
    expected = [plain.batch(ix).tolist() for ix in step]
    assert [ahead.batch(ix).tolist() for ix in step] == expected
    assert 1 in plain.schedule.assign(np.arange(40, 52))[0], "the code source is in these batches"
    for shard in (tmp_path / "code").iterdir():  # every shard of a source truncated after the read-ahead
        with shard.open("r+b") as fh:
            fh.truncate(100)
    assert [ahead.batch(ix).tolist() for ix in step] == expected, "what was read ahead is served from memory"
    fresh = BlendedSamples(found, seed=4, read_ahead=True)
    fresh.prefetch(step, done_before=40)
    with pytest.raises(InputError, match=f"{tmp_path / 'code'}/part-00[01].h5: shard truncated during the run"):
        for ix in step:
            fresh.batch(ix)
    fresh.prefetch([np.arange(60, 64)], done_before=52)
    assert all(key[0] >= 52 for key in fresh._pending), "batches of finished steps are forgotten"
    for samples in (plain, ahead, fresh):
        samples.close()


def test_submit_refuses_a_bad_blend_before_anything_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_shard(tmp_path / "a.h5", np.arange(100))
    job = yaml.safe_load((REPO / "configs" / "jobs" / "gpt-tiny-local.yaml").read_text())
    job["data"] = {"blend": [{"path": str(a), "weight": 1}, {"path": str(tmp_path / "none" / "*.h5"), "weight": 1}]}
    job["run"]["root"] = str(tmp_path / "runs")
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    with pytest.raises(SystemExit) as info:
        main(["submit", str(job_file), "--executor", "local"])
    err = capsys.readouterr().err.splitlines()
    assert info.value.code == 2 and err == [
        f"error: data.blend.1.path: {tmp_path}/none/*.h5 matches no HDF5 (.h5, .hdf5) or Megatron (.bin/.idx) shard"
    ]
    assert not (tmp_path / "runs").exists(), "no run directory, nothing started"
