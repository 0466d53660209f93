"""``air-hpc cluster init``: a cluster profile (configs/clusters/NAME.yaml) drafted from what doctor found.

The draft holds only keys of :class:`~air_hpc.config.models.ClusterConfig`;
what the user should know but cannot set there (how preemption signals the
job, the partitions not chosen) goes into comments above the keys.
"""

import contextlib
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from air_hpc.doctor.nccl import suggested_nccl_env
from air_hpc.doctor.node import NodeNetwork
from air_hpc.errors import SlurmError, UserError
from air_hpc.slurm.cluster import ClusterFacts
from air_hpc.slurm.version import parse_version

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise UserError(f"cluster name {name!r}: expected letters, digits, '.', '_' or '-' (it becomes NAME.yaml)")
    return name


def draft_profile(
    facts: ClusterFacts, partition: str | None = None, account: str | None = None, node: NodeNetwork | None = None
) -> dict[str, Any]:
    """The keys of a cluster profile: partition (given, else the default), account, topology file, NCCL settings,
    Slurm release.

    The release (the controller's own, from ``scontrol show config``) decides what a block job may pin.
    """
    part = facts.partition(partition)
    if part is None:
        names = ", ".join(p.name for p in facts.partitions) or "none"
        what = f"partition {partition!r} does not exist" if partition else "the cluster has no default partition"
        raise UserError(f"{what}; choose one with --partition (partitions: {names})")
    profile: dict[str, Any] = {"partition": part.name}
    chosen_account = account or facts.accounting.default_account
    if chosen_account:
        profile["account"] = chosen_account
    if facts.topology.plugin is not None and facts.topology.file is not None:
        profile["topology_file"] = str(facts.topology.file)
    nccl = suggested_nccl_env(node) if node is not None else {}
    if nccl:
        profile["nccl_env"] = nccl
    with contextlib.suppress(SlurmError):  # an odd version line: plan asks `scontrol --version` at submit time
        profile["slurm_version"] = str(parse_version(f"slurm {facts.settings.version}", "SLURM_VERSION"))
    return profile


def _nccl_comment(profile: dict[str, Any], node: NodeNetwork | None) -> list[str]:
    if node is None:
        return []
    read = f"nccl_env: read off {node.host}'s interfaces and RDMA ports"
    if not node.ports:
        read += "; it has no RDMA device, so NCCL_IB_HCA is not set (NCCL would use TCP between nodes)"
    if "nccl_env" not in profile:
        read += "; nothing to set"
    return [read + ". Run `cluster init` on a compute node (inside an allocation) where it differs from this one."]


def _comments(facts: ClusterFacts, profile: dict[str, Any], node: NodeNetwork | None = None) -> list[str]:
    s = facts.settings
    part = facts.partition(profile["partition"])
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Drafted by `air-hpc cluster init` on {stamp} from cluster {s.cluster_name or '?'} (Slurm {s.version}).",
        "Review every key before the first real job; `air-hpc doctor JOB.yaml` checks a job against this cluster.",
    ]
    if part is not None:
        limit = f"{part.max_time_min} min" if part.max_time_min is not None else "unlimited"
        lines.append(
            f"partition {part.name}: {part.total_nodes} nodes, MaxTime {limit}, "
            f"up to {part.max_gpus_per_node} GPUs per node"
        )
    others = [p.name for p in facts.partitions if p.name != profile["partition"]]
    if others:
        lines.append(f"other partitions: {', '.join(others)}")
    if "account" not in profile:
        lines.append("account: none found (no accounting, or no default account); set it if your site needs one")
    if "topology_file" not in profile:
        lines.append(f"topology_file: not set ({facts.topology.detail}); `air-hpc topo import` can write one")
    lines += _nccl_comment(profile, node)
    if s.preemption_enabled:
        mode = (part.preempt_mode if part else None) or s.preempt_mode
        grace = part.grace_time_s if part else 0
        signal = (
            "the job's --signal (resilience.signal) and SIGTERM"
            if s.preempt_send_user_signal
            else "SIGTERM only (preempt_send_user_signal is not set)"
        )
        lines.append(f"signal: preemption ({s.preempt_type}, {mode}) sends {signal}, then waits GraceTime={grace} s.")
    else:
        lines.append("signal: no preemption here; Slurm sends resilience.signal (default USR2) before the time limit.")
    return lines


def render_profile(facts: ClusterFacts, profile: dict[str, Any], node: NodeNetwork | None = None) -> str:
    header = "".join(f"# {line}\n" for line in _comments(facts, profile, node))
    return header + yaml.safe_dump(profile, sort_keys=False)


def check_target(path: Path, force: bool) -> None:
    """Refuse to replace an existing profile without ``force`` (checked again right before writing)."""
    if path.exists() and not force:
        raise UserError(f"{path}: already exists; review it, or pass --force to replace it")


def write_profile(path: Path, text: str, force: bool) -> Path:
    """Write the draft atomically; an existing file is replaced only with ``force``."""
    check_target(path, force)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        raise UserError(f"{path}: cannot write: {exc.strerror or exc}") from None
    return path
