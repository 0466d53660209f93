"""Warm standby ranks: a process per node that paid the interpreter's start and the torch/Megatron imports in
advance, and forks the node's ranks when a restart needs them.

With hot spares, a restart inside the job spent most of its time starting Python and
importing torch and megatron-core again (on the testbed 17 of its 21 s). So with each step the
supervisor starts, beside it, one standby ``srun`` per healthy node of the allocation (the step's
nodes and the spares): one task with the CPUs of the node's rank slots, running ``python -m
air_hpc.runtime RUN_DIR`` with :data:`STANDBY_ENV` naming a directory. It imports what training
needs at the lowest CPU priority (:func:`warm_up_in_background`), then waits for ``go.json``
there. At a restart the supervisor writes the new rank order (the start's hostfile), then
``go.json`` with the environment of the new step; the standby forks one process per slot the new
order gives its node (``SLURM_LOCALID`` 0, 1, ...), each the normal entry, resuming like any
start; a node without a slot leaves (exit 0).

Why one process that forks, not one per slot: the imports cost 2-3 CPU seconds each, paid once
per node instead of once per rank (on an 8-GPU node, 8 times less CPU while the step trains
beside it, and the imported pages are shared). Towards ``srun`` the standby is the node's one
task: it passes a stop signal to its ranks, and when one fails it ends the others and fails as
that one did (``--kill-on-bad-exit`` within the node; the supervisor ends the other nodes).

Why one ``srun`` per node: a node that dies takes only its own standby with it, and the
survivors' do not wait for Slurm to time the dead node out before they can end.
A standby ends on any stop signal (the job ends, or the supervisor no longer needs it);
once told to go, its ranks hold them like any rank from their first line.
"""

import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType

from air_hpc.records.files import atomic_write, touch
from air_hpc.resilience.signals import STOP_SIGNALS, hold_stop_signals
from air_hpc.slurm import env as slurm_env
from air_hpc.slurm.env import SlurmEnv

log = logging.getLogger(__name__)

#: Set on a standby ``srun``: the directory its processes wait in.
STANDBY_ENV = "AIR_HPC_STANDBY_DIR"
#: Set in a promoted standby's environment: when it was told to go (its start-up clock's origin).
STARTED_AT_ENV = "AIR_HPC_STARTED_AT_S"
GO_FILE = "go.json"
#: A standby touches ``ready-<node>`` once warm (for the supervisor's log and the tests).
READY_PREFIX = "ready-"
#: How often a standby looks for its go (a stat; the restart waits at most this long for it).
GO_POLL_S = 0.01
#: The warm-up's nice value: its imports take only the CPU the step leaves idle.
WARM_UP_NICE = 19
#: After a rank exited with a code, the node's other ranks get this long to leave by themselves before SIGKILL.
RANK_GRACE_S = 2.0


def standby_dir(environ: Mapping[str, str]) -> Path | None:
    value = environ.get(STANDBY_ENV)
    return Path(value) if value else None


def write_go(directory: Path, env: Mapping[str, str], clock: Callable[[], float] = time.time) -> None:
    """Tell the standby processes in ``directory`` to become the ranks of the step ``env`` describes; the start-up
    of each counts from now (:data:`STARTED_AT_ENV`), so a standby still warming up shows the rest as its own."""
    go = {**env, STARTED_AT_ENV: repr(clock())}
    atomic_write(directory / GO_FILE, json.dumps({"env": go}), durable=False)


def read_go(directory: Path) -> dict[str, str] | None:
    """The go's environment once written (None before); anything but strings is refused."""
    try:
        raw = json.loads((directory / GO_FILE).read_text())
    except FileNotFoundError:
        return None
    env = raw.get("env") if isinstance(raw, dict) else None
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError(f"{directory / GO_FILE}: not an environment")
    return env


def _leave(signum: int, frame: FrameType | None) -> None:
    os._exit(0)  # no longer needed: nothing of the run was touched yet


def warm_up() -> None:
    """Import what a rank's start imports (torch, megatron-core, the trainer), without touching the run."""
    from air_hpc.backend import megatron_compat
    from air_hpc.runtime import entry  # noqa: F401  (submitit, the entry's own imports)
    from air_hpc.train import trainer  # noqa: F401

    megatron_compat.import_megatron()
    import torch._dynamo  # noqa: F401  (the optimizer's constructor imports it: ~0.5 s of a restart's model build)

    from air_hpc.resilience import checkpointer  # noqa: F401
    from air_hpc.train import loop, model  # noqa: F401


