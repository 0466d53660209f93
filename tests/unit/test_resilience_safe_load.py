"""Checkpoints are loaded without unpickling untrusted objects; RNG state round-trips as data."""

import inspect
import io
import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from air_hpc.backend import megatron_compat
from air_hpc.errors import CheckpointError
from air_hpc.resilience import safe_load, state


class Payload:
    """What an attacker would plant: unpickling it calls os.system."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return (os.system, ("echo pwned",))


def torch_dist_metadata() -> bytes:
    """A real ``.metadata`` as torch.distributed.checkpoint writes it (one tensor, one byte item)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    tensor = TensorStorageMetadata(
        properties=TensorProperties(dtype=torch.float32),
        size=torch.Size([4, 2]),
        chunks=[ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([4, 2]))],
    )
    metadata = Metadata(
        state_dict_metadata={"w": tensor, "obj": BytesStorageMetadata()},
        storage_data={MetadataIndex("obj", None, 0): _StorageInfo("__0_0.distcp", 0, 0)},
    )
    return pickle.dumps(metadata)


def write_checkpoint(directory: Path, byte_item: bytes) -> None:
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex

    metadata = pickle.loads(torch_dist_metadata())
    metadata.storage_data = {MetadataIndex("obj", None, 0): _StorageInfo("__0_0.distcp", 3, len(byte_item))}
    (directory / ".metadata").write_bytes(pickle.dumps(metadata))
    (directory / "__0_0.distcp").write_bytes(b"abc" + byte_item)
    torch.save({"optimizer": {"param_groups": [{"lr": 0.1}]}, "step": torch.tensor(3.0)}, directory / "common.pt")


def saved(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_real_metadata_and_plain_objects_pass(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, saved({"extra_state": None, "t": torch.zeros(2)}))
    safe_load.check_checkpoint(tmp_path)
    assert safe_load.load_metadata(tmp_path / ".metadata").state_dict_metadata["w"].size == torch.Size([4, 2])


def test_malicious_metadata_is_refused_naming_the_file(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, saved(None))
    (tmp_path / ".metadata").write_bytes(pickle.dumps({"state_dict_metadata": Payload()}))
    with pytest.raises(CheckpointError, match=r"\.metadata: refusing to load: global '(posix|os)\.system'"):
        safe_load.check_checkpoint(tmp_path)


def test_malicious_common_file_is_refused(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, saved(None))
    (tmp_path / "common.pt").write_bytes(saved({"x": Payload()}))
    with pytest.raises(CheckpointError, match=r"common\.pt: refusing to load"):
        safe_load.check_checkpoint(tmp_path)


def test_malicious_byte_item_is_refused_naming_file_and_key(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, saved(Payload()))
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp \[obj\]: refusing to load"):
        safe_load.check_checkpoint(tmp_path)


def test_missing_metadata(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"\.metadata: missing"):
        safe_load.check_checkpoint(tmp_path)


def test_finalize_still_needs_the_cpu_device_shim() -> None:
    """Fails when a megatron-core release stops using CUDA in the save finalize (drop the shim then)."""
    from megatron.core.dist_checkpointing.strategies import state_dict_saver

    assert megatron_compat.FINALIZE_CUDA_EVIDENCE in inspect.getsource(state_dict_saver.save_state_dict_async_finalize)


def test_writers_still_report_through_a_manager_queue() -> None:
    """Fails when megatron-core stops creating its Manager queue (then megatron_compat.results_queue can go)."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    assert megatron_compat.RESULTS_QUEUE_EVIDENCE in inspect.getsource(filesystem_async)
    results = megatron_compat.results_queue()
    assert filesystem_async._get_write_results_queue() is results
    results.put("stale")
    state.drain(results)
    assert results.empty()


def test_rng_state_round_trips_through_json() -> None:
    from megatron.core import tensor_parallel

    with megatron_compat.cpu_patched():
        tracker = tensor_parallel.get_cuda_rng_tracker()
        tracker.reset()
        tracker.add("model-parallel-rng", 7)
        random.seed(1)
        np.random.seed(2)
        torch.manual_seed(3)
        captured = json.loads(json.dumps(state.capture_rng()))
        expected = (random.random(), np.random.rand(), torch.rand(2).tolist())
        with tracker.fork():
            expected_tracker = torch.rand(2).tolist()
        state.restore_rng(captured)
        assert (random.random(), np.random.rand(), torch.rand(2).tolist()) == expected
        with tracker.fork():
            assert torch.rand(2).tolist() == expected_tracker
        tracker.reset()


def test_state_file_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"air_hpc_state\.json: missing"):
        state.read_state_file(tmp_path)
    (tmp_path / state.STATE_FILE).write_text("{")
    with pytest.raises(CheckpointError, match="not JSON"):
        state.read_state_file(tmp_path)
    (tmp_path / state.STATE_FILE).write_text('{"format": 0}')
    with pytest.raises(CheckpointError, match="format 0, expected 1"):
        state.read_state_file(tmp_path)
