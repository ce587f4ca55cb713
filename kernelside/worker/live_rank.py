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

The request pipe is read by a thread of the rank (``RequestReader``), not by the main thread: it
queues the requests and answers the kernel's ``abort`` and ``where`` at once, even while the main
thread waits in a C-level collective (``worker.live_rescue``: gloo's connections shut down, NCCL's
communicators aborted). ``rebuild`` makes the default process group again in the same process
after an abort; the namespace stays.

Example (what the kernel side sends, see ``live.session``)::

    >>> write_frame(fd, dumps_request({"kind": "run", "id": 3, "fn": program, "names": {}}))  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import queue
import select
import signal
import threading
import types

from ..channel import read_frame
from . import context, live_debug, live_rescue, result_segments
from .context import stamp
from .lifecycle import RankEnd, error_payload, run_work, start_rank


@dataclasses.dataclass
class _LiveRankState:
    busy: bool = False  # a request's code is running
    pending: bool = False  # an interrupt came while no code ran: it is for the next request
    namespace: dict | None = None  # the cells' names on this rank
    aborted: bool = False  # the kernel's abort unblocked this rank's collective
    req: int | None = None  # the request running now
    last: int | None = None  # the last request started
    replies: int = -1
    # (request id, where_main) where SIGINT stopped the main thread (``NOT_STARTED`` before the request's code
    # began): the answer to a ``where`` read after the request has already ended (the reader thread may get the
    # CPU only once the interrupted request is over)
    stopped_at: tuple[int, dict] | None = None
    # set by the reader thread's abort (a peer's abort may be felt before it)
    abort_seen: threading.Event = dataclasses.field(default_factory=threading.Event)


# Global on purpose: one rank process serves one live session, and its SIGINT handler and the functions
# rebuilt from the kernel (which take no session argument) must see this rank's state.
LIVE_RANK = _LiveRankState()
CONTROL_KINDS = ("abort", "where")
NOT_STARTED = {"line": None, "collective": None, "seq": None}  # where a rank stopped before a request's code began
# NCCL's watchdog must not end a live rank whose communicator the kernel aborted (worker.live_rescue): with
# torch's default (3) it may end the process on the aborted work; torch's _abort_process_group asks for 0.
# A collective that fails on its own then waits until the cell is stopped (■, --timeout, a peer's failure).
NCCL_LIVE_ERROR_HANDLING = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")


def rebuild_function(code, name, defaults, kwdefaults, closure, qualname, doc, fdict):
    """A notebook function sent by the kernel, bound to this rank's namespace (the cells' names)."""
    fn = types.FunctionType(code, LIVE_RANK.namespace, name, defaults, closure)
    fn.__kwdefaults__, fn.__qualname__, fn.__doc__ = kwdefaults, qualname, doc
    fn.__dict__.update(fdict)
    fn.__module__ = "__main__"
    return fn


def _on_sigint(signum, frame):
    if LIVE_RANK.busy:
        if LIVE_RANK.req is not None:
            LIVE_RANK.stopped_at = (LIVE_RANK.req, live_rescue.where_main(frame))
        raise KeyboardInterrupt
    LIVE_RANK.pending = True


_STATM: dict[int, int] = {}  # pid -> its /proc/self/statm, opened once: every idle reads it again (pread)
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    pid = os.getpid()  # (a process forked from this one opens its own)
    fd = _STATM.get(pid)
    if fd is None:
        fd = _STATM[pid] = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
    return int(os.pread(fd, 128, 0).split()[1]) * _PAGE


def _idle(events, req_id: int, **extra) -> None:
    payload = {**stamp(), "cell": req_id, "seq": live_rescue._seq(), "group": live_rescue.group_generation}
    events.send("idle", {**payload, "rss": _rss(), **extra})


class RequestReader:
    """Reads the kernel's requests in a thread: control messages are served at once, the rest queued."""

    def __init__(self, fd: int, events, inherited: frozenset[str] = frozenset()):
        self.fd, self.events = fd, events
        self.inherited = inherited  # the kernel's sockets a forked rank holds: never shut down (abort)
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.abort_lock = threading.Lock()  # an abort finishes before the rank says it is idle again
        self.watch = live_rescue.WaitWatch(events)
        self.queued: int | None = None  # the id of the last request queued for the main thread
        self.thread = threading.Thread(target=self._read, name="nblaunch-live-requests", daemon=True)
        self.thread.start()

    def next(self):
        """The next request (a dict), or None when the kernel closed the pipe."""
        return self.queue.get()

    def _read(self) -> None:
        try:
            while True:
                ready, _, _ = select.select([self.fd], [], [], 0.5)
                if not ready:
                    self.watch.check(LIVE_RANK.busy)
                    continue
                body = read_frame(self.fd)
                if body is None:
                    break
                req = pickle.loads(body)
                del body
                if req.get("kind") in CONTROL_KINDS:
                    self._control(req)
                else:
                    self.queued = req.get("id")
                    self.queue.put(req)
        except BaseException as e:  # noqa: B036 - the rank must learn that its requests stopped
            self.events.send("error", error_payload(e, "request"))
        self.queue.put(None)

    def _control(self, req: dict) -> None:
        if req["kind"] == "where":
            self._where()
            return
        with self.abort_lock:  # abort: this rank's group connections and communicators; every blocked peer returns
            self._where()
            LIVE_RANK.aborted = True
            LIVE_RANK.abort_seen.set()
            live_rescue.abort_group(self.inherited)

    def _where(self) -> None:
        """Where the main thread is in the request it runs, or that it has not started the one queued."""
        req, stopped = LIVE_RANK.req, LIVE_RANK.stopped_at
        at = live_rescue.where_main() if req is not None else None
        this = req if req is not None else self.queued
        if stopped is not None and stopped[0] == this and not (at and at["line"]):
            # the interrupt came first: where it stopped the code (now unwinding or over) is the answer
            self.events.send("where", {**stopped[1], "cell": stopped[0]})
        elif at is not None:
            self.events.send("where", {**at, "cell": req})
        else:  # not started yet, or done with it already (then the kernel needs no line, but waits for the answer)
            done = self.queued == LIVE_RANK.last
            self.events.send(
                "where", {"line": None, "collective": None, "seq": None, "cell": self.queued, "done": done}
            )


