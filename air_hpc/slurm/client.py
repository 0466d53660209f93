"""The only place that runs Slurm's commands.

Every call has a timeout, logs its command line, and keeps stderr on the error.
Tests inject a fake with the same methods instead of patching subprocess.
Read-only queries retry with backoff when the controller does not answer;
``sbatch`` never retries by itself, so a slow controller cannot cause a
duplicate submission.
"""

import logging
import os
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from air_hpc.errors import SlurmError, SlurmUnreachableError
from air_hpc.slurm.jobs import (
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    JobRecord,
    JobStatus,
    TestOnlyResult,
    ascii_int,
    merge_status,
    parse_sacct,
    parse_sbatch_parsable,
    parse_scontrol_job,
    parse_squeue,
    parse_test_only,
)

log = logging.getLogger(__name__)

#: stderr fragments that mean "the controller did not answer", not "the request was wrong".
UNREACHABLE_MARKERS = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Connection refused",
    "Zero Bytes were transmitted or received",
    "Could not establish a configuration source",
    "slurm_load_jobs error: Unable to contact",
)


class SlurmClient:
    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
        retries: int = 3,
        backoff_s: float = 1.0,
    ) -> None:
        self.env = {**os.environ, **(env or {})}
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s

    def run(
        self,
        args: Sequence[str],
        *,
        input_text: str | None = None,
        timeout_s: float | None = None,
        retry: bool = True,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run one Slurm command; retry only read-only calls when the controller is unreachable."""
        attempts = 1 + (self.retries if retry else 0)
        delay = self.backoff_s
        for attempt in range(1, attempts + 1):
            result = self._run_once(args, input_text, timeout_s or self.timeout_s)
            if result.returncode == 0 or not check:
                return result
            stderr = result.stderr.strip()
            unreachable = any(marker in stderr for marker in UNREACHABLE_MARKERS)
            if not unreachable:
                raise SlurmError(f"{shlex.join(args)} failed (exit {result.returncode}): {stderr}")
            if attempt < attempts:
                log.info("slurm controller unreachable (attempt %d/%d), retrying in %.1f s", attempt, attempts, delay)
                time.sleep(delay)
                delay *= 2
        raise SlurmUnreachableError(
            f"Slurm controller unreachable after {attempts} attempt(s) of {args[0]}: "
            f"{stderr.splitlines()[-1] if stderr else 'no answer'}"
        )

    def _run_once(
        self, args: Sequence[str], input_text: str | None, timeout_s: float
    ) -> subprocess.CompletedProcess[str]:
        log.debug("run: %s", shlex.join(args))
        try:
            return subprocess.run(
                list(args),
                input=input_text,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env=self.env,
                check=False,
            )
        except FileNotFoundError:
            raise SlurmError(f"{args[0]}: command not found; install Slurm's client tools (slurm-client)") from None
        except subprocess.TimeoutExpired as exc:
            return subprocess.CompletedProcess(
                list(args), 124, "", f"Socket timed out: {args[0]} gave no answer in {exc.timeout} s"
            )

    # Typed calls. Parsing lives in air_hpc.slurm.jobs; these only choose the arguments.

    def sbatch(self, script_path: Path, extra_args: Sequence[str] = ()) -> str:
        """Submit a batch script; return the job id.

        Never retried: when the controller times out the job may still have
        been accepted, and a blind retry would submit it twice.
        """
        try:
            result = self.run(["sbatch", "--parsable", *extra_args, str(script_path)], retry=False)
        except SlurmUnreachableError as exc:
            raise SlurmUnreachableError(
                f"{exc}; the job may or may not have been submitted: check `squeue --me` before submitting again"
            ) from None
        return parse_sbatch_parsable(result.stdout)

    def sbatch_test_only(self, script_path: Path) -> TestOnlyResult:
        """Ask the controller whether and where the script would run, without submitting it."""
        result = self.run(["sbatch", "--test-only", str(script_path)])
        return parse_test_only(result.stderr + result.stdout)

    def squeue(self, job_ids: Sequence[str] = (), user: str | None = None) -> list[JobRecord]:
        args = ["squeue", "--noheader", f"--format={SQUEUE_FORMAT}"]
        if job_ids:
            args.append(f"--jobs={','.join(job_ids)}")
        if user:
            args.append(f"--user={user}")
        try:
            result = self.run(args)
        except SlurmError as exc:
            if "Invalid job id" in str(exc) and not isinstance(exc, SlurmUnreachableError):
                return []
            raise
        return parse_squeue(result.stdout)

    def sacct(self, job_ids: Sequence[str]) -> list[JobRecord]:
        """Allocation records, one per run of each job (requeued runs included)."""
        args = [
            "sacct",
            "--noheader",
            "--parsable2",
            "--allocations",
            "--duplicates",
            f"--format={','.join(SACCT_FIELDS)}",
            f"--jobs={','.join(job_ids)}",
        ]
        return parse_sacct(self.run(args).stdout)

    def show_job(self, job_id: str) -> dict[str, str] | None:
        """A few fields of ``scontrol show job``; None once the controller has forgotten the job."""
        try:
            result = self.run(["scontrol", "--oneliner", "show", "job", job_id])
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

    def scancel(self, job_id: str, signal: str | None = None, batch: bool = False) -> None:
        """Cancel or signal a job; safe to retry (cancelling twice is a no-op)."""
        args = ["scancel"]
        if signal:
            args.append(f"--signal={signal}")
        if batch:
            args.append("--batch")
        self.run([*args, job_id])

    def scontrol_requeue(self, job_id: str) -> None:
        self.run(["scontrol", "requeue", job_id], retry=False)
