"""The ``/nblaunch/`` REST API: a routing table of thin handlers over ``ConfigStore`` and ``RunFolders``.

Every verb requires an authenticated user and asks the server's authorizer (Jupyter Server's
``@authorized``) with the resource and action Jupyter Server itself uses: the config and Accelerate
files are ``contents`` (read, or write to save or export), runs and hardware are ``kernels`` (read;
Stop and stacks, which act on a kernel's ranks, are a write, as interrupting a kernel is). PUT/POST
also pass jupyter_server's XSRF check (APIHandler). Files are read off the server's event loop, in one
reader thread (reads take turns, and the loop shares the GIL with that one thread only); Stop and stacks,
which wait for a kernel's answer, wait in the default executor.
Client mistakes come back as JSON ``{"message", "fields"}`` with a 4xx status, never a 500.

Example::

    GET  /nblaunch/version              nblaunch, run_format, labextension, upgrade  api read
    GET  /nblaunch/config               path, values, schema, warnings             contents read
    PUT  /nblaunch/config               {"values": {...}, "overwrite": false}      contents write
    GET  /nblaunch/hardware[?refresh=1] GPUs, CPUs, RAM, torch and CUDA versions   kernels read
    POST /nblaunch/accelerate/import    {"path": "optional/under/root.yaml"}       contents read
    POST /nblaunch/accelerate/export    {"path": "accelerate_config.yaml", ...}    contents write
    GET  /nblaunch/runs                 this user's launches, newest first         kernels read
    GET  /nblaunch/runs/{id}            one run with its ranks and log_dir         kernels read
    GET  /nblaunch/runs/{id}/series     its training curves and each rank's progress counts  kernels read
    GET  /nblaunch/runs/{id}/ranks/{rank}/log[?tail=N | ?offset=B]   a log, JSON   kernels read
    POST /nblaunch/runs/{id}/stop       ask its kernel to stop it (409 why not), {"from": place}  kernels write
    POST /nblaunch/runs/{id}/stacks     every rank's Python stack, from the run's kernel, 1 s  kernels write
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from kernelside.config import MAX_DEPTH, depth_of

from .config_store import ConfigStore
from .errors import PanelRequestError
from .hardware_cache import HardwareCache
from .runs import RunFolders
from .version_check import server_versions

CONTENTS, KERNELS, API = "contents", "kernels", "api"  # Jupyter Server's resources for files, kernels, its status
_TOO_DEEP = f"request body nests deeper than a launch setting can: {MAX_DEPTH} levels of values at most"


class _PanelHandler(APIHandler):
    def initialize(self, store: ConfigStore, hardware: HardwareCache, runs: RunFolders, reader: ThreadPoolExecutor):
        self.store = store
        self.hardware = hardware
        self.runs = runs
        self.reader = reader  # one thread: RunFolders keeps samples between requests, so its reads take turns

    def json_body(self) -> dict:
        try:
            body = json.loads(self.request.body or b"{}")
        except (ValueError, UnicodeDecodeError) as e:
            raise PanelRequestError(400, f"request body is not valid JSON: {e}") from None
        except RecursionError:  # (nested 100,000 deep)
            raise PanelRequestError(400, _TOO_DEEP) from None
        if not isinstance(body, dict):
            raise PanelRequestError(400, f"request body must be a JSON object, got {type(body).__name__}")
        if (
            depth_of(body, MAX_DEPTH + 2) > MAX_DEPTH + 2
        ):  # {"values": {key: value}}: each value may nest MAX_DEPTH levels
            raise PanelRequestError(400, _TOO_DEEP)
        return body

    async def answer(self, action, *, waits: bool = False) -> None:
        """Run ``action`` in the reader thread (``waits``: in the default executor, as it waits for a kernel) and
        send its JSON."""
        try:
            result = await asyncio.get_running_loop().run_in_executor(None if waits else self.reader, action)
        except PanelRequestError as e:
            self.set_status(e.status)
            result = e.to_json()
        self.finish(json.dumps(result))


class VersionHandler(_PanelHandler):
    @tornado.web.authenticated
    @authorized("read", resource=API)  # what Jupyter Server asks for its own /api/status
    async def get(self):
        await self.answer(server_versions)


class ConfigHandler(_PanelHandler):
    @tornado.web.authenticated
    @authorized("read", resource=CONTENTS)
    async def get(self):
        await self.answer(self.store.read)

    @tornado.web.authenticated
    @authorized("write", resource=CONTENTS)
    async def put(self):
        await self.answer(lambda: self.store.save(self.json_body()))


class HardwareHandler(_PanelHandler):
    @tornado.web.authenticated
    @authorized("read", resource=KERNELS)
    async def get(self):
        refresh = self.get_query_argument("refresh", "0") not in ("0", "", "false")
        self.finish(json.dumps(await self.hardware.get(refresh=refresh)))


class AccelerateImportHandler(_PanelHandler):
    @tornado.web.authenticated
    @authorized("read", resource=CONTENTS)  # it reads a file and writes nothing
    async def post(self):
        await self.answer(lambda: self.store.import_accelerate(self.json_body()))


class AccelerateExportHandler(_PanelHandler):
    @tornado.web.authenticated
    @authorized("write", resource=CONTENTS)
    async def post(self):
        await self.answer(lambda: self.store.export_accelerate(self.json_body()))


class RunsHandler(_PanelHandler):
    @tornado.web.authenticated
    @authorized("read", resource=KERNELS)
    async def get(self):
        await self.answer(self.runs.list_runs)


class RunHandler(_PanelHandler):
    @tornado.web.authenticated
    @authorized("read", resource=KERNELS)
    async def get(self, run_id):
        await self.answer(lambda: self.runs.run(run_id))


class RunSeriesHandler(_PanelHandler):
    @tornado.web.authenticated
    @authorized("read", resource=KERNELS)
    async def get(self, run_id):
        await self.answer(lambda: self.runs.series(run_id))


class RunLogHandler(_PanelHandler):
    @tornado.web.authenticated
    @authorized("read", resource=KERNELS)
    async def get(self, run_id, rank):
        tail, offset = self.get_query_argument("tail", None), self.get_query_argument("offset", None)
        await self.answer(lambda: self.runs.log(run_id, rank, tail=tail, offset=offset))


class RunStopHandler(_PanelHandler):
    @tornado.web.authenticated
    @authorized("write", resource=KERNELS)  # stops a kernel's ranks, as interrupting a kernel is a write
    async def post(self, run_id):
        # {"from": where Stop was pressed} (the words after it name it); a bad body is answered as a 400, in answer()
        await self.answer(lambda: self.runs.stop(run_id, self.json_body().get("from")), waits=True)


class RunStacksHandler(_PanelHandler):
    @tornado.web.authenticated
    @authorized("write", resource=KERNELS)  # signals the ranks: a POST (XSRF-checked), a write, never a GET
    async def post(self, run_id):
        await self.answer(lambda: self.runs.stacks(run_id), waits=True)  # the kernel answers within 1 s


def setup_routes(web_app, store: ConfigStore, hardware: HardwareCache, runs: RunFolders) -> None:
    base = url_path_join(web_app.settings["base_url"], "nblaunch")
    reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nblaunch-reads")
    deps = {"store": store, "hardware": hardware, "runs": runs, "reader": reader}
    run = url_path_join(base, "runs", "([^/]+)")  # any segment: the class answers 400 for what is not a run id
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "version"), VersionHandler, deps),
            (url_path_join(base, "config"), ConfigHandler, deps),
            (url_path_join(base, "hardware"), HardwareHandler, deps),
            (url_path_join(base, "accelerate", "import"), AccelerateImportHandler, deps),
            (url_path_join(base, "accelerate", "export"), AccelerateExportHandler, deps),
            (url_path_join(base, "runs"), RunsHandler, deps),
            (run, RunHandler, deps),
            (url_path_join(run, "series"), RunSeriesHandler, deps),
            (url_path_join(run, "ranks", "([^/]+)", "log"), RunLogHandler, deps),
            (url_path_join(run, "stop"), RunStopHandler, deps),
            (url_path_join(run, "stacks"), RunStacksHandler, deps),
        ],
    )
