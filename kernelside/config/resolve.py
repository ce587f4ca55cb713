"""Where each value of a launch comes from: call arguments > nblaunch.yaml > defaults.

Example::

    >>> cfg = resolve_config({"num_processes": 4})
    >>> cfg.values["num_processes"], cfg.sources["num_processes"]
    (4, 'argument')
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from .accelerate import import_accelerate
from .field_checks import check_value
from .fields import FIELDS, defaults
from .files import find_config_path, load_config_file


@dataclasses.dataclass
class ResolvedConfig:
    """Final values, and for each key where it came from ('argument', a file path, 'detected', 'default');
    ``invalid``: only when resolved ``lenient``, the file's refused values (``{key: LaunchConfigError}``), whose
    keys keep their defaults here."""

    values: dict
    sources: dict
    path: Path | None
    warnings: list[str]
    invalid: dict = dataclasses.field(default_factory=dict)

    def __getitem__(self, key):
        return self.values[key]


def resolve_config(
    arguments: dict | None = None,
    *,
    config: str | os.PathLike | None = None,
    cwd: str | os.PathLike | None = None,
    lenient: bool = False,
) -> ResolvedConfig:
    """Merge call arguments over the config file over defaults; validate everything.

    ``arguments`` holds only what the caller gave explicitly (None values are ignored).
    Hardware-dependent defaults (num_processes) stay None here; the launch plan fills them. ``lenient``
    (``%distributed_config``): the file's invalid values are listed in ``invalid`` instead of raised.
    """
    values, sources = defaults(), {f.name: "default" for f in FIELDS}
    path, kind = find_config_path(cwd, config)
    warnings: list[str] = []
    if path is not None:
        if kind == "accelerate":
            cf = import_accelerate(path)
            if cf.invalid and not lenient:  # the file a launch reads refuses a bad value, as nblaunch.yaml does
                raise next(iter(cf.invalid.values()))
        else:
            cf = load_config_file(path, lenient=lenient)
            if {"compute_environment", "distributed_type"} & set(cf.unknown):  # an Accelerate file, given by path
                cf = import_accelerate(path)
                if cf.invalid and not lenient:
                    raise next(iter(cf.invalid.values()))
        warnings.extend(cf.warnings)
        for k, v in cf.values.items():
            values[k], sources[k] = v, str(path)
    for k, v in (arguments or {}).items():
        if v is None:
            continue
        values[k], sources[k] = check_value(k, v), "argument"
    return ResolvedConfig(values, sources, path, warnings, dict(cf.invalid) if path is not None else {})
