"""Load a job file: compose named profiles, apply ``--set`` overrides, validate.

Errors name the file and line where the YAML gives one, the dotted key, and
for unknown keys the closest valid one. A profile named in a job file is looked up
in the ``configs/`` tree the job file sits in, then in the presets shipped with the
package, so a job file anywhere can name them. A job given by name (``gpt-tiny-testbed``)
is the shipped preset job of that name.
"""

import difflib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import UnionType
from typing import Any, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from air_hpc.config.models import ClusterConfig, HardwareConfig, JobConfig, ModelConfig
from air_hpc.config.rules import Problem, RulesBroken
from air_hpc.errors import ConfigError

#: The shipped presets: ``air_hpc/presets`` links to ``configs/`` in a checkout and is a copy of it
#: in a wheel; a package installed by pip always lies on disk, so this is a real directory.
PRESETS_DIR = Path(str(resources.files("air_hpc") / "presets")).resolve()
#: An installed package holds its own copy of the presets (a checkout links them to configs/): a relative
#: path in them must not point into the installed package, so it is taken from the current directory.
PRESETS_INSTALLED = not Path(str(resources.files("air_hpc") / "presets")).is_symlink()

#: Job keys that may name a profile file instead of holding a mapping.
PROFILE_KINDS = {"cluster": "clusters", "hardware": "hardware", "model": "models"}


@dataclass
class Source:
    """Where each dotted key came from, for error messages."""

    lines: dict[str, tuple[Path, int]] = field(default_factory=dict)
    overridden: set[str] = field(default_factory=set)

    def where(self, key: str) -> str:
        if key in self.overridden:
            return f"--set {key}"
        probe = key
        while probe:
            if probe in self.lines:
                path, line = self.lines[probe]
                return f"{path}:{line}"
            probe = probe.rpartition(".")[0]
        return ""


def read_yaml(path: Path, source: Source | None = None, prefix: str = "") -> dict[str, Any]:
    """Parse a YAML mapping, recording the line of every key under ``prefix``."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: invalid YAML: {problem}") from None
    if data is None:
        raise ConfigError(f"{path}: file is empty; expected a mapping of config keys")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: expected a mapping of config keys, got {type(data).__name__}")
    if source is not None and node is not None:
        _record_lines(node, path, prefix, source)
    return data


def _record_lines(node: yaml.Node, path: Path, prefix: str, source: Source) -> None:
    if isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            source.lines[f"{prefix}{index}"] = (path, item.start_mark.line + 1)
            _record_lines(item, path, f"{prefix}{index}.", source)
        return
    if not isinstance(node, yaml.MappingNode):
        return
    for key_node, value_node in node.value:
        key = f"{prefix}{key_node.value}"
        source.lines[key] = (path, key_node.start_mark.line + 1)
        _record_lines(value_node, path, key + ".", source)


def parse_override(item: str) -> tuple[str, str]:
    """``a.b=value`` -> ("a.b", "value"): the key checked, the value still raw text (see :func:`override_value`)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE with a dotted key, e.g. train.steps=100")
    return key, raw


def override_value(key: str, raw: str) -> Any:
    """The value of ``--set key=raw``: verbatim for a text field, else a YAML scalar (``7``, ``true``, ``0.5``).

    YAML would turn ``abc #c`` into ``abc``, ``0x10`` into 16 and drop
    everything after a newline, so a string field never goes through it.
    """
    if key in PROFILE_KINDS or _takes_text(key.split(".")):
        return raw
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        return raw
    if isinstance(value, dict) or value is None:
        return raw
    return value  # a list too: ``--set 'data.blend=[{path: a.h5, weight: 1}, ...]'``


def _takes_text(parts: list[str]) -> bool:
    """Whether the config field at ``parts`` accepts a string (str or Path; the values of env-like mappings)."""
    annotation: Any = JobConfig
    for part in parts:
        options = _options(annotation)
        model = next((o for o in options if isinstance(o, type) and issubclass(o, BaseModel)), None)
        mapping = next((o for o in options if get_origin(o) is dict), None)
        if model is not None and part in model.model_fields:
            annotation = model.model_fields[part].annotation
        elif mapping is not None:
            annotation = get_args(mapping)[1]
        else:
            return False
    return any(option in (str, Path) for option in _options(annotation))


def _options(annotation: Any) -> tuple[Any, ...]:
    """The alternatives of ``X | Y | None`` (just ``(X,)`` for a plain type)."""
    return get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)


