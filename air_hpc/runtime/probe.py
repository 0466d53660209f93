"""Which nodes of a running job are dead: a tiny ``srun --overlap`` on each, in parallel.

``srun`` cannot tell a dead node from a slow one until slurmctld times the node out
(SlurmdTimeout, a minute or more); a one-task step that does not finish in
:data:`PROBE_TIMEOUT_S` is a far quicker verdict. ``--overlap`` lets the probe
share the CPUs the training step holds.
"""

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from air_hpc.slurm import env as slurm_env
from air_hpc.slurm.client import SlurmClient

#: A node whose probe step does not finish in this time is dead: a live one answers in ~0.03 s on an idle
#: testbed and well under a second on a busy controller.
PROBE_TIMEOUT_S = 3.0


def probe_dead(
    client: SlurmClient, job_id: str, hosts: Sequence[str], timeout_s: float = PROBE_TIMEOUT_S
) -> tuple[str, ...]:
    """The hosts where a tiny step of job ``job_id`` does not finish in ``timeout_s``."""
    env = {k: v for k, v in client.env.items() if k != slurm_env.HOSTFILE}  # the probe places its one task itself
    probe = SlurmClient(env=env, timeout_s=timeout_s, retries=0)

    with ThreadPoolExecutor(max_workers=min(32, len(hosts)) or 1) as pool:
        answers = list(pool.map(lambda host: probe.step_finishes(host, job_id), hosts))
    return tuple(h for h, ok in zip(hosts, answers, strict=True) if not ok)
