"""Warm standby ranks: processes that paid the interpreter's start and the torch/Megatron imports in advance.

With hot spares, a restart inside the job spent most of its time starting Python and
importing torch and megatron-core again (on the testbed 17 of its 21 s). So once the step's
ranks are past their imports (at once for ranks that were standbys), the supervisor starts,
beside the step, one standby ``srun`` per healthy node of the allocation (the step's nodes and
the spares), each with the node's rank slots, running ``python -m air_hpc.runtime RUN_DIR`` with
:data:`STANDBY_ENV` naming a directory. Each such process imports what training needs, then
waits for ``go.json`` there. At a restart the supervisor writes the new rank order (the start's
hostfile), then ``go.json`` with the environment of the new step; a process whose node and local
slot hold a rank in the new order becomes that rank (the normal entry, resuming like any start),
the others exit 0.

Why one ``srun`` per node: a node that dies takes only its own standby with it, and the
survivors' do not wait for Slurm to time the dead node out before they can end.
A standby ends on any stop signal (the job ends, or the supervisor no longer needs it);
once told to go, it holds them like any rank from its first line.
"""

import json
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType

from air_hpc.records.files import atomic_write, touch
from air_hpc.resilience.signals import STOP_SIGNALS, hold_stop_signals
from air_hpc.slurm.env import SlurmEnv

log = logging.getLogger(__name__)

#: Set on a standby ``srun``: the directory its processes wait in.
STANDBY_ENV = "AIR_HPC_STANDBY_DIR"
#: Set in a promoted standby's environment: when it was told to go (its start-up clock's origin).
STARTED_AT_ENV = "AIR_HPC_STARTED_AT_S"
GO_FILE = "go.json"
#: A standby touches ``ready-<node>-<local id>`` once warm (for the supervisor's log and the tests).
READY_PREFIX = "ready-"
#: How often a standby looks for its go (a stat; the restart waits at most this long for it).
GO_POLL_S = 0.01


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


def wait_for_go(directory: Path) -> dict[str, str]:
    while (env := read_go(directory)) is None:
        time.sleep(GO_POLL_S)
    return env


def promoted(environ: Mapping[str, str], go: Mapping[str, str]) -> bool:
    """Whether this process's node and local slot hold a rank in the go's rank order (its hostfile)."""
    slurm = SlurmEnv.from_environ({**environ, **go})
    if slurm.hostfile is None or slurm.localid is None:
        return False
    hosts = [line.strip() for line in slurm.hostfile.read_text().splitlines() if line.strip()]
    host = slurm.nodename or ""
    return slurm.localid < hosts.count(host)


def main(run: Callable[[], int]) -> int:
    """A standby's life: warm up, wait, then run as a rank (``run``) or leave."""
    directory = standby_dir(os.environ)
    if directory is None:
        raise ValueError(f"{STANDBY_ENV} is not set")
    for signum in STOP_SIGNALS:
        signal.signal(signum, _leave)
    warm_up()
    slurm = SlurmEnv.from_environ(os.environ)
    touch(directory / f"{READY_PREFIX}{slurm.nodename or 'local'}-{slurm.localid or 0}")
    go = wait_for_go(directory)
    hold_stop_signals()  # from here a rank: a stop waits for the trainer's handler
    if not promoted(os.environ, go):
        return 0
    os.environ.update(go)
    del os.environ[STANDBY_ENV]
    return run()
