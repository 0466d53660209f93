"""Routing across clusters on the real two-cluster testbed (``testbed up --clusters 2``: airtb and airtbb, each its
own slurmctld and slurmds, registered in one slurmdbd): with airtb filled, ``submit --clusters airtb,airtbb`` sends the
job to airtbb, says why in a ``route`` event, and ``status``, ``logs`` and ``cancel`` follow it there (``-M``)."""

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from air_hpc.records.events import EventKind, read_events
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import latest_submission
from air_hpc.testbed import Testbed
from air_hpc.testbed.cluster import CLUSTER_NAME, Daemon
from air_hpc.testbed.conf import Settings
from air_hpc.train import data
from tests.integration.matrix import matrix_build
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
AIR_HPC = str(REPO / ".venv" / "bin" / "air-hpc")
OTHER = CLUSTER_NAME + "b"


@pytest.fixture(scope="module")
def bed() -> Iterator[SimpleNamespace]:
    """Two clusters of two nodes each (one leaf), in a short state dir (slurmd's step sockets)."""
    shared = os.environ.get("AIR_HPC_TEST_STATE_DIR")
    state_dir = Path(f"{shared}-r") if shared else Path(tempfile.mkdtemp(prefix="tb-r", dir="/tmp"))
    testbed = Testbed(state_dir)
    build = matrix_build()
    testbed.up((2,), settings=Settings(clusters=2), slurm_prefix=build.prefix if build else None)
    try:
        yield SimpleNamespace(testbed=testbed, env=testbed.env, client=testbed.client(), clusters=testbed.clusters())
    finally:
        testbed.down()
        if not shared:  # a state dir of its own: leave nothing in /tmp
            shutil.rmtree(state_dir, ignore_errors=True)


def cli(bed: SimpleNamespace, *args: str) -> subprocess.CompletedProcess[str]:
    """``air-hpc ARGS`` as a user runs it: SLURM_CONF names the testbed's own cluster (airtb), nothing else."""
    return subprocess.run([AIR_HPC, *args], env={**os.environ, **bed.env}, capture_output=True, text=True, timeout=120)


def profile(bed: SimpleNamespace, tmp_path: Path, corpus: Path) -> list[str]:
    listed = ", ".join(
        f"{{name: {c['name']}, slurm_conf: {c['slurm_conf']}, topology_file: {c['topology_file']}}}"
        for c in bed.clusters
    )
    sets = [
        f"run.root={tmp_path / 'runs'}",
        "run.name=routed",
        f"data.path={corpus}",
        "train.steps=100000",  # cancelled long before: the test follows it, it need not finish
        f"cluster.clusters=[{listed}]",
        f"cluster.topology_file={bed.clusters[0]['topology_file']}",
    ]
    return [word for s in sets for word in ("--set", s)]


def test_with_one_cluster_full_the_job_goes_to_the_other_and_is_followed_there(
    bed: SimpleNamespace, tmp_path: Path
) -> None:
    corpus = data.prepare([REPO / "README.md"], tmp_path / "corpus.h5", data.ByteTokenizer()).path
    sets = profile(bed, tmp_path, corpus)
    unknown = cli(bed, "submit", "gpt-tiny-testbed", "--clusters", f"{CLUSTER_NAME},nosuch", *sets)
    assert unknown.returncode == 2, unknown.stderr
    assert unknown.stderr.strip().splitlines() == [
        f"error: --clusters: unknown cluster 'nosuch'; cluster profile 'testbed' (cluster.clusters) knows "
        f"{CLUSTER_NAME}, {OTHER}"
    ]

    # Fill airtb: one long job holding both its nodes whole.
    filler = bed.client.sbatch_wrap("sleep 600", ["--exclusive", "--nodes=2", "--time=10", "--job-name=filler"])
    wait_for("the filler to run", lambda: str(bed.client.job_status(filler).state) == "RUNNING", 30, 0.3)

    done = cli(bed, "submit", "gpt-tiny-testbed", "--clusters", f"{CLUSTER_NAME},{OTHER}", *sets)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert f"route: {OTHER}: starts soonest" in done.stderr and f"submitted to cluster {OTHER}" in done.stderr
    run = RunDir(tmp_path / "runs" / "routed")
    assert latest_submission(run).cluster == OTHER
    (event,) = [e for e in read_events(run.events) if e["kind"] == EventKind.ROUTE]
    assert event["cluster"] == OTHER and event["job_id"] == job_id
    assert f"{CLUSTER_NAME}: starts +" in event["reason"]  # the full cluster: later, by how much
    answers = {a["cluster"]: a for a in event["answers"]}
    assert answers[OTHER]["nodelist"] == "b[1-2]" and answers[OTHER]["quality"]["level"] == 0

    # status and logs follow the job on airtbb, though SLURM_CONF names airtb.
    def running() -> bool:
        shown = json.loads(cli(bed, "status", str(run.path), "--json").stdout or "{}")
        return shown.get("state") == "RUNNING" and shown.get("cluster") == OTHER and shown.get("nodelist") == "b[1-2]"

    wait_for(f"job {job_id} to run on {OTHER}", running, 60, 0.5)
    wait_for(
        "the batch log", lambda: f"job {job_id} start 1 on b[1-2]" in cli(bed, "logs", str(run.path)).stdout, 30, 0.5
    )
    bare = cli(bed, "status", job_id)
    assert bare.returncode == 0 and f"on cluster {OTHER}: RUNNING" in bare.stdout, bare.stderr

    # cancel stops it there, and leaves the other cluster's job alone.
    cancelled = cli(bed, "cancel", str(run.path))
    assert cancelled.returncode == 0 and f"cancelled job {job_id} (slurm) on cluster {OTHER}" in cancelled.stdout
    other = bed.client.on_cluster(OTHER)

    def gone() -> bool:
        found = other.job_status(job_id)
        return found is not None and str(found.state) == "CANCELLED"

    wait_for(f"job {job_id} cancelled on {OTHER}", gone, 30, 0.5)
    assert str(bed.client.job_status(filler).state) == "RUNNING"
    bed.client.scancel(filler)


