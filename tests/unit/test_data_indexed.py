"""Megatron's indexed corpora: read in place through megatron-core's reader, converted both ways bit for bit."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

from air_hpc.cli.main import main
from air_hpc.config.models import DataConfig
from air_hpc.data import hdf5
from air_hpc.data.blend import BlendedSamples, check_for_training
from air_hpc.data.convert import Vocabulary, to_hdf5, to_indexed
from air_hpc.data.shards import describe
from air_hpc.errors import InputError
from air_hpc.train import data

SEQ = 8


def megatron_corpus(prefix: Path, docs: list[list[int]], dtype: type = np.uint16) -> Path:
    """A corpus as Megatron's preprocess_data writes it: one document per item, EOD appended (here 256)."""
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for doc in docs:
        builder.add_document(torch.tensor([*doc, 256]), [len(doc) + 1])
    builder.finalize(f"{prefix}.idx")
    return prefix


@pytest.fixture()
def docs() -> list[list[int]]:
    rng = np.random.default_rng(5)
    return [rng.integers(0, 256, int(n)).tolist() for n in rng.integers(1, 60, 40)]


def test_an_indexed_corpus_is_read_in_place_like_its_tokens(tmp_path: Path, docs: list[list[int]]) -> None:
    prefix = megatron_corpus(tmp_path / "web", docs)
    flat = np.array([t for doc in docs for t in [*doc, 256]])
    info = describe(prefix)
    assert (info.kind, info.tokens, info.documents, info.dtype, info.tokenizer) == (
        "indexed",
        len(flat),
        len(docs),
        "uint16",
        None,
    )
    samples = BlendedSamples(check_for_training(DataConfig(path=Path(f"{prefix}.idx")), SEQ, 257), seed=2)
    _, positions = samples.locate(np.arange(10))
    batch = samples.batch(np.arange(10))
    assert batch.tolist() == [flat[p * SEQ : p * SEQ + SEQ + 1].tolist() for p in positions]
    reader = IndexedDataset(str(prefix))
    assert reader.get(3).tolist() == [*docs[3], 256], "megatron-core reads the same corpus"


def test_hdf5_to_indexed_and_back_is_bit_for_bit(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    src.write_text("hello world\n" * 40)
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_text("\n".join(json.dumps({"text": f"doc {i} é"}) for i in range(5)) + "\n")
    h5 = data.prepare([src, jsonl], tmp_path / "c.h5", data.ByteTokenizer()).path
    prefix = to_indexed(h5, tmp_path / "mega" / "c", block_tokens=7)  # documents split in sequences of 7
    original = hdf5.inspect(h5)
    reader = IndexedDataset(str(prefix))
    import h5py

    with h5py.File(h5, "r") as fh:
        tokens, offsets = fh["tokens"][:], fh["doc_offsets"][:]
    assert np.frombuffer(Path(f"{prefix}.bin").read_bytes(), dtype=np.uint16).tolist() == tokens.tolist()
    assert len(reader.document_indices) - 1 == original.documents == len(offsets) - 1
    assert json.loads(Path(f"{prefix}.json").read_text()) == {"tokenizer": "byte", "vocab_size": 257, "eod_id": 256}
    back = to_hdf5(prefix, tmp_path / "back.h5", None, block_tokens=5)
    with h5py.File(back, "r") as fh:
        assert fh["tokens"][:].tolist() == tokens.tolist() and fh["tokens"].dtype == tokens.dtype
        assert fh["doc_offsets"][:].tolist() == offsets.tolist()
        assert dict(fh.attrs) == {"format": 1, "tokenizer": "byte", "vocab_size": 257, "eod_id": 256}


def test_indexed_to_hdf5_to_indexed_keeps_the_bin_bytes(tmp_path: Path, docs: list[list[int]]) -> None:
    prefix = megatron_corpus(tmp_path / "m", docs)
    code = main(
        [
            "data",
            "convert",
            f"{prefix}.bin",
            "-o",
            str(tmp_path / "m.h5"),
            "--tokenizer-name",
            "byte",
            "--vocab-size",
            "257",
            "--eod-id",
            "256",
        ]
    )
    assert code is None
    assert hdf5.inspect(tmp_path / "m.h5").documents == len(docs)
    main(["data", "convert", str(tmp_path / "m.h5"), "-o", str(tmp_path / "again.idx")])
    assert Path(f"{tmp_path}/again.bin").read_bytes() == Path(f"{prefix}.bin").read_bytes()
    assert Path(f"{tmp_path}/again.idx").read_bytes() == Path(f"{prefix}.idx").read_bytes()


def test_an_indexed_corpus_without_its_tokenizer_needs_it_given(tmp_path: Path, docs: list[list[int]]) -> None:
    prefix = megatron_corpus(tmp_path / "m", docs)
    with pytest.raises(InputError, match=r"m\.idx: no m\.json says which tokenizer made it"):
        to_hdf5(prefix, tmp_path / "m.h5", None)
    with pytest.raises(InputError, match="outside the vocabulary of 200"):
        to_hdf5(prefix, tmp_path / "m.h5", Vocabulary("small", 200, 199))
    assert not (tmp_path / "m.h5").exists()


def test_a_blend_of_hdf5_and_indexed_shards(tmp_path: Path, docs: list[list[int]]) -> None:
    (tmp_path / "mixed").mkdir()
    megatron_corpus(tmp_path / "mixed" / "m", docs)
    h5 = data.prepare([Path(__file__)], tmp_path / "mixed" / "h.h5", data.ByteTokenizer()).path
    found = check_for_training(DataConfig(blend=({"path": tmp_path / "mixed", "weight": 1},)), SEQ, 257)
    assert sorted(s.kind for s in found.sources[0].shards) == ["hdf5", "indexed"]
    assert found.tokenizer == "byte", "the indexed shard says nothing; the HDF5 shard names the tokenizer"
    assert BlendedSamples(found, seed=1).batch(np.arange(50)).max() <= 256
    assert h5.exists()


def test_a_broken_index_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.idx").write_bytes(b"not an index at all")
    (tmp_path / "bad.bin").write_bytes(b"")
    with pytest.raises(InputError, match=r"bad\.idx: not a Megatron indexed dataset"):
        describe(tmp_path / "bad")


def test_a_directory_of_shards_converts_shard_by_shard(tmp_path: Path, docs: list[list[int]]) -> None:
    (tmp_path / "mega").mkdir()
    for i in range(3):
        megatron_corpus(tmp_path / "mega" / f"part-{i}", docs[i::3])
    argv = ["data", "convert", str(tmp_path / "mega"), "-o", str(tmp_path / "h5")]
    main([*argv, "--tokenizer-name", "byte", "--vocab-size", "257", "--eod-id", "256"])
    assert sorted(p.name for p in (tmp_path / "h5").iterdir()) == ["part-0.h5", "part-1.h5", "part-2.h5"]
    main(["data", "convert", str(tmp_path / "h5" / "*.h5"), "-o", str(tmp_path / "again")])
    for i in range(3):
        again = Path(f"{tmp_path}/again/part-{i}.bin").read_bytes()
        assert again == Path(f"{tmp_path}/mega/part-{i}.bin").read_bytes()
