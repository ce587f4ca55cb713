"""A Jupyter server extension for tests only: ``GET /nblaunch-test/modules`` answers the server process's
``sys.modules`` names, so a test can see what nblaunch's extension made the server import; and the log
line ``nblaunch-test: listening on port N`` says when the server accepts connections (its own "running
at" comes before it binds its socket), so a test waits on that line instead of polling."""

from __future__ import annotations

import json
import sys

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado.ioloop import IOLoop


class ModulesHandler(APIHandler):
    @tornado.web.authenticated
    def get(self):
        self.finish(json.dumps(sorted(sys.modules)))


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "server_modules_probe"}]


def _load_jupyter_server_extension(server_app) -> None:
    base = url_path_join(server_app.web_app.settings["base_url"], "nblaunch-test", "modules")
    server_app.web_app.add_handlers(".*$", [(base, ModulesHandler)])

    def listening() -> None:
        server_app.log.info("nblaunch-test: listening on port %d", server_app.port)

    # The server binds its socket in a callback queued before its loop starts; a callback queued from a
    # callback of the running loop runs after every one queued before, so after the bind.
    IOLoop.current().add_callback(lambda: IOLoop.current().add_callback(listening))
