"""The batch script's Python half: ``python -m air_hpc.runtime.batch <command> RUN_DIR ...``.

The rendered script (``sbatch/job.sbatch.j2``) keeps in bash only what must run
outside any Python process: the stop-signal trap on its first line, the stop
record/forward protocol, ``srun``, and its own exit code. Everything it decides
is here, so each contract the ranks share (rank 0's address and port, the
start's generation directory, the bad-node list, the event schema) has one
implementation. Imports stay light (no torch, no pydantic): the script runs
this a few times per start and once per stop signal.

=========  ======================================================================
start      check that this job owns the run (before writing anything), record the start in
           submissions.jsonl, fit the placement's rank order to the allocation (a requeue
           that excluded a bad node got other nodes) into the start's hostfile, print
           the generation directory and MASTER_ADDR / MASTER_PORT, one per line
event      append one batch-shell event (``signal``) to events.jsonl
finish     the ranks' verdict over srun's exit code, then the requeue decision
           (Slurm's own preemption, the restart budget); prints ``<exit code> <action>``
requeue    ``scontrol requeue``, then keep the bad nodes out of the next start
=========  ======================================================================

What the submitit executor (``--executor submitit``) has and lacks next to this script, in one place:

===============================================  ==========  ===============================================
resilience feature                               submitit    with submitit instead
===============================================  ==========  ===============================================
the Slurm request (``#SBATCH`` options)        yes         the same list (``render/directives.py``)
rank order from the placement (hostfile)       yes         written once at submit
rank order fitted to a requeue's allocation    no          the first submission's hostfile
stop signal forwarded once every rank is armed no          submitit's signal reaches every rank directly
requeue on the exit-code contract (85-87)      no          only submitit's own requeue after a checkpoint
restart budget (``resilience.max_restarts``)   yes         submitit's ``max_num_timeout``
Slurm's preemption requeued exactly once       no          not checked
the ranks' verdict over srun's 143             no
bad nodes kept out of the next start           no          ``--exclude`` at submit only
hang backstop, dead-node probe (supervisor)    no          the ranks' own watchdogs only
``started`` lines in submissions.jsonl         no          reports use the ranks' ``start`` events
hot spares (in-job supervisor)                 no          refused: ``resources.spare_nodes`` exits 2
pyxis container (``srun --container-image``)   no          refused: ``container.image`` exits 2
MASTER_PORT from the job id and restart count  yes         ``runtime.entry`` derives it the same way
a taken MASTER_PORT replaced on rank 0's node    no          the derived port, new on each start
===============================================  ==========  ===============================================
"""

import argparse
import json
import logging
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from air_hpc.digits import ascii_int
from air_hpc.errors import AirHpcError, SlurmError
from air_hpc.exitcodes import NEVER_REQUEUED, REQUEUE_WORTHY, ExitCode
from air_hpc.health.badnodes import read_bad_nodes
from air_hpc.ownership.attempts import fence_settled
from air_hpc.ownership.owner import advance_chain, read_owner
from air_hpc.records.events import EventKind, EventLog, Payload, Preempted, Requeue, payload_from_text, read_events
from air_hpc.records.files import atomic_write
from air_hpc.records.generation import generation, generation_dir, read_exit_code, start_hostfile
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import record_start, record_submission, submissions
from air_hpc.runtime.rendezvous import free_master_port, master_port
from air_hpc.slurm import hostlist
from air_hpc.slurm.client import IN_JOB, SlurmClient
from air_hpc.slurm.env import JOB_NODELIST, SlurmEnv
from air_hpc.slurm.jobs import Preemption

log = logging.getLogger(__name__)


class BatchError(AirHpcError):
    """The batch script's helper cannot do what the script asked (bad allocation, unreadable file)."""