def _config_dirs(job_path: Path) -> list[Path]:
    dirs = [job_path.resolve().parent.parent, PRESETS_DIR]
    return list(dict.fromkeys(dirs))


def _load_profile(kind: str, name: str, job_path: Path, source: Source) -> dict[str, Any]:
    subdir = PROFILE_KINDS[kind]
    searched = [base / subdir for base in _config_dirs(job_path) if (base / subdir).is_dir()]
    for directory in searched:
        candidate = directory / f"{name}.yaml"
        if candidate.is_file():
            data = read_yaml(candidate, source, prefix=f"{kind}.")
            data.setdefault("name", name)
            return data
    available = {p.stem for directory in searched for p in directory.glob("*.yaml")}
    where = source.where(kind) or str(job_path)
    raise ConfigError(
        f"{where}: {kind} profile {name!r} not found{_suggest(name, available)}"
        f" (available: {', '.join(sorted(available)) or 'none'}; in {' and '.join(map(str, searched))})"
    )


def _suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {key}: {'.'.join(parts[: i + 1])} is not a mapping")
        node = child
    node[parts[-1]] = value


def load_job(path: str | Path, overrides: Iterable[str] = ()) -> JobConfig:
    """Read, compose, override and validate a job file.

    Relative paths (``run.root``, ``data.path``, ``cluster.topology_file``) are
    made absolute against the file that set them (the job file or a profile),
    and a ``--set`` value against the current directory, so the same job file
    means the same files from any directory, and a batch script running
    elsewhere sees them too.
    """
    job_path = job_file(path)
    source = Source()
    raw = read_yaml(job_path, source)
    parsed = [(key, override_value(key, text)) for key, text in map(parse_override, overrides)]
    for key, value in parsed:
        if key in PROFILE_KINDS:
            raw[key] = value
            source.overridden.add(key)
    for kind in PROFILE_KINDS:
        if isinstance(raw.get(kind), str):
            raw[kind] = _load_profile(kind, raw[kind], job_path, source)
    for key, value in parsed:
        if key in PROFILE_KINDS:
            continue
        _set_dotted(raw, key, value)
        source.overridden.add(key)
    _replace_data_source(raw, source.overridden)
    _absolutize(raw, source)
    return validate(raw, source, job_path)


def job_file(path: str | Path) -> Path:
    """The job file ``path`` names: a file, else the shipped preset job of that bare name (``gpt-tiny-testbed``)."""
    given = Path(path)
    if given.exists() or given.suffix or len(given.parts) != 1:
        return given
    preset = PRESETS_DIR / "jobs" / f"{given}.yaml"
    if preset.is_file():
        return preset
    known = sorted(p.stem for p in (PRESETS_DIR / "jobs").glob("*.yaml"))
    raise ConfigError(
        f"{path}: no such file, nor a preset job of that name{_suggest(str(given), known)} "
        f"(preset jobs: {', '.join(known) or 'none'})"
    )


def _replace_data_source(raw: dict[str, Any], overridden: set[str]) -> None:
    """``--set data.blend=...`` replaces the job file's data.path, and ``--set data.path=...`` its blend."""
    node = raw.get("data")
    for given, other in (("path", "blend"), ("blend", "path")):
        if isinstance(node, dict) and f"data.{given}" in overridden and f"data.{other}" not in overridden:
            node.pop(other, None)


def _absolutize(raw: dict[str, Any], source: Source) -> None:
    for section, key in (("run", "root"), ("data", "path"), ("cluster", "topology_file")):
        node = raw.get(section)
        if isinstance(node, dict) and isinstance(node.get(key), str):
            dotted = f"{section}.{key}"
            written = source.lines.get(dotted)
            base = Path.cwd() if dotted in source.overridden or written is None else written[0].parent
            node[key] = str(anchored(base, Path(node[key]).expanduser()))
    members = (raw.get("cluster") or {}).get("clusters") if isinstance(raw.get("cluster"), dict) else None
    for index, item in enumerate(members if isinstance(members, list) else []):
        for key in ("slurm_conf", "topology_file"):
            if isinstance(item, dict) and isinstance(item.get(key), str):
                dotted = f"cluster.clusters.{index}.{key}"
                written = source.lines.get(dotted)
                base = Path.cwd() if "cluster.clusters" in source.overridden or written is None else written[0].parent
                item[key] = str(anchored(base, Path(item[key]).expanduser()))
    blend = (raw.get("data") or {}).get("blend") if isinstance(raw.get("data"), dict) else None
    for index, item in enumerate(blend if isinstance(blend, list) else []):
        if isinstance(item, dict) and isinstance(item.get("path"), str):
            written = source.lines.get(f"data.blend.{index}.path")
            base = Path.cwd() if "data.blend" in source.overridden or written is None else written[0].parent
            item["path"] = str(anchored(base, Path(item["path"]).expanduser()))


