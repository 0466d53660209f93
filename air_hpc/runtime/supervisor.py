"""The in-job supervisor: runs the training step, ends it when a node dies, restarts it on a hot spare.

The batch script of every job runs ``python -m air_hpc.runtime.supervisor RUN_DIR -- srun ARGS...``
in place of the bare ``srun``. The allocation holds the training nodes plus
the spares (``resources.spare_nodes``, often none). When a step fails because
of a node (a rank crashed, the node died, the watchdog found it hung), that
node goes on the run's bad-node list, the nearest spare in the topology takes
its ranks, and the step starts again inside the same job; the ranks resume
from the latest verified checkpoint as on any start. When no spare is left the
supervisor hands a requeue-worthy exit code back to the batch script, which
requeues excluding the bad nodes (the existing path); with in-memory snapshots
(``checkpoint.memory_interval_steps``) a crashed rank on a live node restarts the
step on the same nodes instead, since a requeue would end the snapshot holders.

Without spares only a dead node is blamed: ``srun`` would wait for slurmctld
to time the node out (SlurmdTimeout), and Slurm would then requeue the job
itself still pinned to that node; the probe's verdict ends ``srun`` in seconds
and the batch script requeues without the node. A crashed rank on a live node
goes back unchanged, for the batch script to requeue as ``crashed``.

Why each check:

- ``srun --kill-on-bad-exit`` names the first failed task on stderr
  (``srun: error: n2: task 3: Killed``): that node failed, unless a probe finds
  another node dead (a dead node's ranks report nothing; the survivors fail first).
- ``srun`` cannot finish a step while one of its nodes is dead: after a task
  failed, every node of the step is probed with a tiny ``srun --overlap``; a
  node that does not answer in time (``runtime.probe``: a few times the live nodes' answer, at
  most :data:`PROBE_TIMEOUT_S`) is dead, and ``srun`` is
  ended instead of waiting for Slurm to time the node out.
- A step where no rank beats for the backstop time (every process frozen, or
  the filesystem gone) is stopped as hung: the backstop to the ranks' own watchdogs.

With spares, warm standby ranks (``runtime.standby``: one ``srun`` per healthy node, started with
the step, interpreter started and torch/megatron-core imported at the lowest priority) wait beside
it; a restart promotes them instead of starting a new ``srun`` (``resilience.warm_standby``), which
saves the start's interpreter and imports, most of a restart.

A stop signal (preemption, time limit) is forwarded to ``srun``; the step then
saves and exits with its requeue code, which goes back to the batch script:
no in-job restart after a stop. Every step start and end is an event.
"""

import contextlib
import ctypes
import functools
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

from air_hpc.config.models import JobConfig
from air_hpc.errors import AirHpcError, TopologyError
from air_hpc.exitcodes import REQUEUE_WORTHY, ExitCode
from air_hpc.health.badnodes import append_bad_nodes, read_bad_nodes
from air_hpc.ownership.attempts import fence_settled
from air_hpc.records.events import (
    EventLog,
    InJobRestart,
    NodeDead,
    Payload,
    SparesExhausted,
    StepEnded,
    StepStarted,
)
from air_hpc.records.files import atomic_write, remove_tree, touch
from air_hpc.records.generation import (
    STEP_ATTEMPT_ENV,
    generation,
    generation_dir,
    read_exit_code,
    start_hostfile,
    write_exit_code,
)
from air_hpc.records.names import ARMED_FILE_PREFIX, BEAT_GLOB, STOP_REQUESTED_FILE, SUPERVISOR_ARMED_FILE
from air_hpc.records.rundir import RunDir
from air_hpc.runtime.probe import PROBE_TIMEOUT_S, probe_dead
from air_hpc.runtime.rendezvous import free_port_from
from air_hpc.runtime.snapholders import SOCKET_DIR_ENV, Holders, holder_dir
from air_hpc.runtime.standby import STANDBY_ENV, write_go
from air_hpc.runtime.step_group import StepGroup, StepProcess
from air_hpc.runtime.stop_signals import STOP_SIGNALS
from air_hpc.slurm import env as slurm_env
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.env import SlurmEnv
from air_hpc.slurm.hostlist import compress
from air_hpc.topology import files
from air_hpc.topology.blocks import aggregate_fabric
from air_hpc.topology.fabric import Fabric
from air_hpc.topology.request import place_in_allocation
from air_hpc.topology.select import pick_spare
from air_hpc.topology.treeconf import BlockTopology

