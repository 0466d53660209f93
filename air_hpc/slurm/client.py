"""The only place that runs Slurm's commands.

Every call has a timeout, logs its command line, and keeps stderr on the error.
Tests inject a fake with the same methods instead of patching subprocess.
How long a call keeps asking a controller that does not answer is its
:class:`RetryPolicy`, chosen per call: read-only queries retry with backoff
(:data:`PATIENT`); ``sbatch`` and other requests a blind retry could repeat
try once (:data:`ONCE`), so a slow controller cannot cause a duplicate
submission; the batch script's helper, inside a running job, tries once and
briefly (:data:`IN_JOB`).
"""

import logging
import os
import shlex
import subprocess
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from air_hpc.digits import ascii_int
from air_hpc.errors import (
    AccountingMissingError,
    AccountingUnreachableError,
    ConfigError,
    JobRefusedError,
    SlurmCommandMissing,
    SlurmError,
    SlurmNotConfiguredError,
    SlurmUnreachableError,
)
from air_hpc.slurm.accounting import FLEET_FIELDS, Accounting, iter_lines, parse_accounting
from air_hpc.slurm.cluster import (
    CONFIG_ARGS,
    PARTITION_ARGS,
    Partition,
    SlurmSettings,
    parse_partitions,
    parse_show_config,
)
from air_hpc.slurm.controller import describe, refused_everywhere
from air_hpc.slurm.jobs import (
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    TAGGED_FIELDS,
    TAGGED_FORMAT,
    JobRecord,
    JobStatus,
    Preemption,
    TestOnlyResult,
    accounting_ids,
    merge_status,
    parse_preemption,
    parse_sacct,
    parse_sbatch_parsable,
    parse_scontrol_job,
    parse_squeue,
    parse_tagged,
    parse_test_only,
    slurm_epoch,
)
from air_hpc.slurm.reasons import refusal
from air_hpc.slurm.version import SlurmVersion, parse_version

log = logging.getLogger(__name__)

#: stderr fragments that mean "the controller did not answer", not "the request was wrong".
UNREACHABLE_MARKERS = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Connection refused",
    "Zero Bytes were transmitted or received",
    "slurm_load_jobs error: Unable to contact",
)

#: sacct's answer on a cluster without accounting (AccountingStorageType=accounting_storage/none).
ACCOUNTING_DISABLED_MARKER = "accounting storage is disabled"

#: Commands answered by slurmdbd, not slurmctld: one that cannot reach it says nothing about the controller.
ACCOUNTING_COMMANDS = frozenset({"sacct", "sacctmgr"})

#: stderr of a Slurm command that found no slurm.conf (nor a configless source): no cluster to ask, not a slow one.
NO_CONFIG_MARKER = "Could not establish a configuration source"


def no_configuration(env: Mapping[str, str]) -> str:
    """Why Slurm's commands have no configuration here, and how to point them at one."""
    conf = env.get("SLURM_CONF", "")
    if conf and not os.path.isfile(conf):
        where = f"SLURM_CONF={conf} names no file"
    elif conf:
        where = f"SLURM_CONF={conf} could not be read"
    else:
        where = "SLURM_CONF is not set, there is no /etc/slurm/slurm.conf and no configless slurmctld answered"
    return (
        f"no Slurm cluster configuration found: {where}; point at one with `export SLURM_CONF=/path/to/slurm.conf`, "
        'or for the local testbed `eval "$(air-hpc testbed env)"`'
    )


#: A command that has not answered in this long is checked for a controller that refuses connections.
QUICK_ANSWER_S = 1.0

#: Longest a Slurm call may take, retries included (``AIR_HPC_SLURM_DEADLINE_S`` overrides).
DEFAULT_DEADLINE_S = 20.0
DEADLINE_ENV = "AIR_HPC_SLURM_DEADLINE_S"


def deadline_from_env(env: Mapping[str, str]) -> float:
    """``$AIR_HPC_SLURM_DEADLINE_S`` (seconds, > 0), else the default; a bad value is a user error."""
    raw = env.get(DEADLINE_ENV, "").strip()
    if not raw:
        return DEFAULT_DEADLINE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ConfigError(f"${DEADLINE_ENV}={raw!r}: expected a number of seconds above 0")
    return value


