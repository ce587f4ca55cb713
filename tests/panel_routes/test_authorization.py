"""Every ``/nblaunch/`` route asks the server's ``Authorizer``, with the resource and action Jupyter Server uses
(``contents`` for the config and Accelerate files, ``kernels`` for runs and hardware; read, or write for
Save, export, Stop and stacks), through a real Jupyter server configured with a custom Authorizer as in
Jupyter Server's own tests. A read-only user sees runs and config but cannot Save, Stop, ask for stacks
or export over a file; the stacks route, which signals ranks, is a POST that a cookie session cannot send
without the XSRF token."""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest
from harness import fetch, forge_run
from jupyter_server.auth import Authorizer
from tornado.httpclient import HTTPClientError
from traitlets.config import Config

from kernelside.launch.run_control import socket_address

RUN = "run-20200101-000000-authz"
READ_ONLY = {("read", "contents"), ("read", "kernels"), ("read", "api")}  # api: what /api/status asks
EVERYTHING = READ_ONLY | {("write", "contents"), ("write", "kernels")}


class RecordingAuthorizer(Authorizer):
    """Allows the (action, resource) pairs in ``allowed`` and records every question it is asked."""

    allowed: set = set()
    asked: list = []

    def is_authorized(self, handler, user, action, resource):
        RecordingAuthorizer.asked.append((handler.request.method, handler.request.path, action, resource))
        return (action, resource) in RecordingAuthorizer.allowed


@pytest.fixture
def jp_server_config():
    return Config(
        {"ServerApp": {"jpserver_extensions": {"jupyter_ext": True}, "authorizer_class": RecordingAuthorizer}}
    )


@pytest.fixture
def permissions():
    """Set what the user may do; the questions asked are in ``RecordingAuthorizer.asked``."""
    RecordingAuthorizer.asked = []

    def allow(pairs):
        RecordingAuthorizer.allowed = set(pairs)

    yield allow
    RecordingAuthorizer.allowed, RecordingAuthorizer.asked = set(), []


class FakeKernel(threading.Thread):
    """Listens on a run folder's ``control.sock`` as the run's kernel would; records each request it gets."""

    def __init__(self, run_dir):
        super().__init__(daemon=True)
        self.requests: list[dict] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dir_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self.listener.bind(socket_address(str(run_dir), dir_fd))  # pytest's paths can be too long for sun_path
        finally:
            os.close(dir_fd)
        self.listener.listen(4)
        self.listener.settimeout(0.2)
        self.stopping = threading.Event()

    def run(self):
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            with conn:
                request = json.loads(conn.makefile().readline())
                self.requests.append(request)
                reply = {"ok": True, "message": "stopping"} if request["op"] == "stop" else {"ok": True, "ranks": []}
                conn.sendall(json.dumps(reply).encode() + b"\n")

    def close(self):
        self.stopping.set()
        self.join(5)
        self.listener.close()


@pytest.fixture
def live_run(run_base):
    """A run that looks live (its lock held, a control socket listening), and the fake kernel behind it."""
    d, lock = forge_run(run_base, RUN, {"state": "running", "control": True, "engine": "local"}, hold_lock=True)
    kernel = FakeKernel(d)
    kernel.start()
    yield kernel
    kernel.close()
    os.close(lock)


def routes():
    """Every route with a request it takes, and the (action, resource) Jupyter Server would ask for."""
    return [
        ("GET", ("version",), None, ("read", "api")),
        ("GET", ("config",), None, ("read", "contents")),
        ("PUT", ("config",), {"values": {"num_processes": 3}}, ("write", "contents")),
        ("GET", ("hardware",), None, ("read", "kernels")),
        ("POST", ("accelerate", "import"), {"path": "acc.yaml"}, ("read", "contents")),
        ("POST", ("accelerate", "export"), {"path": "notes.ipynb", "values": {}}, ("write", "contents")),
        ("GET", ("runs",), None, ("read", "kernels")),
        ("GET", ("runs", RUN), None, ("read", "kernels")),
        ("GET", ("runs", RUN, "ranks", "0", "log"), None, ("read", "kernels")),
        ("GET", ("runs", RUN, "series"), None, ("read", "kernels")),
        ("POST", ("runs", RUN, "stop"), {}, ("write", "kernels")),
        ("POST", ("runs", RUN, "stacks"), {}, ("write", "kernels")),
    ]


