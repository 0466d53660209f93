"""The testbed's tenants: accounts with users, node quotas and fair shares, and three QOS tiers, in slurmdbd.

What a shared training platform sets up with ``sacctmgr``: teams (accounts) under ``root``, each with a
node quota (``GrpTRES=node=N``) and a fair share, the QOS it may use; tiers ``high`` (preempts
``scavenger``), ``normal`` and ``scavenger`` (preemptible, requeued after its GraceTime, free of fair-share
usage). :func:`plan` is pure (what to add given what slurmdbd already holds, then the settings every
entity gets, so ``up`` after ``down`` on the same MariaDB converges); :func:`apply` runs it.

Users: the user who runs the testbed (it submits the trainings) belongs to every account, beside named
users without a Unix account (slurmdbd accepts them, as it does directory users a login node resolves)
and the system users ``daemon`` and ``nobody``, which exist on every Debian machine, so jobs of other
users really run under other uids (``runuser -u nobody -- sbatch ...``).
"""

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from air_hpc.errors import TestbedError
from air_hpc.slurm.client import ONCE, SlurmClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Qos:
    name: str
    priority: int
    """Multiplied by PriorityWeightQOS (after normalising to the highest QOS priority)."""
    preempts: tuple[str, ...] = ()
    preemptible: bool = False
    """Requeued when preempted, after the testbed's preemption grace time; its usage counts nothing towards
    fair-share (UsageFactor=0)."""


@dataclass(frozen=True)
class Tenant:
    account: str
    fairshare: int
    quota_share: float
    """Fraction of the testbed's nodes the account may hold at once (``GrpTRES=node=N``, at least 2)."""
    users: tuple[str, ...]
    """Besides the user who runs the testbed."""


QOS_TIERS = (
    Qos("high", priority=1000, preempts=("scavenger",)),
    Qos("normal", priority=100),
    Qos("scavenger", priority=0, preemptible=True),
)
DEFAULT_QOS = "normal"
TENANTS = (
    Tenant("research", fairshare=50, quota_share=0.75, users=("alice", "daemon")),
    Tenant("product", fairshare=30, quota_share=0.5, users=("bob", "nobody")),
    Tenant("ops", fairshare=20, quota_share=0.25, users=("carol", "nobody")),
)
#: Users with a Unix account on every Debian machine, so their jobs can run as them.
SYSTEM_USERS = ("daemon", "nobody")


def node_quota(tenant: Tenant, nodes: int) -> int:
    """The tenant's ``GrpTRES=node=N`` on a testbed of ``nodes`` nodes: its share, at least 2 (one gpt-tiny run)."""
    return min(nodes, max(2, int(nodes * tenant.quota_share)))


@dataclass(frozen=True)
class Existing:
    """What slurmdbd already holds (``sacctmgr show``): QOS names, account names, (account, user) associations."""

    qos: frozenset[str] = frozenset()
    accounts: frozenset[str] = frozenset()
    users: frozenset[tuple[str, str]] = frozenset()


def plan(existing: Existing, nodes: int, owner: str, grace_s: int) -> list[list[str]]:
    """The ``sacctmgr -i`` argument lists that bring slurmdbd to the tenants' setup. Pure.

    Entities are added only when missing (``add`` of an existing one is refused); their settings are then
    set with ``modify``, which is idempotent, so a second ``up`` on the same database changes nothing.
    """
    qos_names = ",".join(q.name for q in QOS_TIERS)
    steps = [["add", "qos", q.name] for q in QOS_TIERS if q.name not in existing.qos]
    for q in QOS_TIERS:
        sets = [f"Priority={q.priority}", f"Preempt={','.join(q.preempts)}"]
        if q.preemptible:
            sets += [f"GraceTime={grace_s}", "PreemptMode=requeue", "UsageFactor=0"]
        steps.append(["modify", "qos", "where", f"name={q.name}", "set", *sets])
    for tenant in TENANTS:
        if tenant.account not in existing.accounts:
            steps.append(["add", "account", tenant.account, f"Description={tenant.account} team", "Parent=root"])
        steps.append(
            [
                "modify",
                "account",
                "where",
                f"name={tenant.account}",
                "set",
                f"Fairshare={tenant.fairshare}",
                f"GrpTRES=node={node_quota(tenant, nodes)}",
                f"QOS={qos_names}",
                f"DefaultQOS={DEFAULT_QOS}",
            ]
        )
        for user in dict.fromkeys((owner, *tenant.users)):
            if (tenant.account, user) not in existing.users:
                steps.append(["add", "user", user, f"Account={tenant.account}"])
    return steps


def parse_existing(qos: str, accounts: str, associations: str) -> Existing:
    """From ``sacctmgr -nP show qos format=name``, ``show account format=account`` and
    ``show assoc format=account,user``. Pure."""
    pairs = (line.split("|", 1) for line in associations.splitlines() if "|" in line)
    return Existing(
        qos=frozenset(line.strip() for line in qos.splitlines() if line.strip()),
        accounts=frozenset(line.strip() for line in accounts.splitlines() if line.strip()),
        users=frozenset((account.strip(), user.strip()) for account, user in pairs if user.strip()),
    )


def read_existing(client: SlurmClient) -> Existing:
    def show(*what: str) -> str:
        return client.run(["sacctmgr", "-nP", "show", *what]).stdout

    return parse_existing(
        show("qos", "format=name"), show("account", "format=account"), show("assoc", "format=account,user")
    )


def apply(client: SlurmClient, nodes: int, owner: str, grace_s: int, timeout_s: float = 30.0) -> list[list[str]]:
    """Create or update the tenants in slurmdbd and wait until slurmctld has them; returns the ``sacctmgr`` calls.

    slurmdbd pushes new associations to slurmctld on its own time: a job submitted before they arrive
    would be refused with "Invalid account".
    """
    steps = plan(read_existing(client), nodes, owner, grace_s)
    for step in steps:
        client.run(["sacctmgr", "-i", *step], retry=ONCE)
        log.info("sacctmgr %s", " ".join(step))
    deadline = time.monotonic() + timeout_s
    missing: list[str] = []
    while time.monotonic() < deadline:
        shown = client.run(["scontrol", "show", "assoc_mgr", "flags=assoc", f"users={owner}"]).stdout
        missing = unknown_to_controller(shown, owner)
        if not missing:
            return steps
        time.sleep(0.5)
    raise TestbedError(f"slurmctld did not learn the accounts {', '.join(missing)} of {owner} in {timeout_s:g} s")


def unknown_to_controller(assoc_mgr: str, owner: str) -> list[str]:
    """The tenants' accounts whose association with ``owner`` ``scontrol show assoc_mgr`` lacks. Pure."""
    known = set(re.findall(rf"Account=(\S+) UserName={re.escape(owner)}\(", assoc_mgr))
    return [t.account for t in TENANTS if t.account not in known]


def describe(nodes: int) -> Sequence[str]:
    """One line per tenant and QOS tier, for ``testbed status``."""
    lines = [
        f"account {t.account}: node quota {node_quota(t, nodes)}, fair share {t.fairshare}, users {', '.join(t.users)}"
        for t in TENANTS
    ]
    for q in QOS_TIERS:
        extra = f", preempts {', '.join(q.preempts)}" if q.preempts else ""
        extra += ", preemptible (requeued)" if q.preemptible else ""
        lines.append(f"qos {q.name}: priority {q.priority}{extra}")
    return lines