@dataclass(frozen=True)
class RetryPolicy:
    """How long one call keeps asking a controller that does not answer (a refused request is never retried).

    ``retries``: further attempts after the first (None: the client's ``retries``). ``deadline_s``:
    the most the call may take, attempts and waits together (None: the client's deadline,
    ``$AIR_HPC_SLURM_DEADLINE_S``, which also caps a shorter one).
    """

    retries: int | None = None
    deadline_s: float | None = None


#: Read-only queries: retry with backoff until the client's deadline.
PATIENT = RetryPolicy()
#: Requests a blind retry could repeat (a second job, a second signal, a second requeue): one attempt.
ONCE = RetryPolicy(retries=0)
#: Inside a running job (the batch script's helper, as a start ends): one attempt of at most 10 s.
IN_JOB = RetryPolicy(retries=0, deadline_s=10.0)


#: ``scontrol show`` words answered from slurm.conf alone, without the controller.
_OFFLINE_SCONTROL = frozenset({"hostnames", "hostlist", "hostlistsorted"})


def talks_to_slurmctld(args: Sequence[str]) -> bool:
    """Whether the command needs slurmctld (sacct talks to slurmdbd, ``scontrol show hostnames`` and ``--version``
    to no one)."""
    if not args or args[0] not in ("sbatch", "squeue", "scancel", "scontrol", "sinfo", "srun", "salloc"):
        return False
    if "--version" in args[1:]:
        return False
    words = [a for a in args[1:] if not a.startswith("-")]
    offline = args[0] == "scontrol" and len(words) > 1 and words[0] == "show" and words[1] in _OFFLINE_SCONTROL
    return not offline


#: Commands that take Slurm's multi-cluster option (``-M NAME``, here ``--clusters=NAME``).
MULTI_CLUSTER_COMMANDS = frozenset({"sbatch", "squeue", "sacct", "scancel", "scontrol", "sinfo"})


def with_cluster(args: Sequence[str], cluster: str | None) -> list[str]:
    """``args`` aimed at ``cluster`` with Slurm's ``--clusters=NAME`` (``-M``), where the command takes it.

    ``scontrol --version`` and the offline ``scontrol show hostnames`` ask no daemon (with ``-M``
    scontrol would ask slurmdbd for the cluster first); ``srun`` runs inside a job, on its cluster. Pure.
    """
    if cluster is None or not args or args[0] not in MULTI_CLUSTER_COMMANDS:
        return list(args)
    if args[0] != "sacct" and not talks_to_slurmctld(args):  # sacct asks slurmdbd, which holds every cluster
        return list(args)
    return [args[0], f"--clusters={cluster}", *args[1:]]


def strip_cluster_banner(text: str) -> str:
    """squeue, sinfo and scontrol under ``-M`` print a ``CLUSTER: NAME`` line before each cluster's answer. Pure."""
    if "CLUSTER: " not in text:
        return text
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("CLUSTER: "))


class NotRun(SlurmUnreachableError):
    """The controller is known to be down, so the command was not even started (nothing was submitted)."""


