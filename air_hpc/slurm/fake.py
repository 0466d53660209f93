"""A fake Slurm controller for fast unit tests: keeps job state, answers in Slurm's text formats.

It replaces only :meth:`SlurmClient._run_once`, so the real client's argument
building, retries and parsers all run against it. Tests drive the cluster
with :meth:`start`, :meth:`finish`, :meth:`requeue` and :attr:`reachable`.
The real-cluster tests in ``tests/integration`` check the same formats against
a live slurmctld.
"""

import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from air_hpc.slurm import hostlist
from air_hpc.slurm.client import SlurmClient
from air_hpc.slurm.cluster import parse_partitions, parse_sinfo_groups
from air_hpc.slurm.jobs import JobState
from air_hpc.slurm.nodes import scontrol_state_available

UNREACHABLE = "{cmd}: error: Unable to contact slurm controller (connect failure)"
#: What sacct 22.05 says when slurmdbd is not running (recorded on the testbed).
ACCOUNTING_DOWN = (
    "{cmd}: error: slurm_persist_conn_open_without_init: failed to open persistent connection to "
    "host:127.0.0.1:13419: Connection refused\n{cmd}: error: Sending PersistInit msg: Connection refused\n"
    "{cmd}: error: Problem talking to the database: Connection refused"
)
INVALID_JOB = "slurm_load_jobs error: Invalid job id specified"
#: What slurmctld 22.05 answers ``sbatch --test-only`` when the nodes it needs are drained or down (or missing).
NODES_UNAVAILABLE = "allocation failure: Requested node configuration is not available"
#: What slurmctld answers a GPU request on a partition whose nodes have no GPU gres.
GRES_INVALID = "sbatch: error: Batch job submission failed: Invalid generic resource (gres) specification"


@dataclass
class FakeJob:
    job_id: str
    name: str
    nodes: int
    script: str
    state: JobState = JobState.PENDING
    nodelist: str = ""
    reason: str = "Priority"
    restarts: int = 0
    exit_code: int = 0
    exit_signal: int = 0
    time_limit: str = "00:30:00"
    signals: list[str] = field(default_factory=list)
    earlier_runs: list[tuple[JobState, str, int]] = field(default_factory=list)
    comment: str = ""
    workdir: str = ""
    preempt_time: str = "None"
    """``scontrol show job``'s PreemptTime: when Slurm preempted the job (local ``2026-12-03T07:00:00``)."""
    end_time: str = "Unknown"


def _directives(script: str) -> dict[str, str]:
    """``#SBATCH --key=value`` lines, read the way sbatch reads them (until the first command)."""
    found: dict[str, str] = {}
    for line in script.splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break
        if line.startswith("#SBATCH"):
            for word in shlex.split(line[len("#SBATCH") :], comments=True):
                key, _, value = word.partition("=")
                found[key.lstrip("-")] = value
    return found


def _array_indices(spec: str) -> list[int]:
    """``--array=0-3,7%2`` -> [0, 1, 2, 3, 7] (the ``%K`` limit is the scheduler's, not the fake's)."""
    indices: list[int] = []
    for part in spec.partition("%")[0].split(","):
        low, _, high = part.partition("-")
        indices.extend(range(int(low), int(high or low) + 1))
    return indices


@dataclass
class FakeClusterText:
    """The fake's answers to the read-only cluster queries (``air-hpc doctor``), in Slurm's own text."""

    config: str
    """``scontrol show config``"""
    partitions: str
    """``scontrol show partition --oneliner``"""
    sinfo: str
    """``sinfo --noheader --format=%R|%D|%c|%m|%G``"""
    topology: str = ""
    default_account: str | None = None
    """None: sacctmgr fails as it does without slurmdbd."""
    accounts: tuple[str, ...] = ()


