"""Fixtures shared by unit and integration tests."""

import signal
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Run as a background job of a script, the suite starts with SIGINT ignored, and so would every process
# it starts (a Ctrl-C to `air-hpc metrics --serve` would do nothing). The tests that need an ignored
# SIGINT ask for it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real HDF5 token file from the README: enough samples for gpt-tiny, built once per session."""
    from air_hpc.train import data

    out = tmp_path_factory.mktemp("corpus") / "readme.h5"
    return data.prepare([REPO / "README.md"], out, data.ByteTokenizer()).path
