"""Ask a cluster what it offers, read-only: :func:`probe_cluster` for ``air-hpc doctor`` and ``cluster init``.

It runs the queries whose text :mod:`air_hpc.slurm.cluster` parses through the one
:class:`SlurmClient`, and keeps going when an optional part (accounting, the topology)
is missing, recording why.
"""

import logging
from dataclasses import replace

from air_hpc.errors import SlurmError
from air_hpc.slurm.client import ONCE, SlurmClient
from air_hpc.slurm.cluster import (
    CONFIG_ARGS,
    SACCT_PROBE_ARGS,
    SINFO_ARGS,
    TOPOLOGY_ARGS,
    Accounting,
    ClusterFacts,
    Partition,
    SlurmSettings,
    TopologyInfo,
    parse_accounts,
    parse_default_account,
    parse_show_config,
    parse_sinfo_groups,
    parse_topology,
)

log = logging.getLogger(__name__)


def _optional(client: SlurmClient, args: list[str]) -> tuple[str | None, str]:
    """Run a query whose failure is a finding, not an error: (stdout or None, why it failed).

    Not retried: a slurmdbd that refuses connections is an answer here, not a reason to wait.
    """
    try:
        return client.run(args, retry=ONCE).stdout, ""
    except SlurmError as exc:
        log.info("%s", exc)
        return None, str(exc).splitlines()[0] if str(exc) else "failed"


def _probe_accounting(client: SlurmClient, settings: SlurmSettings, user: str) -> Accounting:
    if settings.accounting_storage is None:
        return Accounting(False, "AccountingStorageType is none: no sacct, no accounts")
    out, why = _optional(client, list(SACCT_PROBE_ARGS))
    if out is None:
        return Accounting(False, f"sacct does not answer: {why}")
    users, _ = _optional(
        client, ["sacctmgr", "--noheader", "--parsable2", "show", "user", user, "format=User,DefaultAccount"]
    )
    assocs, _ = _optional(
        client, ["sacctmgr", "--noheader", "--parsable2", "show", "assoc", f"user={user}", "format=Account"]
    )
    return Accounting(
        True,
        f"{settings.accounting_storage}; sacct answers",
        parse_default_account(users or ""),
        parse_accounts(assocs or ""),
    )


def _probe_topology(client: SlurmClient, settings: SlurmSettings) -> TopologyInfo:
    plugin = settings.topology_plugin
    candidates = []
    if settings.conf_path is not None:
        candidates = [settings.conf_path.parent / "topology.conf", settings.conf_path.parent / "topology.yaml"]
    readable = next((p for p in candidates if p.is_file()), None)
    if plugin is None:
        return TopologyInfo(None, readable, 0, 0, "no topology plugin: Slurm places jobs without regard to switches")
    out, why = _optional(client, list(TOPOLOGY_ARGS))
    leaves, switches = parse_topology(out or "")
    where = f"{readable}" if readable else "no topology.conf readable beside slurm.conf (configless?)"
    detail = f"{leaves} leaf switch(es)/block(s), {switches} in all; {where}" if out is not None else why
    return TopologyInfo(plugin, readable, leaves, switches, detail)


def partitions_with_nodes(client: SlurmClient) -> tuple[Partition, ...]:
    """Every partition with the kinds of nodes it holds (CPUs, memory, GPU gres: ``sinfo``)."""
    groups = parse_sinfo_groups(client.run(list(SINFO_ARGS)).stdout)
    return tuple(replace(p, groups=groups.get(p.name, ())) for p in client.partitions())


def probe_cluster(client: SlurmClient, user: str) -> ClusterFacts:
    """Ask the controller what it offers; read-only. Unreachable controller -> :class:`SlurmUnreachableError`."""
    settings = parse_show_config(client.run(list(CONFIG_ARGS)).stdout)
    partitions = partitions_with_nodes(client)
    return ClusterFacts(
        settings=settings,
        partitions=partitions,
        accounting=_probe_accounting(client, settings, user),
        topology=_probe_topology(client, settings),
        user=user,
    )
