"""Refuse checkpoints that would make the loader unpickle anything but plain data.

Megatron's ``torch_dist`` format has three places where bytes become objects:

- ``.metadata``: ``torch.distributed.checkpoint`` reads it with a bare ``pickle.load``;
- ``common.pt``: ``torch.load`` with torch's default, ``weights_only=True`` since torch 2.6
  (unless ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` is set);
- byte items (``ShardedObject`` data) inside ``*.distcp`` files: ``torch.load(weights_only=False)``.

Rather than patch those readers, :func:`check_checkpoint` reads each of them
first with a restricted loader (an allow-listed ``pickle.Unpickler`` for
``.metadata``, ``torch.load(weights_only=True)`` for the rest) and raises
:class:`~air_hpc.errors.CheckpointError` naming the file and the offending
global. Our own state (RNG, progress, scheduler) is stored as tensors and JSON,
so a checkpoint written by air-hpc has no byte items at all.
"""

import io
import pickle
from pathlib import Path
from typing import Any

from air_hpc.errors import CheckpointError

#: (module, name) pairs a torch_dist ``.metadata`` pickle may reference.
_METADATA_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint.planner",
    "torch.distributed.checkpoint._extension",
    "torch.distributed.checkpoint.storage",
)
_METADATA_GLOBALS = frozenset(
    {
        ("torch", "Size"),
        ("torch", "device"),
        ("torch.serialization", "_get_layout"),
        ("collections", "OrderedDict"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "slice"),
        ("megatron.core.dist_checkpointing.strategies.torch", "MCoreMetadata"),
    }
)
_TORCH_ENUMS = {"dtype", "layout", "memory_format"}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        import torch

        if module in _METADATA_MODULES or (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and type(getattr(torch, name, None)).__name__ in _TORCH_ENUMS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed")


def load_metadata(path: Path) -> Any:
    """Unpickle a ``.metadata`` file allowing only checkpoint-metadata types."""
    try:
        with open(path, "rb") as stream:
            return _MetadataUnpickler(stream).load()
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path}: missing (not a torch_dist checkpoint)") from exc
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{path}: refusing to load: {exc}") from exc


def check_weights_only(path: Path, data: bytes | None = None, what: str = "") -> None:
    """Load with ``weights_only=True`` (tensors and plain containers only) or raise naming the file."""
    import torch

    try:
        source: Any = io.BytesIO(data) if data is not None else path
        torch.load(source, map_location="cpu", weights_only=True)
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path}: missing") from exc
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}{what}: refusing to load: {first_line}") from exc


def check_checkpoint(directory: Path) -> None:
    """Every object the torch_dist loader would unpickle from ``directory`` passes a restricted load."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    metadata = load_metadata(directory / ".metadata")
    common = directory / "common.pt"
    if common.exists():
        check_weights_only(common)
    byte_keys = {k for k, v in metadata.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)}
    for index, info in (metadata.storage_data or {}).items():
        if index.fqn not in byte_keys:
            continue
        path = directory / info.relative_path
        if getattr(info, "transform_descriptors", None):
            raise CheckpointError(f"{path} [{index.fqn}]: refusing to load a transformed byte item")
        with open(path, "rb") as stream:
            stream.seek(info.offset)
            data = stream.read(info.length)
        check_weights_only(path, data, what=f" [{index.fqn}]")