def test_a_sweep_goes_to_the_other_cluster_as_one_array_and_is_followed_and_cancelled_there(
    bed: SimpleNamespace, tmp_path: Path
) -> None:
    """Element 1 waits behind element 0 (each takes both nodes) and is cancelled before it starts: its state
    comes from the array's accounting record on airtbb."""
    corpus = data.prepare([REPO / "README.md"], tmp_path / "corpus.h5", data.ByteTokenizer()).path
    sets = [*profile(bed, tmp_path, corpus), "--set", "run.name=swept"]
    filler = bed.client.sbatch_wrap("sleep 600", ["--exclusive", "--nodes=2", "--time=10", "--job-name=filler"])
    try:
        wait_for("the filler to run", lambda: str(bed.client.job_status(filler).state) == "RUNNING", 30, 0.3)
        done = cli(
            bed, "sweep", "gpt-tiny-testbed", "--grid", "train.seed=1,2", "--clusters", f"{CLUSTER_NAME},{OTHER}", *sets
        )
        assert done.returncode == 0, done.stderr
        array = done.stdout.strip()
        assert f"route: {OTHER}: starts soonest" in done.stderr and f"on cluster {OTHER}" in done.stderr
        runs = [RunDir(tmp_path / "runs" / f"swept-{i}") for i in (0, 1)]
        assert [latest_submission(r).cluster for r in runs] == [OTHER, OTHER]

        def first_runs() -> bool:
            shown = json.loads(cli(bed, "status", str(runs[0].path), "--json").stdout or "{}")
            return shown.get("state") == "RUNNING" and shown.get("cluster") == OTHER

        wait_for(f"element 0 ({array}_0) to run on {OTHER}", first_runs, 60, 0.5)
        cancelled = cli(bed, "cancel", str(tmp_path / "runs" / "swept.sweep"), "--json")
        assert cancelled.returncode == 0, cancelled.stderr
        assert [e["cancelled"] for e in json.loads(cancelled.stdout)["elements"]] == [True, True]

        def both_cancelled() -> bool:
            states = [json.loads(cli(bed, "status", str(r.path), "--json").stdout or "{}").get("state") for r in runs]
            return states == ["CANCELLED", "CANCELLED"]

        wait_for(f"both elements cancelled on {OTHER}", both_cancelled, 60, 0.5)
    finally:
        bed.client.scancel(filler)


def test_a_cluster_that_does_not_answer_is_skipped_with_one_line_and_none_answering_is_exit_2(
    bed: SimpleNamespace, tmp_path: Path
) -> None:
    """airtbb's slurmctld stopped (slurmdbd then says it cannot be reached): routed to airtb with one warning line;
    asked alone, exit 2 and nothing submitted. Dry runs: the decision is all this needs."""
    corpus = data.prepare([REPO / "README.md"], tmp_path / "corpus.h5", data.ByteTokenizer()).path
    sets = profile(bed, tmp_path, corpus)
    state = json.loads(bed.testbed.layout.state_json.read_text())
    (ctld,) = [Daemon(**d) for d in state["daemons"] if d["name"] == f"{OTHER}/slurmctld"]
    proc = ctld.process()
    assert proc is not None
    proc.terminate()
    proc.wait(30)
    try:
        both = cli(bed, "submit", "gpt-tiny-testbed", "--dry-run", "--clusters", f"{CLUSTER_NAME},{OTHER}", *sets)
        assert both.returncode == 0, both.stderr
        warnings = [line for line in both.stderr.splitlines() if line.startswith("warning:")]
        assert len(warnings) == 1 and warnings[0].startswith(f"warning: cluster {OTHER} skipped: "), both.stderr
        assert f"route: {CLUSTER_NAME}: starts soonest" in both.stderr
        alone = cli(bed, "submit", "gpt-tiny-testbed", "--clusters", OTHER, *sets)
        assert alone.returncode == 2
        errors = [line for line in alone.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and errors[0].startswith("error: --clusters: no cluster answered ("), alone.stderr
        assert errors[0].endswith("; nothing submitted") and not (tmp_path / "runs" / "routed").exists()
    finally:
        bed.testbed.up(
            (2,), settings=Settings(clusters=2), slurm_prefix=bed.testbed.build.prefix if bed.testbed.build else None
        )
