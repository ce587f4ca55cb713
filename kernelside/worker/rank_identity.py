"""A rank looks like a launched worker (as torchrun's are), not like the notebook it was forked from.

A forked rank inherits the kernel's interpreter state, and with it what libraries read to decide
"this is an interactive session": ``sys.ps1`` (Lightning refuses ``strategy="ddp"`` there), module
constants computed from it at import time, and per-process framework state that an earlier
notebook cell created (an ``Accelerator()`` made in the kernel leaves Accelerate's shared state
saying "one process, not distributed", and every rank's ``Accelerator()`` would silently agree).
``become_launched_worker()`` runs in every rank before user code and puts these back to what a
script started by torchrun would see. A spawned rank starts clean already; the calls are no-ops
there.

(The kernel side's guard against a launch started from inside a rank is in ``launch.runner``.)

Example::

    >>> become_launched_worker(rank=1)     # in a rank, before the user's code   # doctest: +SKIP
    >>> import sys; hasattr(sys, "ps1")
    False
"""

from __future__ import annotations

import os
import sys

# Lightning computes ``_IS_INTERACTIVE = hasattr(sys, "ps1") or bool(sys.flags.interactive)`` once,
# at import, and the modules below copy it with ``from ... import _IS_INTERACTIVE``: a kernel that
# imported Lightning before the launch hands every rank ``True``. Every loaded module of these
# packages is looked at (the set of copying modules changes between Lightning releases).
_INTERACTIVE_FLAG = "_IS_INTERACTIVE"
_LIGHTNING_PACKAGES = ("lightning", "lightning_fabric", "pytorch_lightning")

# ``rank_zero_only.rank`` is read from RANK / LOCAL_RANK at import: imported in the kernel, it says 0 on every rank.
_RANK_ZERO_MODULES = (
    "lightning_utilities.core.rank_zero",
    "lightning.fabric.utilities.rank_zero",
    "lightning_fabric.utilities.rank_zero",
    "lightning.pytorch.utilities.rank_zero",
    "pytorch_lightning.utilities.rank_zero",
)


# [(pid, number of loaded modules, the names of Lightning's loaded modules)]: the parent's look just before it
# forked (``prime``). Global on purpose: what a parent found is what its forked ranks inherit.
_PRIMED: list[tuple[int, int, list[str]]] = []


def prime() -> None:
    """In a process about to fork ranks: which loaded modules are Lightning's, so that a rank forked before it
    imports anything else needs no walk of every module (each module a walk touches is a page copied into
    the rank, about 8 ms and 2,400 page copies per rank in a kernel with torch and transformers)."""
    names = [n for n, m in list(sys.modules.items()) if m is not None and n.split(".", 1)[0] in _LIGHTNING_PACKAGES]
    _PRIMED[:] = [(os.getpid(), len(sys.modules), names)]


def _lightning_modules() -> list[tuple[str, object]]:
    if _PRIMED and _PRIMED[0][0] != os.getpid() and _PRIMED[0][1] == len(sys.modules):
        return [(n, sys.modules.get(n)) for n in _PRIMED[0][2]]
    return [(n, m) for n, m in list(sys.modules.items()) if n.split(".", 1)[0] in _LIGHTNING_PACKAGES]


def become_launched_worker(rank: int) -> list[str]:
    """Drop the kernel's interactive markers and per-process framework state in this rank.

    Returns what was changed, for the rank's log (an empty list in a spawned rank).

    Example::

        >>> become_launched_worker(0)          # doctest: +SKIP
        ['sys.ps1', 'lightning.fabric.connector._IS_INTERACTIVE', 'accelerate state']
    """
    changed = []
    for name in ("ps1", "ps2"):
        if hasattr(sys, name):
            delattr(sys, name)
            changed.append(f"sys.{name}")
    for mod_name, mod in _lightning_modules():
        if mod is None:
            continue
        if getattr(mod, _INTERACTIVE_FLAG, None) is True:
            setattr(mod, _INTERACTIVE_FLAG, False)
            changed.append(f"{mod_name}.{_INTERACTIVE_FLAG}")
    for mod_name in _RANK_ZERO_MODULES:
        fn = getattr(sys.modules.get(mod_name), "rank_zero_only", None)
        if fn is not None and getattr(fn, "rank", rank) != rank:
            fn.rank = rank
            changed.append(f"{mod_name}.rank_zero_only.rank")
    if _reset_accelerate_state():
        changed.append("accelerate state")
    return changed


def leave_kernel_shell(shell) -> None:
    """(fork) Take out what still leads back to the kernel's IPython shell once the rank forgets it.

    During a cell IPython puts ``get_ipython`` into builtins (and hides ``exit`` / ``quit``): a
    forked rank would keep a ``get_ipython()`` that returns the kernel's shell, and libraries that
    look for it (rich) would open widgets over the kernel's sockets from the rank. The
    notebook's own ``get_ipython`` / ``exit`` / ``quit`` names are the shell's too.
    """
    import builtins

    trap = getattr(shell, "builtin_trap", None)
    if trap is not None and getattr(trap, "_nested_level", 0) > 0:
        trap.deactivate()  # builtins as they were before the cell: no get_ipython, site's exit/quit back
        trap._nested_level = 0
    builtins.__dict__.pop("__IPYTHON__", None)
    comm = sys.modules.get("comm")
    if comm is not None and hasattr(comm, "_create_comm"):
        # ipykernel's comms write on the kernel's sockets: a widget made in a rank gets the inert comm
        # a process without a kernel gets (tqdm.notebook, rich's Live, ipywidgets)
        comm.create_comm, comm.get_comm_manager = comm._create_comm, comm._get_comm_manager
        comm._comm_manager = None
    main = sys.modules.get("__main__")
    user_ns = vars(main) if main is not None else {}
    for ns in {id(d): d for d in (user_ns, getattr(shell, "user_ns", None) or {})}.values():
        if "get_ipython" in ns:
            from IPython.core.getipython import get_ipython

            ns["get_ipython"] = get_ipython  # None in a rank, as in any script
        for name in ("exit", "quit"):
            if name in ns and name in builtins.__dict__:
                ns[name] = builtins.__dict__[name]


def _reset_accelerate_state() -> bool:
    """Accelerate keeps one shared dict per state class (per process): start this rank's empty,
    so that ``Accelerator()`` in the rank reads the launch's environment (MULTI_CPU / MULTI_GPU)."""
    state = sys.modules.get("accelerate.state")
    if state is None:
        return False
    had_state = False
    for cls_name in ("AcceleratorState", "PartialState", "GradientState"):
        cls = getattr(state, cls_name, None)
        shared = getattr(cls, "_shared_state", None)
        if shared is None:
            continue
        had_state = had_state or bool(shared)
        # in place: assigning a new dict would replace Accelerate's SharedDict descriptor
        shared.clear()
    return had_state