async def call(jp_fetch, method, path, body):
    kwargs = {"method": method}
    if body is not None:
        kwargs["body"] = json.dumps(body)
    try:
        response = await jp_fetch("nblaunch", *path, **kwargs)
    except HTTPClientError as e:
        response = e.response
    return response.code, response.body


@pytest.fixture
def files(jp_root_dir):
    """The files a write could clobber: the config, a notebook; and an Accelerate config to import."""
    (jp_root_dir / "nblaunch.yaml").write_text("num_processes: 2\n")
    (jp_root_dir / "notes.ipynb").write_text('{"cells": [], "note": "my work"}')
    (jp_root_dir / "acc.yaml").write_text("num_processes: 4\ndistributed_type: MULTI_CPU\n")
    return {p: (jp_root_dir / p).read_text() for p in ("nblaunch.yaml", "notes.ipynb")}


async def test_each_route_asks_for_the_resource_and_action_jupyter_server_uses(
    jp_fetch, jp_root_dir, permissions, live_run, files
):
    permissions(EVERYTHING)
    for method, path, body, expected in routes():
        RecordingAuthorizer.asked = []
        code, answer = await call(jp_fetch, method, path, body)
        assert code == 200, (path, answer)
        asked = {(a, r) for m, p, a, r in RecordingAuthorizer.asked if p.endswith("/nblaunch/" + "/".join(path))}
        assert asked == {expected}, (method, path, RecordingAuthorizer.asked)
    assert [r["op"] for r in live_run.requests] == ["stop", "stacks"]  # allowed: the kernel was asked
    assert "compute_environment: LOCAL_MACHINE" in (jp_root_dir / "notes.ipynb").read_text()  # allowed: overwritten


async def test_a_read_only_user_sees_runs_and_config_but_cannot_save_stop_export_or_ask_for_stacks(
    jp_fetch, jp_root_dir, permissions, live_run, files
):
    permissions(READ_ONLY)
    response = await jp_fetch("api", "contents", "notes.ipynb", method="PUT", raise_error=False, body="{}")
    assert response.code == 403  # Jupyter's own contents API refuses this user a write; so does every route here
    for method, path, body, (action, _) in routes():
        code, answer = await call(jp_fetch, method, path, body)
        assert code == (200 if action == "read" else 403), (method, path, answer)
    code, runs = await fetch(jp_fetch)
    assert code == 200 and [r["id"] for r in runs] == [RUN]
    code, config = await call(jp_fetch, "GET", ("config",), None)
    assert json.loads(config)["values"]["num_processes"] == 2
    assert live_run.requests == []  # neither Stop nor stacks reached the run's kernel
    assert {p: (jp_root_dir / p).read_text() for p in files} == files  # nothing saved, nothing exported over


async def test_a_user_the_authorizer_allows_nothing_gets_403_on_every_route(
    jp_fetch, jp_root_dir, permissions, live_run, files
):
    permissions(set())
    for method, path, body, _ in routes():
        code, answer = await call(jp_fetch, method, path, body)
        assert code == 403 and b"forged line" not in answer and b"num_processes" not in answer, path
    assert live_run.requests == []


async def test_stacks_is_a_post_a_cookie_session_cannot_send_without_the_xsrf_token(
    http_server_client, jp_base_url, jp_auth_header, permissions, live_run
):
    permissions(EVERYTHING)
    url = f"{jp_base_url}nblaunch/runs/{RUN}/stacks"
    got = await http_server_client.fetch(url, headers=jp_auth_header, raise_error=False)
    assert got.code == 405  # not a GET any more: a link or an <img> cannot signal ranks
    # a browser session: the login cookie that a token-authenticated request sets, and nothing else
    login = await http_server_client.fetch(f"{jp_base_url}nblaunch/runs", headers=jp_auth_header)
    cookies = "; ".join(c.split(";", 1)[0] for c in login.headers.get_list("Set-Cookie"))
    assert cookies, "the server set no login cookie"
    no_token = await http_server_client.fetch(
        url, method="POST", body="{}", headers={"Cookie": cookies}, raise_error=False
    )
    assert no_token.code == 403 and b"_xsrf" in no_token.body and live_run.requests == []
    with_token = await http_server_client.fetch(
        url,
        method="POST",
        body="{}",
        headers={"Cookie": f"{cookies}; _xsrf=5eed", "X-XSRFToken": "5eed"},
        raise_error=False,
    )
    assert with_token.code == 200 and [r["op"] for r in live_run.requests] == ["stacks"]
