"""Why a job waits, in plain words: Slurm's pending reasons (``squeue %r``) mapped to a sentence. Pure.

Slurm names its limit reasons by a grammar (``src/common/job_state_reason.c``): a scope (``Assoc``: the
account's association; ``QOS``; none for the QOS's per-account limits), a limit kind (``Grp``: the whole
group at once; ``Max``: per job, user, node or account; ``Min``), a resource (``Node``, ``Cpu``, ``Mem``,
``GRES``, ``Jobs``, ``Wall``, ...), and what is counted (``Limit``, ``Minutes``, ``RunMinutes``, ``PerJob``,
``PerUser``, ...). :func:`plain_reason` reads that grammar, so the ~200 limit reasons of every release
need no table of their own; the others are listed.
"""

import re

#: Reasons that are not accounting limits.
_FIXED = {
    "Priority": "waiting for jobs of higher priority to start first",
    "Resources": "waiting for free nodes",
    "Dependency": "waiting for the jobs it depends on",
    "DependencyNeverSatisfied": "will never start: a job it depends on ended in a way the dependency excludes",
    "BeginTime": "waiting for its --begin time",
    "JobHeldUser": "held by its user (scontrol release)",
    "JobHeldAdmin": "held by an administrator",
    "JobHoldMaxRequeue": "held: it was requeued more often than Slurm allows (MaxBatchRequeue)",
    "launch failed requeued held": "held after its launch failed (scontrol release once the node is fixed)",
    "ReqNodeNotAvail": "a node it requires is unavailable (down, drained or reserved)",
    "NodeDown": "a node it needs is down",
    "PartitionDown": "its partition is down",
    "PartitionInactive": "its partition is inactive",
    "PartitionNodeLimit": "asks for more nodes than its partition allows",
    "PartitionTimeLimit": "asks for more time than its partition allows",
    "PartitionConfig": "its partition's configuration does not allow it",
    "Reservation": "waiting for its reservation to start",
    "BadConstraints": "will never start: no node matches its constraints",
    "Constraints": "waiting for nodes with its constraints",
    "Licenses": "waiting for licenses",
    "InvalidAccount": "will never start: its account is unknown or not allowed here",
    "InvalidQOS": "will never start: its QOS is unknown or not allowed for its account",
    "QOSNotAllowed": "will never start: its account may not use this QOS",
    "AccountNotAllowed": "will never start: its account may not use this partition",
    "QOSUsageThreshold": "its QOS's usage is over the threshold it needs",
    "AssociationJobLimit": "held by its account's job limit",
    "AssociationResourceLimit": "held by its account's resource quota",
    "AssociationTimeLimit": "held by its account's time limit",
    "QOSJobLimit": "held by its QOS's job limit",
    "QOSResourceLimit": "held by its QOS's resource limit",
    "QOSTimeLimit": "held by its QOS's time limit",
    "AccountingPolicy": "held by an accounting limit",
    "SchedDefer": "the scheduler deferred it",
    "Prolog": "its prolog is running",
    "Cleaning": "its nodes are still cleaning up after its last run",
    "JobArrayTaskLimit": "held by its array's limit on tasks running at once",
    "MaxPoweredUpNodes": "waiting for nodes to power up (MaxPoweredUpNodes)",
    "BurstBufferResources": "waiting for burst buffer space",
    "BurstBufferStageIn": "staging its burst buffer in",
    "FedJobLock": "waiting for the federation's job lock",
    "DeadLine": "its deadline passed",
    "TimeLimit": "ended at its time limit",
    "InactiveLimit": "ended: its srun was inactive too long",
    "NonZeroExitCode": "its last run exited with a non-zero code",
    "RaisedSignal": "its last run was killed by a signal",
    "OutOfMemory": "its last run ran out of memory",
    "JobLaunchFailure": "its launch failed",
    "SystemFailure": "a system failure ended its last run",
    "NvidiaImexChannels": "waiting for NVIDIA IMEX channels",
    "BurstBufferOperation": "waiting for a burst buffer operation",
    "MaxMemPerLimit": "asks for more memory per CPU or node than allowed",
    "ReservationDeleted": "its reservation was deleted",
    "ReservationInvalid": "its reservation is invalid",
    "MpiPortsBusy": "waiting for free MPI ports",
}

