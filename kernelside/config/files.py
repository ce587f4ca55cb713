"""The config file: parse, validate, write atomically, and find the one a launch reads.

The file is found as: explicit path > ``$NBLAUNCH_CONFIG`` > ``nblaunch.yaml`` walking up from
the working directory > Accelerate's default config (overlapping keys).

Example::

    >>> parse_config_text("num_processes: 4\n").values
    {'num_processes': 4}
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

import yaml

from ..errors import LaunchConfigError
from .bounded_yaml import load_yaml, read_config_text
from .field_checks import check_value, validate
from .fields import ACCELERATE_PASSTHROUGH, FIELDS, FIELDS_BY_NAME

CONFIG_FILENAME = "nblaunch.yaml"
MAX_KEY_WARNINGS = 10  # unknown keys named one by one; the rest are counted
ENV_CONFIG = "NBLAUNCH_CONFIG"


def accelerate_default_config_path() -> Path:
    """Where ``accelerate config`` writes its default file (same rules as Accelerate)."""
    hf_home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface"
    )
    return Path(hf_home) / "accelerate" / "default_config.yaml"


@dataclasses.dataclass
class ConfigFile:
    """A parsed config file: known values, unknown keys (kept on save), warnings, and the values refused
    (``{key: LaunchConfigError}``; a launch reading the file raises the first, the panel marks each)."""

    path: Path | None
    values: dict
    unknown: dict
    warnings: list[str]
    invalid: dict = dataclasses.field(default_factory=dict)


def parse_config_text(text: str, path: Path | None = None, *, lenient: bool = False) -> ConfigFile:
    """The file's values; an invalid value raises (``lenient``: is kept aside in ``invalid``, to be shown).

    The YAML is read within ``bounded_yaml``'s limits (size, nesting, what aliases expand to)."""
    where = str(path) if path else "<config>"
    data = load_yaml(text, where, path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise LaunchConfigError(
            None,
            None,
            None,
            path=path,
            message=f"{where} must hold a mapping of keys to values, found {type(data).__name__}.",
        )
    values, unknown, warnings, invalid = {}, {}, [], {}
    for k, v in data.items():
        k = str(k)
        if k in FIELDS_BY_NAME:
            try:
                values[k] = check_value(k, v)
            except LaunchConfigError as e:
                e.path = path
                if not lenient:
                    raise
                invalid[k] = e
        else:
            unknown[k] = v
            if k not in ACCELERATE_PASSTHROUGH:
                warnings.append(f"{where}: unknown key {k!r} is kept but ignored")
    if len(warnings) > MAX_KEY_WARNINGS:  # a file of 5,000 stray keys gets a line, not 5,000
        more = len(warnings) - MAX_KEY_WARNINGS
        warnings[MAX_KEY_WARNINGS:] = [f"{where}: {more} more unknown keys are kept but ignored"]
    return ConfigFile(path, values, unknown, warnings, invalid)


def load_config_file(path: str | os.PathLike, *, lenient: bool = False) -> ConfigFile:
    """Read and parse the config file ``path`` (``read_config_text``'s limits, then ``parse_config_text``)."""
    p = Path(path)
    return parse_config_text(read_config_text(p), p, lenient=lenient)


def dump_config_text(values: dict, unknown: dict | None = None) -> str:
    """YAML text for a config: known keys in schema order (non-default only), then unknown keys."""
    out = {}
    for f in FIELDS:
        if f.name in values and values[f.name] != f.default:
            out[f.name] = values[f.name]
    for k, v in (unknown or {}).items():
        if k not in FIELDS_BY_NAME:
            out[k] = v
    return yaml.safe_dump(out, sort_keys=False, default_flow_style=False) if out else "{}\n"


def save_config_file(path: str | os.PathLike, values: dict, unknown: dict | None = None) -> Path:
    """Validate, then write atomically (temporary file in the same folder, then rename)."""
    good, errors = validate(values)
    if errors:
        k = next(iter(errors))
        raise LaunchConfigError(k, values[k], None, message=f"{k}: {errors[k]}")
    p = Path(path)
    write_text_atomic(p, dump_config_text(good, unknown))
    return p


def write_text_atomic(path: Path, text: str) -> None:
    """Write a temporary file beside ``path``, then rename it over: readers see the old or the new file, whole."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def find_config_path(
    start: str | os.PathLike | None = None, explicit: str | os.PathLike | None = None
) -> tuple[Path | None, str]:
    """The config file a launch from ``start`` would read, and why: (path or None, kind)."""
    if explicit:
        return Path(explicit), "explicit"
    if os.environ.get(ENV_CONFIG):
        return Path(os.environ[ENV_CONFIG]), ENV_CONFIG
    here = Path(start or os.getcwd()).resolve()
    for d in (here, *here.parents):
        if (d / CONFIG_FILENAME).is_file():
            return d / CONFIG_FILENAME, "nblaunch.yaml"
    acc = accelerate_default_config_path()
    if acc.is_file():
        return acc, "accelerate"
    return None, "none"
