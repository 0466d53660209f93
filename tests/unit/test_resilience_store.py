"""CheckpointStore: staging, commit, manifest, verification, fallback, retention, partial saves."""

import json
import os
from pathlib import Path

import pytest

from air_hpc.errors import CheckpointError, ConfigError
from air_hpc.resilience.store import MANIFEST, CheckpointStore, record_hashes, retained_steps, step_name


def write_shards(store: CheckpointStore, step: int, payload: bytes | None = None) -> Path:
    staging = store.staging_dir(step)
    (staging / "__0_0.distcp").write_bytes(payload or os.urandom(3000) + step.to_bytes(4, "little"))
    (staging / "common.pt").write_bytes(b"common" * 10)
    (staging / "sub").mkdir(exist_ok=True)
    (staging / "sub" / "shard_0.pt").write_bytes(b"x" * 17)
    return staging


def save(store: CheckpointStore, step: int, retain: bool = True) -> Path:
    store.begin(step)
    write_shards(store, step)
    return store.commit(step, retain=retain)


def flip_byte(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "checkpoints", keep_last=3, keep_every=0)


def test_commit_writes_manifest_renames_and_moves_latest(store: CheckpointStore) -> None:
    final = save(store, 123)
    assert final.name == "step_0000123" and final == store.path(123)
    assert not (store.root / ".tmp-step_0000123").exists()
    manifest = json.loads((final / MANIFEST).read_text())
    assert [f["path"] for f in manifest["files"]] == ["__0_0.distcp", "common.pt", "sub/shard_0.pt"]
    assert manifest["files"][1]["bytes"] == 60
    assert store.latest_file.read_text() == "step_0000123\n"
    assert store.latest_pointer() == 123
    assert store.latest_complete() == 123
    assert store.verify(123).bytes == sum(f["bytes"] for f in manifest["files"])


def test_first_start_finds_nothing(store: CheckpointStore) -> None:
    assert store.latest_complete() is None
    assert store.list() == []


def test_step_names_take_ascii_digits_only(store: CheckpointStore) -> None:
    save(store, 10)
    (store.root / "step_١٢").mkdir()  # r"\d" matches Arabic-Indic digits and int() reads them as 12
    store.latest_file.write_text("step_١٢\n")
    assert store.latest_pointer() is None
    assert [i.step for i in store.list()] == [10]
    assert store.latest_complete() == 10


def test_partial_save_is_ignored_reported_and_cleaned(store: CheckpointStore, caplog: pytest.LogCaptureFixture) -> None:
    save(store, 10)
    store.begin(20)
    write_shards(store, 20)  # no commit: the process died here
    resolution = store.resolve()
    assert resolution.step == 10
    assert [p.name for p in resolution.partial] == [".tmp-step_0000020"]
    assert "did not finish" in caplog.text
    infos = store.list()
    assert [(i.step, i.complete) for i in infos] == [(10, True), (20, False)]
    store.begin(30)
    assert [p.name for p in store.partial()] == [".tmp-step_0000030"]


def test_flipped_byte_fails_sha256_naming_file_and_resume_falls_back(
    store: CheckpointStore, caplog: pytest.LogCaptureFixture
) -> None:
    save(store, 10)
    save(store, 20)
    flip_byte(store.path(20) / "__0_0.distcp")
    store.verify(20, check="size")  # same size: only the hash can tell
    with pytest.raises(CheckpointError, match=r"step_0000020/__0_0\.distcp: sha256 .* \(corrupt\)"):
        store.verify(20)
    resolution = store.resolve()
    assert resolution.step == 10
    assert resolution.skipped[0][0] == 20 and "__0_0.distcp" in resolution.skipped[0][1]
    assert "skipping checkpoint step 20" in caplog.text
    assert store.resolve(check="size").step == 20


def test_truncated_and_missing_files_fail_the_size_check(store: CheckpointStore) -> None:
    save(store, 10)
    (store.path(10) / "common.pt").write_bytes(b"short")
    with pytest.raises(CheckpointError, match=r"common\.pt: 5 bytes, the manifest says 60"):
        store.verify(10, check="size")
    (store.path(10) / "sub" / "shard_0.pt").unlink()
    (store.path(10) / "common.pt").write_bytes(b"common" * 10)
    with pytest.raises(CheckpointError, match=r"shard_0\.pt: missing"):
        store.verify(10, check="size")


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "no manifest"), ("{not json", "unreadable manifest"), ('{"format": 9}', "manifest format 9")],
)
def test_bad_manifests_are_not_complete(store: CheckpointStore, content: str | None, message: str) -> None:
    save(store, 10)
    save(store, 20)
    manifest = store.path(20) / MANIFEST
    if content is None:
        manifest.unlink()
    else:
        manifest.write_text(content)
    with pytest.raises(CheckpointError, match=message):
        store.verify(20)
    assert store.latest_complete() == 10
    info = store.list()[-1]
    assert info.step == 20 and not info.verified and message in (info.problem or "")


