"""What ``%distributed_config`` prints: the configuration the next launch would use, what differs from the
defaults first (with where each value came from), values the file holds that a launch would refuse, then the
defaults, what was detected and the plan.

Example::

    >>> from kernelside.config import resolve_config
    >>> print(config_report(resolve_config({"num_processes": 3}, lenient=True)))  # doctest: +SKIP
    config file: (none found; using defaults)
    changed from the defaults:
      num_processes  3      from argument
    ...
"""

from __future__ import annotations

import os
import sys

from ..config import ResolvedConfig
from ..config.field_checks import allowed
from ..engines.table import engine_class
from ..errors import LaunchConfigError
from ..launch import hardware
from ..launch.runner import plan_for


def config_report(cfg: ResolvedConfig) -> str:
    """The text ``%distributed_config`` prints for ``cfg`` (resolved ``lenient``, so bad values are shown)."""
    out = [f"config file: {cfg.path or '(none found; using defaults)'}"]
    changed = [k for k, v in cfg.values.items() if cfg.sources[k] != "default" or k in cfg.invalid]
    shown = {k: repr(cfg.invalid[k].value if k in cfg.invalid else v) for k, v in cfg.values.items()}
    width = max(len(k) for k in cfg.values)
    column = min(24, max(len(v) for v in shown.values()))  # values line up without pushing the source off the cell
    if changed:
        out.append("changed from the defaults:")
        for k in changed:
            where = f"invalid, allowed: {allowed(k)}" if k in cfg.invalid else f"from {cfg.sources[k]}"
            out.append(f"  {k:<{width}}  {shown[k]:<{column}}  {where}")
    else:
        out.append("changed from the defaults: nothing")
    out.append("defaults:")
    out += [f"  {k:<{width}}  {shown[k]:<{column}}  from default" for k in cfg.values if k not in changed]
    out += [f"  warning: {w}" for w in cfg.warnings]
    out.append(f"detected: {hardware.gpu_count()} GPU(s), {_cpu_count()} CPU core(s), python {sys.executable}")
    out += _plan_lines(cfg)
    return "\n".join(out)


def _plan_lines(cfg: ResolvedConfig) -> list[str]:
    if cfg.invalid:
        first = next(iter(cfg.invalid.values()))
        return [f"plan: not possible: {first}"]
    try:
        plan = plan_for(cfg)
        engine_class(plan.engine)  # a missing engine library is named here too
    except (LaunchConfigError, NotImplementedError) as e:
        return [f"plan: not possible: {e}"]
    devices = [plan.device_for(r) for r in range(plan.num_processes)]
    return [
        f"plan: {plan.num_processes} processes, backend {plan.backend}, devices {devices}",
        f"start method: {plan.start_method} ({plan.start_reason.removeprefix('nblaunch: ')})",
    ]


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
