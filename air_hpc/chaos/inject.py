"""One injector per fault kind; each strikes the job once and says what it hit.

Processes are signalled only after proving they belong to the job: a rank is a
process whose environment names this job id and a task rank, and whose parent is
``slurmstepd`` (a task) or, for the ranks of a running step, whose PID its heartbeat
names (a warm standby forks its node's ranks); it is remembered by PID and start time
and checked again right before the signal, so a recycled PID is never hit.
"""

import logging
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psutil

from air_hpc.errors import AirHpcError, UserError
from air_hpc.health.heartbeat import Beat, read_beats
from air_hpc.records.rundir import RunDir
from air_hpc.slurm import hostlist
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.cluster import SINFO_ARGS, parse_sinfo_groups
from air_hpc.slurm.env import SlurmEnv
from air_hpc.testbed.conf import URGENT_PARTITION

log = logging.getLogger(__name__)

#: Heartbeat phases of a rank inside a save.
SAVE_PHASES = frozenset({"save", "sync_save"})


class InjectionError(AirHpcError):
    """A fault could not be injected (the job's processes were gone, no save started in time)."""


@dataclass(frozen=True)
class RankProcess:
    rank: int
    pid: int
    create_time: float
    node: str

    def signal(self, signum: int) -> None:
        """Signal it only if the PID still names the same process (same start time)."""
        try:
            proc = psutil.Process(self.pid)
            if proc.create_time() != self.create_time:
                raise InjectionError(f"rank {self.rank}: PID {self.pid} now belongs to another process")
            proc.send_signal(signum)
        except psutil.NoSuchProcess as exc:
            raise InjectionError(f"rank {self.rank}: PID {self.pid} is gone") from exc


class NodeControl(Protocol):
    """Power a testbed node off and on (:class:`air_hpc.testbed.Testbed`)."""

    def kill_node(self, name: str) -> list[int]: ...

    def restart_node(self, name: str, timeout_s: float = 60.0) -> None: ...


@dataclass(frozen=True)
class Target:
    job_id: str
    run_dir: RunDir
    client: SlurmClient
    signal: str
    """resilience.signal, e.g. ``USR2``."""
    nodes: int
    rng: random.Random
    node_control: NodeControl | None = None
    killed: list[str] = field(default_factory=list)
    """Nodes ``node-kill`` powered off, for the campaign to bring back when it ends."""
    stopped: list[RankProcess] = field(default_factory=list)
    """Ranks ``hang`` or ``straggler`` stopped (SIGSTOP), for the campaign to continue when it ends, however it ends."""


def stop(target: Target, rank: RankProcess) -> None:
    """SIGSTOP ``rank``, remembered first, so that an interrupt right after it still finds the rank to continue."""
    target.stopped.append(rank)
    rank.signal(signal.SIGSTOP)


def continue_stopped(target: Target) -> int:
    """SIGCONT every rank the campaign stopped that still runs (same PID and start time); how many were."""
    continued = 0
    while target.stopped:
        rank = target.stopped.pop()
        try:
            rank.signal(signal.SIGCONT)
            continued += 1
        except InjectionError:  # it ended (a requeue killed it): nothing to continue
            continue
    return continued


def rank_processes(job_id: str, run_dir: RunDir | None = None) -> list[RankProcess]:
    """The job's rank processes on this machine, by rank (the testbed's nodes all run here).

    With ``run_dir``, only the ranks of the running training step, by the PIDs of its newest heartbeats: a job
    with in-memory snapshots or hot spares has other tasks too (a snapshot holder per node, warm standby ranks),
    and striking one of those tests nothing the fault means to test.
    """
    beats = _step_beats(run_dir) if run_dir is not None else None
    found = []
    for proc in psutil.process_iter(["pid", "create_time", "ppid"]):
        try:
            if beats is not None and proc.info["pid"] not in beats:
                continue
            slurm = SlurmEnv.from_environ(proc.environ())
            if slurm.job_id != job_id or slurm.step_id is None or slurm.procid is None:
                continue
            if beats is None and psutil.Process(proc.info["ppid"]).name() != "slurmstepd":
                continue
            rank = beats[proc.info["pid"]].rank if beats is not None else slurm.procid
            found.append(RankProcess(rank, proc.info["pid"], proc.info["create_time"], slurm.nodename or "?"))
        except (psutil.Error, OSError, AirHpcError):  # gone, not ours, or not a task's environment
            continue
    return sorted(found, key=lambda r: r.rank)