def test_manifest_of_another_step_is_rejected(store: CheckpointStore) -> None:
    save(store, 10)
    os.rename(store.path(10), store.path(11))
    with pytest.raises(CheckpointError, match="says step 10, directory is step 11"):
        store.verify(11)


def test_commit_without_staging_is_an_error(store: CheckpointStore) -> None:
    with pytest.raises(CheckpointError, match="no staging directory"):
        store.commit(5)


def test_saving_the_same_step_twice_replaces_it(store: CheckpointStore) -> None:
    save(store, 10)
    first = store.verify(10).files
    save(store, 10)
    assert store.verify(10).files != first
    assert not list(store.root.glob(".trash-*"))


def test_crash_between_rename_and_pointer_still_resumes_from_newest(store: CheckpointStore) -> None:
    save(store, 10)
    save(store, 20)
    store.latest_file.write_text("step_0000010\n")
    assert store.latest_complete() == 20


@pytest.mark.parametrize(
    ("steps", "keep_last", "keep_every", "expected"),
    [
        ([10, 20, 30, 40], 2, 0, {30, 40}),
        ([10, 20, 30, 40, 50], 2, 20, {20, 40, 50}),
        ([5], 3, 0, {5}),
        ([], 3, 10, set()),
    ],
)
def test_retained_steps(steps: list[int], keep_last: int, keep_every: int, expected: set[int]) -> None:
    assert retained_steps(steps, keep_last, keep_every) == expected


def test_retention_after_commit_and_keeps_newest_good_one(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "c", keep_last=2, keep_every=30)
    for step in (10, 20, 30, 40, 50):
        save(store, step)
    assert store.committed_steps() == [30, 40, 50]
    (store.path(50) / "common.pt").write_bytes(b"")
    (store.path(40) / "common.pt").write_bytes(b"")
    assert store.apply_retention(keep_last=1) == []  # 40 and 50 are broken: nothing supersedes 30 or 40
    assert store.committed_steps() == [30, 40, 50]


def test_retention_deletes_only_what_a_verified_newer_checkpoint_supersedes(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "c", keep_last=1)
    for step in (10, 20, 30):
        save(store, step, retain=False)
    (store.path(30) / "common.pt").write_bytes(b"")  # the newest is corrupt
    assert store.apply_retention() == [10]  # 20 is the newest verified one; 30 has nothing newer
    assert store.committed_steps() == [20, 30]
    save(store, 40, retain=False)
    assert store.apply_retention(trusted=[]) == []  # nothing verified by the caller: delete nothing
    assert store.apply_retention(trusted=[40]) == [20, 30]
    assert store.committed_steps() == [40]


@pytest.mark.parametrize(("keep_last", "keep_every", "key"), [(0, 0, "keep_last"), (1, -1, "keep_every")])
def test_bad_retention_settings(tmp_path: Path, keep_last: int, keep_every: int, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"checkpoint\.{key}"):
        CheckpointStore(tmp_path, keep_last=keep_last, keep_every=keep_every)


def test_step_names_sort_and_parse() -> None:
    assert step_name(7) == "step_0000007"
    assert step_name(12345678) == "step_12345678"


def test_commit_merges_hashes_recorded_by_the_writers(store: CheckpointStore) -> None:
    staging = store.begin(7)
    write_shards(store, 7)
    record_hashes(staging, "rank0", [staging / "__0_0.distcp"])
    recorded = json.loads((staging / ".sha256-rank0.json").read_text())
    assert recorded[0]["path"] == "__0_0.distcp"
    recorded[0]["sha256"] = "0" * 64  # a record is trusted for what its writer wrote...
    (staging / ".sha256-rank0.json").write_text(json.dumps(recorded))
    store.commit(7)
    assert not list(store.path(7).glob(".sha256-*"))
    files = {f.path: f for f in store.verify(7, check="size").files}
    assert files["__0_0.distcp"].sha256 == "0" * 64
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp: sha256"):  # ...and verify catches a wrong one
        store.verify(7)


def test_a_record_for_a_file_that_changed_size_is_rehashed(store: CheckpointStore) -> None:
    staging = store.begin(8)
    write_shards(store, 8)
    record_hashes(staging, "rank0", [staging / "common.pt"])
    (staging / "common.pt").write_bytes(b"rewritten")
    store.commit(8)
    store.verify(8)


def test_unreadable_hash_record(store: CheckpointStore) -> None:
    staging = store.begin(9)
    write_shards(store, 9)
    (staging / ".sha256-rank3.json").write_text("[{")
    with pytest.raises(CheckpointError, match=r"\.sha256-rank3\.json: unreadable hash record"):
        store.commit(9)


def test_verify_share_hashes_only_its_files(store: CheckpointStore) -> None:
    save(store, 10)
    flip_byte(store.path(10) / "common.pt", offset=5)  # files: __0_0.distcp, common.pt, sub/shard_0.pt
    store.verify(10, share=(0, 2))  # hashes files 0 and 2
    with pytest.raises(CheckpointError, match=r"common\.pt: sha256"):
        store.verify(10, share=(1, 2))
