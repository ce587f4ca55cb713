"""The default process group is nblaunch's, from a rank's start to its end.

nblaunch sets the default group up before user code runs, and user code written for torchrun
sets it up and takes it down itself: ``init_process_group()`` at its start, and
``destroy_process_group()`` at its end (directly, or through Accelerate's ``end_training()``,
Lightning's teardown, a test script's ``main()``). ``take_over()`` makes both no-ops for the
default group in this rank:

- init: the group is already up;
- destroy: taking the group down while a DDP model still holds it lets DDP's reducer drop the
  last reference when the function's locals are freed, and gloo's destructor then joins its
  threads holding the GIL, which one of them waits for: the rank never exits (torch 2.13). Kept
  by nblaunch, the group outlives every model, the rank leaves with ``os._exit`` without running
  any destructor, and in a live session the next cell still has a working group.

A group the user made (``new_group``) is still destroyed as asked, but the object is kept
referenced until the process ends, for the same reason.

The default group's collective timeout is ``GROUP_TIMEOUT`` (2 hours), not torch's 10 minutes
(NCCL) or 30 (gloo): in a notebook a person may sit in one rank's debugger while its peers wait in
a collective, and nblaunch does not wait for a collective timeout to learn of a failure (a rank that
dies, fails or is stopped gets its peers stopped at once; a live session names mismatched
collectives). A pending collective keeps the timeout it started with, so the long one must be the
group's from the start. User code's own ``init_process_group(timeout=...)`` is honoured: the
group nblaunch made takes that timeout (torch's default of 30 minutes, which Lightning passes when its
user chose none, leaves nblaunch's).

Example::

    >>> take_over([vars(sys.modules["__main__"])])     # doctest: +SKIP  (start_rank does this)
    >>> torch.distributed.destroy_process_group()      # doctest: +SKIP  no-op: the group stays up
"""

from __future__ import annotations

import datetime
import functools
import inspect

from ..debugger import rank_side

GROUP_TIMEOUT = datetime.timedelta(hours=2)  # the default group's collective timeout (see above)


def take_over(namespaces, own_destroy: bool = True) -> None:
    """Make ``init_process_group()`` and (``own_destroy``) ``destroy_process_group()`` of the default group
    no-ops here. ``own_destroy`` only where the rank leaves with ``os._exit``: an interpreter that exits
    normally would run the kept group's destructor at its end; and never for a group the engine made.

    ``namespaces``: dicts (a module's globals) in which names bound to torch's originals
    (``from torch.distributed import destroy_process_group``) are re-bound to nblaunch's.
    """
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    replaced = {}
    owned_names = [("init_process_group", _owned_init)]
    if own_destroy:
        owned_names.append(("destroy_process_group", _owned_destroy))
    for name, make in owned_names:
        original = getattr(c10d, name)
        if getattr(original, "_nblaunch", False):
            continue
        owned = make(original, dist, c10d)
        owned._nblaunch = True
        owned.__doc__ = original.__doc__
        owned.__wrapped__ = original
        owned.__name__ = original.__name__
        setattr(dist, name, owned)
        setattr(c10d, name, owned)
        replaced[id(original)] = owned
    for ns in namespaces:
        for k, v in list(ns.items()):
            if id(v) in replaced:
                ns[k] = replaced[id(v)]


def _owned_init(original, dist, c10d):
    signature = functools.cache(lambda: inspect.signature(original))  # at the first call: most ranks make none

    def init_process_group(*args, **kwargs):
        if dist.is_initialized():
            try:
                timeout = signature().bind_partial(*args, **kwargs).arguments.get("timeout")
            except TypeError:
                timeout = None  # arguments torch itself would refuse: the group is up, nothing to take from them
            # the caller's collective timeout holds for nblaunch's group; torch's own default, which libraries
            # pass on when their user chose none (Lightning's DDP strategy), is no choice: nblaunch's stays
            # (in a rank JupyterLab's debugger may hold stopped, peers wait for the person: nblaunch's stays)
            asked = isinstance(timeout, datetime.timedelta) and timeout != c10d.default_pg_timeout
            if asked and not rank_side.debugged():
                c10d._set_pg_timeout(timeout, c10d._get_default_group())
            return None
        return original(*args, **kwargs)

    return init_process_group


def _owned_destroy(original, dist, c10d):
    kept = []  # groups the user destroyed: referenced until os._exit, so no destructor ever runs

    def destroy_process_group(group=None):
        if not dist.is_initialized():
            return original(group)  # torch's own error
        if group is None or group is c10d.GroupMember.WORLD:
            return None  # the default group is nblaunch's: it stays up until the rank ends
        kept.append(group)
        return original(group)

    return destroy_process_group
