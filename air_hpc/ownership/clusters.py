"""Which Slurm cluster holds a run's job, and the client aimed at it (``submit --clusters``)."""

from air_hpc.errors import UserError
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import SubmissionRecord, submissions
from air_hpc.slurm.client import SlurmClient


def cluster_client(run_dir: RunDir, client: SlurmClient, cluster: str | None) -> SlurmClient:
    """The client aimed at ``cluster`` for this run: with ``-M NAME``, and with that cluster's own slurm.conf
    where the run's cluster profile names one. No cluster, or ``client``'s own: ``client``."""
    if cluster is None or cluster == client.cluster_name:
        return client
    conf = None
    if run_dir.job_json.is_file():
        try:
            listed = run_dir.read_job().cluster.clusters
        except UserError:
            listed = ()
        conf = next((c.slurm_conf for c in listed if c.name == cluster), None)
    return client.on_cluster(cluster, conf)


def run_client(run_dir: RunDir, client: SlurmClient, record: SubmissionRecord | None = None) -> SlurmClient:
    """The client aimed at the cluster holding the run's job (``record``, else its latest submission)."""
    if record is None:
        records = submissions(run_dir)
        record = records[-1] if records else None
    return cluster_client(run_dir, client, record.cluster if record is not None else None)
