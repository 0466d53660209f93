"""Which nodes of a running job are dead: a tiny ``srun --overlap`` on each, in parallel.

``srun`` cannot tell a dead node from a slow one until slurmctld times the node out
(SlurmdTimeout, a minute or more); a one-task step that does not finish in
:data:`PROBE_TIMEOUT_S` is a far quicker verdict. ``--overlap`` lets the probe
share the CPUs the training step holds.

The live nodes' answers also say how long an answer takes now: once one came, a node that
has not answered in :data:`PROBE_FACTOR` times the slowest live answer (at least
:data:`PROBE_MIN_S`) is dead, without waiting out the whole timeout. A slow controller slows
every node's answer alike and so stretches the verdict with it; when no node answers, the
full timeout decides.
"""

import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from air_hpc.slurm import env as slurm_env
from air_hpc.slurm.client import SlurmClient

#: A node whose probe step does not finish in this time is dead: a live one answers in ~0.03 s on an idle
#: testbed and well under a second on a busy controller.
PROBE_TIMEOUT_S = 3.0
#: Once a live node answered, the others get this many times its answer's time ...
PROBE_FACTOR = 5.0
#: ... but never less than this (a live node's answer varies by a few tenths of a second under load).
PROBE_MIN_S = 1.0


def probe_dead(
    client: SlurmClient,
    job_id: str,
    hosts: Sequence[str],
    timeout_s: float = PROBE_TIMEOUT_S,
    answers: Callable[[str], bool] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[str, ...]:
    """The hosts where a tiny step of job ``job_id`` does not finish in time (see the module docstring).

    ``answers(host)``: whether the host's probe step finished well (default: a one-task ``srun`` that
    gives up after ``timeout_s``). Probes still running at the verdict end by their own timeout.
    """
    if answers is None:
        env = {k: v for k, v in client.env.items() if k != slurm_env.HOSTFILE}  # the probe places its one task itself
        probe = SlurmClient(env=env, timeout_s=timeout_s, retries=0)
        answers = lambda host: probe.step_finishes(host, job_id)  # noqa: E731
    if not hosts:
        return ()
    pool = ThreadPoolExecutor(max_workers=min(32, len(hosts)), thread_name_prefix="probe")
    try:
        started = clock()
        pending: dict[Future[bool], str] = {pool.submit(answers, host): host for host in hosts}
        dead: list[str] = []
        slowest: float | None = None  # the slowest live answer so far
        while pending:
            deadline = started + (timeout_s if slowest is None else deadline_after(slowest, timeout_s))
            left = deadline - clock()
            if left <= 0:
                break
            done, _ = wait(pending, timeout=left, return_when=FIRST_COMPLETED)
            for future in done:
                host = pending.pop(future)
                if future.exception() is not None or not future.result():
                    dead.append(host)
                else:
                    slowest = max(slowest or 0.0, clock() - started)
        dead += pending.values()
        return tuple(h for h in hosts if h in set(dead))
    finally:
        pool.shutdown(wait=False)


def deadline_after(answered_in_s: float, timeout_s: float = PROBE_TIMEOUT_S) -> float:
    """How long after the probe's start a node is dead, once a live one answered in ``answered_in_s``."""
    return min(timeout_s, max(PROBE_MIN_S, PROBE_FACTOR * answered_in_s))
