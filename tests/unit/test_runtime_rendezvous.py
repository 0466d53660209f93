"""Rank 0's rendezvous port: a new one for each start of a job, and one that is taken here is replaced.

Real sockets on this host: a listener holds the port, as a process left over from a killed start
held rank 0's TCPStore port (issue 27 item 2), and the batch script's ``start`` must publish another.
"""

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

from air_hpc.config import load_job
from air_hpc.records.rundir import RunDir
from air_hpc.runtime.batch import JobStart, start
from air_hpc.runtime.rendezvous import MASTER_PORT_BASE, MASTER_PORT_SPAN, can_bind, free_master_port, master_port
from air_hpc.runtime.supervisor import Supervisor
from air_hpc.slurm.client import SlurmClient

TESTBED_JOB = Path(__file__).resolve().parents[2] / "configs" / "jobs" / "gpt-tiny-testbed.yaml"


def test_each_start_of_a_job_derives_its_own_port_in_the_span() -> None:
    ports = [master_port(4242, restart) for restart in range(4)]
    assert len(set(ports)) == 4
    assert all(MASTER_PORT_BASE <= port < MASTER_PORT_BASE + MASTER_PORT_SPAN for port in ports)
    assert master_port(4242) == master_port(4242, 0) == MASTER_PORT_BASE + 4242


@contextlib.contextmanager
def held_port(all_addresses: bool) -> Iterator[int]:
    """A job id whose first port is free now, with that port held by a listener (on every address or loopback)."""
    for job_id in range(1, MASTER_PORT_SPAN):
        port = master_port(job_id)
        if not can_bind(port):
            continue  # another test's or testbed's job listens there
        try:
            if all_addresses and socket.has_dualstack_ipv6():
                listener = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
            else:
                listener = socket.create_server(("" if all_addresses else "127.0.0.1", port))
        except OSError:
            continue  # taken between the check and the bind
        with listener:
            yield job_id
        return
    raise AssertionError("no free port in the rendezvous span")


def test_a_port_held_on_any_address_cannot_be_bound() -> None:
    for all_addresses in (True, False):
        with held_port(all_addresses) as job_id:
            assert not can_bind(master_port(job_id))
        assert can_bind(master_port(job_id))


def test_a_taken_port_is_replaced_by_one_that_can_be_bound() -> None:
    with held_port(all_addresses=True) as job_id:
        port = free_master_port(job_id, 0)
        assert port != master_port(job_id) and can_bind(port)
        assert MASTER_PORT_BASE <= port < MASTER_PORT_BASE + MASTER_PORT_SPAN


def test_the_batch_script_publishes_a_free_port_when_rank_0_runs_on_its_node(tmp_path: Path) -> None:
    with held_port(all_addresses=True) as job_id:
        job = JobStart(str(job_id), 0, "n1", ("n1", "n2"), job_id)
        on_n1 = {"SLURM_JOB_ID": str(job_id), "SLURMD_NODENAME": "n1"}
        *_, master, port = start(RunDir(tmp_path), job, on_n1, [], master=True)
        assert master == "n1" and int(port) != master_port(job_id) and can_bind(int(port))
        # rank 0 on another node: that node's ports cannot be checked from here; the derived port stands
        on_n2 = {**on_n1, "SLURMD_NODENAME": "n2"}
        assert start(RunDir(tmp_path), job, on_n2, [], master=True)[-1] == str(master_port(job_id))


def test_an_in_job_restart_replaces_a_port_held_on_rank_0s_node(tmp_path: Path, small_corpus: Path) -> None:
    """The supervisor's next step must not need the port the killed step's rank 0 (or anything) holds."""
    job = load_job(TESTBED_JOB, [f"run.root={tmp_path / 'runs'}", f"data.path={small_corpus}"])
    with held_port(all_addresses=True) as job_id:
        port = master_port(job_id)
        environ = {
            "SLURM_JOB_ID": str(job_id),
            "SLURMD_NODENAME": "n3",
            "SLURM_HOSTFILE": str(tmp_path / "hostfile"),
            "MASTER_PORT": str(port),
        }
        sup = Supervisor(job, RunDir.of(job), ["srun"], environ, SlurmClient())
        assert sup._step_env(0, ["n3", "n4"])["MASTER_PORT"] == str(port)  # the batch script checked it
        restarted = int(sup._step_env(1, ["n3", "n4"])["MASTER_PORT"])
        assert restarted != port and can_bind(restarted)
        assert sup._step_env(1, ["n4", "n3"])["MASTER_PORT"] == str(port)  # rank 0 elsewhere: not checkable here