def _step_beats(run_dir: RunDir) -> dict[int, Beat]:
    """PID -> beat of the ranks of the newest training step (the generation whose beat was written last)."""
    newest: tuple[float, dict[int, Beat]] = (0.0, {})
    try:
        generations = [d for d in run_dir.heartbeat.iterdir() if d.is_dir()]
    except OSError:
        return {}
    for directory in generations:
        beats = read_beats(directory)
        latest = max((b.time_s for b in beats.values()), default=0.0)
        if beats and latest > newest[0]:
            newest = (latest, beats)
    return {beat.pid: beat for beat in newest[1].values()}


def _pick_rank(target: Target) -> RankProcess:
    ranks = rank_processes(target.job_id, target.run_dir)
    if not ranks:
        raise InjectionError(f"job {target.job_id}: no rank process running")
    return target.rng.choice(ranks)


def _describe(rank: RankProcess) -> str:
    return f"rank {rank.rank} pid {rank.pid} on {rank.node}"


def preempt(target: Target) -> str:
    """What Slurm does before a time limit or a preemption: the configured signal to the batch shell."""
    target.client.scancel(target.job_id, signal=target.signal, batch=True)
    return f"job {target.job_id} batch shell SIG{target.signal}"


def slurm_preempt(target: Target) -> str:
    """A short job in the urgent partition takes the job's nodes; Slurm preempts (signals, requeues) the job."""
    status = target.client.job_status(target.job_id)
    if status is None or not status.nodelist:
        raise InjectionError(f"job {target.job_id}: no nodes to preempt")
    options = [f"--partition={URGENT_PARTITION}", f"--nodelist={status.nodelist}", "--exclusive", "--output=/dev/null"]
    blocker = target.client.sbatch_wrap("sleep 1", options)
    return f"job {blocker} in {URGENT_PARTITION} on {status.nodelist}"


def rank_kill(target: Target) -> str:
    rank = _pick_rank(target)
    rank.signal(signal.SIGKILL)
    return f"SIGKILL {_describe(rank)}"


def hang(target: Target) -> str:
    """Freeze one rank (SIGSTOP): the others block in its collectives until the watchdog fires."""
    rank = _pick_rank(target)
    stop(target, rank)
    return f"SIGSTOP {_describe(rank)}"


def straggler(target: Target, cycles: int = 6, stopped_s: float = 0.5, running_s: float = 0.5) -> str:
    """Slow one rank down without stopping it: SIGSTOP/SIGCONT at a fixed duty cycle, ending running."""
    rank = _pick_rank(target)
    try:
        for _ in range(cycles):
            stop(target, rank)
            time.sleep(stopped_s)
            rank.signal(signal.SIGCONT)
            target.stopped.remove(rank)
            time.sleep(running_s)
    except InjectionError:
        log.info("straggler: %s ended during the duty cycle", _describe(rank))
    return f"SIGSTOP/SIGCONT x{cycles} ({stopped_s:g}s/{running_s:g}s) {_describe(rank)}"


def ckpt_kill(target: Target, timeout_s: float = 5.0, poll_s: float = 0.02) -> str:
    """SIGKILL a rank while a checkpoint is being written (a ``.tmp-step_*`` staging directory exists).

    Waits a few seconds for a save to start; the campaign tries again while the run has training left.
    """
    deadline = time.monotonic() + timeout_s
    while not _saving(target.run_dir.checkpoints):
        if time.monotonic() > deadline:
            raise InjectionError(f"no checkpoint save started within {timeout_s:g} s")
        time.sleep(poll_s)
    rank = _pick_rank(target)
    rank.signal(signal.SIGKILL)
    return f"SIGKILL {_describe(rank)} during a save"


