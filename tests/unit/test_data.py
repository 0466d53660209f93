"""HDF5 token data: prepare, inspect, bad files, sample order and DP sharding (real h5py files)."""

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from air_hpc.cli.main import main
from air_hpc.config.models import DataConfig
from air_hpc.data.blend import BlendedSamples, check_for_training
from air_hpc.errors import InputError
from air_hpc.exitcodes import ExitCode
from air_hpc.train import data

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    text = tmp_path / "a.txt"
    text.write_text("hello world\n" * 50)
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_text("\n".join(json.dumps({"text": f"doc {i} é"}) for i in range(3)) + "\n")
    out = tmp_path / "corpus.h5"
    data.prepare([text, jsonl], out, data.ByteTokenizer())
    return out


def test_prepare_writes_tokens_offsets_and_attributes(corpus: Path) -> None:
    with h5py.File(corpus, "r") as fh:
        tokens = fh["tokens"][:]
        offsets = fh["doc_offsets"][:]
        assert fh.attrs["tokenizer"] == "byte"
        assert fh.attrs["vocab_size"] == 257
        assert fh.attrs["eod_id"] == 256
    first = ("hello world\n" * 50).encode()
    docs = [first] + [f"doc {i} é".encode() for i in range(3)]
    expected = [b for doc in docs for b in [*doc, 256]]
    assert tokens.dtype == np.uint16
    assert tokens.tolist() == expected
    assert offsets.tolist() == np.cumsum([0] + [len(d) + 1 for d in docs]).tolist()
    info = data.inspect(corpus)
    assert (info.tokens, info.documents, info.contiguous) == (len(expected), 4, True)


def test_prepare_streams_a_file_larger_than_one_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data, "_BLOCK_BYTES", 64)
    src = tmp_path / "big.txt"
    words = " ".join(f"w{i}" for i in range(300))
    src.write_text(f"{words}\n" + "".join(f"line {i}\n" for i in range(100)) + words)
    out = tmp_path / "big.h5"
    data.prepare([src], out, data.ByteTokenizer())
    with h5py.File(out, "r") as fh:
        assert data.ByteTokenizer().decode(fh["tokens"][:-1].tolist()) == src.read_text()
        assert fh["doc_offsets"][:].tolist() == [0, len(src.read_bytes()) + 1]
    pieces = list(next(data.documents(src)))
    assert "".join(pieces) == src.read_text()
    assert all(p.endswith("\n") or len(p) >= 4 * 64 for p in pieces[:-1])


def test_token_dtype_is_the_narrowest_that_fits() -> None:
    assert data.token_dtype(256) == np.uint8
    assert data.token_dtype(257) == np.uint16
    assert data.token_dtype(65536) == np.uint16
    assert data.token_dtype(65537) == np.uint32


def test_missing_file_is_one_line_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such HDF5 token file"):
        data.inspect(tmp_path / "nope.h5")


def test_corrupt_file_is_an_input_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(range(256)) * 4)
    with pytest.raises(InputError, match="cannot read as HDF5") as info:
        data.inspect(bad)
    assert "\n" not in str(info.value)


