"""The ``/nblaunch/`` REST API: a routing table of thin handlers over ``ConfigStore``.

Every verb requires an authenticated user; PUT/POST also pass jupyter_server's XSRF check
(APIHandler).  Client mistakes come back as JSON ``{"message", "fields"}`` with a 4xx status.

Example::

    GET  /nblaunch/config               path, values, schema, warnings
    PUT  /nblaunch/config               {"values": {...}, "overwrite": false}
    GET  /nblaunch/hardware[?refresh=1] GPUs, CPUs, RAM, torch and CUDA versions
    POST /nblaunch/accelerate/import    {"path": "optional/under/root.yaml"}
    POST /nblaunch/accelerate/export    {"path": "accelerate_config.yaml", "values": {...}}
    GET  /nblaunch/runs                 this user's launches, newest first (RunFolders.list_runs)
    GET  /nblaunch/runs/{id}            one run with its ranks (pid, state, CPU, RSS, GPU) and log_dir
    GET  /nblaunch/runs/{id}/ranks/{rank}/log[?tail=N | ?offset=B]   a rank's log text, JSON
    POST /nblaunch/runs/{id}/stop       ask the run's kernel to stop it (409 with the reason if it cannot)
    GET  /nblaunch/runs/{id}/stacks     every rank's Python stack and collective, from the run's kernel, within 1 s
"""

from __future__ import annotations

import asyncio
import json

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from .config_store import ConfigStore
from .errors import PanelRequestError
from .hardware_cache import HardwareCache
from .runs import RunFolders


class _PanelHandler(APIHandler):
    def initialize(self, store: ConfigStore, hardware: HardwareCache, runs: RunFolders):
        self.store = store
        self.hardware = hardware
        self.runs = runs

    def json_body(self) -> dict:
        try:
            body = json.loads(self.request.body or b"{}")
        except (ValueError, UnicodeDecodeError) as e:
            raise PanelRequestError(400, f"request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise PanelRequestError(400, f"request body must be a JSON object, got {type(body).__name__}")
        return body

    def answer(self, action) -> None:
        try:
            result = action()
        except PanelRequestError as e:
            self.set_status(e.status)
            result = e.to_json()
        self.finish(json.dumps(result))


class ConfigHandler(_PanelHandler):
    @tornado.web.authenticated
    def get(self):
        self.answer(self.store.read)

    @tornado.web.authenticated
    def put(self):
        self.answer(lambda: self.store.save(self.json_body()))


class HardwareHandler(_PanelHandler):
    @tornado.web.authenticated
    async def get(self):
        refresh = self.get_query_argument("refresh", "0") not in ("0", "", "false")
        self.finish(json.dumps(await self.hardware.get(refresh=refresh)))


class AccelerateImportHandler(_PanelHandler):
    @tornado.web.authenticated
    def post(self):
        self.answer(lambda: self.store.import_accelerate(self.json_body()))


class AccelerateExportHandler(_PanelHandler):
    @tornado.web.authenticated
    def post(self):
        self.answer(lambda: self.store.export_accelerate(self.json_body()))


class RunsHandler(_PanelHandler):
    @tornado.web.authenticated
    def get(self):
        self.answer(self.runs.list_runs)


class RunHandler(_PanelHandler):
    @tornado.web.authenticated
    def get(self, run_id):
        self.answer(lambda: self.runs.run(run_id))


class RunLogHandler(_PanelHandler):
    @tornado.web.authenticated
    def get(self, run_id, rank):
        tail, offset = self.get_query_argument("tail", None), self.get_query_argument("offset", None)
        self.answer(lambda: self.runs.log(run_id, rank, tail=tail, offset=offset))


class RunStopHandler(_PanelHandler):
    @tornado.web.authenticated
    async def post(self, run_id):
        try:  # the kernel has up to a few seconds to answer: off the server's event loop
            result = await asyncio.to_thread(self.runs.stop, run_id)
        except PanelRequestError as e:
            self.set_status(e.status)
            result = e.to_json()
        self.finish(json.dumps(result))


class RunStacksHandler(_PanelHandler):
    @tornado.web.authenticated
    async def get(self, run_id):
        try:  # the kernel answers within 1 s: still off the server's event loop
            result = await asyncio.to_thread(self.runs.stacks, run_id)
        except PanelRequestError as e:
            self.set_status(e.status)
            result = e.to_json()
        self.finish(json.dumps(result))


def setup_routes(web_app, store: ConfigStore, hardware: HardwareCache, runs: RunFolders) -> None:
    base = url_path_join(web_app.settings["base_url"], "nblaunch")
    deps = {"store": store, "hardware": hardware, "runs": runs}
    run = url_path_join(base, "runs", "([^/]+)")  # any segment: the class answers 400 for what is not a run id
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "config"), ConfigHandler, deps),
            (url_path_join(base, "hardware"), HardwareHandler, deps),
            (url_path_join(base, "accelerate", "import"), AccelerateImportHandler, deps),
            (url_path_join(base, "accelerate", "export"), AccelerateExportHandler, deps),
            (url_path_join(base, "runs"), RunsHandler, deps),
            (run, RunHandler, deps),
            (url_path_join(run, "ranks", "([^/]+)", "log"), RunLogHandler, deps),
            (url_path_join(run, "stop"), RunStopHandler, deps),
            (url_path_join(run, "stacks"), RunStacksHandler, deps),
        ],
    )
