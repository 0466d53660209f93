"""Quoting for the two languages a batch script speaks: bash, and sbatch's ``#SBATCH`` lines.

Bash values are single-quoted unless they are plain words. ``#SBATCH`` lines are comments to
bash and are parsed by sbatch itself (``_get_argument`` in ``src/sbatch/opt.c``):
whitespace ends an argument unless quoted, where a single quote and a double quote
each open a quoted stretch that only the same quote closes (so a bare ``'`` in a
value is not literal either); a backslash takes the next character literally, in
quotes too; an unescaped ``#`` outside quotes starts a comment; and nothing can
continue past the end of the line. So a directive value is wrapped in double
quotes with ``\\``, ``"`` and ``#`` escaped (a ``'`` inside them is literal), and
values sbatch cannot carry at all (newlines, other control characters, over-long
values) are rejected naming the config key they came from.
"""

import re

from air_hpc.errors import ConfigError

#: sbatch copies each argument into a BUFSIZ (8192) buffer; stay well below it.
MAX_DIRECTIVE_CHARS = 4096

_SAFE_WORD = re.compile(r"[A-Za-z0-9_@%+:,./\-]+")
_SAFE_DIRECTIVE = re.compile(r"[A-Za-z0-9_@%+=:,./\-\[\]]+")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def shell_quote(value: object) -> str:
    """Quote one value for bash; plain words stay readable.

    Stricter than :func:`shlex.quote`, which leaves ``=`` bare (``X==a`` is valid
    bash but shellcheck rejects it).
    """
    text = str(value)
    if _SAFE_WORD.fullmatch(text):
        return text
    return "'" + text.replace("'", "'\"'\"'") + "'"


def sbatch_value(value: str, key: str) -> str:
    """Encode ``value`` so sbatch reads it back verbatim from an ``#SBATCH --opt=VALUE`` line."""
    if _CONTROL.search(value):
        raise ConfigError(
            f"{key}: {value!r} contains a newline or control character, which an #SBATCH line cannot carry"
        )
    if not value:
        raise ConfigError(f"{key}: must not be empty")
    if len(value) > MAX_DIRECTIVE_CHARS:
        raise ConfigError(f"{key}: {len(value)} characters is longer than sbatch accepts ({MAX_DIRECTIVE_CHARS})")
    if _SAFE_DIRECTIVE.fullmatch(value):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("#", "\\#")
    return f'"{escaped}"'


def slurm_filename(path: str) -> str:
    """Escape ``%`` so Slurm's filename patterns (``%j``, ``%t``, ...) leave a literal path alone."""
    return path.replace("%", "%%")


def check_env_name(name: str, key: str) -> str:
    if not _ENV_NAME.fullmatch(name):
        raise ConfigError(f"{key}: {name!r} is not a valid environment variable name (letters, digits, _)")
    return name


def check_one_line(value: str, key: str) -> str:
    """Refuse a value with a line break: quoted or not, it would end a line of the batch script early."""
    if "\n" in value or "\r" in value:
        raise ConfigError(f"{key}: {value!r} contains a line break, which a batch script value cannot hold")
    return value
