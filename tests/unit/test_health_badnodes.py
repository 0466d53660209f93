from pathlib import Path

from air_hpc.health.badnodes import append_bad_nodes, exclude_expression, merge_bad_nodes, read_bad_nodes


def test_missing_file_is_an_empty_list(tmp_path: Path) -> None:
    assert read_bad_nodes(tmp_path / "bad_nodes.txt") == ()
    assert exclude_expression([]) is None


def test_append_keeps_reasons_and_skips_listed_nodes(tmp_path: Path) -> None:
    path = tmp_path / "run" / "bad_nodes.txt"
    assert append_bad_nodes(path, ["n10", "n3"], "hung: rank 5\nin step 3", now_s=0) == ("n3", "n10")
    assert append_bad_nodes(path, ["n3", "n4"], "unhealthy: disk", now_s=60) == ("n4",)
    assert append_bad_nodes(path, ["n4"], "again", now_s=120) == ()
    assert path.read_text().splitlines() == [
        "n3  # hung: rank 5 in step 3 (1970-01-01T00:00:00Z)",
        "n10  # hung: rank 5 in step 3 (1970-01-01T00:00:00Z)",
        "n4  # unhealthy: disk (1970-01-01T00:01:00Z)",
    ]
    assert read_bad_nodes(path) == ("n3", "n4", "n10")
    assert exclude_expression(read_bad_nodes(path)) == "n[3-4,10]"


def test_read_skips_comments_blank_lines_and_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "bad_nodes.txt"
    path.write_text("# nodes to avoid\n\n gpu2 \ngpu10 # flaky\ngpu2\n")
    assert read_bad_nodes(path) == ("gpu2", "gpu10")


def test_merge_is_a_sorted_union() -> None:
    assert merge_bad_nodes(["n2", "n1"], ("n1", " ", "a7")) == ("a7", "n1", "n2")
