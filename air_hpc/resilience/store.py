"""The checkpoint directory: staging, manifest, atomic commit, verification, retention.

Layout under ``RunDir.checkpoints``::

    .tmp-step_0000120/     being written (all ranks write their shards here); never loaded
    step_0000100/          committed: the shards + manifest.json (written last)
    step_0000110/
    latest                 "step_0000110": tmp + fsync + rename after the commit

A checkpoint counts only if its directory is named ``step_*`` and holds a manifest
whose listed files exist with the listed sizes (and, for a deep check, sha256).
The rename is the commit point: the manifest is written after every shard is
fsynced, inside the staging directory, and the directory only gets its final
name afterwards. The ``latest`` pointer is a convenience for people and tools;
:meth:`CheckpointStore.resolve` trusts the manifests, so a crash between the
rename and the pointer update loses nothing.

Verification cost is hashing, so it is spread out: each writer hashes its own files right
after writing them (page cache, in parallel across ranks and nodes, in the background for
async saves) and :meth:`CheckpointStore.commit` only merges those records. Sizes are checked
on every listing and load; sha256 by ``air-hpc ckpt verify`` and, by default, on the one
checkpoint a run resumes from, split over the ranks (``verify(share=...)``);
``checkpoint.verify: size`` skips that where re-reading is expensive.
"""

import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from air_hpc.digits import DIGITS
from air_hpc.errors import CheckpointError, ConfigError
from air_hpc.records.files import atomic_write, open_fd, remove_tree

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
LATEST = "latest"
#: Hashes computed by the ranks that wrote the files (``.sha256-<writer>.json``), merged at commit.
WRITER_HASHES_PREFIX = ".sha256-"
MANIFEST_FORMAT = 1
_STEP_RE = re.compile(rf"^step_({DIGITS})$")
_STAGING_RE = re.compile(rf"^\.tmp-step_({DIGITS})$")
_TRASH_PREFIX = ".trash-"
_CHUNK_BYTES = 8 << 20

Check = Literal["size", "sha256"]


def step_name(step: int) -> str:
    return f"step_{step:07d}"


@dataclass(frozen=True)
class FileEntry:
    path: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    step: int
    files: tuple[FileEntry, ...]
    created_s: float

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": MANIFEST_FORMAT,
                "step": self.step,
                "created": self.created_s,
                "bytes": self.bytes,
                "files": [{"path": f.path, "bytes": f.bytes, "sha256": f.sha256} for f in self.files],
            },
            indent=1,
        )

    @classmethod
    def read(cls, directory: Path) -> "Manifest":
        path = directory / MANIFEST
        try:
            data = json.loads(path.read_text())
            if data.get("format") != MANIFEST_FORMAT:
                raise CheckpointError(f"{path}: manifest format {data.get('format')!r}, expected {MANIFEST_FORMAT}")
            files = tuple(FileEntry(str(f["path"]), int(f["bytes"]), str(f["sha256"])) for f in data["files"])
            return cls(step=int(data["step"]), files=files, created_s=float(data["created"]))
        except FileNotFoundError as exc:
            raise CheckpointError(f"{path}: no manifest (the save did not finish)") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{path}: unreadable manifest ({exc})") from exc


@dataclass(frozen=True)
class CheckpointInfo:
    """One entry of :meth:`CheckpointStore.list`.

    ``complete``: committed (named ``step_*``, manifest present). ``verified``: the check named
    by ``check`` passed. ``problem`` says why not, naming the file.
    """

    step: int
    path: Path
    bytes: int
    complete: bool
    verified: bool
    check: Check | None
    problem: str | None


