"""The pre-flight health check each node runs before training: fail fast, blame the node, requeue.

A node with a missing GPU, a down InfiniBand port, a full or read-only
checkpoint directory or unreadable data would otherwise surface as a hang or a
cryptic NCCL error minutes into the run. Every rank runs the checks before any
process group starts (they are cheap); a failing rank records its node in the
run's bad-node list, emits an ``unhealthy`` event, writes the start's verdict
and raises :class:`UnhealthyNodeError` (exit code ``UNHEALTHY``), which the
batch script treats as "requeue without this node".
"""

import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from air_hpc.config.models import DataConfig, JobConfig
from air_hpc.data.blend import plan
from air_hpc.data.shards import FilePool
from air_hpc.errors import AirHpcError, InputError
from air_hpc.exitcodes import ExitCode
from air_hpc.health.badnodes import append_bad_nodes
from air_hpc.health.ibstat import parse_ibstat, select_ports
from air_hpc.records.events import EventLog, Unhealthy
from air_hpc.records.files import atomic_write
from air_hpc.records.generation import write_exit_code
from air_hpc.records.names import PREFLIGHT_PREFIX
from air_hpc.records.rundir import RunDir

log = logging.getLogger(__name__)

#: A GPU counts as having its nominal memory when it reports at least this share of it (decimal GB).
GPU_MEMORY_TOLERANCE = 0.95
IBSTAT_TIMEOUT_S = 30
#: Checks of storage that every node shares (by their CheckResult names).
SHARED_CHECKS = frozenset({"checkpoint dir", "data"})
#: How long a node that failed a shared check waits to hear that another node passed it.
PEER_WAIT_S = 20.0


class UnhealthyNodeError(AirHpcError):
    """This node failed the pre-flight check; it is on the bad-node list and the job should requeue without it."""

    exit_code = ExitCode.UNHEALTHY


class SharedStorageError(AirHpcError):
    """The checkpoint directory or the data failed on every node that checked: not a node's fault."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class PreflightReport:
    host: str
    checks: tuple[CheckResult, ...]

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        return tuple(check for check in self.checks if not check.ok)

    def summary(self) -> str:
        """One line: what failed on which node, or what passed."""
        if self.ok:
            return f"node {self.host} passed pre-flight: " + "; ".join(f"{c.name}: {c.detail}" for c in self.checks)
        return f"node {self.host} failed pre-flight: " + "; ".join(f"{c.name}: {c.detail}" for c in self.failures)


def check_gpus(memories_bytes: Sequence[int], expected: int, min_mem_gb: float) -> CheckResult:
    """At least ``expected`` visible GPUs, each with about ``min_mem_gb`` of memory (0: not checked)."""
    if len(memories_bytes) < expected:
        return CheckResult("gpus", False, f"{len(memories_bytes)} visible GPU(s), expected {expected}")
    floor = min_mem_gb * 1e9 * GPU_MEMORY_TOLERANCE
    small = [f"GPU {i} has {m / 1e9:.1f} GB" for i, m in enumerate(memories_bytes) if m < floor]
    if small:
        return CheckResult("gpus", False, f"{', '.join(small)}, expected {min_mem_gb:g} GB")
    total = f", {min(memories_bytes) / 1e9:.0f}+ GB each" if memories_bytes else ""
    return CheckResult("gpus", True, f"{len(memories_bytes)} GPU(s){total}")


def check_ib(ibstat_text: str | None, hcas: tuple[str, ...], min_rate_gbps: float) -> CheckResult:
    """Every HCA the job uses has its ports Active/LinkUp at ``min_rate_gbps`` or faster."""
    if ibstat_text is None:
        return CheckResult("infiniband", True, "ibstat not installed; not checked")
    ports = select_ports(parse_ibstat(ibstat_text), hcas)
    found = {p.ca for p in ports} | {p.name for p in ports}
    missing = [hca for hca in hcas if hca not in found]
    problems = [f"{hca} not present" for hca in missing]
    problems += [f"{p.name} is {p.state}/{p.physical_state}" for p in ports if not p.up]
    problems += [
        f"{p.name} runs at {p.rate_gbps:g} Gb/s, expected {min_rate_gbps:g}"
        for p in ports
        if p.up and p.rate_gbps < min_rate_gbps
    ]
    if problems:
        return CheckResult("infiniband", False, ", ".join(problems))
    rates = sorted({p.rate_gbps for p in ports})
    return CheckResult(
        "infiniband", True, f"{len(ports)} port(s) Active/LinkUp at {'/'.join(f'{r:g}' for r in rates)} Gb/s"
    )


def check_checkpoint_dir(directory: Path, min_free_gb: float) -> CheckResult:
    """The checkpoint directory exists (or can be made), takes a write, and has ``min_free_gb`` free."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".preflight-") as probe:
            probe.write(b"air-hpc pre-flight\n")
            probe.flush()
            os.fsync(probe.fileno())
        free_gb = shutil.disk_usage(directory).free / 1e9
    except OSError as exc:
        return CheckResult("checkpoint dir", False, f"{directory} is not writable: {exc.strerror or exc}")
    if free_gb < min_free_gb:
        return CheckResult(
            "checkpoint dir",
            False,
            f"{directory} has {free_gb:.1f} GB free, health.min_free_disk_gb is {min_free_gb:g}",
        )
    return CheckResult("checkpoint dir", True, f"writable, {free_gb:.1f} GB free")


