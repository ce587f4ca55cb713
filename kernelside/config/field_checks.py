"""Checking a value against the schema (``fields.py``): its type, range, choices or shape, with the one
wording every entry point uses (form, ``nblaunch.yaml``, flags, ``notebook_launcher()`` arguments, an
imported Accelerate config) when it refuses one.

Example::

    >>> check_value("num_processes", "4")
    4
    >>> allowed("main_process_port")
    'an integer from 1 to 65535 or empty'
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..errors import LaunchConfigError
from .bounded_yaml import MAX_DEPTH, depth_of
from .fields import FIELDS_BY_NAME, Field, copy_value

_INT = re.compile(r"[+-]?[0-9]{1,19}")  # re's [0-9] is ASCII; at most 19 digits (int() of 5,000 raises)
_INT_MAX = 2**63 - 1  # no setting needs more; beyond it C code (a port, a timeout) would overflow
HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[?[0-9A-Fa-f:]+\]?")
RAY_ADDRESS = re.compile(r"(ray://)?[A-Za-z0-9.\-\[\]:]+:[0-9]+")


def _allowed(f: Field) -> str:
    if f.choices:
        return "one of " + ", ".join(repr(c) for c in f.choices)
    base = {
        "int": "an integer",
        "float": "a number",
        "bool": "true or false",
        "str": "a string",
        "dict": "a mapping",
        "list": "a list",
    }[f.type]
    if f.minimum is not None and f.maximum is not None:
        base += f" from {f.minimum:g} to {f.maximum:g}"
    elif f.minimum is not None:
        base += f" {'>' if f.above_minimum else '>='} {f.minimum:g}"
    elif f.maximum is not None:
        base += f" <= {f.maximum:g}"
    return base + (" or empty" if f.nullable else "")


def allowed(name: str) -> str:
    """What the schema allows for ``name``, in words (``allowed("main_process_port")`` → 'an integer from 1 to
    65535 or empty'): the text every refusal of a bad value ends with."""
    return _STRING_RULES[name][1] if name in _STRING_RULES else _allowed(FIELDS_BY_NAME[name])


def _gpu_ids(v: str) -> bool:
    return v == "all" or all(p.isdigit() for p in v.split(","))


def _path(v: str) -> bool:
    # Checked as text only: the folder is made at launch, relative to the kernel's working directory.
    return bool(v.strip()) and "\x00" not in v


# Strings with a shape beyond their type: the rule and the words that say what is allowed.
_STRING_RULES = {
    "gpu_ids": (_gpu_ids, "'all' or comma-separated GPU indices such as '0,1'"),
    "main_process_ip": (HOST.fullmatch, "an IP address or host name without port, e.g. 10.0.0.1"),
    "ray_address": (
        lambda v: v in ("local", "auto") or RAY_ADDRESS.fullmatch(v),
        "'local', 'auto', 'HOST:PORT' or 'ray://HOST:PORT'",
    ),
    "log_dir": (_path, "a folder path (not blank, no NUL character) or empty"),
}


def _env_name(k) -> bool:
    return isinstance(k, str) and bool(k) and "=" not in k and "\x00" not in k


def check_value(name: str, value: Any) -> Any:
    """Validate and normalise one value; raise LaunchConfigError naming key, value and what is allowed."""
    f = FIELDS_BY_NAME.get(name)
    if f is None:
        raise LaunchConfigError(name, value, "a known key: " + ", ".join(FIELDS_BY_NAME))
    if value is None:
        if f.nullable:
            return None
        if f.type in ("dict", "list"):
            return copy_value(f.default)
        raise LaunchConfigError(name, value, _allowed(f))
    v = value
    if f.type == "int":
        if isinstance(v, str) and _INT.fullmatch(v.strip()):  # ASCII digits only: '²' is a digit to isdigit()
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or abs(v) > _INT_MAX:
            raise LaunchConfigError(name, value, _allowed(f))
    elif f.type == "float":
        if isinstance(v, str):
            try:
                v = float(v) if v.isascii() and len(v) <= 64 else None
            except ValueError:
                v = None
            if v is None:
                raise LaunchConfigError(name, value, _allowed(f)) from None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise LaunchConfigError(name, value, _allowed(f))
        v = float(v)
    elif f.type == "bool":
        if isinstance(v, str) and v.lower() in ("true", "false", "yes", "no", "1", "0"):
            v = v.lower() in ("true", "yes", "1")
        if not isinstance(v, bool):
            raise LaunchConfigError(name, value, _allowed(f))
    elif f.type == "str":
        if name == "metrics" and isinstance(v, bool):  # YAML reads a bare `metrics: off` as false
            v = "on" if v else "off"
        if name == "gpu_ids" and isinstance(v, int) and not isinstance(v, bool):
            v = str(v)
        if name == "gpu_ids" and isinstance(v, (list, tuple)):
            v = ",".join(str(i) for i in v)
        if not isinstance(v, str):
            raise LaunchConfigError(name, value, allowed(name))
        if f.choices and v not in f.choices:
            raise LaunchConfigError(name, value, _allowed(f))
        if name == "gpu_ids":
            v = v.replace(" ", "")
        rule = _STRING_RULES.get(name)
        if rule is not None and not rule[0](v):
            raise LaunchConfigError(name, value, rule[1])
    elif f.type == "list":
        if not isinstance(v, (list, tuple)):
            raise LaunchConfigError(name, value, _allowed(f))
        _check_depth(name, v)
        v = list(v)
    elif f.type == "dict":
        if not isinstance(v, dict):
            raise LaunchConfigError(name, value, _allowed(f))
        _check_depth(name, v)
        if name == "env":
            if not all(_env_name(k) for k in v):
                raise LaunchConfigError(name, value, "a mapping of variable names (no '=' in them) to values")
            v = {str(k): str(val) for k, val in v.items()}
            bad = next((k for k, val in v.items() if "\x00" in val), None)
            if bad is not None:
                raise LaunchConfigError(
                    name,
                    value,
                    f"a mapping of variable names to values; the value of {bad!r} holds a NUL character "
                    "(\\x00), which no environment variable can hold",
                )
        if name == "resources_per_worker":
            bad = [k for k, n in v.items() if isinstance(n, bool) or not isinstance(n, (int, float)) or n < 0]
            if bad:
                raise LaunchConfigError(name, value, "a mapping of resource name to a number >= 0, e.g. {CPU: 2}")
    if f.minimum is not None and (v <= f.minimum if f.above_minimum else v < f.minimum):
        raise LaunchConfigError(name, value, _allowed(f))
    if f.maximum is not None and v > f.maximum:
        raise LaunchConfigError(name, value, _allowed(f))
    return v


def _check_depth(name: str, value) -> None:
    if depth_of(value) > MAX_DEPTH:
        raise LaunchConfigError(
            name, value, f"a value nested at most {MAX_DEPTH} levels deep (a DeepSpeed config needs 4)"
        )


def validate(values: dict) -> tuple[dict, dict[str, str]]:
    """Check every known key. Returns (normalised values, {key: error message})."""
    good, errors = {}, {}
    for k, v in values.items():
        if k not in FIELDS_BY_NAME:
            continue
        try:
            good[k] = check_value(k, v)
        except LaunchConfigError as e:
            errors[k] = e.allowed_message
    return good, errors
