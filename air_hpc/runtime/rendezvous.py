"""Where rank 0 listens: MASTER_ADDR and MASTER_PORT, the same for the batch script and every executor.

Standard library only: the batch script's helper (``runtime.batch``) and the ranks both import it.
"""

#: MASTER_PORT = base + job id modulo span: the same port after a requeue, rarely shared by two jobs, and
#: below Linux's default ephemeral range (32768-60999), where any outgoing connection may hold it.
MASTER_PORT_BASE = 20000
MASTER_PORT_SPAN = 12000


def master_port(job_id: int) -> int:
    """Rank 0's port, derived from the job id so it survives requeues."""
    return MASTER_PORT_BASE + job_id % MASTER_PORT_SPAN
