"""The one module that touches Megatron's ``parallel_state`` globals and the default process group.

Everything else receives a :class:`ParallelContext` value: the ranks of this
process along each axis and the groups it needs. Megatron keeps its groups in
module globals (``parallel_state.py``); confining the calls that set and clear
them to :func:`distributed` keeps their lifetime explicit and testable.
"""

import contextlib
import datetime
import logging
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from air_hpc.config.layout import ParallelLayout
from air_hpc.errors import ConfigError

log = logging.getLogger(__name__)

Backend = Literal["gloo", "nccl"]

#: :func:`wait_for_listener` tries again after this long, doubling up to :data:`LISTENER_POLL_MAX_S`.
LISTENER_POLL_S = 0.005
#: The longest pause between two tries: what a rank adds at most, and all ranks' tries stay a few per second.
LISTENER_POLL_MAX_S = 0.1


@dataclass(frozen=True)
class DistEnv:
    """Who this process is, as the launcher (Slurm, submitit) told it."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    hostname: str


def rank_from_hostfile(hosts: Sequence[str], hostname: str, local_rank: int) -> int:
    """Logical rank of the ``local_rank``-th process on ``hostname`` in a placement's rank order.

    ``hosts`` lists one host per rank (a Slurm hostfile). Under
    ``srun --distribution=arbitrary`` Slurm already numbers tasks this way, so
    applying the order again is a no-op; under launchers that ignore the
    hostfile it reorders the ranks to match the placement.
    """
    slots = [i for i, host in enumerate(hosts) if host == hostname]
    if local_rank >= len(slots):
        raise ConfigError(
            f"rank order: host {hostname!r} has {len(slots)} slot(s) in the hostfile "
            f"but runs local rank {local_rank}; the hostfile does not match the allocation"
        )
    return slots[local_rank]


def apply_rank_order(env: DistEnv, hosts: Sequence[str] | None) -> DistEnv:
    """Renumber this process by the placement's rank order; rank 0's host becomes the master."""
    if not hosts:
        return env
    if len(hosts) != env.world_size:
        raise ConfigError(f"rank order: hostfile lists {len(hosts)} ranks but the job has {env.world_size}")
    return replace(env, rank=rank_from_hostfile(hosts, env.hostname, env.local_rank), master_addr=hosts[0])


@dataclass(frozen=True)
class ParallelContext:
    """This rank's place in the TP x PP x DP grid, and the groups the trainer uses."""

    layout: ParallelLayout
    rank: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    dp_group: Any
    backend: Backend
    hostname: str = ""
    """The node this rank runs on (as the launcher named it)."""

    @property
    def chunks(self) -> int:
        """Model chunks held by this rank (virtual pipeline stages)."""
        return self.layout.vpp or 1

    def chunk_is_first(self, chunk: int) -> bool:
        return self.pp_rank == 0 and chunk == 0

    def chunk_is_last(self, chunk: int) -> bool:
        return self.pp_rank == self.layout.pp - 1 and chunk == self.chunks - 1

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.layout.pp - 1

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def writes_metrics(self) -> bool:
        """The last pipeline stage's DP-rank-0 (and TP-rank-0) writes metrics.jsonl."""
        return self.is_last_stage and self.dp_rank == 0 and self.tp_rank == 0


@contextlib.contextmanager
def distributed(env: DistEnv, layout: ParallelLayout, backend: Backend, timeout_s: int) -> Iterator[ParallelContext]:
    """Start the default process group and Megatron's TP/PP/DP groups; tear both down on exit."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if layout.world_size != env.world_size:
        raise ConfigError(
            f"parallel: layout tp*pp*dp = {layout.tp}*{layout.pp}*{layout.dp} does not match "
            f"the {env.world_size} ranks the launcher started"
        )
    timeout = datetime.timedelta(seconds=timeout_s)
    if env.rank:
        wait_for_listener(env.master_addr, env.master_port, timeout_s)
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{env.master_addr}:{env.master_port}",
        rank=env.rank,
        world_size=env.world_size,
        timeout=timeout,
    )
    try:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=layout.tp,
            pipeline_model_parallel_size=layout.pp,
            virtual_pipeline_model_parallel_size=layout.vpp,
            distributed_timeout_minutes=max(1, timeout_s // 60),
            create_gloo_process_groups=backend == "nccl",
        )
        ctx = ParallelContext(
            layout=layout,
            rank=env.rank,
            tp_rank=parallel_state.get_tensor_model_parallel_rank(),
            pp_rank=parallel_state.get_pipeline_model_parallel_rank(),
            dp_rank=parallel_state.get_data_parallel_rank(),
            dp_group=parallel_state.get_data_parallel_group(),
            backend=backend,
            hostname=env.hostname,
        )
        log.info(
            "rank %d: tp %d/%d pp %d/%d dp %d/%d vpp %s",
            env.rank,
            ctx.tp_rank,
            layout.tp,
            ctx.pp_rank,
            layout.pp,
            ctx.dp_rank,
            layout.dp,
            layout.vpp,
        )
        yield ctx
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def seed(ctx: ParallelContext, value: int) -> None:
    """Seed Megatron's model-parallel RNG tracker, then the default generators of each pipeline stage.

    As in Megatron-LM, each pipeline stage is offset by ``100 * pp_rank`` so its layers
    start from different draws; TP and DP ranks of one stage share the seed, because CPU
    initialisation builds each full weight from the default generator and slices it,
    and DP replicas must start identical.
    """
    import random

    import numpy as np
    import torch
    from megatron.core import tensor_parallel

    stage_seed = value + 100 * ctx.pp_rank
    tensor_parallel.model_parallel_cuda_manual_seed(stage_seed)
    random.seed(stage_seed)
    np.random.seed(stage_seed)
    torch.manual_seed(stage_seed)


def wait_for_listener(
    host: str,
    port: int,
    timeout_s: float,
    connect: Callable[[str, int], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Whether ``host:port`` accepted a connection within ``timeout_s`` (tried with a growing pause).

    The ranks other than 0 connect to rank 0's store only once it listens: torch's store client backs off
    for about half a second after a refused connection, so a rank that came a few milliseconds before
    rank 0's store cost every start (and every in-job restart) that much. A refused or failed try is tried
    again; after ``timeout_s`` the caller connects anyway and torch's own error names what is wrong (a wrong
    address, a rank 0 that never came).
    """
    connect = connect or _connect_and_close
    deadline = clock() + timeout_s
    pause = LISTENER_POLL_S
    while True:
        try:
            connect(host, port)
            return True
        except OSError:
            if clock() >= deadline:
                return False
        sleep(pause)
        pause = min(pause * 2, LISTENER_POLL_MAX_S)


def _connect_and_close(host: str, port: int) -> None:
    socket.create_connection((host, port), timeout=1.0).close()