class SlurmClient:
    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
        retries: int = 3,
        backoff_s: float = 1.0,
        deadline_s: float | None = None,
        bin_dir: Path | None = None,
        run_as: str | None = None,
        cluster_name: str | None = None,
    ) -> None:
        """``bin_dir``: where Slurm's commands are (a build's ``PREFIX/bin``); it goes first on the commands'
        ``PATH``, which both picks the executables and is what jobs submitted through this client inherit.
        ``run_as``: run every command as this user (``runuser -u``; root only), so its jobs are that user's.
        ``cluster_name``: aim every command at this Slurm cluster (``-M NAME``; see :meth:`on_cluster`)."""
        self.run_as = run_as
        self.cluster_name = cluster_name
        self.own_conf = False
        """Whether ``SLURM_CONF`` was set for the bound cluster (else it is the default cluster's)."""
        self.env = {**os.environ, **(env or {})}
        if bin_dir is not None:
            self.env["PATH"] = os.pathsep.join(filter(None, [str(bin_dir), self.env.get("PATH", "")]))
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.deadline_s = deadline_from_env(self.env) if deadline_s is None else deadline_s
        self._down_until = 0.0
        self._down_reason = ""
        """After the controller failed to answer, calls fail at once for one deadline (a submit's later steps)."""

    def as_user(self, user: str) -> "SlurmClient":
        """The same client, its commands run as ``user`` (root only): another user's jobs, on a testbed."""
        bound = SlurmClient(
            self.env,
            self.timeout_s,
            self.retries,
            self.backoff_s,
            self.deadline_s,
            run_as=user,
            cluster_name=self.cluster_name,
        )
        bound.own_conf = self.own_conf
        return bound

    def on_cluster(self, name: str, slurm_conf: Path | None = None) -> "SlurmClient":
        """The same client aimed at Slurm cluster ``name``: every command with ``-M NAME`` (the clusters share a
        slurmdbd, which knows each controller), and with ``slurm_conf``, that cluster's own ``SLURM_CONF`` for the
        commands and for the jobs submitted through it (they run on that cluster's nodes)."""
        env = {**self.env, "SLURM_CONF": str(slurm_conf)} if slurm_conf is not None else self.env
        bound = SlurmClient(
            env, self.timeout_s, self.retries, self.backoff_s, self.deadline_s, run_as=self.run_as, cluster_name=name
        )
        bound.own_conf = slurm_conf is not None
        return bound

    def cluster_names(self, *, retry: RetryPolicy = PATIENT) -> tuple[str, ...]:
        """Every cluster the slurmdbd knows (``sacctmgr show clusters``): those ``-M`` can reach."""
        out = self.run(["sacctmgr", "--noheader", "--parsable2", "show", "clusters", "format=Cluster"], retry=retry)
        return tuple(dict.fromkeys(line.strip() for line in out.stdout.splitlines() if line.strip()))

    def controller_refused(self) -> str | None:
        """``host:port, ...`` when every controller address in slurm.conf refuses connections, else None.

        A client aimed at another cluster with ``-M`` and no slurm.conf of its own cannot tell (the file names
        the default cluster's controller): None."""
        if self.cluster_name is not None and not self.own_conf:
            return None
        addresses = refused_everywhere(self.env, timeout_s=min(2.0, self.deadline_s))
        return describe(addresses) if addresses else None

    def run(
        self,
        args: Sequence[str],
        *,
        input_text: str | None = None,
        timeout_s: float | None = None,
        retry: RetryPolicy = PATIENT,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run one Slurm command; while the controller does not answer, retry as ``retry`` allows.

        A controller that refuses connections fails ``sbatch`` before it runs
        (nothing submitted) and any other call once it is slow to answer; one that
        does not answer is retried (one warning line each) until the call's
        deadline, which bounds every attempt and wait together; for one more
        client deadline after that, calls fail without waiting again. ``check=False``
        (the caller reads the answer itself, e.g. ``scontrol ping``) skips both.
        """
        args = with_cluster(args, self.cluster_name)
        self._refuse_early(args, check)
        deadline_s = self.deadline_s if retry.deadline_s is None else min(retry.deadline_s, self.deadline_s)
        deadline = time.monotonic() + deadline_s
        attempts = 1 + (self.retries if retry.retries is None else retry.retries)
        delay = self.backoff_s
        stderr = ""
        for attempt in range(1, attempts + 1):
            left = deadline - time.monotonic()
            budget = max(0.1, min(timeout_s or self.timeout_s, left if attempt == attempts else left / 2))
            result = self._run_once(args, input_text, budget, probe_slow=check and talks_to_slurmctld(args))
            if self.cluster_name is not None:
                result.stdout = strip_cluster_banner(result.stdout)
            if result.returncode == 0 or not check:
                return result
            stderr = result.stderr.strip()
            self._raise_unless_unanswered(args, result.returncode, stderr)
            left = deadline - time.monotonic()
            if attempt == attempts or left <= delay:
                break
            log.warning(
                "%s: Slurm controller did not answer (attempt %d/%d); retrying in %.1f s, %.0f s left of the %.0f s "
                "deadline (%s)",
                args[0],
                attempt,
                attempts,
                delay,
                left,
                deadline_s,
                DEADLINE_ENV,
            )
            time.sleep(delay)
            delay *= 2
        last = stderr.splitlines()[-1] if stderr else "no answer"
        self._mark_down(last)
        raise SlurmUnreachableError(
            f"Slurm controller unreachable: {args[0]} gave no answer within {deadline_s:g} s (${DEADLINE_ENV}): {last}"
        )

    def _raise_unless_unanswered(self, args: Sequence[str], code: int, stderr: str) -> None:
        """Raise what a failed command's stderr says went wrong, unless it is a controller that did not answer."""
        if NO_CONFIG_MARKER in stderr:
            raise SlurmNotConfiguredError(f"{no_configuration(self.env)} ({stderr.splitlines()[-1]})")
        refused = refusal(stderr) if args[0] == "sbatch" else None
        if refused is not None:
            raise JobRefusedError(f"{refused} (`sacctmgr show assoc user=$USER` lists what you may use)")
        if not any(marker in stderr for marker in UNREACHABLE_MARKERS):
            raise SlurmError(f"{shlex.join(args)} failed (exit {code}): {stderr}")
        if args[0] in ACCOUNTING_COMMANDS:  # slurmdbd, not slurmctld: the controller is not marked down
            raise AccountingUnreachableError(f"Slurm accounting (slurmdbd) unreachable: {stderr.splitlines()[-1]}")

    def _refuse_early(self, args: Sequence[str], check: bool) -> None:
        """Fail before running ``args`` when the controller is known to be down."""
        if not check:
            return
        if time.monotonic() < self._down_until:
            raise NotRun(f"Slurm controller unreachable ({self._down_reason}); {args[0]} not run")
        refused = self.controller_refused() if args[0] == "sbatch" else None
        if refused is not None:
            raise NotRun(f"Slurm controller unreachable: connection refused at {refused} (is slurmctld running?)")

    def _mark_down(self, reason: str) -> None:
        self._down_until, self._down_reason = time.monotonic() + self.deadline_s, reason

    def _run_once(
        self, args: Sequence[str], input_text: str | None, timeout_s: float, *, probe_slow: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run the command; with ``probe_slow``, one still running after :data:`QUICK_ANSWER_S` is ended at once
        when no controller address accepts a connection (Slurm's tools retry a stopped one for a minute or more).

        Only a slow command probes: every probe is a connection slurmctld logs as an error ("Zero Bytes were
        transmitted"), which a probe per command turned into a line in its log for every poll.
        """
        log.debug("run: %s", shlex.join(args))
        conf = self.env.get("SLURM_CONF", "")
        if conf and not os.path.isfile(conf):  # Slurm's tools would retry reading it for a minute
            raise SlurmNotConfiguredError(no_configuration(self.env))
        try:
            proc = subprocess.Popen(
                ["runuser", "-u", self.run_as, "--", *args] if self.run_as else list(args),
                stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=self.env,
            )
        except FileNotFoundError:
            raise SlurmCommandMissing(
                f"{args[0]}: command not found; install Slurm's client tools (slurm-client)"
            ) from None
        with proc:
            return self._answer(proc, args, input_text, timeout_s, probe_slow)

    def _answer(
        self,
        proc: "subprocess.Popen[str]",
        args: Sequence[str],
        input_text: str | None,
        timeout_s: float,
        probe_slow: bool,
    ) -> subprocess.CompletedProcess[str]:
        started = time.monotonic()
        try:
            out, err = proc.communicate(input_text, timeout=min(timeout_s, QUICK_ANSWER_S))
        except subprocess.TimeoutExpired:
            refused = self.controller_refused() if probe_slow else None
            if refused is not None:
                proc.kill()
                proc.communicate()
                self._mark_down(f"connection refused at {refused}")
                raise SlurmUnreachableError(
                    f"Slurm controller unreachable: connection refused at {refused} (is slurmctld running?)"
                ) from None
            try:
                out, err = proc.communicate(timeout=max(0.0, timeout_s - (time.monotonic() - started)))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                return subprocess.CompletedProcess(
                    list(args), 124, "", f"Socket timed out: {args[0]} gave no answer in {timeout_s} s"
                )
        return subprocess.CompletedProcess(list(args), proc.returncode, out, err)

    # Typed calls. Parsing lives in air_hpc.slurm.jobs, cluster and version; these choose the arguments and,
    # unless a caller knows better, the retry policy.

    def sbatch(self, script_path: Path, extra_args: Sequence[str] = ()) -> str:
        """Submit a batch script; return the job id.

        Never retried: when the controller times out the job may still have
        been accepted, and a blind retry would submit it twice.
        """
        return self._submit(["sbatch", "--parsable", *extra_args, str(script_path)])

    def sbatch_wrap(self, command: str, extra_args: Sequence[str] = ()) -> str:
        """Submit ``command`` as a one-line batch job (``sbatch --wrap``); return the job id. Never retried."""
        return self._submit(["sbatch", "--parsable", *extra_args, f"--wrap={command}"])

    def _submit(self, args: list[str]) -> str:
        try:
            result = self.run(args, retry=ONCE)
        except NotRun:
            raise
        except SlurmUnreachableError as exc:
            raise SlurmUnreachableError(f"{exc}; the job may or may not have been submitted") from None
        return parse_sbatch_parsable(result.stdout)

    def find_submitted(
        self,
        token: str,
        user: str,
        since_s: float,
        workdir: Path,
        known: Collection[str] = (),
        *,
        retry: RetryPolicy = PATIENT,
    ) -> str | None:
        """The job id of the ``sbatch --comment=TOKEN`` this user ran after ``since_s``; None when Slurm has none.

        The controller knows recent jobs with their comment; accounting knows
        older ones, with the comment where ``AccountingStoreFlags=job_comment``
        keeps it and else by working directory (our script's ``--chdir``, the
        run directory). Raises SlurmUnreachableError when it cannot tell.
        """
        queued = self.run(["squeue", "--noheader", f"--user={user}", f"--format={TAGGED_FORMAT}"], retry=retry)
        for job_id, _, comment in parse_tagged(queued.stdout):
            if comment == token:
                return job_id
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since_s - 1))
        args = [
            "sacct",
            "--noheader",
            "--parsable2",
            "--allocations",
            f"--user={user}",
            f"--starttime={since}",
            f"--format={','.join(TAGGED_FIELDS)}",
        ]
        try:
            accounted = self.run(args, retry=retry).stdout
        except (SlurmUnreachableError, AccountingUnreachableError):
            raise
        except SlurmError as exc:
            log.warning("accounting unavailable (%s); deciding on the controller's queue alone", exc)
            return None
        found = parse_tagged(accounted)
        for job_id, _, comment in found:
            if comment == token:
                return job_id
        same_dir = [j for j, where, comment in found if not comment and where == str(workdir) and j not in known]
        return same_dir[-1] if same_dir else None

    def sbatch_test_only(self, script_path: Path, *, retry: RetryPolicy = PATIENT) -> TestOnlyResult:
        """Ask the controller whether and where the script would run, without submitting it."""
        result = self.run(["sbatch", "--test-only", str(script_path)], retry=retry)
        return parse_test_only(result.stderr + result.stdout)

    def squeue(
        self, job_ids: Sequence[str] = (), user: str | None = None, *, retry: RetryPolicy = PATIENT
    ) -> list[JobRecord]:
        # --array: one line per array task (a sweep's pending elements too), each by its ARRAY_INDEX id.
        args = ["squeue", "--noheader", "--array", f"--format={SQUEUE_FORMAT}"]
        if job_ids:
            args.append(f"--jobs={','.join(job_ids)}")
        if user:
            args.append(f"--user={user}")
        try:
            result = self.run(args, retry=retry)
        except SlurmError as exc:
            if "Invalid job id" in str(exc) and not isinstance(exc, SlurmUnreachableError):
                return []
            raise
        return parse_squeue(result.stdout)

    def sacct(self, job_ids: Sequence[str], *, retry: RetryPolicy = PATIENT) -> list[JobRecord]:
        """Allocation records, one per run of each job (requeued runs included); an element's whole array too."""
        args = [
            "sacct",
            "--noheader",
            "--parsable2",
            "--allocations",
            "--duplicates",
            f"--format={','.join(SACCT_FIELDS)}",
            f"--jobs={','.join(accounting_ids(job_ids))}",
        ]
        return parse_sacct(self.run(args, retry=retry).stdout)

    def show_job(self, job_id: str, *, retry: RetryPolicy = PATIENT) -> dict[str, str] | None:
        """A few fields of ``scontrol show job``; None once the controller has forgotten the job."""
        try:
            result = self.run(["scontrol", "--oneliner", "show", "job", job_id], retry=retry)
        except SlurmError as exc:
            if "Invalid job id" in str(exc) and not isinstance(exc, SlurmUnreachableError):
                return None
            raise
        return parse_scontrol_job(result.stdout) or None

    def job_status(self, job_id: str) -> JobStatus | None:
        """The controller's view of a job, else accounting's; None when neither knows it."""
        queued = self.squeue([job_id])
        restarts: int | None = None
        if queued:
            shown = self.show_job(job_id) or {}
            restarts = ascii_int(shown.get("Restarts", ""))
            return merge_status(job_id, queued, [], restarts)
        return merge_status(job_id, [], self.sacct([job_id]), restarts)

    def clusters_of_job(self, job_id: str, *, retry: RetryPolicy = PATIENT) -> tuple[str, ...]:
        """The clusters whose accounting holds job ``job_id`` (``sacct -M all``): where a bare job id may live."""
        args = [
            "sacct",
            "--clusters=all",
            "--noheader",
            "--parsable2",
            "--allocations",
            f"--jobs={job_id}",
            "--format=Cluster",
        ]
        out = self.run(args, retry=retry).stdout
        return tuple(dict.fromkeys(line.strip() for line in out.splitlines() if line.strip()))

    def preemption(self, job_id: str, *, retry: RetryPolicy = PATIENT) -> Preemption | None:
        """Slurm's own preemption of the job (PreemptMode=REQUEUE); None when it was not preempted or is forgotten.

        Who requeues it depends on the release; one whose version cannot be read counts as older than 24.05.
        """
        return self.preemption_in(self.show_job(job_id, retry=retry) or {}, retry=retry)

    def preemption_in(self, fields: Mapping[str, str], *, retry: RetryPolicy = PATIENT) -> Preemption | None:
        """:meth:`preemption` from the job's ``scontrol show job`` fields (the release is asked only if preempted)."""
        if slurm_epoch(fields.get("PreemptTime", "")) is None:
            return None
        try:
            version: SlurmVersion | None = self.version(retry=retry)
        except SlurmError as exc:
            log.warning("%s; taking Slurm for a release before 24.05", exc)
            version = None
        return parse_preemption(fields, version, time.time())

    def version(self, *, retry: RetryPolicy = PATIENT) -> SlurmVersion:
        """The release of Slurm's commands (``scontrol --version``; no daemon is asked, slurm.conf must be readable)."""
        return parse_version(self.run(["scontrol", "--version"], retry=retry).stdout)

    def srun_help(self) -> str:
        """srun's options, those of SPANK plugins (pyxis) included; read-only, it starts nothing."""
        return self.run(["srun", "--help"], retry=ONCE, check=False).stdout

    def settings(self, *, retry: RetryPolicy = PATIENT) -> SlurmSettings:
        """The controller's settings (``scontrol show config``): MaxArraySize, requeue, preemption."""
        return parse_show_config(self.run(list(CONFIG_ARGS), retry=retry).stdout)

    def partitions(self, *, retry: RetryPolicy = PATIENT) -> tuple[Partition, ...]:
        """Every partition with its limits, default flag and GraceTime (``scontrol show partition``)."""
        return parse_partitions(self.run(list(PARTITION_ARGS), retry=retry).stdout)

    def scancel(
        self, job_id: str, signal: str | None = None, batch: bool = False, *, retry: RetryPolicy = PATIENT
    ) -> None:
        """Cancel or signal a job; cancelling is safe to retry (twice is a no-op), a signal may arrive twice."""
        args = ["scancel"]
        if signal:
            args.append(f"--signal={signal}")
        if batch:
            args.append("--batch")
        self.run([*args, job_id], retry=retry)

    def step_finishes(self, host: str, job_id: str | None = None) -> bool:
        """Whether a one-task step (``srun --overlap ... true``) on ``host`` of the job ends well within the client's
        timeout; no retry, and no answer is a no (the caller judges a node by it)."""
        args = ["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "true"]
        if job_id:
            args.insert(1, f"--jobid={job_id}")
        return self.run(args, check=False, retry=ONCE).returncode == 0

    def start_step(
        self, host: str, argv: Sequence[str], job_id: str | None, log_path: Path
    ) -> "subprocess.Popen[bytes]":
        """Start a one-task helper step (``srun --overlap``) on ``host`` of the job and return at once.

        The caller owns the process (a long-lived helper such as the snapshot holder) and ends it;
        its output goes to ``log_path``. ``--overlap`` shares the training step's CPUs.
        """
        args = ["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--kill-on-bad-exit=0"]
        if job_id:
            args.insert(1, f"--jobid={job_id}")
        args += list(argv)
        log.info("starting %s", shlex.join(args))
        with open(log_path, "ab") as out:
            return subprocess.Popen(args, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=False)

    def scontrol_requeue(self, job_id: str, *, retry: RetryPolicy = ONCE) -> None:
        self.run(["scontrol", "requeue", job_id], retry=retry)

    def update_job(self, job_id: str, fields: Mapping[str, str], *, retry: RetryPolicy = ONCE) -> None:
        """``scontrol update jobid=ID Key=Value ...`` (e.g. ExcNodeList, ReqNodeList of a pending job)."""
        self.run(
            ["scontrol", "update", f"jobid={job_id}", *(f"{key}={value}" for key, value in fields.items())], retry=retry
        )

    def accounting(
        self, since_s: float, until_s: float, accounts: Sequence[str] = (), *, retry: RetryPolicy = PATIENT
    ) -> Accounting:
        """Every job record of the window, ours or not, each requeued run its own (``sacct -a -X -P --duplicates``).

        No ``sacct``, accounting switched off, or a slurmdbd that does not answer: :class:`AccountingMissingError`.
        """
        args = [
            "sacct",
            "--allusers",
            "--allocations",
            "--parsable2",
            "--noheader",
            "--duplicates",
            f"--starttime={slurm_time(since_s)}",
            f"--endtime={slurm_time(until_s)}",
            f"--format={','.join(FLEET_FIELDS)}",
        ]
        if accounts:
            args.append(f"--accounts={','.join(accounts)}")
        try:
            result = self.run(args, retry=retry)
        except SlurmCommandMissing:
            raise AccountingMissingError(
                "sacct not found: install Slurm's client tools (slurm-client) on this host"
            ) from None
        except AccountingUnreachableError as exc:
            raise AccountingMissingError(f"{exc}; start slurmdbd or point SLURM_CONF at a cluster with one") from None
        except SlurmError as exc:
            if ACCOUNTING_DISABLED_MARKER not in str(exc):
                raise
            raise AccountingMissingError(
                "no Slurm accounting: the cluster has no slurmdbd (AccountingStorageType is none), "
                "so sacct knows no jobs"
            ) from None
        return parse_accounting(iter_lines(result.stdout))

    def account_names(self, *, retry: RetryPolicy = PATIENT) -> tuple[str, ...]:
        """Every account slurmdbd knows (``sacctmgr show account``)."""
        out = self.run(["sacctmgr", "--noheader", "--parsable2", "show", "account", "format=Account"], retry=retry)
        return tuple(dict.fromkeys(line.strip() for line in out.stdout.splitlines() if line.strip()))

    def qos_names(self, *, retry: RetryPolicy = PATIENT) -> tuple[str, ...]:
        """Every QOS slurmdbd knows (``sacctmgr show qos``)."""
        out = self.run(["sacctmgr", "--noheader", "--parsable2", "show", "qos", "format=Name"], retry=retry)
        return tuple(dict.fromkeys(line.strip() for line in out.stdout.splitlines() if line.strip()))


def slurm_time(epoch_s: float) -> str:
    """Epoch seconds as the local ``YYYY-MM-DDTHH:MM:SS`` Slurm's commands read."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch_s))
