"""A Slurm build the testbed runs instead of the system's: ``testbed up --slurm-prefix PREFIX``.

A prefix is what ``scripts/slurm-build.sh SOURCE PREFIX`` (``configure --prefix``) installs: daemons in
``sbin/``, commands in ``bin/``. It is checked once, at the edge, so that a half-installed or foreign tree
fails with one line naming what is missing, never later inside a daemon's log.
"""

import subprocess
from dataclasses import dataclass
from pathlib import Path

from air_hpc.errors import SlurmError, UserError
from air_hpc.slurm.version import KNOWN_RELEASES, SlurmVersion, is_known, parse_version

#: What the testbed starts or runs from a prefix: its three daemons and the commands the CLI and tests use.
REQUIRED = (
    "sbin/slurmctld",
    "sbin/slurmd",
    "sbin/slurmdbd",
    "bin/sbatch",
    "bin/scontrol",
    "bin/squeue",
    "bin/sinfo",
    "bin/sacct",
    "bin/scancel",
    "bin/srun",
)


@dataclass(frozen=True)
class SlurmBuild:
    """A checked prefix: where the build lives and which release it is."""

    prefix: Path
    version: SlurmVersion

    @property
    def bin_dir(self) -> Path:
        return self.prefix / "bin"

    def daemon(self, name: str) -> str:
        """Absolute path of a daemon (``slurmctld``, ``slurmd``, ``slurmdbd``) of this build."""
        return str(self.prefix / "sbin" / name)

    def search_path(self, path: str) -> str:
        """``PATH`` with this build's commands and daemons first, so every Slurm command run is this build's."""
        return ":".join([str(self.prefix / "bin"), str(self.prefix / "sbin"), *filter(None, path.split(":"))])


def check_prefix(prefix: Path) -> SlurmBuild:
    """The build at ``prefix``; :class:`UserError` (exit 2) naming what is missing or the release not known."""
    where = f"--slurm-prefix {prefix}"
    if not prefix.is_dir():
        raise UserError(f"{where}: no such directory; build one with scripts/slurm-build.sh SOURCE PREFIX")
    missing = [name for name in REQUIRED if not (prefix / name).is_file()]
    if missing:
        raise UserError(
            f"{where}: missing {', '.join(missing)}; expected a Slurm installed with `make install` "
            "(scripts/slurm-build.sh SOURCE PREFIX)"
        )
    version = daemon_version(str(prefix / "sbin" / "slurmctld"), where)
    if not is_known(version):
        known = ", ".join(f"{v.major:02d}.{v.minor:02d}" for v in KNOWN_RELEASES)
        raise UserError(f"{where}: Slurm {version} is not a release air-hpc knows ({known})")
    return SlurmBuild(prefix.resolve(), version)


def daemon_version(ctld: str, where: str = "slurmctld") -> SlurmVersion:
    """The release ``ctld -V`` prints (it needs no slurm.conf); :class:`UserError` when it runs or answers badly."""
    try:
        shown = subprocess.run([ctld, "-V"], capture_output=True, text=True, timeout=30, check=False)
        return parse_version(shown.stdout or shown.stderr, f"{ctld} -V")
    except OSError as exc:
        raise UserError(f"{where}: cannot run {ctld}: {exc.strerror}") from None
    except SlurmError as exc:
        raise UserError(f"{where}: {exc}") from None