def test_truncated_corpus_is_an_input_error(corpus: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.h5"
    cut.write_bytes(corpus.read_bytes()[:1500])
    with pytest.raises(InputError, match=str(cut)):
        data.inspect(cut)


def test_hdf5_without_our_datasets_is_rejected(tmp_path: Path) -> None:
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as fh:
        fh.create_dataset("x", data=[1, 2, 3])
    with pytest.raises(InputError, match="missing dataset"):
        data.inspect(other)


def test_seq_len_longer_than_the_data(corpus: Path) -> None:
    tokens = data.inspect(corpus).tokens
    with pytest.raises(InputError, match="shorter than one sample"):
        check_for_training(DataConfig(path=corpus), seq_len=tokens, vocab_size=512)
    assert check_for_training(DataConfig(path=corpus), seq_len=tokens - 1, vocab_size=512).sources[0].tokens == tokens


def test_vocab_smaller_than_the_tokenizer(corpus: Path) -> None:
    with pytest.raises(InputError, match=r"model\.vocab_size 256 is smaller"):
        check_for_training(DataConfig(path=corpus), seq_len=8, vocab_size=256)


def test_bad_jsonl_line_names_file_and_line(tmp_path: Path) -> None:
    src = tmp_path / "x.jsonl"
    src.write_text('{"text": "ok"}\n{"body": 1}\n')
    with pytest.raises(InputError, match=r"x\.jsonl:2: expected an object"):
        data.prepare([src], tmp_path / "x.h5", data.ByteTokenizer())
    assert not (tmp_path / "x.h5").exists()
    assert list(tmp_path.glob(".x.h5*")) == []


def test_missing_tokenizer_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not 'byte'"):
        data.load_tokenizer(str(tmp_path / "missing"))


def _samples(path: Path, seq_len: int, seed: int) -> BlendedSamples:
    return BlendedSamples(check_for_training(DataConfig(path=path), seq_len, 512), seed)


def _starts(samples: BlendedSamples, indices: np.ndarray) -> list[int]:
    return (samples.locate(indices)[1] * samples.plan.seq_len).tolist()


def test_samples_cover_every_sample_once_per_epoch_in_a_seeded_order(corpus: Path) -> None:
    samples = _samples(corpus, seq_len=16, seed=7)
    n = samples.plan.sources[0].samples
    epoch0 = _starts(samples, np.arange(n))
    epoch1 = _starts(samples, np.arange(n, 2 * n))
    assert sorted(epoch0) == list(range(0, n * 16, 16)) == sorted(epoch1)
    assert epoch0 != epoch1
    assert epoch0 == _starts(_samples(corpus, seq_len=16, seed=7), np.arange(n))
    assert epoch0 != _starts(_samples(corpus, seq_len=16, seed=8), np.arange(n))


def test_a_single_file_keeps_the_order_of_earlier_releases(corpus: Path) -> None:
    """Runs saved before blends existed resume on the same samples: data.path alone is permuted as it was."""
    samples = _samples(corpus, seq_len=16, seed=7)
    n = samples.plan.sources[0].samples
    legacy = [np.random.default_rng([7, epoch]).permutation(n) * 16 for epoch in (0, 1, 2)]
    assert _starts(samples, np.arange(3 * n)) == np.concatenate(legacy).tolist()


def test_batch_is_consecutive_tokens_and_matches_the_h5py_path(corpus: Path, tmp_path: Path) -> None:
    samples = _samples(corpus, seq_len=16, seed=1)
    batch = samples.batch(np.array([0, 5, 3]))
    with h5py.File(corpus, "r") as fh:
        tokens = fh["tokens"][:]
        chunked = tmp_path / "chunked.h5"
        with h5py.File(chunked, "w") as out:
            out.create_dataset("tokens", data=tokens, chunks=(64,), compression="gzip")
            out.create_dataset("doc_offsets", data=fh["doc_offsets"][:])
            out.attrs.update(dict(fh.attrs))
    starts = _starts(samples, np.array([0, 5, 3]))
    assert batch.shape == (3, 17)
    assert batch.tolist() == [tokens[s : s + 17].tolist() for s in starts]
    fallback = _samples(chunked, seq_len=16, seed=1)
    assert not data.inspect(chunked).contiguous
    assert fallback.batch(np.array([0, 5, 3])).tolist() == batch.tolist()


def test_dp_ranks_split_each_global_batch_without_overlap() -> None:
    dp, mbs, micro = 2, 3, 4
    seen = [data.micro_batch_indices(24, m, mbs, r, dp).tolist() for m in range(micro) for r in range(dp)]
    flat = [i for chunk in seen for i in chunk]
    assert sorted(flat) == list(range(24, 24 + dp * mbs * micro))


def test_cli_prepare_and_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "readme.h5"
    assert main(["data", "prepare", str(REPO / "README.md"), "-o", str(out)]) is None
    assert "tokens" in capsys.readouterr().out
    main(["data", "inspect", str(out), "--sample-tokens", "8"])
    text = capsys.readouterr().out
    assert "tokenizer:  byte (vocab 257, eod 256)" in text
    assert (REPO / "README.md").read_text()[:8] in text


def test_cli_inspect_of_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["data", "inspect", str(tmp_path / "none.h5")])
    assert exit_info.value.code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_cli_prepare_project_corpus_is_deterministic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sources = data.project_sources()
    assert sources[0] == REPO / "README.md" and REPO / "air_hpc/train/data.py" in sources
    first, second = tmp_path / "a.h5", tmp_path / "b.h5"
    main(["data", "prepare", "--project", "-o", str(first)])
    main(["data", "prepare", "--project", "-o", str(second)])
    with h5py.File(first, "r") as a, h5py.File(second, "r") as b:
        assert np.array_equal(a["tokens"][:], b["tokens"][:])
        assert a["doc_offsets"].shape[0] == len(sources) + 1


def test_cli_prepare_without_inputs_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["data", "prepare", "-o", str(tmp_path / "x.h5")])
    assert exit_info.value.code == ExitCode.USAGE
    assert "no INPUT files" in capsys.readouterr().err
