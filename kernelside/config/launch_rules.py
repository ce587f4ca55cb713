"""The names and defaults every launch path shares: aliases of keys, the default port and process
count, and the rules a launch across machines must meet. The magics, ``notebook_launcher``, the plan
and the export read them here; none keeps a copy.

Example::

    >>> arguments(use_port=29501, num_processes=None)
    {'main_process_port': 29501}
"""

from __future__ import annotations

from ..errors import LaunchConfigError
from .field_checks import check_value
from .fields import FIELDS_BY_NAME

# Other spellings of a key: Accelerate's notebook_launcher(use_port=...), the magics' --port.
ALIASES = {"use_port": "main_process_port", "port": "main_process_port"}
DEFAULT_PORT = 29500  # the rendezvous port across machines and in exported commands (torchrun's default)
PROCESSES_WITHOUT_GPU = 2  # num_processes left empty on a machine without GPUs


def arguments(origin: str | None = None, **given) -> dict:
    """Explicitly given launch settings under their schema names: aliases mapped, empty ones dropped, each
    checked against the schema here, where the caller can still say where it came from.

    ``use_port=0`` or ``""`` means "no port asked for", as in Accelerate. ``origin`` names the entry point for
    the error: ``"flag"`` (a magic's line, so ``port`` reads ``--port``) or a function's name.
    """
    out = {}
    for key, value in given.items():
        name = ALIASES.get(key, key)
        if value is None or (name == "main_process_port" and value in ("", 0, "0")):
            continue
        if name not in FIELDS_BY_NAME:
            raise LaunchConfigError(key, value, "a known key: " + ", ".join(FIELDS_BY_NAME))
        try:
            out[name] = check_value(name, value)
        except LaunchConfigError as e:
            e.source = e.source or _spelled(origin, key)
            raise
    return out


def _spelled(origin: str | None, key: str) -> str:
    """How the user wrote ``key`` at that entry point."""
    if origin == "flag":
        return f"the flag --{key.replace('_', '-')}"
    if origin:
        return f"{origin}({key}=...)"
    return f"the argument {key}"


def default_processes_per_machine(gpus: int) -> int:
    """One rank per GPU the launch uses, or PROCESSES_WITHOUT_GPU without GPUs."""
    return gpus or PROCESSES_WITHOUT_GPU


def processes_per_machine(values: dict, gpus: int, *, doing: str = "Nothing was started.") -> int:
    """``num_processes`` counts every machine's processes (as in Accelerate's config): this machine's share."""
    check_machines(values, doing=doing)
    machines, total = values["num_machines"], values["num_processes"]
    return default_processes_per_machine(gpus) if total is None else total // machines


def check_machines(values: dict, *, doing: str = "Nothing was started.") -> None:
    """The settings a launch across machines needs, checked before anything starts (or is written)."""
    machines = values["num_machines"]
    if machines == 1:
        return
    if values["main_process_ip"] is None:
        raise LaunchConfigError(
            "main_process_ip",
            None,
            None,
            message=f"num_machines={machines} needs main_process_ip: the address of machine 0, which every machine "
            f"can reach (or rdzv_endpoint='HOST:PORT' in notebook_launcher). {doing}",
        )
    if values["machine_rank"] >= machines:
        raise LaunchConfigError(
            "machine_rank", values["machine_rank"], f"0 .. {machines - 1} (num_machines={machines})"
        )
    n = values["num_processes"]
    if n is not None and n % machines:
        raise LaunchConfigError(
            "num_processes",
            n,
            None,
            message=f"num_processes={n} counts the processes of all num_machines={machines} machines and must "
            f"divide evenly among them: use a multiple of {machines}. {doing}",
        )
