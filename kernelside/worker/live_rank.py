"""A live rank: set up once, then run one request after another in one namespace, until told to stop.

The kernel writes requests on this rank's own request pipe (``channel.write_frame``; nothing else
can write it, so unpickling what arrives is safe). A request runs the way a one-shot launch runs
its function (``lifecycle.run_work``: the same ``done`` / ``result`` / ``error`` events), then the
rank sends ``idle`` with the request's id, its process group's collective count (``seq``: the
kernel compares them to see a world out of step) and its memory. Between requests the rank is idle.

SIGINT raises ``KeyboardInterrupt`` only while user code runs. One that arrives between reading a
request and starting its code is kept and raised as the code starts (the kernel stops a request as
soon as a peer fails, which can be before this rank began it); one that arrives while the rank
waits for the next request was meant for the one before and is dropped.

Functions the kernel defines after the session started are rebuilt here with this rank's
namespace as their globals (``rebuild_function``), so they see the names the cells assigned.

Example (what the kernel side sends, see ``live.session``)::

    >>> write_frame(fd, dumps_request({"kind": "run", "id": 3, "fn": program, "names": {}}))  # doctest: +SKIP
"""

from __future__ import annotations

import os
import pickle
import signal
import types

from ..channel import read_frame
from . import context
from .context import stamp
from .lifecycle import RankEnd, error_payload, run_work, start_rank

_state = {"busy": False, "pending": False, "namespace": None}


def rebuild_function(code, name, defaults, kwdefaults, closure, qualname, doc, fdict):
    """A notebook function sent by the kernel, bound to this rank's namespace (the cells' names)."""
    fn = types.FunctionType(code, _state["namespace"], name, defaults, closure)
    fn.__kwdefaults__, fn.__qualname__, fn.__doc__ = kwdefaults, qualname, doc
    fn.__dict__.update(fdict)
    fn.__module__ = "__main__"
    return fn


def _on_sigint(signum, frame):
    if _state["busy"]:
        raise KeyboardInterrupt
    _state["pending"] = True


def _collectives_seq() -> int | None:
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            return int(dist.distributed_c10d._get_default_group()._get_sequence_number_for_group())
    except Exception:
        return None
    return None


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _idle(events, req_id: int) -> None:
    events.send("idle", {**stamp(), "cell": req_id, "seq": _collectives_seq(), "rss": _rss()})


def serve_requests(spec, events, requests_fd: int, namespace: dict, replies_fd: int = -1) -> RankEnd:
    """Set up once, then serve requests until the kernel says stop or closes the pipe."""
    _state["namespace"] = namespace
    failed = start_rank(spec, events, [namespace], replies_fd)
    if failed is not None:
        return failed
    import torch

    # what every rank defines for the code it runs, cells and functions alike (DESIGN.md's contract)
    namespace.update(rank=spec.rank, local_rank=spec.local_rank, world_size=spec.world_size)
    namespace["device"] = torch.device(spec.device)
    events.send("ready", {**stamp(), "pid": os.getpid()})
    signal.signal(signal.SIGINT, _on_sigint)
    _idle(events, 0)
    while True:
        _state["busy"] = False
        req = None
        body = read_frame(requests_fd)
        _state["pending"] = False  # an interrupt that came while waiting was for the request before
        if body is None:
            return RankEnd(0)
        try:
            req = pickle.loads(body)
            del body
            if req["kind"] == "stop":
                return RankEnd(0)
            _serve(spec, events, req, namespace)
        except KeyboardInterrupt:
            pass  # an interrupt meant for the request that has just ended
        except BaseException as e:  # noqa: B036 - the request loop must survive whatever a request did
            events.send("error", error_payload(e, "request"))
        _idle(events, req["id"] if isinstance(req, dict) else -1)


def _serve(spec, events, req: dict, namespace: dict) -> None:
    """One request: take the kernel's names, then run the work like a one-shot rank runs its function."""
    import dataclasses

    try:
        for name, blob in req.get("names", {}).items():
            namespace[name] = pickle.loads(blob)
        fn = pickle.loads(req["fn"])
        args, kwargs = pickle.loads(req["args"]) if req.get("args") else ((), {})
    except BaseException as e:  # noqa: B036
        events.send("error", error_payload(e, "unpickle"))
        return
    if hasattr(fn, "namespace"):  # a cell (CellProgram): it runs in this rank's namespace
        fn.namespace = namespace
    ctx = context.current()
    ctx.progress_scope = req.get("progress", ctx.progress_scope)
    rank_spec = dataclasses.replace(spec, return_result=spec.rank in req.get("return_from", (0,)))
    events.send("ready", {**stamp(), "pid": os.getpid()})

    def work():
        _state["busy"] = True
        if _state["pending"]:
            _state["pending"] = False
            raise KeyboardInterrupt
        try:
            return fn(*args, **kwargs)
        finally:
            _state["busy"] = False

    run_work(rank_spec, work, (), {}, events)