def serve_requests(spec, events, requests_fd: int, namespace: dict, replies_fd: int = -1) -> RankEnd:
    """Set up once, then serve requests until the kernel says stop or closes the pipe."""
    LIVE_RANK.namespace = namespace
    inherited = live_rescue.socket_inodes()  # before the process group exists: none of these is its
    if spec.backend == "nccl":  # before the group exists (torch reads it then); a user's own value stays
        os.environ.setdefault(*NCCL_LIVE_ERROR_HANDLING)
    failed = start_rank(spec, events, [namespace], replies_fd)
    if failed is not None:
        return failed
    import torch

    # what every rank defines for the code it runs, cells and functions alike (DESIGN.md's contract)
    namespace.update(rank=spec.rank, local_rank=spec.local_rank, world_size=spec.world_size)
    namespace["device"] = torch.device(spec.device)
    events.send("ready", {**stamp(), "pid": os.getpid()})
    signal.signal(signal.SIGINT, _on_sigint)
    reader = RequestReader(requests_fd, events, inherited)
    _idle(events, 0)
    while True:
        LIVE_RANK.busy = False
        req = reader.next()
        LIVE_RANK.pending = False  # an interrupt that came while waiting was for the request before
        if req is None or req["kind"] == "stop":
            return RankEnd(0)
        extra = {}
        try:
            LIVE_RANK.req = LIVE_RANK.last = req["id"]
            if req["kind"] == "rebuild":
                extra = {"group": req["gen"], "rebuild_failed": True}  # (until it succeeds: the kernel stops waiting)
                extra = {"group": req["gen"], "notes": live_rescue.rebuild_group(req["gen"], namespace)}
                LIVE_RANK.aborted = False
                LIVE_RANK.abort_seen.clear()
            elif req["kind"] == "debug":
                live_debug.post_mortem(req["of"], spec.rank)
            else:
                _serve(spec, events, req, namespace)
        except KeyboardInterrupt:
            pass  # an interrupt meant for the request that has just ended
        except BaseException as e:  # noqa: B036 - the request loop must survive whatever a request did
            events.send("error", error_payload(e, req["kind"]))
        LIVE_RANK.req = None
        with reader.abort_lock:
            _idle(events, req["id"], **extra)


_RETURNING: dict[bool, tuple] = {}  # returns -> (the rank's spec, that spec with return_result=returns)


def _returning(spec, returns: bool):
    """The rank's spec with ``return_result`` for this request, made once per rank life, not at every request."""
    got = _RETURNING.get(returns)
    if got is None or got[0] is not spec:
        got = _RETURNING[returns] = (spec, dataclasses.replace(spec, return_result=returns))
    return got[1]


def _serve(spec, events, req: dict, namespace: dict) -> None:
    """One request: take the kernel's names, then run the work like a one-shot rank runs its function."""
    try:
        for name, blob in req.get("names", {}).items():  # big ones mapped from the kernel's segment
            namespace[name] = result_segments.loads_shared(blob, spec.result_segments)
        fn = pickle.loads(req["fn"])
        args, kwargs = pickle.loads(req["args"]) if req.get("args") else ((), {})
    except BaseException as e:  # noqa: B036
        events.send("error", error_payload(e, "unpickle"))
        return
    if hasattr(fn, "namespace"):  # a cell (CellProgram): it runs in this rank's namespace
        fn.namespace = namespace
    ctx = context.current()
    ctx.progress_scope = req.get("progress", ctx.progress_scope)
    rank_spec = _returning(spec, spec.rank in req.get("return_from", (0,)))
    events.send("ready", {**stamp(), "pid": os.getpid()})

    def work():
        LIVE_RANK.busy = True
        if LIVE_RANK.pending:  # stopped before its code began: the answer to a ``where`` read after it ends
            LIVE_RANK.pending = False
            LIVE_RANK.stopped_at = (req["id"], NOT_STARTED)
            raise KeyboardInterrupt
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if not LIVE_RANK.aborted and any(w in str(e) for w in live_rescue.PEER_LOSS):
                # a peer closed its sockets on the kernel's abort before this rank's came
                LIVE_RANK.abort_seen.wait(1.0)
            if LIVE_RANK.aborted:  # unblocked by the kernel's abort: stopped, not a failure of this rank
                raise KeyboardInterrupt from e
            live_debug.keep(req["id"], e)  # for %debug in the notebook
            raise
        finally:
            LIVE_RANK.busy = False

    run_work(rank_spec, work, (), {}, events, run=str(req["id"]))  # (the request's id: the same on every rank)