@dataclass(frozen=True)
class JobStart:
    """One start of the job, from Slurm's environment in the batch shell."""

    job_id: str
    """As the run's records name the job: ``ARRAY_INDEX`` for a sweep's element (:attr:`SlurmEnv.run_job_id`)."""
    restart_count: int
    nodelist: str
    """Slurm's expression of the allocation, as the ``started`` line records it."""
    allocated: tuple[str, ...]
    number: int
    """``SLURM_JOB_ID``, a number even for an array task: the rendezvous port derives from it."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> "JobStart":
        slurm = SlurmEnv.from_environ(environ)
        if slurm.job_id is None:
            raise BatchError("SLURM_JOB_ID is not set: this helper runs inside the batch script")
        expression = next((environ[var] for var in JOB_NODELIST if environ.get(var)), "")
        number = ascii_int(slurm.job_id)
        if number is None:
            raise BatchError(f"SLURM_JOB_ID={slurm.job_id!r} is not a job id")
        return cls(slurm.run_job_id or slurm.job_id, slurm.restart_count, expression, slurm.nodelist, number)


def say(message: str) -> None:
    """One line for the job's stderr, as the script's own messages read."""
    print(f"air-hpc: {message}", file=sys.stderr, flush=True)


def fit_rank_order(rank_hosts: Sequence[str], allocated: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Each placed host missing from the allocation moves, with all its ranks, to an allocated host no rank uses.

    Every other rank keeps its place. Returns the rank order and missing -> new host.
    """
    present, placed = set(allocated), set(rank_hosts)
    unused = [host for host in allocated if host not in placed]
    moved: dict[str, str] = {}
    for host in rank_hosts:
        if host in present or host in moved:
            continue
        if not unused:
            raise BatchError(f"{host} is not in this allocation and no allocated node is free to take its ranks")
        moved[host] = unused.pop(0)
    return [moved.get(host, host) for host in rank_hosts], moved


def start(
    run_dir: RunDir,
    job: JobStart,
    environ: Mapping[str, str],
    rank_hosts: Sequence[str],
    master: bool,
    client: SlurmClient | None = None,
) -> list[str]:
    """Check that this job owns the run, fit the rank order, record the start; the lines the script reads.

    The owner fence comes first and nothing is written before it: a second ``sbatch`` of the run's own
    script must leave the run directory as it found it. The fitted rank order goes to this start's own
    directory (``<generation>/hostfile``), which no other job writes. The lines: the start's directory
    (, rank 0's address and port).
    """
    if advance_chain(run_dir, job.job_id) is not None:  # a chain's next link: the run's job from now on
        earlier = submissions(run_dir)  # a routed run's links run on the cluster of its first
        record_submission(run_dir, job.job_id, "slurm", cluster=earlier[-1].cluster if earlier else None)
    fence_settled(run_dir, environ, client)
    owner = read_owner(run_dir)
    if owner is not None and owner.chain and client is not None and run_complete(run_dir):
        end_chain(run_dir, job, client, including_this=True)
        raise BatchError(f"the run is complete: job {job.job_id} has nothing to train")
    start_dir = generation_dir(run_dir, generation(environ))
    first = job.allocated[0]
    if rank_hosts:
        fitted, moved = fit_rank_order(rank_hosts, job.allocated)
        for missing, host in moved.items():
            say(f"{missing} is not in this allocation; its ranks run on {host}")
        atomic_write(start_hostfile(start_dir), "".join(f"{host}\n" for host in fitted), durable=False)
        first = fitted[0]
    record_start(run_dir, job.job_id, job.restart_count, job.nodelist)
    say(f"job {job.job_id} start {job.restart_count + 1} on {job.nodelist}")
    lines = [str(start_dir)]
    return [*lines, first, str(_rendezvous_port(job, first, environ))] if master else lines


def _rendezvous_port(job: JobStart, rank_0_host: str, environ: Mapping[str, str]) -> int:
    """This start's port; checked for being free, and replaced if not, where rank 0 runs on this node."""
    here = SlurmEnv.from_environ(environ).nodename or socket.gethostname()
    if rank_0_host == here:
        return free_master_port(job.number, job.restart_count)
    return master_port(job.number, job.restart_count)


