"""Every write in a run directory, through one door that never follows a symbolic link.

A run directory is shared, long-lived and writable by whoever runs jobs there: a link
planted at ``.owner.json.tmp``, ``.metrics.jsonl.tmp``, ``events.jsonl`` or a heartbeat
would otherwise make submit, the trainer or the ranks write wherever it points. So each
file is opened with ``O_NOFOLLOW`` (a temporary one also with ``O_EXCL``: it must be new),
in a parent directory that is itself no link, and a refusal names the refused path.
Replacing a file by ``rename`` never follows a link at the destination: it replaces the link.
"""

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from io import TextIOWrapper
from pathlib import Path

from air_hpc.errors import UserError

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePathError(UserError, OSError):
    """A write in a run directory would have gone through a symbolic link; nothing was written.

    An ``OSError`` too, so that a writer that tolerates a failed write (a heartbeat on a full
    disk) tolerates this one the same way, with the message naming the path.
    """


def _refuse(path: Path, what: str) -> UnsafePathError:
    return UnsafePathError(f"{path}: refusing to write through {what} (a run directory's files are never links)")


def _check_parent(path: Path) -> None:
    if path.parent.is_symlink():
        raise _refuse(path.parent, "a symbolic link to a directory")


def refuse_link(path: Path) -> None:
    """Raise :class:`UnsafePathError` when ``path`` or its parent is a link (before reading what a writer rewrites)."""
    _check_parent(path)
    if path.is_symlink():
        raise _refuse(path, "a symbolic link")


def open_fd(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` of a run-directory file that refuses a link at ``path`` or at its parent."""
    _check_parent(path)
    try:
        return os.open(path, flags | _NOFOLLOW, mode)
    except OSError as exc:
        if path.is_symlink():  # ELOOP for O_NOFOLLOW, EEXIST for O_CREAT | O_EXCL
            raise _refuse(path, "a symbolic link") from exc
        raise


def append_bytes(path: Path, data: bytes, *, durable: bool = False) -> None:
    """Append ``data`` with one ``write`` (O_APPEND keeps concurrent lines whole); ``durable``: fsync first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_and_close(open_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), data, durable)


def open_append(path: Path) -> TextIOWrapper:
    """A text stream appending to ``path`` (the trainer's metrics.jsonl), opened without following a link."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.fdopen(open_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a", encoding="utf-8")


def create_new(path: Path, data: bytes = b"", *, durable: bool = False) -> bool:
    """Create ``path`` with ``data`` unless it exists (True: this call created it); a link there is refused."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return False
    _write_and_close(fd, data, durable)
    return True


def _write_and_close(fd: int, data: bytes, durable: bool) -> None:
    """One ``write`` of ``data``, fsynced when ``durable``; the descriptor is closed however it ends."""
    try:
        os.write(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def touch(path: Path) -> None:
    """Make sure ``path`` exists (a marker file), without following a link."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.close(open_fd(path, os.O_WRONLY | os.O_CREAT))


def atomic_write(path: Path, data: bytes | str, *, durable: bool = True, tmp: Path | None = None) -> None:
    """Replace ``path`` by ``data`` all at once: written to a new temporary file, then renamed over it.

    ``tmp`` (default ``.<name>.tmp`` beside ``path``) must not exist as a link; a regular file
    there is a leftover of a writer that died mid-write and is replaced. ``durable``: fsync the
    file before the rename and the directory after it.
    """
    payload = data.encode() if isinstance(data, str) else data
    tmp = tmp or path.with_name(f".{path.name}.tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    with _new_file(tmp) as fd:
        os.write(fd, payload)
        if durable:
            os.fsync(fd)
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


@contextmanager
def _new_file(tmp: Path) -> Iterator[int]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        fd = open_fd(tmp, flags)
    except FileExistsError:
        tmp.unlink()  # a regular file (a link was refused above): the leftover of a writer that died
        fd = open_fd(tmp, flags)
    try:
        yield fd
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_tree(path: Path) -> None:
    """Remove a directory tree, or the link or file found in its place (``rmtree`` refuses a link and left it)."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)