def check_data(data: DataConfig) -> CheckResult:
    """Every shard is there at its full size; the first and last tokens of each source's first and last
    shard read back (catches a stale mount without opening every shard on every node)."""
    try:
        found = plan(data, seq_len=1)
        pool = FilePool(max_open=2)
        for source in found.sources:
            for shard in source.shards:
                if shard.end_bytes and shard.path.stat().st_size < shard.end_bytes:
                    raise InputError(f"{shard.path}: truncated: {shard.path.stat().st_size} of {shard.end_bytes} bytes")
            for shard in {source.shards[0], source.shards[-1]}:
                count = min(shard.tokens, 64)
                pool.read(shard, np.array([0, shard.tokens - count]), count)
        pool.close()
    except (AirHpcError, OSError) as exc:
        return CheckResult("data", False, f"{exc}")
    tokens = sum(s.tokens for s in found.sources)
    shards = sum(len(s.shards) for s in found.sources)
    return CheckResult("data", True, f"{shards} shard(s) readable ({tokens} tokens)")


def gpu_memories() -> tuple[int, ...]:
    """Total memory of each visible GPU, in bytes."""
    import torch

    return tuple(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))


def read_ibstat() -> str | None:
    """``ibstat``'s output, or None where it is not installed; a failing ibstat is a failing node."""
    exe = shutil.which("ibstat")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe], capture_output=True, text=True, timeout=IBSTAT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        log.error("ibstat did not answer in %d s; counting no port as up", IBSTAT_TIMEOUT_S)
        return ""
    if done.returncode != 0:
        log.warning("ibstat exited %d: %s", done.returncode, done.stderr.strip())
    return done.stdout


def run_preflight(
    job: JobConfig,
    host: str,
    *,
    probe_gpus: Callable[[], Sequence[int]] = gpu_memories,
    probe_ibstat: Callable[[], str | None] = read_ibstat,
) -> PreflightReport:
    """Run every check that applies to this job's hardware."""
    checks = []
    hw = job.hardware
    if hw.device == "cuda":
        checks.append(check_gpus(probe_gpus(), job.resources.tasks_per_node, hw.gpu_mem_gb))
    if hw.hcas:
        checks.append(check_ib(probe_ibstat(), hw.hcas, job.health.min_ib_rate_gbps))
    checks.append(check_checkpoint_dir(RunDir.of(job).checkpoints, job.health.min_free_disk_gb))
    checks.append(check_data(job.data))
    return PreflightReport(host, tuple(checks))


def publish(report: PreflightReport, generation_dir: Path) -> None:
    """Share which checks failed on this node, so failing nodes can tell a bad node from bad storage."""
    path = generation_dir / f"{PREFLIGHT_PREFIX}{report.host}.json"
    text = json.dumps({"host": report.host, "failed": sorted(c.name for c in report.failures)})
    atomic_write(path, text, durable=False, tmp=path.with_name(f".{path.name}.{os.getpid()}.tmp"))


def read_published(generation_dir: Path) -> dict[str, frozenset[str]]:
    """Host -> names of the checks that failed there, for every node that has published."""
    published = {}
    for path in generation_dir.glob(f"{PREFLIGHT_PREFIX}*.json"):
        try:
            raw = json.loads(path.read_text())
            published[str(raw["host"])] = frozenset(str(name) for name in raw["failed"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return published


def blames_node(report: PreflightReport, published: dict[str, frozenset[str]]) -> bool:
    """Whether the failure is this node's: a node-local check failed, or another node passed the shared ones."""
    failed = {c.name for c in report.failures}
    if failed - SHARED_CHECKS:
        return True
    return any(host != report.host and not (names & failed) for host, names in published.items())


def enforce(
    report: PreflightReport, run_dir: RunDir, generation_dir: Path, rank: int, peer_wait_s: float = PEER_WAIT_S
) -> None:
    """Publish the report; on failure decide whose fault it is, record it and raise.

    A node-local failure (GPUs, InfiniBand) blames this node at once. A failed
    shared-storage check (checkpoint directory, data) blames it only when
    another node passes that check within ``peer_wait_s``; otherwise the
    storage is broken for everyone: blaming nodes would exclude them all, and a
    requeue would not help, so it is an ordinary failure naming the path.
    """
    publish(report, generation_dir)
    if report.ok:
        log.info("%s", report.summary())
        return
    message = report.summary()
    log.error("%s", message)
    deadline = time.monotonic() + peer_wait_s
    while not blames_node(report, read_published(generation_dir)):
        if time.monotonic() >= deadline:
            write_exit_code(generation_dir, ExitCode.FAILURE)
            raise SharedStorageError(
                f"{message}; no other node passed these checks within {peer_wait_s:g} s, so the shared storage "
                "is at fault, not this node: fix it and resubmit"
            )
        time.sleep(0.2)
    added = append_bad_nodes(run_dir.bad_nodes, [report.host], f"unhealthy: {message}")
    if added:
        EventLog(run_dir.events).emit(
            Unhealthy(node=report.host, rank=rank, failed={c.name: c.detail for c in report.failures})
        )
    write_exit_code(generation_dir, ExitCode.UNHEALTHY)
    raise UnhealthyNodeError(message)