class FakeSlurm(SlurmClient):
    def __init__(
        self, retries: int = 2, nodes: dict[str, str] | None = None, cluster: FakeClusterText | None = None
    ) -> None:
        super().__init__(env={}, timeout_s=5.0, retries=retries, backoff_s=0.0)
        self.nodes: dict[str, str] = dict(nodes or {})
        """Node name -> scontrol state (``IDLE``, ``ALLOCATED``, ``IDLE+DRAIN``, ...)."""
        self.cluster = cluster
        self.jobs: dict[str, FakeJob] = {}
        self.calls: list[list[str]] = []
        self._reachable = True
        self.refused = False
        """Every controller address refuses connections (slurmctld stopped), so nothing is even run."""
        self.lose_sbatch_reply = False
        """sbatch queues the job, then times out before its answer arrives."""
        self.next_id = 100
        self.accounting_up = True
        """Whether slurmdbd answers (``sacct``, ``sacctmgr``); slurmctld may answer while it does not."""
        self.version_line = "slurm 25.05.8"
        """What ``scontrol --version`` prints."""
        self.pyxis = False
        """Whether srun has pyxis's SPANK options (``srun --help`` lists ``--container-image``)."""
        self.max_array_size = 1001
        self.members: dict[str, FakeSlurm] = {}
        self.unknown_cluster = False
        self.default_name = "main"
        """The ClusterName of the cluster SLURM_CONF names (the one reached without ``-M``)."""
        self.given_conf: Path | None = None
        """Other clusters sharing this one's slurmdbd (:meth:`add_cluster`), reached with ``-M NAME``."""
        self.test_only_start = "2026-12-02T14:00:00"
        """The start ``sbatch --test-only`` predicts (local time)."""
        self.slurmctld_parameters = ""
        """``SlurmctldParameters`` in ``scontrol show config`` (``enable_expedited_requeue``) without cluster text."""
        """``MaxArraySize`` in ``scontrol show config`` when the fake has no cluster text."""

    # Driving the fake cluster.

    @property
    def reachable(self) -> bool:
        """Whether the controller answers; setting it true also ends the client's memory of the outage."""
        return self._reachable

    @reachable.setter
    def reachable(self, value: bool) -> None:
        self._reachable = value
        if value:
            self._down_until = 0.0

    def start(self, job_id: str, nodelist: str) -> None:
        job = self.jobs[job_id]
        job.state, job.nodelist, job.reason = JobState.RUNNING, nodelist, ""

    def finish(self, job_id: str, state: JobState = JobState.COMPLETED, exit_code: int = 0) -> None:
        job = self.jobs[job_id]
        job.state, job.exit_code = state, exit_code

    def requeue(self, job_id: str) -> None:
        job = self.jobs[job_id]
        job.earlier_runs.append((JobState.REQUEUED, job.nodelist, job.exit_code))
        job.state, job.reason, job.restarts = JobState.PENDING, "BeginTime", job.restarts + 1

    def add_cluster(self, name: str, nodes: dict[str, str] | None = None) -> "FakeSlurm":
        """Another cluster registered in the same slurmdbd: ``on_cluster(name)`` reaches it (``-M NAME``)."""
        member = FakeSlurm(retries=self.retries, nodes=nodes)
        member.cluster_name = name
        member.next_id = self.next_id + 1000 * (len(self.members) + 1)
        self.members[name] = member
        return member

    def on_cluster(self, name: str, slurm_conf: Path | None = None) -> SlurmClient:
        """The member cluster ``name`` (its commands carry ``--clusters=NAME``); one slurmdbd does not know: a
        cluster whose every command fails as Slurm's do for an unknown ``-M`` name."""
        member = self.members.get(name)
        if member is None:
            member = FakeSlurm(retries=self.retries)
            member.cluster_name = name
            member.unknown_cluster = True
        member.own_conf = slurm_conf is not None
        member.given_conf = slurm_conf
        return member

    # What the client sees.

    def controller_refused(self) -> str | None:
        return "fake-ctld:6817" if self.refused else None

    def _run_once(
        self, args: Sequence[str], input_text: str | None, timeout_s: float, *, probe_slow: bool = False
    ) -> subprocess.CompletedProcess[str]:
        args = list(args)
        self.calls.append(args)
        if self.cluster_name is not None:  # the real client added -M; this fake is that cluster
            if f"--clusters={self.cluster_name}" not in args and args[0] in ("sbatch", "squeue", "scancel", "sacct"):
                raise AssertionError(f"fake cluster {self.cluster_name}: {shlex.join(args)} lacks --clusters")
            args = [a for a in args if not a.startswith("--clusters=")]
            if self.unknown_cluster:
                return self._done(args, 1, err=f"{args[0]}: error: No cluster '{self.cluster_name}' known by database.")
        elif any(a == "--clusters=all" for a in args) and args[0] == "sacct":
            return self._sacct_all(args)
        if not self._reachable and args[1:] != ["--version"]:  # --version asks no daemon
            return self._done(args, 1, err=UNREACHABLE.format(cmd=args[0]))
        if not self.accounting_up and args[0] in ("sacct", "sacctmgr"):
            return self._done(args, 1, err=ACCOUNTING_DOWN.format(cmd=args[0]))
        handler = {
            "sbatch": self._sbatch,
            "squeue": self._squeue,
            "sacct": self._sacct,
            "scontrol": self._scontrol,
            "scancel": self._scancel,
            "sinfo": self._sinfo,
            "sacctmgr": self._sacctmgr,
            "srun": self._srun_help,
        }[args[0]]
        return handler(args)

    @staticmethod
    def _done(args: list[str], rc: int = 0, out: str = "", err: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, rc, out, err)

    @staticmethod
    def _option(args: list[str], name: str) -> str | None:
        for arg in args:
            if arg.startswith(f"--{name}="):
                return arg.split("=", 1)[1]
        return None

    def _sbatch(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        wrapped = self._option(args, "wrap")
        script = f"#!/bin/sh\n{wrapped}\n" if wrapped is not None else Path(args[-1]).read_text()
        opts = _directives(script)
        opts.update(_directives("#!/bin/sh\n" + "".join(f"#SBATCH {shlex.quote(a)}\n" for a in args[1:-1])))
        nodes = int(opts.get("nodes", "1"))
        if self._no_such_gres(opts):
            return self._done(args, 1, err=GRES_INVALID)
        if "--test-only" in args:
            if not self._could_start_now(nodes, opts.get("nodelist")):
                return self._done(args, 1, err=NODES_UNAVAILABLE)
            where = f" on cluster {self.cluster_name}" if self.cluster_name else ""
            return self._done(
                args,
                err=f"sbatch: Job {self.next_id} to start at {self.test_only_start}{where} using {nodes * 2} "
                f"processors on nodes {opts.get('nodelist') or f'n[1-{nodes}]'} in partition "
                f"{opts.get('partition', 'debug')}\n",
            )
        job_id = str(self.next_id)
        self.next_id += 1
        comment = self._option(args, "comment") or opts.get("comment", "")
        array = opts.get("array")
        for task in [job_id] if array is None else [f"{job_id}_{i}" for i in _array_indices(array)]:
            self.jobs[task] = FakeJob(
                task, opts.get("job-name", "sbatch"), nodes, script, comment=comment, workdir=opts.get("chdir", "")
            )
        if self.lose_sbatch_reply:
            return self._done(args, 1, err="sbatch: error: Batch job submission failed: Socket timed out on send/recv")
        return self._done(args, out=f"{job_id};{self.cluster_name}\n" if self.cluster_name else f"{job_id}\n")

    def _no_such_gres(self, opts: dict[str, str]) -> bool:
        """GPUs asked of a partition without GPU gres (known only when the fake has cluster text)."""
        if self.cluster is None or not (opts.get("gpus-per-node") or opts.get("gres")):
            return False
        parts = parse_partitions(self.cluster.partitions)
        wanted = opts.get("partition") or next((p.name for p in parts if p.default), "")
        groups = parse_sinfo_groups(self.cluster.sinfo).get(wanted, ())
        return not any(group.gpus for group in groups)

    def _could_start_now(self, nodes: int, nodelist: str | None) -> bool:
        """Like slurmctld's test-only: every pinned node, and enough nodes, available now (no nodes known: yes)."""
        if not self.nodes:
            return True
        available = {name for name, state in self.nodes.items() if scontrol_state_available(state)}
        pinned = set(hostlist.expand(nodelist, "sbatch --nodelist")) if nodelist else set()
        return pinned <= available and nodes <= len(available)

    def _squeue(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        wanted = (self._option(args, "jobs") or "").split(",")
        fmt = self._option(args, "format") or ""
        live = [j for j in self.jobs.values() if not j.state.terminal]
        if wanted != [""]:
            if not any(j.job_id in wanted for j in self.jobs.values()):
                return self._done(args, 1, err=INVALID_JOB)
            live = [j for j in live if j.job_id in wanted]
        codes = {
            "i": lambda j: j.job_id,
            "T": lambda j: str(j.state),
            "D": lambda j: str(j.nodes),
            "N": lambda j: j.nodelist,
            "r": lambda j: j.reason or "None",
            "M": lambda j: "0:05" if j.state is JobState.RUNNING else "0:00",
            "l": lambda j: j.time_limit.lstrip("0:") or "0",
            "j": lambda j: j.name,
            "k": lambda j: j.comment or "(null)",
            "Z": lambda j: j.workdir,
        }
        lines = [re.sub(r"%(\w)", lambda m, j=j: codes[m.group(1)](j), fmt) for j in live]  # type: ignore[misc]
        banner = f"CLUSTER: {self.cluster_name}\n" if self.cluster_name else ""
        return self._done(args, out=banner + "".join(line + "\n" for line in lines))

    def _sacct(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        wanted = (self._option(args, "jobs") or "").split(",")
        fields = (self._option(args, "format") or "").split(",")
        lines = []
        for job in self.jobs.values():
            if wanted != [""] and job.job_id not in wanted:
                continue
            runs = [*job.earlier_runs, (job.state, job.nodelist, job.exit_code)]
            for state, nodelist, code in runs:
                values = {
                    "JobIDRaw": job.job_id,
                    "JobID": job.job_id,
                    "State": "CANCELLED by 0" if state is JobState.CANCELLED else str(state),
                    "ExitCode": f"{code}:{job.exit_signal}",
                    "NNodes": str(job.nodes),
                    "NodeList": nodelist or "None assigned",
                    "Elapsed": "00:00:05",
                    "Timelimit": job.time_limit,
                    "JobName": job.name,
                    "WorkDir": job.workdir,
                    "Comment": job.comment,
                }
                lines.append("|".join(values[f] for f in fields))
        return self._done(args, out="".join(line + "\n" for line in lines))

    def _sacct_all(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        """``sacct -M all --jobs=ID --format=Cluster``: the clusters whose accounting holds the job."""
        wanted = self._option(args, "jobs")
        everyone = {self.default_name: self, **self.members}
        found = [name for name, fake in everyone.items() if wanted in fake.jobs]
        return self._done(args, out="".join(f"{name}\n" for name in found))

    def _scontrol(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        if args[1:] == ["--version"]:
            return self._done(args, out=f"{self.version_line}\n")
        words = [a for a in args[1:] if not a.startswith("-")]
        if words[:2] == ["show", "job"]:
            job = self.jobs.get(words[2])
            if job is None:
                return self._done(args, 1, err=INVALID_JOB)
            return self._done(
                args,
                out=f"JobId={job.job_id} JobName={job.name} UserId=root(0) GroupId=root(0) "
                f"Priority=1 Nice=0 Account=(null) QOS=(null) JobState={job.state} Reason={job.reason or 'None'} "
                f"Dependency=(null) Requeue=1 Restarts={job.restarts} BatchFlag=1 Reboot=0 "
                f"ExitCode={job.exit_code}:0 RunTime=00:00:05 TimeLimit={job.time_limit} EndTime={job.end_time} "
                f"PreemptEligibleTime=None PreemptTime={job.preempt_time} "
                f"NodeList={job.nodelist or '(null)'} NumNodes={job.nodes} Command=/tmp/job.sbatch\n",
            )
        if words[:2] == ["show", "nodes"]:
            if not self.nodes:
                return self._done(args, out="No nodes in the system\n")
            lines = [
                f"NodeName={name} Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=2 "
                f"NodeAddr=127.0.0.1 NodeHostName={name} Partitions=debug State={state} RealMemory=1"
                for name, state in self.nodes.items()
            ]
            return self._done(args, out="".join(line + "\n" for line in lines))
        cluster_queries = {"config": "config", "partition": "partitions", "topology": "topology"}
        if words[:1] == ["show"] and words[1] in cluster_queries and self.cluster is not None:
            return self._done(args, out=getattr(self.cluster, cluster_queries[words[1]]))
        if words[:2] == ["show", "config"]:  # no cluster text: the few settings the client reads
            return self._done(
                args,
                out=f"SLURM_VERSION = 25.05.8\nMaxArraySize = {self.max_array_size}\n"
                f"SlurmctldParameters = {self.slurmctld_parameters or '(null)'}\n",
            )
        if words[:2] == ["show", "partition"]:  # no cluster text: a controller without partitions
            return self._done(args, out="No partitions in the system\n")
        if words[:1] == ["requeue"]:
            self.requeue(words[1])
            return self._done(args)
        if words[:1] == ["update"]:
            return self._done(args)
        raise NotImplementedError(f"fake scontrol: {shlex.join(args)}")

    def _scancel(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        job = self.jobs.get(args[-1])
        if job is None:
            return self._done(args, 1, err=f"scancel: error: Kill job error on job id {args[-1]}: Invalid job id")
        signal = self._option(args, "signal")
        if signal:
            job.signals.append(signal)
        elif not job.state.terminal:
            job.state = JobState.CANCELLED
        return self._done(args)

    def _srun_help(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        plugin = "\nOptions provided by plugins:\n      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH\n"
        return self._done(args, out="Usage: srun [OPTIONS(0)...]\n" + (plugin if self.pyxis else ""))

    def _sinfo(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        if self._option(args, "format") != "%R|%D|%c|%m|%G":
            raise NotImplementedError(f"fake sinfo: {shlex.join(args)}")
        return self._done(args, out="" if self.cluster is None else self.cluster.sinfo)

    def _sacctmgr(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        if "clusters" in args:
            return self._done(args, out="".join(f"{name}\n" for name in [self.default_name, *self.members]))
        if self.cluster is None or self.cluster.default_account is None:
            return self._done(
                args,
                1,
                err="sacctmgr: error: slurm_persist_conn_open_without_init: failed to open persistent connection "
                "to host:localhost:6819: Connection refused",
            )
        if "assoc" in args:
            return self._done(args, out="".join(f"{account}|\n" for account in self.cluster.accounts))
        user = args[args.index("user") + 1]
        return self._done(args, out=f"{user}|{self.cluster.default_account}\n")