def ckpt_hang(target: Target, timeout_s: float = 5.0, poll_s: float = 0.005) -> str:
    """Freeze (SIGSTOP) a rank inside a save: its heartbeat names a save phase before and after the stop.

    A phase change is always written to the beat file, so a file that still says a save once the rank is
    stopped proves where it froze; a rank that left the save just before is continued and another save awaited.
    Only beat files are read while waiting (a save's blocking part may last a few milliseconds); the running
    step's ranks are listed once, and again when a beat names a process not in the list (a restart). Only its
    ranks: by task ID alone a snapshot holder or a warm standby would stand for a rank, and no save would match.
    """
    deadline = time.monotonic() + timeout_s
    ranks = {r.rank: r for r in rank_processes(target.job_id, target.run_dir)}
    while time.monotonic() < deadline:
        saving = _beats_saving(target.run_dir)
        if any(ranks.get(rank) is None or ranks[rank].pid != pid for rank, (pid, _) in saving.items()):
            ranks = {r.rank: r for r in rank_processes(target.job_id, target.run_dir)}
        candidates = sorted(r for r, (pid, _) in saving.items() if r in ranks and ranks[r].pid == pid)
        if candidates:
            rank = ranks[target.rng.choice(candidates)]
            stop(target, rank)
            now = _beats_saving(target.run_dir).get(rank.rank)
            if now is not None and now[0] == rank.pid:
                return f"SIGSTOP {_describe(rank)} during the save of step {now[1]}"
            rank.signal(signal.SIGCONT)
            target.stopped.remove(rank)
        time.sleep(poll_s)
    raise InjectionError(f"no rank was inside a save within {timeout_s:g} s")


def _beats_saving(run_dir: RunDir) -> dict[int, tuple[int, int]]:
    """Rank -> (PID, step) of each rank of the running step whose newest beat is a save.

    The running step is the generation whose beat was written last: a directory's own time is no guide, since
    the start's directory and a warm standby's change beside it.
    """
    return {b.rank: (b.pid, b.step) for b in _step_beats(run_dir).values() if b.phase in SAVE_PHASES}


def _saving(checkpoints: Path) -> bool:
    return checkpoints.is_dir() and any(p.name.startswith(".tmp-step_") for p in checkpoints.iterdir())


def node_kill(target: Target) -> str:
    """Power loss on a node running ranks other than the batch host: its slurmd and every process it started die."""
    if target.node_control is None:
        raise InjectionError("node-kill needs the testbed's node control")
    status = target.client.job_status(target.job_id)
    hosts = hostlist.expand(status.nodelist, "the job's node list") if status and status.nodelist else []
    # Slurm runs the batch shell on the allocation's first node; an idle spare's death would test nothing.
    training = sorted({r.node for r in rank_processes(target.job_id, target.run_dir)} - set(hosts[:1]))
    if not training:
        raise InjectionError(f"job {target.job_id}: no node running ranks beside the batch host ({hosts or 'none'})")
    node = target.rng.choice(training)
    pids = target.node_control.kill_node(node)
    target.killed.append(node)
    return f"node {node}: slurmd and {len(pids) - 1} process(es) it started killed"


INJECTORS: dict[str, Callable[[Target], str]] = {
    "node-kill": node_kill,
    "preempt": preempt,
    "slurm-preempt": slurm_preempt,
    "rank-kill": rank_kill,
    "hang": hang,
    "straggler": straggler,
    "ckpt-kill": ckpt_kill,
    "ckpt-hang": ckpt_hang,
}


def check_cluster(kinds: tuple[str, ...], client: SlurmClient) -> None:
    """Refuse kinds the running cluster cannot host (slurm-preempt needs the urgent partition)."""
    if "slurm-preempt" not in kinds:
        return
    partitions = sorted(parse_sinfo_groups(client.run(list(SINFO_ARGS)).stdout))
    if URGENT_PARTITION not in partitions:
        raise UserError(
            f"--faults slurm-preempt: unsupported on this testbed (no {URGENT_PARTITION!r} partition; "
            f"it has {', '.join(partitions) or 'none'})"
        )