log = logging.getLogger(__name__)

#: After the backstop's SIGTERM, ``srun`` gets this long before SIGKILL.
STOP_GRACE_S = 30.0
#: A standby ``srun`` no longer needed gets this long to end before SIGKILL (a dead node's never ends by itself).
RETIRED_GRACE_S = 5.0
#: How often the supervisor looks at the step and its stderr: a stop or a dead node is passed on within this.
POLL_S = 0.05
#: How often it reads the ranks' heartbeat files (one stat per rank: cheap here, not on a shared filesystem).
STALE_CHECK_S = 1.0

_TASK_FAILURE = re.compile(r"^srun: error: (?P<node>[^\s:]+): tasks? (?P<tasks>[0-9,\-]+): (?P<reason>.+?)\s*$")


@dataclass(frozen=True)
class TaskFailure:
    """What ``srun`` says about a task that ended badly."""

    node: str
    tasks: str
    reason: str


def parse_task_failure(line: str) -> TaskFailure | None:
    """``srun: error: n2: task 3: Killed`` -> TaskFailure('n2', '3', 'Killed'); other lines -> None."""
    match = _TASK_FAILURE.match(line)
    return TaskFailure(match["node"], match["tasks"], match["reason"]) if match else None


@dataclass(frozen=True)
class StepResult:
    srun_exit_code: int
    verdict: int | None
    """The exit code the ranks agreed on (``<generation>/exit_code``), if they wrote one."""
    first_failure: TaskFailure | None
    dead_nodes: tuple[str, ...]
    hung: bool
    """The supervisor's backstop stopped the step."""

    @property
    def exit_code(self) -> int:
        """The ranks' verdict wins over srun's own code (srun reports the signal it killed the others with)."""
        if self.srun_exit_code != ExitCode.OK and self.verdict is not None:
            return self.verdict
        return self.srun_exit_code


def failed_nodes(
    result: StepResult, hosts: Sequence[str], newly_bad: Iterable[str], with_spares: bool = True
) -> tuple[str, ...]:
    """The step's nodes to replace: dead ones, else those the ranks listed as bad, else the first failed task's.

    Without spares only a dead node is blamed: a crashed rank's node is as good as any other for the
    requeue (the batch script's ``crashed`` path), while a dead one would stall it.
    """
    on_step = set(hosts)
    if result.dead_nodes or not with_spares:
        return tuple(n for n in result.dead_nodes if n in on_step)
    listed = tuple(n for n in newly_bad if n in on_step)
    if listed:
        return listed
    if result.first_failure is not None and result.verdict is None and result.first_failure.node in on_step:
        return (result.first_failure.node,)
    return ()


def replace_nodes(
    rank_hosts: Sequence[str],
    failed: Sequence[str],
    spares: Sequence[str],
    fabric: Fabric | None,
    domain_nodes: int = 1,
) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, str]]:
    """Move each failed node's ranks to its nearest spare, every other rank keeps its place.

    Returns the new rank order, the spares left, and failed -> spare.
    """
    left = list(spares)
    moved: dict[str, str] = {}
    for node in failed:
        spare = pick_spare(fabric, node, left, domain_nodes)
        left.remove(spare)
        moved[node] = spare
    return tuple(moved.get(h, h) for h in rank_hosts), tuple(left), moved