def emit(run_dir: RunDir, job: JobStart, payload: Payload, at_s: float | None = None) -> None:
    """One event of the batch shell, beside the ranks' events."""
    EventLog(run_dir.events, {"job_id": job.job_id, "restart_count": job.restart_count}).emit(payload, at_s)


#: Slurm's states of a job it is ending while the batch script still runs (scancel, the time limit: ``scontrol``
#: shows COMPLETING): the ranks got its SIGTERM as a stop and saved, and a requeue would bring back a job that was
#: meant to end.
SLURM_ENDING = frozenset({"COMPLETING", "CANCELLED", "TIMEOUT", "DEADLINE"})


def slurm_view(client: SlurmClient, job_id: str) -> tuple[Preemption | None, str]:
    """Asked once, briefly, as the job ends: Slurm's own preemption of it and its state (an unanswered question
    means "not preempted, still running")."""
    try:
        fields = client.show_job(job_id, retry=IN_JOB) or {}
        return client.preemption_in(fields, retry=IN_JOB), fields.get("JobState", "")
    except SlurmError as exc:
        log.warning("cannot tell whether Slurm preempted or ends the job: %s", exc)
        return None, ""


def finish(
    run_dir: RunDir, start_dir: Path, job: JobStart, rc: int, max_restarts: int, client: SlurmClient
) -> tuple[int, bool]:
    """The job's exit code and whether to requeue it; says why on stderr and records the batch shell's events."""
    verdict = read_exit_code(start_dir)
    if rc != ExitCode.OK and verdict is not None:
        # srun reports the signal it killed the other ranks with (143), not why the first one stopped.
        say(f"step exited {rc}; the ranks' verdict is {verdict}")
        rc = verdict
    if rc == ExitCode.OK:
        end_chain(run_dir, job, client)
        return rc, False
    if rc == ExitCode.CRASH_LOOP:
        say("restarts in a row made no progress (see the crash_loop event); not requeueing")
        return rc, False
    if rc in NEVER_REQUEUED:
        say(f"step failed with exit code {rc}; a requeue would fail the same way")
        return rc, False
    crashed = rc not in REQUEUE_WORTHY  # a rank died or raised: resume from the newest checkpoint
    preempted, state = slurm_view(client, job.job_id)
    if preempted is None and state in SLURM_ENDING:
        say(f"step exited {rc} while Slurm ends the job ({state}); not requeueing")
        return rc, False
    if preempted is not None:
        emit(run_dir, job, Preempted(preempted.grace_s, preempted.ended_after_s, preempted.fit, preempted.requeue_by))
        say(f"step exited {rc} after Slurm preempted the job; requeue by {preempted.requeue_by}")
        return rc, preempted.requeue_by == "batch"
    why = "crashed" if crashed else "requeue-worthy"
    following = [] if crashed else live_links_after(run_dir, job, client)
    if following:
        say(f"step exited {rc} at a stop; the chain's next link, job {following[0]}, resumes the run")
        return rc, False
    if job.restart_count < max_restarts:
        say(f"step exited {rc} ({why}); requeue {job.restart_count + 1} of {max_restarts}")
        emit(run_dir, job, Requeue(exit_code=rc, reason=why))
        return rc, True
    say(f"step exited {rc} but the restart budget ({max_restarts}) is spent")
    return rc, False


