"""The README's first command: bring up the testbed and run a job across emulated nodes."""

import logging
import time
from collections.abc import Callable
from pathlib import Path

from air_hpc.errors import AirHpcError
from air_hpc.slurm.client import SlurmClient
from air_hpc.testbed import Testbed

log = logging.getLogger(__name__)

FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"})


def wait_for_job(client: SlurmClient, job_id: str, timeout_s: float, poll_s: float = 1.0) -> str:
    """Poll accounting until the job ends; sacct lags the controller by about a second."""
    deadline = time.monotonic() + timeout_s
    state = "PENDING"
    while time.monotonic() < deadline:
        out = client.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], check=False).stdout.split()
        state = out[-1] if out else state
        if state in FINAL_STATES:
            return state
        time.sleep(poll_s)
    raise AirHpcError(f"job {job_id} did not finish within {timeout_s:.0f} s (last state {state})")


def hello_nodes(state_dir: Path | None, out_dir: Path, echo: Callable[[str], None]) -> str:
    """Submit a 2-node job whose every task prints its hostname and topology address."""
    bed = Testbed(state_dir)
    bed.up()
    echo(f"testbed up: {bed.layout.root} (export SLURM_CONF={bed.layout.slurm_conf})")
    client = bed.client()
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / "hello-%j.out"
    command = "srun bash -c 'echo \"$(hostname) topology=$SLURM_TOPOLOGY_ADDR rank=$SLURM_PROCID\"'"
    job_id = (
        client.run(
            [
                "sbatch",
                "--parsable",
                "-N2",
                "--ntasks-per-node=1",
                "-J",
                "air-hpc-hello",
                "-o",
                str(output),
                "--wrap",
                command,
            ],
            retry=False,
        )
        .stdout.strip()
        .split(";")[0]
    )
    echo(f"submitted job {job_id} on 2 nodes")
    state = wait_for_job(client, job_id, timeout_s=120)
    echo(f"job {job_id}: {state}")
    text = Path(str(output).replace("%j", job_id)).read_text()
    for line in sorted(text.splitlines()):
        echo(f"  {line}")
    echo(f"the testbed stays up for you to explore; stop it with: air-hpc testbed down --state-dir {bed.layout.root}")
    return state
