"""The ``/nblaunch/`` REST API: a routing table of thin handlers over ``ConfigStore``.

Every verb requires an authenticated user; PUT/POST also pass jupyter_server's XSRF check
(APIHandler).  Client mistakes come back as JSON ``{"message", "fields"}`` with a 4xx status.

Example::

    GET  /nblaunch/config               path, values, schema, warnings
    PUT  /nblaunch/config               {"values": {...}, "overwrite": false}
    GET  /nblaunch/hardware[?refresh=1] GPUs, CPUs, RAM, torch and CUDA versions
    POST /nblaunch/accelerate/import    {"path": "optional/under/root.yaml"}
    POST /nblaunch/accelerate/export    {"path": "accelerate_config.yaml", "values": {...}}
"""

from __future__ import annotations

import json

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from .config_store import ConfigStore
from .errors import PanelRequestError
from .hardware_cache import HardwareCache


class _PanelHandler(APIHandler):
    def initialize(self, store: ConfigStore, hardware: HardwareCache):
        self.store = store
        self.hardware = hardware

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


def setup_routes(web_app, store: ConfigStore, hardware: HardwareCache) -> None:
    base = url_path_join(web_app.settings["base_url"], "nblaunch")
    deps = {"store": store, "hardware": hardware}
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "config"), ConfigHandler, deps),
            (url_path_join(base, "hardware"), HardwareHandler, deps),
            (url_path_join(base, "accelerate", "import"), AccelerateImportHandler, deps),
            (url_path_join(base, "accelerate", "export"), AccelerateExportHandler, deps),
        ],
    )
