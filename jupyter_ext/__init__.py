"""nblaunch's JupyterLab extension: the side panel (built into ``labextension/``) and the
server extension whose REST API under ``/nblaunch/`` the panel talks to.

Installing the package enables both (``jupyter-config/server-config/nblaunch.json``).

Example::

    >>> _jupyter_server_extension_points()
    [{'module': 'jupyter_ext'}]
"""

from __future__ import annotations

from kernelside.versions import installed_version

__version__ = installed_version()  # `jupyter server extension list` shows it beside jupyter_ext


def _jupyter_labextension_paths() -> list[dict]:
    return [{"src": "labextension", "dest": "nblaunch"}]


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "jupyter_ext"}]


def _load_jupyter_server_extension(server_app) -> None:
    """Add the ``/nblaunch/`` routes to a running Jupyter server."""
    from .config_store import ConfigStore
    from .hardware_cache import HardwareCache
    from .routes import setup_routes
    from .runs import RunFolders

    store = ConfigStore(server_app.root_dir)
    setup_routes(server_app.web_app, store, HardwareCache(), RunFolders(server_app.root_dir))
    server_app.log.info("nblaunch: launch config for %s is %s", server_app.root_dir, store.target_path())
