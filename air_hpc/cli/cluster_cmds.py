"""``air-hpc doctor | cluster init``: what the cluster you are on offers, and a profile drafted from it.

Both only read from Slurm (``scontrol show``, ``sinfo``, ``sacct``, ``sacctmgr``); neither changes anything.
"""

import getpass
import os
from pathlib import Path

import click

from air_hpc.cli.options import echo_json, json_option, set_option, slurm_client
from air_hpc.config import JobConfig, load_job
from air_hpc.doctor.checks import Finding, cluster_findings, job_findings
from air_hpc.doctor.container import container_findings, enroot_installed, pyxis_loaded
from air_hpc.doctor.nccl import nccl_findings
from air_hpc.doctor.node import NodeNetwork, read_node_network
from air_hpc.doctor.profile import check_name, check_target, draft_profile, render_profile, write_profile
from air_hpc.render import job_environment
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.cluster import ClusterFacts
from air_hpc.slurm.survey import probe_cluster


def _facts(client: SlurmClient) -> ClusterFacts:
    return probe_cluster(client, getpass.getuser())


def _on_compute_node() -> bool:
    """Inside a Slurm allocation the node doctor reads is one the job's ranks would run on."""
    return "SLURM_JOB_ID" in os.environ


def _node_findings(job: JobConfig, node: NodeNetwork, client: SlurmClient) -> list[Finding]:
    """The job's NCCL settings and container against the node doctor runs on."""
    here = _on_compute_node()
    found = nccl_findings(job_environment(job), node, job.hardware.device, here)
    if job.container is not None:
        found += container_findings(job, pyxis_loaded(client), enroot_installed(), node.host, here)
    return found


def _describe_node(node: NodeNetwork) -> str:
    up = ", ".join(i.name for i in node.interfaces if i.up) or "none up"
    ports = ", ".join(
        f"{p.device}:{p.port} {'ACTIVE' if p.active else 'down'} ({'RoCE' if p.roce else 'IB'})" for p in node.ports
    )
    return f"node         {node.host}: interfaces {up}; RDMA {ports or 'none'}"


def _limit(value: int | None, unit: str = "") -> str:
    return "unlimited" if value is None else f"{value}{unit}"


def _describe(facts: ClusterFacts) -> list[str]:
    s, t, a = facts.settings, facts.topology, facts.accounting
    up = ", ".join(f"{role} {state}" for role, state in s.controllers) or "controller status not shown"
    requeue = "JobRequeue=1" if s.job_requeue else "JobRequeue=0 (our script asks --requeue itself)"
    if s.max_batch_requeue is not None:
        requeue += f", MaxBatchRequeue={s.max_batch_requeue}"
    preempt = (
        f"{s.preempt_type}, PreemptMode={s.preempt_mode}, "
        f"preempt_send_user_signal {'set' if s.preempt_send_user_signal else 'not set'}"
        if s.preemption_enabled
        else "off"
    )
    account = ""
    if a.available:
        account = f"; default account {a.default_account or 'none'}"
        if a.accounts:
            account += f" (accounts: {', '.join(a.accounts)})"
    lines = [
        f"cluster      {s.cluster_name or '?'}: Slurm {s.version}, {up}",
        f"select       {s.select_type or '?'} ({s.select_type_parameters or 'default'})",
        f"topology     {t.plugin or 'none'}: {t.detail}",
        f"requeue      {requeue}",
        f"preemption   {preempt}",
        f"gres         {', '.join(s.gres_types) or 'none'}",
        f"accounting   {a.detail}{account}",
        "partitions",
    ]
    for p in facts.partitions:
        lines.append(
            f"  {p.name}{'*' if p.default else ''}: {p.state}, {p.total_nodes} nodes ({p.nodes}), "
            f"MaxNodes {_limit(p.max_nodes)}, MaxTime {_limit(p.max_time_min, ' min')}, "
            f"GPUs/node {p.max_gpus_per_node}, CPUs/node {_limit(p.max_cpus_per_node)}, "
            f"PreemptMode {p.preempt_mode or '(cluster)'}, GraceTime {p.grace_time_s} s"
        )
    return lines


@click.command()
@click.argument("job_file", required=False, type=click.Path(dir_okay=False))
@set_option
@json_option
def doctor(job_file: str | None, overrides: tuple[str, ...], as_json: bool) -> None:
    """Probe the Slurm cluster you are on; with JOB_FILE, say what in it the cluster cannot honour.

    Read-only. Exits 1 when JOB_FILE has an error finding.
    """
    job = None
    if job_file:
        job = load_job(job_file, overrides)
    client = slurm_client()
    facts = _facts(client)
    node = read_node_network()
    part = facts.partition(job.cluster.partition) if job else None
    findings: list[Finding] = cluster_findings(facts, part.name if part else None)
    if job is not None:
        findings += job_findings(job, facts) + _node_findings(job, node, client)
    errors = [f for f in findings if f.severity == "error"]
    if as_json:
        data = {
            "cluster": facts.to_json(),
            "node": node.to_json(),
            "job_file": job_file,
            "findings": [f.to_json() for f in findings],
            "ok": not errors,
        }
        echo_json(data)
    else:
        for line in _describe(facts):
            click.echo(line)
        click.echo(_describe_node(node))
        if job_file:
            verdict = f"{len(errors)} error(s)" if errors else "nothing this cluster cannot honour"
            click.echo(f"job          {job_file}: {verdict}")
        for finding in findings:
            click.echo(f"  {finding.describe()}")
    if errors:
        raise click.exceptions.Exit(1)


@click.group()
def cluster() -> None:
    """Cluster profiles (configs/clusters/)."""


@cluster.command()
@click.argument("name")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the profile [default: configs/clusters/NAME.yaml].",
)
@click.option("--partition", help="Partition to use [default: the cluster's default partition].")
@click.option("--account", help="Account to charge [default: your default account in Slurm's accounting].")
@click.option("--force", is_flag=True, help="Replace an existing file.")
def init(name: str, output: Path | None, partition: str | None, account: str | None, force: bool) -> None:
    """Draft configs/clusters/NAME.yaml from what `air-hpc doctor` finds here, for you to review."""
    path = output or Path("configs") / "clusters" / f"{check_name(name)}.yaml"
    check_target(path, force)
    facts = _facts(slurm_client())
    node = read_node_network()
    profile = draft_profile(facts, partition, account, node)
    written = write_profile(path, render_profile(facts, profile, node), force)
    click.echo(f"wrote {written}: review it, then use `cluster: {name}` in a job file")