def restartable(code: int, stopping: bool) -> bool:
    """A failed step restarts in the job unless a stop was asked for, the ranks saved to requeue, or input is bad."""
    return not stopping and code not in (ExitCode.OK, ExitCode.REQUEUE, ExitCode.USAGE)


def exhausted_code(code: int) -> int:
    """With no spare left, a node failure requeues (excluding the node) like a hang or a failed health check."""
    return code if code in REQUEUE_WORTHY else int(ExitCode.UNHEALTHY)


def block_order(allocated: Sequence[str], bad: Iterable[str], nodes: int, tasks_per_node: int) -> tuple[str, ...]:
    """Ranks on the first ``nodes`` healthy allocated nodes in Slurm's block order, when no placement pinned them."""
    healthy = [n for n in allocated if n not in set(bad)]
    return tuple(n for n in healthy[:nodes] for _ in range(tasks_per_node))


def unpinned_order(
    job: JobConfig, blocks: BlockTopology | None, allocated: Sequence[str], bad: Iterable[str]
) -> tuple[str, ...]:
    """The rank order on nodes Slurm chose: on a block topology each TP group inside one block, else Slurm's order.

    A block job is left unpinned where the release refuses its node list beside
    ``--segment`` (25.05); its placement is made here, on the allocation.
    """
    bad = set(bad)
    placed = place_in_allocation(job, blocks, allocated, bad) if blocks is not None else None
    return placed or block_order(allocated, bad, job.resources.nodes, job.resources.tasks_per_node)


def hang_backstop_s(job: JobConfig) -> int:
    """Twice the longest phase limit: well past the moment every working watchdog has fired."""
    h = job.health
    return 2 * max(h.heartbeat_setup_s, h.heartbeat_step_s, h.heartbeat_checkpoint_s)


def unique(hosts: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(hosts))


def standby_argv(srun_argv: Sequence[str], node: str, tasks_per_node: int) -> list[str]:
    """The step's ``srun`` as one node's warm standby (``runtime.standby``) beside the step: one task with the CPUs
    of the node's rank slots, which forks the ranks."""
    placement = ("--ntasks=", "--distribution=", "--nodes=", "--nodelist=", "--cpus-per-task=")
    rest = [a for a in srun_argv[1:] if not a.startswith(placement)]
    cpus = [a.removeprefix("--cpus-per-task=") for a in srun_argv[1:] if a.startswith("--cpus-per-task=")]
    per_task = [f"--cpus-per-task={int(cpus[-1]) * tasks_per_node}"] if cpus and cpus[-1].isdigit() else []
    return [srun_argv[0], "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={node}", *per_task, *rest]


@dataclass
class _Standby:
    """Warm standby ranks waiting to become the step of ``attempt``."""

    attempt: int
    directory: Path
    group: StepGroup
    retired: list["subprocess.Popen[str]"] = field(default_factory=list)