_RESOURCES = {
    "Node": "node",
    "Cpu": "CPU",
    "CPU": "CPU",
    "Mem": "memory",
    "Memory": "memory",
    "GRES": "GPU/GRES",
    "Billing": "billing",
    "Energy": "energy",
    "License": "license",
    "BB": "burst buffer",
    "Unknown": "TRES",
    "Jobs": "running-job",
    "Job": "running-job",
    "SubmitJobs": "queued-job",
    "SubmitJob": "queued-job",
    "Wall": "wall-time",
    "WallDuration": "wall-time",
}
_PLURAL = {"node": "nodes", "CPU": "CPUs", "GPU/GRES": "GPUs/GRES", "license": "licenses", "wall-time": "time"}
_RESOURCE_NAMES = "|".join(sorted(_RESOURCES, key=len, reverse=True))
_LIMIT = re.compile(
    rf"^(?P<scope>Assoc|QOS)?(?P<kind>Grp|Max|Min)(?P<res>{_RESOURCE_NAMES})"
    r"(?P<count>RunMinutes|RunMins|Minutes|)(?P<per>PerJob|PerUser|PerNode|PerAccount|)(?:Limit|NotSatisfied)?$"
)
_SCOPE = {"Assoc": "its account's", "QOS": "its QOS's", None: "its QOS's"}


def _limit_words(match: "re.Match[str]") -> str:
    scope = _SCOPE[match["scope"]]
    resource, kind, per = _RESOURCES[match["res"]], match["kind"], match["per"]
    if match["count"]:
        resource += "-minutes" if match["count"] == "Minutes" else " running-minutes"
    each = f" per {per.removeprefix('Per').lower()}" if per else ""
    if match["res"] in ("Jobs", "Job", "SubmitJobs", "SubmitJob"):
        return f"held by {scope} limit on {resource.replace('-job', ' jobs')}{each or ' at once'}"
    if kind == "Min":
        return f"will never start: asks for less than {scope} minimum of {_PLURAL.get(resource, resource)}"
    if kind == "Grp" and not per:
        group = "account" if match["scope"] == "Assoc" else "QOS"
        return f"held by {scope} {resource} quota: the {group}'s running jobs hold all of it"
    if per in ("", "PerJob", "PerNode"):
        allows = "a job" if per != "PerNode" else "a job on one node"
        return f"will not start: asks for more {_PLURAL.get(resource, resource)} than {scope} limit for {allows}"
    holder = "its user's" if per == "PerUser" else "its account's"
    return f"held by {scope} {resource} limit{each}: {holder} running jobs hold all of it"


def plain_reason(reason: str) -> str:
    """``AssocGrpNodeLimit`` -> "held by its account's node quota: ..."; an empty or ``None`` reason -> "";
    one this table does not know comes back as Slurm said it."""
    reason = reason.strip()
    if reason in ("", "None"):
        return ""
    head = reason.split(",", 1)[0].strip()  # "ReqNodeNotAvail, UnavailableNodes:n3"
    if head in _FIXED:
        return _FIXED[head]
    match = _LIMIT.match(head)
    if match:
        return _limit_words(match)
    if head.startswith("Max") and head.endswith(("PerAccount", "PerUser")):  # MaxNodeRunMinsPerUser ...
        return f"held by its QOS's limit {head}"
    return reason


#: Fixed-name reasons that are accounting limits too.
_FIXED_LIMITS = frozenset(
    {
        "AssociationJobLimit",
        "AssociationResourceLimit",
        "AssociationTimeLimit",
        "QOSJobLimit",
        "QOSResourceLimit",
        "QOSTimeLimit",
        "AccountingPolicy",
    }
)


def is_limit(reason: str) -> bool:
    """Whether the reason is an accounting limit (a quota or QOS limit), not a wait for nodes or priority."""
    head = reason.strip().split(",", 1)[0].strip()
    return (
        bool(_LIMIT.match(head))
        or head in _FIXED_LIMITS
        or (head.startswith("Max") and head.endswith(("PerAccount", "PerUser")))
    )


#: sbatch's refusals of what a job asks (``Batch job submission failed: ...``), and what to check.
_REFUSALS = (
    ("Invalid account", "cluster.account (--account): an account your user has no association with"),
    ("Invalid qos", "cluster.qos (--qos): a QOS that does not exist or that the account may not use"),
    ("Invalid partition", "cluster.partition (--partition): no such partition"),
    ("Job violates accounting/QOS policy", "the job's size or time: over a limit of its account or QOS"),
)


def refusal(stderr: str) -> str | None:
    """What to fix when sbatch refused a job for what it asks, with sbatch's own words; None for other errors."""
    for marker, fix in _REFUSALS:
        if marker.lower() in stderr.lower():
            said = next((line for line in stderr.splitlines() if marker.lower() in line.lower()), marker)
            return f"Slurm refused the job: {said.strip().removeprefix('sbatch: error: ')}; check {fix}"
    return None


def with_reason(state: str, reason: str) -> str:
    """``PENDING`` plus Slurm's reason and its plain words: ``PENDING (AssocGrpNodeLimit: held by ...)``."""
    words = plain_reason(reason)
    if not words:
        return state
    return f"{state} ({reason}: {words})" if words != reason.strip() else f"{state} ({reason.strip()})"