def anchored(base: Path, value: Path) -> Path:
    """``value`` made absolute against ``base`` (the folder of the file that set it).

    In an installed package a preset's relative paths are taken from the current directory, as they are
    from the checkout root in a checkout (``configs/jobs/../../runs`` is the checkout's runs/ there and
    ./runs here), so rendering or submitting a packaged preset never puts a run inside the package.
    """
    path = (base / value).resolve()
    if PRESETS_INSTALLED and base.resolve().is_relative_to(PRESETS_DIR) and path.is_relative_to(PRESETS_DIR.parent):
        return (Path.cwd() / path.relative_to(PRESETS_DIR.parent)).resolve()
    return path


def validate(raw: Mapping[str, Any], source: Source, job_path: Path) -> JobConfig:
    try:
        return JobConfig.model_validate(raw)
    except ValidationError as exc:
        errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
        broken = errors[0].get("ctx", {}).get("error")
        if isinstance(broken, RulesBroken):
            raise ConfigError("\n".join(_describe_problem(p, source, job_path) for p in broken.problems)) from None
        raise ConfigError(_describe(errors[0], source, job_path)) from None


def _describe_problem(problem: Problem, source: Source, job_path: Path) -> str:
    """One line for a broken cross-field rule, naming where its key was set."""
    where = source.where(problem.key) or str(job_path)
    if where.startswith("--set"):
        return f"{where}: {problem.message}"
    return f"{where}: {problem.key}: {problem.message}"


def _describe(error: Mapping[str, Any], source: Source, job_path: Path) -> str:
    loc = [str(part) for part in error["loc"]]
    message = str(error["msg"])
    key = ".".join(loc)
    message = message.removeprefix("Value error, ")
    where = source.where(key) or str(job_path)
    if error["type"] == "extra_forbidden":
        hint = _suggest(loc[-1], _fields_at(JobConfig, loc[:-1]))
        prefix = ".".join(loc[:-1])
        hint = hint.replace("mean '", f"mean '{prefix}." if prefix else "mean '")
        return f"{where}: unknown key {key!r}{hint}"
    if error["type"] == "missing":
        return f"{where}: missing required key {key!r}"
    if where.startswith("--set"):
        return f"{where}: {message}"
    return f"{where}: {key}: {message}"


def _fields_at(model: type[BaseModel], loc: list[str]) -> list[str]:
    for part in loc:
        field_info = model.model_fields.get(part)
        annotation = getattr(field_info, "annotation", None)
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not nested:
            return []
        model = nested[0]
    return list(model.model_fields)


Profile = TypeVar("Profile", ClusterConfig, HardwareConfig, ModelConfig)


def load_profile(kind: str, ref: str, model: type[Profile]) -> Profile:
    """One profile on its own (``cluster``, ``hardware``, ``model``): a YAML file, or a shipped preset's name,
    validated like the section it fills, with errors naming the file and line."""
    subdir = PROFILE_KINDS[kind]
    path = Path(ref).expanduser()
    if not path.is_file():
        preset = PRESETS_DIR / subdir / f"{ref}.yaml"
        if Path(ref).name != ref or not preset.is_file():
            known = sorted(p.stem for p in (PRESETS_DIR / subdir).glob("*.yaml"))
            raise ConfigError(
                f"{ref}: no such file, nor a shipped {kind} profile{_suggest(ref, known)} (shipped: {', '.join(known)})"
            )
        path = preset
    source = Source()
    data = read_yaml(path, source, prefix=f"{kind}.")
    data.setdefault("name", path.stem)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first: dict[str, Any] = dict(exc.errors()[0])
        first["loc"] = (kind, *first["loc"])
        raise ConfigError(_describe(first, source, path)) from None


def validate_json(path: Path) -> JobConfig:
    """Load a resolved config written by :meth:`RunDir.write_job` (already composed and absolute)."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file; is this a run directory made by `air-hpc submit`?") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read resolved config: {exc}") from None
    return validate(raw, Source(), path)
