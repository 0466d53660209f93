"""Fixtures shared by unit and integration tests."""

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: ``run_main(args)`` -> (exit code, stdout, stderr) of ``air-hpc ARGS`` run in this process.
RunMain = Callable[[list[str]], tuple[int, str, str]]

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


@pytest.fixture
def run_main(capsys: pytest.CaptureFixture[str]) -> RunMain:
    """``air-hpc ARGS`` in this process, exiting as the console script does (a command that returns exits 0)."""
    from air_hpc.cli.main import main

    def run(args: list[str]) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as info:
            main(args)
            raise SystemExit(0)
        out, err = capsys.readouterr()
        return int(info.value.code or 0), out, err

    return run