@dataclass(frozen=True)
class Resolution:
    """What :meth:`CheckpointStore.resolve` found: the step to load and what it passed over."""

    step: int | None
    skipped: tuple[tuple[int, str], ...]
    partial: tuple[Path, ...]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as stream:
        while chunk := stream.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def record_hashes(staging: Path, writer: str, files: Iterable[Path], threads: int = 2) -> None:
    """Called by each writer right after writing its files: fsync them, hash them from its page cache.

    Spreads the cost of hashing over the ranks (and nodes) instead of re-reading everything on
    rank 0, and fsyncs where the data was written (on NFS or Lustre another node's fsync does
    not flush this node's cache). :meth:`CheckpointStore.commit` merges these records into the
    manifest and trusts them for files whose size still matches.
    """
    paths = [Path(p) for p in files]

    def one(path: Path) -> dict[str, object]:
        digest = sha256_file(path)
        fsync_path(path)  # the writer's own fsync is what makes its data durable on a shared file system
        return {"path": path.relative_to(staging).as_posix(), "bytes": path.stat().st_size, "sha256": digest}

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        entries = list(pool.map(one, paths))
    _write_durably(staging / f"{WRITER_HASHES_PREFIX}{writer}.json", json.dumps(entries))


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (directories: so that created/renamed entries persist)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def retained_steps(steps: Iterable[int], keep_last: int, keep_every: int) -> set[int]:
    """The steps retention keeps: the newest ``keep_last`` plus every ``keep_every``-th (0: none)."""
    ordered = sorted(set(steps))
    keep = set(ordered[-keep_last:]) if keep_last > 0 else set()
    if keep_every > 0:
        keep.update(s for s in ordered if s % keep_every == 0)
    return keep


