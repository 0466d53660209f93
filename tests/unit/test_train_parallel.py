"""Who a rank is: Slurm/submitit environment parsing, placement rank order, chunk stage roles."""

import socket
import threading
import time
from pathlib import Path

import pytest

from air_hpc.config.layout import ParallelLayout
from air_hpc.errors import ConfigError
from air_hpc.runtime.entry import current_dist_env, dist_env_from_slurm
from air_hpc.runtime.rendezvous import master_port
from air_hpc.train.parallel import (
    LISTENER_POLL_MAX_S,
    DistEnv,
    ParallelContext,
    apply_rank_order,
    rank_from_hostfile,
    wait_for_listener,
)

SLURM = {
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_JOB_ID": "77",
    "SLURM_JOB_NODELIST": "n[3-4]",
    "SLURMD_NODENAME": "n4",
}


def test_slurm_env_gives_rank_world_and_first_node_as_master() -> None:
    env = dist_env_from_slurm(SLURM)
    assert env == DistEnv(3, 4, 1, "n3", master_port(77), "n4")
    assert master_port(77) == 20077 != master_port(78)


def test_explicit_master_wins() -> None:
    env = dist_env_from_slurm({**SLURM, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    assert (env.master_addr, env.master_port) == ("10.0.0.1", 29500)


def test_outside_slurm_is_a_one_line_config_error() -> None:
    with pytest.raises(ConfigError, match="SLURM_PROCID is not set"):
        dist_env_from_slurm({})


def test_rank_from_hostfile_counts_slots_per_host() -> None:
    hosts = ["n2", "n2", "n1", "n1"]
    assert [rank_from_hostfile(hosts, h, lr) for h, lr in [("n2", 0), ("n2", 1), ("n1", 0), ("n1", 1)]] == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match="1 slot"):
        rank_from_hostfile(["n1", "n2"], "n1", 1)


def test_rank_order_renumbers_and_moves_the_master(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n4\nn4\nn3\nn3\n")
    env = current_dist_env({**SLURM, "SLURM_HOSTFILE": str(hostfile)})
    assert (env.rank, env.master_addr) == (1, "n4")
    arbitrary = DistEnv(1, 4, 1, "n4", 1, "n4")
    assert apply_rank_order(arbitrary, ["n4", "n4", "n3", "n3"]) == arbitrary
    with pytest.raises(ConfigError, match="lists 2 ranks"):
        apply_rank_order(arbitrary, ["n4", "n3"])


def test_virtual_stages_first_and_last_chunks() -> None:
    layout = ParallelLayout(tp=1, pp=2, dp=1, vpp=2)
    first = ParallelContext(layout, 0, 0, 0, 0, None, "gloo")
    last = ParallelContext(layout, 1, 0, 1, 0, None, "gloo")
    assert [first.chunk_is_first(c) for c in range(2)] == [True, False]
    assert [first.chunk_is_last(c) for c in range(2)] == [False, False]
    assert [last.chunk_is_last(c) for c in range(2)] == [False, True]
    assert last.writes_metrics and not first.writes_metrics


def test_derived_master_ports_stay_below_the_ephemeral_range() -> None:
    """Linux hands out 32768-60999 to outgoing connections; a derived port there may be taken (EADDRINUSE)."""
    assert max(master_port(job_id) for job_id in range(100_000)) < 32768


def test_a_rank_connects_once_rank_0_listens_not_after_torchs_backoff() -> None:
    """Rank 0's store comes 0.2 s after the rank asked: the rank goes on within a pause of it (torch's own
    client, refused, waited about half a second more on the testbed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def listen_later() -> None:
        time.sleep(0.2)
        listener.bind(("127.0.0.1", port))
        listener.listen()

    later = threading.Thread(target=listen_later)
    started = time.monotonic()
    later.start()
    try:
        assert wait_for_listener("127.0.0.1", port, timeout_s=10)
        waited = time.monotonic() - started
    finally:
        later.join()
        listener.close()
    assert 0.2 <= waited < 0.2 + LISTENER_POLL_MAX_S + 0.2


def test_nobody_listening_gives_up_at_the_timeout_with_growing_pauses() -> None:
    now = [0.0]
    pauses: list[float] = []

    def refused(host: str, port: int) -> None:
        raise ConnectionRefusedError(111, "Connection refused")

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        now[0] += seconds

    assert not wait_for_listener("n1", 20001, 2.0, connect=refused, clock=lambda: now[0], sleep=sleep)
    assert now[0] >= 2.0
    assert pauses[:3] == [0.005, 0.01, 0.02] and max(pauses) == LISTENER_POLL_MAX_S
