"""The routing of the debugger panel's requests, without a kernel: every command JupyterLab's panel sends that
names a thread, frame or variable reaches the rank that made the id, in that rank's own numbers, and the
answer comes back in the panel's; the kernel's own ids pass untouched."""

from __future__ import annotations

from kernelside.debugger.dap_ids import BASE, DapIds
from kernelside.debugger.rank_adapters import for_ranks
from kernelside.debugger.routes import ROUTES, Route, inward, outward, panel_id_of, thread_name


def test_two_ranks_same_local_ids_get_different_panel_ids_and_route_back_to_their_rank():
    ids = DapIds()
    t0, t1 = ids.outward(0, "thread", 1), ids.outward(1, "thread", 1)
    assert t0 != t1 and min(t0, t1) >= BASE and max(t0, t1) < 2**53
    assert ids.inward(t1) == (1, "thread", 1)
    assert ids.inward(5) is None  # the kernel's own thread
    assert inward({"threadId": t1, "levels": 20}, ids) == {"threadId": 1, "levels": 20}


def test_a_ranks_answers_carry_panel_ids_and_never_say_all_threads_continued():
    ids = DapIds()
    frames = outward("stackTrace", {"stackFrames": [{"id": 2, "line": 3}]}, 1, ids)["stackFrames"]
    assert ids.inward(frames[0]["id"]) == (1, "frame", 2) and frames[0]["line"] == 3
    scopes = outward("scopes", {"scopes": [{"name": "Locals", "variablesReference": 4}]}, 1, ids)["scopes"]
    assert ids.inward(scopes[0]["variablesReference"]) == (1, "ref", 4)
    plain = outward("variables", {"variables": [{"name": "x", "variablesReference": 0}]}, 1, ids)["variables"]
    assert plain[0]["variablesReference"] == 0  # a plain value has no children to ask for
    assert outward("continue", {"allThreadsContinued": True}, 1, ids) == {"allThreadsContinued": False}


def test_a_rank_that_runs_on_forgets_its_frames_but_keeps_its_threads():
    ids = DapIds()
    thread, frame = ids.outward(0, "thread", 1), ids.outward(0, "frame", 9)
    ids.forget(0)
    assert ids.inward(frame) is None and ids.inward(thread) == (0, "thread", 1)


def test_every_id_carrying_request_of_the_panel_is_routed_by_its_id():
    assert panel_id_of(ROUTES["copyToGlobals"], {"srcFrameId": 7}) == 7
    assert panel_id_of(ROUTES["variables"], {"variablesReference": 8}) == 8
    for command in ("stackTrace", "continue", "next", "stepIn", "stepOut"):
        assert ROUTES[command] is Route.BY_THREAD
    assert ROUTES["pause"] is Route.PAUSE  # a rank's thread, or every rank (kernel_proxy._pause)
    assert ROUTES.get("dumpCell", Route.KERNEL) is Route.KERNEL


def test_uncaught_in_the_panel_is_user_unhandled_in_a_rank_and_thread_names_say_the_rank():
    assert for_ranks({"filters": ["uncaught"]})["filters"] == ["uncaught", "userUnhandled"]
    assert for_ranks({"filters": ["raised"]})["filters"] == ["raised"]
    assert (thread_name(1, "MainThread"), thread_name(2, "loader")) == ("rank 1", "rank 2: loader")
