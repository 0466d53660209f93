"""A small real multi-process job for the watchdog tests: gloo ranks that step in lock-step.

``python -m tests.integration.health_payload RUN_DIR RANK WORLD PORT HANG_RANK HANG_STEP``: every rank
beats and all-reduces once per step; rank HANG_RANK sleeps forever in the middle of step HANG_STEP.
"""

import logging
import os
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    run_path, rank, world, port, hang_rank, hang_step = argv[0], *map(int, argv[1:])
    import torch
    import torch.distributed as dist

    from air_hpc.health.heartbeat import Heartbeat
    from air_hpc.health.watchdog import PhaseLimits, Watchdog
    from air_hpc.records.events import EventLog
    from air_hpc.records.rundir import RunDir
    from air_hpc.train.metrics import setup_rank_logging

    run_dir = RunDir(Path(run_path))
    setup_rank_logging(run_dir.rank_log(rank), rank)
    heartbeat = Heartbeat(run_dir.heartbeat / "1-0", rank, host=f"host{rank}")
    Watchdog(
        heartbeat,
        PhaseLimits(setup_s=60, step_s=4, checkpoint_s=60),
        world_size=world,
        log_path=run_dir.rank_log(rank),
        bad_nodes_path=run_dir.bad_nodes,
        events=EventLog(run_dir.events),
    ).start()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    tensor = torch.ones(4)
    for step in range(1, 1000):
        heartbeat.beat("step", step)
        if rank == hang_rank and step == hang_step:
            logging.getLogger("payload").info("rank %d: sleeping forever in step %d", rank, step)
            while True:
                time.sleep(3600)
        dist.all_reduce(tensor)
        time.sleep(0.05)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main(sys.argv[1:]))