def run_complete(run_dir: RunDir) -> bool:
    """The run's final checkpoint is saved (``train.steps`` reached): read from job.json and events, no pydantic."""
    try:
        steps = int(json.loads(run_dir.job_json.read_text())["train"]["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    saved = (e for e in read_events(run_dir.events) if e.get("kind") == EventKind.CHECKPOINT_SAVED)
    return any(e.get("reason") == "final" and isinstance(e.get("step"), int) and e["step"] >= steps for e in saved)


def live_links_after(run_dir: RunDir, job: JobStart, client: SlurmClient) -> list[str]:
    """The chain's links after this job that Slurm still holds (queued), in order; empty outside a chain."""
    owner = read_owner(run_dir)
    links = [] if owner is None or owner.job_id != job.job_id else list(owner.later_links())
    if not links:
        return []
    try:
        queued = {r.job_id for r in client.squeue(links, retry=IN_JOB) if not r.state.terminal}
    except SlurmError as exc:
        log.warning("cannot ask Slurm for the chain's next links (%s); counting them as queued", exc)
        return links
    return [link for link in links if link in queued]


def end_chain(run_dir: RunDir, job: JobStart, client: SlurmClient, including_this: bool = False) -> None:
    """The run is complete: cancel the chain's links still queued, so none takes an allocation for nothing."""
    for link in live_links_after(run_dir, job, client):
        say(f"the run is complete; cancelling the chain's queued link {link}")
        try:
            client.scancel(link, retry=IN_JOB)
        except SlurmError as exc:
            say(f"could not cancel link {link} ({exc}); it will find the run complete and end at once")
    if including_this:
        client.scancel(job.job_id, retry=IN_JOB)


def requeue(run_dir: RunDir, job: JobStart, pinned: str | None, client: SlurmClient) -> None:
    """Requeue, then keep the bad nodes out of the next start (Slurm takes ExcNodeList only from a pending job).

    The bad nodes also leave a pinned node list; Slurm adds nodes for them.
    """
    client.scontrol_requeue(job.job_id)
    bad = read_bad_nodes(run_dir.bad_nodes)
    if not bad:
        return
    update = {"ExcNodeList": ",".join(bad)}
    if pinned:
        healthy = [host for host in hostlist.expand(pinned, "--pinned") if host not in set(bad)]
        update["ReqNodeList"] = ",".join(healthy)
    say(f"the next start avoids bad node(s) {','.join(bad)}")
    client.update_job(job.job_id, update)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m air_hpc.runtime.batch", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cmd = commands.add_parser("start")
    cmd.add_argument("run_dir", type=Path)
    cmd.add_argument("--rank-hosts", nargs="+", default=[], metavar="HOST", help="the placement's rank order")
    cmd.add_argument("--master", action="store_true", help="also print MASTER_ADDR and MASTER_PORT")
    cmd = commands.add_parser("event")
    cmd.add_argument("run_dir", type=Path)
    cmd.add_argument("kind")
    cmd.add_argument("--at", type=float, help="epoch seconds of the moment (default: now)")
    cmd.add_argument("--field", action="append", default=[], metavar="NAME=VALUE", help="a text field of the event")
    cmd = commands.add_parser("finish")
    cmd.add_argument("run_dir", type=Path)
    cmd.add_argument("exit_code", type=int)
    cmd.add_argument("--max-restarts", type=int, required=True)
    cmd = commands.add_parser("requeue")
    cmd.add_argument("run_dir", type=Path)
    cmd.add_argument("--pinned", help="the placement's pinned node list")
    return parser


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = _parser().parse_args(argv)
    env = dict(os.environ if environ is None else environ)
    logging.basicConfig(level=logging.WARNING, format="air-hpc: %(levelname)s %(name)s: %(message)s")
    try:
        job = JobStart.from_env(env)
        run_dir = RunDir(args.run_dir)
        start_dir = generation_dir(run_dir, generation(env))
        if args.command == "start":
            print("\n".join(start(run_dir, job, env, args.rank_hosts, args.master, SlurmClient(env))))
        elif args.command == "event":
            fields = dict(field.split("=", 1) for field in args.field)
            emit(run_dir, job, payload_from_text(args.kind, fields), args.at)
        elif args.command == "finish":
            rc, requeue_it = finish(run_dir, start_dir, job, args.exit_code, args.max_restarts, SlurmClient(env))
            print(rc, "requeue" if requeue_it else "none")
        else:
            requeue(run_dir, job, args.pinned, SlurmClient(env))
    except (AirHpcError, OSError, KeyError, ValueError) as exc:
        print(f"air-hpc: batch {args.command}: {exc}", file=sys.stderr)
        return int(ExitCode.FAILURE)
    return int(ExitCode.OK)


if __name__ == "__main__":
    sys.exit(main())
