"""Every topology parser the CLI can reach raises only the project's errors, whatever the input.

A traceback (RecursionError from python-hostlist, ``_csv.Error``, a KeyError
deep in the importer) would escape the CLI's one error boundary; each of these
runs thousands of generated inputs, full Unicode included.
"""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from air_hpc.errors import UserError
from air_hpc.slurm import hostlist
from air_hpc.topology import block_build, files, topoyaml, treeconf
from air_hpc.topology.ibnetdiscover import import_ibnetdiscover

#: Outside the fast tier (scripts/test.sh --fast): thousands of generated inputs per reader (about 40 s on 2 cores).
pytestmark = pytest.mark.slow

DATA = Path(__file__).parent.parent / "data" / "topology"
MANY = settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: each example runs three or four parses
FEWER = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: characters that make hostlists, key=value lines, CSV and YAML interesting
_SYNTAX = st.sampled_from([*"n0123[]-,=#\\\n\r\t \"':{}!&*|>%@`", "\x00", "\x85", "\u2028", "é", "٣"])
texts = st.text(alphabet=_SYNTAX, max_size=40) | st.text(max_size=40)


@pytest.mark.parametrize("expr", ["[]1-1[\n]", "a\n", "n[1-3] ", "n[1-99999999999]", "n[٣-٤]", "[" * 2000 + "]" * 2000])
def test_known_bad_hostlists_are_input_errors(expr: str) -> None:
    with pytest.raises(UserError, match="where: "):
        hostlist.expand(expr, "where")


@MANY
@given(texts)
def test_hostlist_expand(expr: str) -> None:
    try:
        names = hostlist.expand(expr, "where")
    except UserError as exc:
        assert str(exc).startswith("where: ")
    else:
        assert names and all(name and name.isprintable() and " " not in name for name in names)


@FEWER
@given(st.lists(texts, max_size=4))
def test_topology_conf_readers(lines: list[str]) -> None:
    text = "\n".join(["SwitchName=l1 Nodes=n[1-2]", *lines, "BlockName=b1 Nodes=n[3-4]"])
    for reader in (treeconf.parse, treeconf.parse_block, files.read_topology):
        try:
            reader(text, "fuzz.conf")
        except UserError as exc:
            assert str(exc).startswith("fuzz.conf")


@FEWER
@given(texts, st.sampled_from(["tree", "block"]))
def test_topology_yaml_reader(value: str, kind: str) -> None:
    body = (
        f"  tree:\n    switches:\n    - switch: s1\n      nodes: {value!r}\n"
        if kind == "tree"
        else f"  block:\n    block_sizes: [2]\n    blocks:\n    - block: {value!r}\n      nodes: n[1-2]\n"
    )
    for text in (f"- topology: t\n{body}", f"- topology: {value}\n{body}", value, f"- topology:\n  {value}"):
        try:
            topoyaml.parse(text, "fuzz.yaml")
        except UserError as exc:
            assert str(exc).startswith("fuzz.yaml")


@MANY
@given(texts)
def test_nvlink_csv_reader(text: str) -> None:
    for candidate in (text, f"gb01,{text},1\n", f"{text},u,1\ngb02,u,1\n"):
        try:
            block_build.read_nvlink_csv(candidate, "n.csv")
        except UserError as exc:
            assert str(exc).startswith("n.csv")


THREE_LEVEL = (DATA / "hpc-3level.ibnetdiscover").read_text()
PORTS = (DATA / "dgx-superpod-ports.ibnetdiscover").read_text()


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([THREE_LEVEL, PORTS]), st.data())
def test_ibnetdiscover_importer(capture: str, data: st.DataObject) -> None:
    lines = capture.splitlines()
    i = data.draw(st.integers(0, len(lines) - 1))
    mutation = data.draw(st.sampled_from(["replace", "insert", "cut", "splice"]))
    noise = data.draw(texts)
    if mutation == "replace":
        lines[i] = noise
    elif mutation == "insert":
        lines.insert(i, noise)
    elif mutation == "cut":
        lines[i] = lines[i][: data.draw(st.integers(0, len(lines[i])))]
    else:
        at = data.draw(st.integers(0, len(lines[i])))
        lines[i] = lines[i][:at] + noise + lines[i][at:]
    try:
        import_ibnetdiscover("\n".join(lines), "fuzz.ibnet")
    except UserError as exc:
        assert str(exc).startswith("fuzz.ibnet")