class CheckpointStore:
    """Checkpoints of one run under ``root``; see the module docstring for the layout."""

    def __init__(self, root: Path, keep_last: int, keep_every: int = 0, hash_threads: int | None = None) -> None:
        if keep_last < 1:
            raise ConfigError(f"checkpoint.keep_last: {keep_last}, expected >= 1")
        if keep_every < 0:
            raise ConfigError(f"checkpoint.keep_every: {keep_every}, expected >= 0")
        self.root = Path(root)
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.hash_threads = hash_threads or min(8, os.cpu_count() or 1)

    # -- names ------------------------------------------------------------------------------
    def path(self, step: int) -> Path:
        return self.root / step_name(step)

    def staging_dir(self, step: int) -> Path:
        """Where every rank writes its shards of ``step``; created if missing."""
        path = self.root / f".tmp-{step_name(step)}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def latest_file(self) -> Path:
        return self.root / LATEST

    # -- writing (rank 0) ----------------------------------------------------------------------
    def begin(self, step: int) -> Path:
        """Rank 0, before the ranks write: drop leftovers of interrupted saves, return an empty staging dir.

        Call it only when no other save of this run is in flight (the checkpointer waits first).
        """
        self.remove_partial()
        return self.staging_dir(step)

    def remove_partial(self) -> list[Path]:
        """Delete staging directories of interrupted saves (and leftovers of swaps); returns them."""
        removed = self.partial()
        for stale in removed:
            log.warning("removing the partial checkpoint %s left by an interrupted save", stale)
            remove_tree(stale)
        if self.root.is_dir():
            for trash in self.root.glob(f"{_TRASH_PREFIX}*"):
                remove_tree(trash)
        return removed

    def commit(self, step: int, retain: bool = True) -> Path:
        """Rank 0, after every rank finished writing: make ``step`` durable, visible, and the latest.

        fsync each file and directory, write the manifest last, rename into ``step_*``, move the
        ``latest`` pointer, then (``retain``) apply retention; deleting large old checkpoints takes
        a while, so the checkpointer does that part off the critical path.
        """
        staging = self.root / f".tmp-{step_name(step)}"
        if not staging.is_dir():
            raise CheckpointError(f"{staging}: no staging directory to commit for step {step}")
        started = time.monotonic()
        entries = self._hash_and_sync(staging)
        manifest = Manifest(step=step, files=tuple(entries), created_s=time.time())
        _write_durably(staging / MANIFEST, manifest.to_json() + "\n")
        fsync_path(staging)
        final = self.path(step)
        if final.exists():
            # Saving a step twice (e.g. a signal right after resuming): swap, never merge.
            trash = self.root / f"{_TRASH_PREFIX}{step_name(step)}-{os.getpid()}"
            os.rename(final, trash)
            os.rename(staging, final)
            remove_tree(trash)
        else:
            os.rename(staging, final)
        fsync_path(self.root)
        self._write_latest(step)
        log.info(
            "committed %s: %d files, %.1f MB in %.2f s",
            final,
            len(entries),
            manifest.bytes / 1e6,
            time.monotonic() - started,
        )
        if retain:
            self.apply_retention()
        return final

    def _hash_and_sync(self, directory: Path) -> list[FileEntry]:
        known: dict[str, FileEntry] = {}
        for record in sorted(directory.glob(f"{WRITER_HASHES_PREFIX}*.json")):
            try:
                for e in json.loads(record.read_text()):
                    known[e["path"]] = FileEntry(str(e["path"]), int(e["bytes"]), str(e["sha256"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise CheckpointError(f"{record}: unreadable hash record ({exc})") from exc
            record.unlink()
        files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)

        def one(path: Path) -> FileEntry:
            name = path.relative_to(directory).as_posix()
            size = path.stat().st_size
            entry = known.get(name)
            if entry is not None and entry.bytes == size:
                return entry  # hashed and fsynced by the rank that wrote it
            fsync_path(path)
            return FileEntry(name, size, sha256_file(path))

        with ThreadPoolExecutor(max_workers=self.hash_threads) as pool:
            entries = list(pool.map(one, files))
        for sub in sorted((p for p in directory.rglob("*") if p.is_dir()), reverse=True):
            fsync_path(sub)
        return entries

    def _write_latest(self, step: int) -> None:
        atomic_write(self.latest_file, step_name(step) + "\n", tmp=self.root / f".{LATEST}.tmp")

    def retention_victims(
        self, keep_last: int | None = None, keep_every: int | None = None, trusted: Iterable[int] | None = None
    ) -> list[int]:
        """The committed steps :meth:`apply_retention` would delete now, deleting nothing (a dry run).

        A checkpoint goes only when a newer *verified* one supersedes it: one that passes
        the size check and, when ``trusted`` is given, is among those steps (the checkpointer's
        own: the step it resumed from after hashing it, and those it wrote and hashed itself).
        So corrupt newer checkpoints never cost an older one, which may be the only one left to
        resume from. ``keep_last`` counts verified checkpoints only.
        """
        keep_last = self.keep_last if keep_last is None else keep_last
        keep_every = self.keep_every if keep_every is None else keep_every
        if keep_last < 1:
            raise ConfigError(f"--keep: {keep_last}, expected >= 1")
        steps = self.committed_steps()
        allowed = None if trusted is None else set(trusted)
        verified = [s for s in steps if (allowed is None or s in allowed) and self._passes_size_check(s)]
        keep = retained_steps(verified, keep_last, 0) | retained_steps(steps, 0, keep_every)
        newest_verified = max(verified, default=None)
        if newest_verified is None:
            return []
        return [step for step in steps if step not in keep and step < newest_verified]

    def apply_retention(
        self,
        keep_last: int | None = None,
        keep_every: int | None = None,
        trusted: Iterable[int] | None = None,
        only: Iterable[int] | None = None,
    ) -> list[int]:
        """Delete the committed checkpoints :meth:`retention_victims` names; returns their steps.

        ``only``: delete no step outside these (what a person confirmed), even if retention now names more.
        """
        confirmed = None if only is None else set(only)
        removed = []
        for step in self.retention_victims(keep_last, keep_every, trusted):
            if confirmed is not None and step not in confirmed:
                continue
            trash = self.root / f"{_TRASH_PREFIX}{step_name(step)}-{os.getpid()}"
            os.rename(self.path(step), trash)
            remove_tree(trash)
            removed.append(step)
        if removed:
            fsync_path(self.root)
            log.info("retention removed steps %s", removed)
        return removed

    def _passes_size_check(self, step: int) -> bool:
        try:
            self.verify(step, check="size")
        except CheckpointError:
            return False
        return True

    # -- reading ------------------------------------------------------------------------------
    def committed_steps(self) -> list[int]:
        return sorted(_steps(self.root, _STEP_RE))

    def partial(self) -> list[Path]:
        """Staging directories of saves that did not commit (or are being written right now)."""
        return [self.root / f".tmp-{step_name(s)}" for s in sorted(_steps(self.root, _STAGING_RE))]

    def latest_pointer(self) -> int | None:
        try:
            match = _STEP_RE.match(self.latest_file.read_text().strip())
        except FileNotFoundError:
            return None
        return int(match.group(1)) if match else None

    def verify(self, step: int, check: Check = "sha256", share: tuple[int, int] = (0, 1)) -> Manifest:
        """Raise :class:`CheckpointError` naming the file and what is wrong, else return the manifest.

        ``share=(i, n)``: hash only every n-th file starting at i, so that n ranks can split the
        reading (sizes are always checked for every file).
        """
        directory = self.path(step)
        if not directory.is_dir():
            raise CheckpointError(f"{directory}: no such checkpoint")
        manifest = Manifest.read(directory)
        if manifest.step != step:
            raise CheckpointError(f"{directory / MANIFEST}: says step {manifest.step}, directory is step {step}")
        for entry in manifest.files:
            path = directory / entry.path
            try:
                size = path.stat().st_size
            except FileNotFoundError as exc:
                raise CheckpointError(f"{path}: missing (listed in the manifest)") from exc
            if size != entry.bytes:
                raise CheckpointError(f"{path}: {size} bytes, the manifest says {entry.bytes}")
        if check == "sha256":
            mine = manifest.files[share[0] :: share[1]]
            with ThreadPoolExecutor(max_workers=self.hash_threads) as pool:
                digests = list(pool.map(sha256_file, (directory / e.path for e in mine)))
            for entry, digest in zip(mine, digests, strict=True):
                if digest != entry.sha256:
                    raise CheckpointError(
                        f"{directory / entry.path}: sha256 {digest[:12]}… does not match the manifest's "
                        f"{entry.sha256[:12]}… (corrupt)"
                    )
        return manifest

    def resolve(self, check: Check = "sha256") -> Resolution:
        """The newest committed checkpoint that verifies; logs every one passed over and why."""
        partial = tuple(self.partial())
        for path in partial:
            log.warning("ignoring %s: a save that did not finish", path)
        skipped: list[tuple[int, str]] = []
        for step in sorted(self.committed_steps(), reverse=True):
            try:
                self.verify(step, check=check)
            except CheckpointError as exc:
                log.warning("skipping checkpoint step %d: %s", step, exc)
                skipped.append((step, str(exc)))
                continue
            pointer = self.latest_pointer()
            if pointer != step and not skipped:
                log.info("the latest pointer says %s, the newest complete checkpoint is %d", pointer, step)
            return Resolution(step, tuple(skipped), partial)
        return Resolution(None, tuple(skipped), partial)

    def latest_complete(self, check: Check = "sha256") -> int | None:
        """Step of the newest checkpoint that verifies, or None (the first start)."""
        return self.resolve(check).step

    def list(self, check: Check = "size") -> list[CheckpointInfo]:
        """Every committed and partial checkpoint, oldest first."""
        infos = []
        for step in self.committed_steps():
            directory = self.path(step)
            try:
                manifest = self.verify(step, check=check)
                infos.append(CheckpointInfo(step, directory, manifest.bytes, True, True, check, None))
            except CheckpointError as exc:
                has_manifest = (directory / MANIFEST).is_file()
                infos.append(
                    CheckpointInfo(step, directory, _tree_bytes(directory), has_manifest, False, check, str(exc))
                )
        for path in self.partial():
            match = _STAGING_RE.match(path.name)
            if match:
                infos.append(
                    CheckpointInfo(
                        int(match.group(1)), path, _tree_bytes(path), False, False, None, "save did not finish"
                    )
                )
        return sorted(infos, key=lambda i: (i.step, i.complete))


def _steps(root: Path, pattern: re.Pattern[str]) -> Iterator[int]:
    if not root.is_dir():
        return
    for entry in root.iterdir():
        match = pattern.match(entry.name)
        if match and entry.is_dir():
            yield int(match.group(1))


def _tree_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def _write_durably(path: Path, text: str) -> None:
    fd = open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
