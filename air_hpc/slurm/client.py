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

from air_hpc.errors import SlurmError, SlurmUnreachableError

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
                log.warning(
                    "slurm controller unreachable (attempt %d/%d), retrying in %.1f s", attempt, attempts, delay
                )
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