class Supervisor:
    """Starts the step on the rank hosts, watches it, restarts it on spares; see the module docstring."""

    def __init__(
        self,
        job: JobConfig,
        run_dir: RunDir,
        srun_argv: Sequence[str],
        environ: Mapping[str, str],
        client: SlurmClient,
        fabric: Fabric | None = None,
        probe: Callable[[Sequence[str]], tuple[str, ...]] | None = None,
        blocks: BlockTopology | None = None,
    ) -> None:
        """``probe`` returns the given hosts that are dead (default: :meth:`probe_dead`, a tiny srun on each);
        ``blocks`` is the cluster's block topology, for the rank order of a job Slurm placed itself."""
        self.job = job
        self.run_dir = run_dir
        self.srun_argv = tuple(srun_argv)
        self.environ = dict(environ)
        self.client = client
        self.fabric = fabric
        self.blocks = blocks
        self.slurm = SlurmEnv.from_environ(self.environ)
        self.job_id = self.slurm.job_id or ""
        self.restart_count = self.slurm.restart_count
        record_id = self.slurm.run_job_id or ""
        self.events = EventLog(run_dir.events, {"job_id": record_id, "restart_count": self.restart_count})
        job_start = {k: v for k, v in environ.items() if k != STEP_ATTEMPT_ENV}
        self.start_dir = generation_dir(run_dir, generation(job_start))
        self.hostfile = self.slurm.hostfile or start_hostfile(self.start_dir)
        self.backstop_s = hang_backstop_s(job)
        self.probe = probe or self.probe_dead
        self._signum: int | None = None
        self._proc: StepProcess | None = None
        self._standby: _Standby | None = None
        self._retired: list[subprocess.Popen[str]] = []
        self._in_place = 0
        """In-place restarts of this start so far, which ``resilience.max_restarts`` bounds (moves to spares are
        bounded by the spares)."""
        self._next: tuple[int, tuple[str, ...], bool] = (1, (), False)
        """The attempt a standby would serve, the nodes it would start on (the step's and the spares), and
        whether a restart is left: a spare, or an in-place restart from the snapshots (without either, a failure
        requeues and no standby is wanted)."""

    # ---- signals -----------------------------------------------------------------

    def install_signals(self) -> None:
        """Handle the stop signals, tell the batch shell so, then take a stop it recorded before.

        The batch shell's protocol for the ranks, with the supervisor in their place: the shell
        records a stop before it counts armed announcements, the supervisor announces before it
        looks for the record, so either the shell forwards the signal or the supervisor finds it.
        """
        names = {self.job.resilience.signal, *STOP_SIGNALS}
        for name in names:
            signal.signal(getattr(signal, f"SIG{name}"), self._on_signal)
        self.start_dir.mkdir(parents=True, exist_ok=True)
        touch(self.start_dir / SUPERVISOR_ARMED_FILE)
        if (self.start_dir / STOP_REQUESTED_FILE).exists():
            log.warning("a stop was requested before the supervisor was armed")
            self._signum = int(getattr(signal, f"SIG{self.job.resilience.signal}"))

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Only flag: the watch loop passes the stop on to the step, whose exit code decides what follows."""
        self._signum = signum

    @property
    def stopping(self) -> bool:
        return self._signum is not None

    def _pass_on_stop(self, gen_dir: Path) -> None:
        """Record the stop for the ranks of this step, then signal them if every rank is armed (else they read it)."""
        signum = self._signum
        proc = self._proc
        if signum is None or proc is None or proc.poll() is not None:
            return
        gen_dir.mkdir(parents=True, exist_ok=True)
        touch(gen_dir / STOP_REQUESTED_FILE)
        armed = len(list(gen_dir.glob(f"{ARMED_FILE_PREFIX}*")))
        if armed >= self.job.resources.world_size:
            log.warning("stop signal %d: forwarding it to the step", signum)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)
        else:
            log.warning("stop signal %d while the ranks start: they read the stop once armed", signum)

    # ---- the loop ----------------------------------------------------------------

    def run(self) -> int:
        res = self.job.resources
        allocated = self.slurm.nodelist
        bad = read_bad_nodes(self.run_dir.bad_nodes)
        if self.hostfile.is_file() and self.slurm.hostfile is not None:
            rank_hosts = tuple(line.strip() for line in self.hostfile.read_text().splitlines() if line.strip())
        else:
            rank_hosts = unpinned_order(self.job, self.blocks, allocated, bad)
        spares = tuple(n for n in allocated if n not in set(rank_hosts) and n not in set(bad))
        attempt = 0
        holders = self._start_holders((*unique(rank_hosts), *spares))
        try:
            while True:
                if self.stopping:
                    log.warning("stop requested before the next step started; handing the requeue to the batch script")
                    return int(ExitCode.REQUEUE)
                result = self._run_step(attempt, rank_hosts, spares)
                code = result.exit_code
                if not restartable(code, self.stopping):
                    return code
                hosts = unique(rank_hosts)
                newly_bad = [n for n in read_bad_nodes(self.run_dir.bad_nodes) if n not in set(bad)]
                failed = failed_nodes(result, hosts, newly_bad, with_spares=bool(res.spare_nodes))
                no_spare = not failed or len(failed) > len(spares)
                listed = [n for n in newly_bad if n in set(hosts)]
                if no_spare and self._restarts_in_place(result, listed):
                    attempt += 1
                    self._in_place += 1
                    reason = self._reason(result, code)
                    self._emit(InJobRestart(attempt=attempt, replaced={}, reason=reason, spares_left=list(spares)))
                    log.warning("%s; restarting the step on the same nodes from the in-memory snapshots", reason)
                    continue
                if not failed:
                    log.warning("step exited %d without a node to blame; handing it to the batch script", code)
                    return code
                reason = self._reason(result, code)
                append_bad_nodes(self.run_dir.bad_nodes, failed, reason)
                bad = read_bad_nodes(self.run_dir.bad_nodes)
                if result.dead_nodes:
                    self._emit(NodeDead(nodes=list(failed)))
                if len(failed) > len(spares):
                    if res.spare_nodes:
                        self._emit(SparesExhausted(failed=list(failed), spares=list(spares), exit_code=code))
                    log.warning("no spare left for %s; requeueing without it", compress(failed))
                    return exhausted_code(code)
                domain = self.job.hardware.nvlink_domain_nodes
                rank_hosts, spares, moved = replace_nodes(rank_hosts, failed, spares, self.fabric, domain)
                attempt += 1
                self._emit(InJobRestart(attempt=attempt, replaced=moved, reason=reason, spares_left=list(spares)))
                swaps = ", ".join(f"{a} -> {b}" for a, b in moved.items())
                log.warning("%s; restarting the step with %s", reason, swaps)
        finally:
            self._end_step()
            if holders is not None:
                holders.stop()

    def _restarts_in_place(self, result: StepResult, newly_bad: Sequence[str] = ()) -> bool:
        """A rank crashed on a live node and the snapshot holders keep the state: restart on the same nodes.

        Taken where no spare is left to move to (none configured, or all used by earlier restarts of this
        start): a requeue would end the holders and go back to the persistent checkpoint. Only a crash (not a
        hang, whose node may be at fault, nor a node the ranks listed as bad), at most
        ``resilience.max_restarts`` times a start (a crash loop stops there), however many spares were taken before.
        """
        if not self._in_place_left():
            return False
        crashed = result.first_failure is not None and result.verdict is None
        return crashed and not result.dead_nodes and not result.hung and not newly_bad

    def _in_place_left(self) -> bool:
        """Whether the step may still be restarted in place (snapshots on, max_restarts not reached)."""
        return bool(self.job.checkpoint.memory_interval_steps) and self._in_place < self.job.resilience.max_restarts

    def _start_holders(self, nodes: Sequence[str]) -> Holders | None:
        """The per-node snapshot holders of ``checkpoint.memory_interval_steps`` (spares too), or None when off."""
        if not self.job.checkpoint.memory_interval_steps:
            return None
        directory = holder_dir(self.job_id, self.restart_count)
        holders = Holders(self.client, self.job_id, directory, self.run_dir.logs)
        holders.start(nodes)
        self.environ[SOCKET_DIR_ENV] = str(directory)
        return holders

    def _run_step(self, attempt: int, rank_hosts: Sequence[str], spares: Sequence[str]) -> StepResult:
        env = self._step_env(attempt, rank_hosts)
        gen_dir = generation_dir(self.run_dir, generation(env))
        hosts = unique(rank_hosts)
        started = time.time()
        failures: list[TaskFailure] = []
        warm = self._promote(attempt, env, hosts, failures)
        self._emit(
            StepStarted(
                attempt=attempt, generation=gen_dir.name, nodes=compress(hosts), spares=list(spares), warm=bool(warm)
            )
        )
        proc, join_readers = warm or self._start_srun(attempt, env, failures)
        self._proc = proc
        self._next = (attempt + 1, (*hosts, *spares), bool(spares) or self._in_place_left())
        self._start_standby()
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="probe")
        try:
            rc, probing, hung = self._watch(proc, gen_dir, hosts, failures, pool)
            join_readers(5.0)
            self._proc = None
            dead = self._dead_after(rc, hosts, failures, probing)
        finally:
            pool.shutdown(wait=False)  # a probe no longer needed ends by its own timeout
        result = StepResult(rc, read_exit_code(gen_dir), failures[0] if failures else None, dead, hung)
        self._emit(
            StepEnded(
                attempt=attempt,
                exit_code=result.exit_code,
                srun_exit_code=rc,
                verdict=result.verdict,
                failure=None if result.first_failure is None else vars(result.first_failure),
                dead_nodes=list(dead),
                elapsed_s=round(time.time() - started, 3),
            )
        )
        return result

    def _start_srun(
        self, attempt: int, env: Mapping[str, str], failures: list[TaskFailure]
    ) -> tuple[StepProcess, Callable[[float], None]]:
        """A new ``srun`` for the step (and a function that waits for its stderr's end)."""
        argv = list(self.srun_argv)
        if attempt and argv and Path(argv[0]).name == "srun":
            # The failed step may hold the healthy nodes' CPUs until Slurm hears from a dead node.
            argv.insert(1, "--overlap")
        proc = subprocess.Popen(
            argv, env=dict(env), stderr=subprocess.PIPE, text=True, errors="replace", preexec_fn=_die_with_parent
        )
        reader = threading.Thread(target=_copy_stderr, args=(proc.stderr, failures), daemon=True)
        reader.start()
        return proc, lambda timeout_s: reader.join(timeout=timeout_s)

    # ---- warm standby ------------------------------------------------------------

    @property
    def warm_standby(self) -> bool:
        """Standbys serve in-job restarts, which need spares, of a real ``srun`` step."""
        res = self.job.resources
        return bool(self.job.resilience.warm_standby and res.spare_nodes and Path(self.srun_argv[0]).name == "srun")

    def _start_standby(self) -> None:
        """Start the standbys for the next attempt on the step's nodes and the spares, as the step starts: their
        imports run at the lowest priority (``runtime.standby``), so they take only what the step leaves idle,
        and a fault soon after a start or a restart finds them further on."""
        if not self.warm_standby or self._standby is not None or self.stopping:
            return
        attempt, nodes, restart_left = self._next
        if not restart_left:
            return
        directory = self.start_dir / f"standby-{attempt}"
        remove_tree(directory)
        directory.mkdir(parents=True)
        env = {k: v for k, v in self.environ.items() if k not in (slurm_env.HOSTFILE, "SLURM_DISTRIBUTION")}
        env[STANDBY_ENV] = str(directory)
        tasks = self.job.resources.tasks_per_node
        procs = {
            node: subprocess.Popen(
                standby_argv(self.srun_argv, node, tasks),
                env=env,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
                preexec_fn=_die_with_parent,
            )
            for node in nodes
        }
        self._standby = _Standby(attempt, directory, StepGroup(procs, _pass_through))
        log.info("warm standby for step attempt %d started on %s", attempt, compress(nodes))

    def _promote(
        self, attempt: int, env: Mapping[str, str], hosts: Sequence[str], failures: list[TaskFailure]
    ) -> tuple[StepProcess, Callable[[float], None]] | None:
        """The standby made the step of ``attempt`` (told to go), or None when there is none ready on every host."""
        standby, self._standby = self._standby, None
        if standby is None:
            return None
        if standby.attempt != attempt or not all(standby.group.alive(h) for h in hosts):
            log.warning("warm standby not usable for attempt %d; starting a new srun", attempt)
            self._retired += standby.group.keep(set())
            return None
        self._retired += standby.group.keep(set(hosts))
        standby.group.listen(functools.partial(_note_line, failures))
        go = {k: env[k] for k in (STEP_ATTEMPT_ENV, slurm_env.HOSTFILE, "MASTER_ADDR", "MASTER_PORT") if k in env}
        write_go(standby.directory, {**go, slurm_env.NTASKS: str(self.job.resources.world_size)})
        return standby.group, standby.group.join_readers

    def _watch(
        self,
        proc: StepProcess,
        gen_dir: Path,
        hosts: Sequence[str],
        failures: list[TaskFailure],
        pool: ThreadPoolExecutor,
    ) -> tuple[int, "Future[tuple[str, ...]] | None", bool]:
        """Until ``srun`` ends: pass a stop on, probe the nodes once a task failed (ending the step at once when
        one is dead), stop the step when every rank is frozen. Returns srun's code, the probe, whether hung."""
        probing: Future[tuple[str, ...]] | None = None
        hung = passed_on = False
        kill_at: float | None = None
        stale_at = time.monotonic() + STALE_CHECK_S
        while (rc := proc.poll()) is None:
            time.sleep(POLL_S)
            if self.stopping and not passed_on:
                passed_on = True
                self._pass_on_stop(gen_dir)
            if failures and probing is None and not self.stopping:
                probing = pool.submit(self.probe, hosts)  # beside srun's own teardown, not after it
            if probing is not None and probing.done() and probing.result() and kill_at is None:
                log.warning("node(s) %s do not answer; ending the step now", compress(probing.result()))
                kill_at = time.monotonic()  # srun would wait for slurmctld to time the node out
            if not hung and time.monotonic() > stale_at:
                stale_at = time.monotonic() + STALE_CHECK_S
                if self._stale(gen_dir):
                    hung = True
                    log.warning("no rank made progress for %d s; stopping the step as hung", self.backstop_s)
                    write_exit_code(gen_dir, ExitCode.HUNG)
                    proc.terminate()
                    kill_at = time.monotonic() + STOP_GRACE_S
            if kill_at is not None and time.monotonic() >= kill_at:
                proc.kill()
        return (128 - rc if rc < 0 else rc), probing, hung  # killed by a signal: 128 + signal, as a shell says

    def _dead_after(
        self, rc: int, hosts: Sequence[str], failures: Sequence[TaskFailure], probing: "Future[tuple[str, ...]] | None"
    ) -> tuple[str, ...]:
        """The dead nodes of a step that failed. A node whose stepd reported a task's end was alive: when every
        node did, srun's own teardown is the verdict and the probe is not waited for."""
        if not rc or self.stopping:
            return ()
        if probing is None:
            return self.probe(hosts)
        reported = {f.node for f in failures}
        return probing.result() if any(h not in reported for h in hosts) else ()

    def _step_env(self, attempt: int, rank_hosts: Sequence[str]) -> dict[str, str]:
        atomic_write(self.hostfile, "".join(f"{h}\n" for h in rank_hosts), durable=False)
        env = {**self.environ, slurm_env.HOSTFILE: str(self.hostfile), STEP_ATTEMPT_ENV: str(attempt)}
        if "MASTER_ADDR" not in self.job.env:
            env["MASTER_ADDR"] = rank_hosts[0]
        if attempt and "MASTER_PORT" not in self.job.env and self.environ.get("MASTER_PORT"):
            env["MASTER_PORT"] = str(self._restart_port(rank_hosts[0], int(self.environ["MASTER_PORT"])))
        return env

    def _restart_port(self, rank_0_host: str, port: int) -> int:
        """The start's port, replaced where rank 0 runs on this node and something (the killed step's) holds it."""
        here = self.slurm.nodename or socket.gethostname()
        return free_port_from(port) if rank_0_host == here else port

    def _stale(self, gen_dir: Path) -> bool:
        """No rank has beaten for the backstop time (only once some rank has beaten at all)."""
        try:
            newest = max((p.stat().st_mtime for p in gen_dir.glob(BEAT_GLOB)), default=None)
        except OSError:
            return False
        return newest is not None and time.time() - newest > self.backstop_s

    def probe_dead(self, hosts: Sequence[str]) -> tuple[str, ...]:
        """The hosts where a tiny step does not finish in time (at most :data:`PROBE_TIMEOUT_S`)."""
        return probe_dead(self.client, self.job_id, hosts, PROBE_TIMEOUT_S)

    def _end_step(self) -> None:
        """Leave nothing behind: a step or standby still running when the supervisor ends is stopped, then killed."""
        standby, self._standby = self._standby, None
        running = [p for p in (self._proc, standby.group if standby else None) if p is not None]
        for proc in running:
            if proc.poll() is None:
                proc.terminate()
        for proc in running:
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for retired in self._retired:
            try:
                retired.wait(timeout=RETIRED_GRACE_S)
            except subprocess.TimeoutExpired:  # a dead node's srun waits for Slurm to time the node out
                retired.kill()
                retired.wait()

    def _reason(self, result: StepResult, code: int) -> str:
        if result.dead_nodes:
            return f"node death: {compress(result.dead_nodes)} stopped answering Slurm"
        if result.hung or code == ExitCode.HUNG:
            return "hung step (watchdog verdict)"
        if code == ExitCode.UNHEALTHY:
            return "failed health check"
        failure = result.first_failure
        return f"rank crash: task {failure.tasks} on {failure.node}: {failure.reason}" if failure else f"exit {code}"

    def _emit(self, payload: Payload) -> None:
        self.events.emit(payload)


def _copy_stderr(stream: IO[str] | None, failures: list[TaskFailure]) -> None:
    """Pass srun's stderr through to the batch log and remember every failed task, the first one first."""
    if stream is None:
        return
    for line in stream:
        _note_line(failures, line)


def _note_line(failures: list[TaskFailure], line: str) -> None:
    _pass_through(line)
    if (failure := parse_task_failure(line)) is not None:
        failures.append(failure)


def _pass_through(line: str) -> None:
    sys.stderr.write(line)
    sys.stderr.flush()


def _die_with_parent() -> None:
    """In the child before exec: the kernel kills srun if the supervisor itself is killed (PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def load_topology(job: JobConfig) -> tuple[Fabric | None, BlockTopology | None]:
    """The cluster's fabric for topology-aware spare choice, and its blocks when it has some; (None, None) without.

    A topology/block file gives its blocks under Slurm's aggregates: the spare in
    the failed node's block (its NVLink domain) first, then the nearest block's.
    Without a fabric, spares are taken in allocation order.
    """
    topo = job.cluster.topology_file
    if topo is None:
        return None, None
    try:
        topology = files.read_topology(topo.read_text(), str(topo))
    except (OSError, TopologyError) as exc:
        log.warning("topology %s unusable (%s); choosing spares in allocation order", topo, exc)
        return None, None
    if isinstance(topology, BlockTopology):
        return aggregate_fabric(topology), topology
    return topology, None


def main(argv: Sequence[str] | None = None, signal_setup: Callable[[Supervisor], None] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="air-hpc supervisor: %(message)s", stream=sys.stderr)
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m air_hpc.runtime.supervisor RUN_DIR -- srun ARGS...", file=sys.stderr)
        return int(ExitCode.USAGE)
    try:
        run_dir = RunDir(Path(args[0]))
        fence_settled(run_dir, os.environ)  # a job that does not own the run directory restarts nothing there
        job = run_dir.read_job()
        fabric, blocks = load_topology(job)
        supervisor = Supervisor(job, run_dir, args[2:], os.environ, SlurmClient(), fabric, blocks=blocks)
        (signal_setup or Supervisor.install_signals)(supervisor)
        return supervisor.run()
    except AirHpcError as exc:
        print(f"air-hpc supervisor: {exc}", file=sys.stderr)
        return int(exc.exit_code)


if __name__ == "__main__":
    sys.exit(main())