def warm_up_in_background(imports: Callable[[], None]) -> None:
    """Run ``imports`` in a thread at the lowest CPU priority and wait for it.

    The standby starts beside a step that is starting or training and should take only the CPU they leave
    idle. Linux's nice value is per thread, and raising it needs no privilege but lowering it again does: the
    thread that imports is niced, the main thread that later forks the ranks keeps its priority, and so do
    they (a fork copies only the calling thread).
    """
    failed: list[BaseException] = []

    def niced() -> None:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WARM_UP_NICE)
        try:
            imports()
        except BaseException as exc:  # raised again in the main thread
            failed.append(exc)

    thread = threading.Thread(target=niced, name="standby-warm-up")
    thread.start()
    thread.join()  # a signal's handler still runs meanwhile (lock waits are interruptible)
    if failed:
        raise failed[0]


def wait_for_go(directory: Path) -> dict[str, str]:
    while (env := read_go(directory)) is None:
        time.sleep(GO_POLL_S)
    return env


def rank_slots(environ: Mapping[str, str], go: Mapping[str, str]) -> int:
    """How many ranks the go's rank order (its hostfile) places on this process's node."""
    slurm = SlurmEnv.from_environ({**environ, **go})
    if slurm.hostfile is None:
        return 0
    hosts = [line.strip() for line in slurm.hostfile.read_text().splitlines() if line.strip()]
    return hosts.count(slurm.nodename or "")


def main(run: Callable[[], int], leave: Callable[[int], None]) -> int:
    """A standby's life: warm up, wait, then fork the node's ranks (each runs ``run`` and ends by ``leave``)
    and return as they did, or leave at once when the new order has no slot here."""
    directory = standby_dir(os.environ)
    if directory is None:
        raise ValueError(f"{STANDBY_ENV} is not set")
    for signum in STOP_SIGNALS:
        signal.signal(signum, _leave)
    warm_up_in_background(warm_up)
    slurm = SlurmEnv.from_environ(os.environ)
    touch(directory / f"{READY_PREFIX}{slurm.nodename or 'local'}")
    go = wait_for_go(directory)
    hold_stop_signals()  # from here the ranks' signals: a stop waits for a rank's handler, or for the forwarding
    slots = rank_slots(os.environ, go)
    if not slots:
        return 0
    os.environ.update(go)
    del os.environ[STANDBY_ENV]
    ranks = [_fork_rank(local_id, run, leave) for local_id in range(slots)]
    return _wait_for_ranks(ranks)


def _fork_rank(local_id: int, run: Callable[[], int], leave: Callable[[int], None]) -> int:
    """One rank in a child process (the node's ``local_id``-th slot); returns its PID in the standby."""
    standby = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        _die_with_parent(standby)
        for signum in STOP_SIGNALS:  # as a rank's first line has them: held, with their default action
            signal.signal(signum, signal.SIG_DFL)
        os.environ[slurm_env.LOCALID] = os.environ[slurm_env.PROCID] = str(local_id)
        code = run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # the child must never return into the standby's code
        traceback.print_exc()
    leave(code)
    os._exit(code)  # ``leave`` exits; this only guards a ``leave`` that returned


def _wait_for_ranks(pids: list[int]) -> int:
    """Pass stop signals on to the ranks until all ended; return as the first that failed did.

    A rank killed by a signal ends the others at once (a crash: they would wait for it in a collective);
    after a rank exited with a code (a verdict the ranks agreed on, or an error) the others get
    :data:`RANK_GRACE_S` to leave by themselves. A signal's death is passed on as this process's own,
    so that srun reports the node's task killed as the rank was.
    """
    running = set(pids)

    def forward(signum: int, frame: object) -> None:
        for pid in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def kill_the_rest() -> None:
        for pid in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    for signum in STOP_SIGNALS:
        signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    failed: int | None = None
    kill_at: float | None = None
    while running:
        pid, status = os.waitpid(-1, 0 if kill_at is None else os.WNOHANG)
        if pid == 0:  # within the grace: nobody ended yet
            if time.monotonic() >= (kill_at or 0.0):
                kill_the_rest()
                kill_at = None
            time.sleep(GO_POLL_S)
            continue
        if pid not in running:
            continue
        running.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        if code and failed is None:
            failed = code
            log.warning("standby rank %d ended with %d: ending the node's other ranks", pid, code)
            if code < 0:
                kill_the_rest()
            else:
                kill_at = time.monotonic() + RANK_GRACE_S
    if failed is not None and failed < 0:
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP keep theirs
            signal.signal(-failed, signal.SIG_DFL)
        sys.stderr.flush()
        os.kill(os.getpid(), -failed)
        return 128 - failed
    return failed or 0


def _die_with_parent(parent: int) -> None:
    """A rank ends with its standby (PR_SET_PDEATHSIG), as a task ends with its slurmstepd."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    if os.getppid() != parent:  # the standby ended before the request took hold
        os._exit(1)
