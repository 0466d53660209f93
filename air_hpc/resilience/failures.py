"""One line for a failed checkpoint save, naming the path and the errno where the cause has them."""

import errno
import os
from pathlib import Path


def describe_error(exc: BaseException, where: Path | None = None) -> str:
    """One line for a failed save: ``<path>: No space left on device (errno 28, ENOSPC)`` for OS errors.

    Follows ``raise ... from`` chains, so an ``OSError`` wrapped by a library is still named;
    ``where`` stands in for the path when the error has none (a write to an open file). An error
    without an errno (torch's serializer reports a short write as "unexpected pos") is checked
    against ``where``'s file system: a read-only or full one is named as such.
    """
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    os_error = os_error_in(exc)
    found_after = ""
    if os_error is None and where is not None:
        os_error = file_system_problem(where)
        found_after = f"; found after: {text}"
    if os_error is None or os_error.errno is None:
        return text
    path = os_error.filename or where
    prefix = f"{path}: " if path else ""
    name = errno.errorcode.get(os_error.errno, "?")
    return f"{prefix}{os_error.strerror or os.strerror(os_error.errno)} (errno {os_error.errno}, {name}{found_after})"


#: Free space below which a failed write is put down to a full file system.
_FULL_BELOW_BYTES = 1 << 20


def file_system_problem(where: Path) -> OSError | None:
    """A read-only or (nearly) full file system under ``where``, as the OSError a write there would raise."""
    path = where
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        fs = os.statvfs(path)
    except OSError:
        return None
    if fs.f_flag & os.ST_RDONLY:
        return OSError(errno.EROFS, os.strerror(errno.EROFS), str(where))
    if fs.f_bavail * fs.f_frsize < _FULL_BELOW_BYTES:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(where))
    return None


def os_error_in(exc: BaseException) -> OSError | None:
    """The first ``OSError`` with an errno in ``exc``'s cause/context chain."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
