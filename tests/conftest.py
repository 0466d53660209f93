"""Fixtures shared by unit and integration tests."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real HDF5 token file from the README: enough samples for gpt-tiny, built once per session."""
    from air_hpc.train import data

    out = tmp_path_factory.mktemp("corpus") / "readme.h5"
    return data.prepare([REPO / "README.md"], out, data.ByteTokenizer()).path
