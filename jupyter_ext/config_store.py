"""What the panel's REST API does, as a plain class: read, validate and save the launch
config, and import from / export to Accelerate, for one server root directory.

The file it edits is the one a kernel started in the root directory would read
(``kernelside.config.find_config_path``): ``$NBLAUNCH_CONFIG``, else the nearest
``nblaunch.yaml`` walking up from the root.  When that lookup ends at Accelerate's default
config (or at nothing), the panel shows those values and a save creates
``<root>/nblaunch.yaml``, which kernels then read first; Accelerate's own file is never
written.  Paths that clients send are resolved inside the root and refused outside it.

Example::

    >>> store = ConfigStore("/srv/notebooks")
    >>> store.save({"values": {"num_processes": 3}})["values"]["num_processes"]
    3
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import yaml

from kernelside import config
from kernelside.config import accelerate as accelerate_config
from kernelside.errors import LaunchConfigError

from .errors import PanelRequestError

DEFAULT_EXPORT_NAME = "accelerate_config.yaml"

# Multi-machine launches go through torch's elastic launcher (num_machines > 1) or Ray (engine: ray);
# while this is False the panel shows those fields disabled with a note.
MULTI_MACHINE_AVAILABLE = True


class ConfigStore:
    """The launch config of one Jupyter server root, as JSON-ready dicts."""

    def __init__(self, root_dir: str | os.PathLike):
        self.root = Path(root_dir).expanduser().resolve()

    # -- where things are -------------------------------------------------------------

    def _lookup(self) -> tuple[Path | None, str]:
        path, kind = config.find_config_path(self.root)
        if path is not None and not path.is_absolute():
            path = self.root / path  # a relative $NBLAUNCH_CONFIG, as a kernel in the root reads it
        return path, kind

    def target_path(self) -> Path:
        """The file a save writes."""
        path, kind = self._lookup()
        if path is not None and kind != "accelerate":
            return path
        return self.root / config.CONFIG_FILENAME

    def _display(self, path: Path) -> str:
        try:
            return str(path.resolve().relative_to(self.root))
        except ValueError:
            return str(path)

    def resolve_client_path(self, raw) -> Path:
        """A path sent by the client, inside the root; 400 when malformed, 403 when outside."""
        if not isinstance(raw, str) or not raw.strip() or "\x00" in raw:
            raise PanelRequestError(400, f"path must be a non-empty string, got {raw!r}")
        path = (self.root / raw.strip()).resolve()
        if path != self.root and self.root not in path.parents:
            raise PanelRequestError(403, f"path {raw!r} is outside the server's root directory {self.root}")
        return path

    # -- the config -------------------------------------------------------------------

    def read(self) -> dict:
        """Everything the panel needs to draw its form: path, values, schema, warnings, errors."""
        path, kind = self._lookup()
        target = self.target_path()
        loaded = _LoadedFile()
        read_from = None
        if kind == "accelerate":
            read_from = path
            loaded = _load_accelerate(path)
            loaded.warnings.insert(
                0, f"Values come from Accelerate's default config {path}; saving writes them to {target}."
            )
        elif path is not None and path.exists():
            read_from = path
            loaded = _load_nblaunch(path)
        return {
            "path": str(target),
            "display_path": self._display(target),
            "root_dir": str(self.root),
            "source": kind,
            "exists": target.exists(),
            "read_from": str(read_from) if read_from else None,
            "values": {**config.defaults(), **loaded.values},
            "unknown_keys": sorted(loaded.unknown),
            "schema": config.schema(),
            "warnings": loaded.warnings,
            "field_errors": loaded.field_errors,
            "error": loaded.error,
            "features": {"multi_machine": MULTI_MACHINE_AVAILABLE},
        }

    def save(self, body: dict) -> dict:
        """Validate ``body["values"]`` and write the config atomically, keeping unknown keys.

        A file on disk that does not parse is only replaced when ``body["overwrite"]`` is true.
        """
        values = _values_from(body)
        overwrite = body.get("overwrite", False)
        if not isinstance(overwrite, bool):
            raise PanelRequestError(400, f"overwrite must be true or false, got {overwrite!r}")
        target = self.target_path()
        unknown: dict = {}
        if target.exists():
            current = _load_nblaunch(target)
            unparsable = current.error is not None and current.error["key"] is None
            if unparsable and not overwrite:
                raise PanelRequestError(
                    409,
                    f"{target} could not be read, so it was not overwritten: {current.error['message']}",
                    detail={"error": current.error},
                )
            unknown = current.unknown
        good = _validated(values)
        try:
            config.save_config_file(target, good, unknown)
        except OSError as e:
            raise PanelRequestError(500, f"could not write {target}: {e.strerror or e}") from None
        return {**self.read(), "saved": True}

    # -- Accelerate -------------------------------------------------------------------

    def import_accelerate(self, body: dict) -> dict:
        """Values from an Accelerate config (``body["path"]`` under the root, or Accelerate's default)."""
        raw = body.get("path")
        if raw in (None, ""):
            path = accelerate_config.default_config_path()
            missing = f"no Accelerate config at {path}: run `accelerate config` first, or give a path under {self.root}"
        else:
            path = self.resolve_client_path(raw)
            missing = f"{raw!r} does not exist under {self.root}"
        if not path.exists():
            raise PanelRequestError(404, missing)
        if not path.is_file():
            raise PanelRequestError(400, f"{raw or path!r} is not a file")
        try:
            imported = accelerate_config.import_accelerate(path)
        except LaunchConfigError as e:  # (its message names the file, as the kernel's does)
            raise PanelRequestError(400, str(e) if e.path else f"{path}: {e}") from None
        except (ValueError, TypeError, UnicodeDecodeError) as e:
            raise PanelRequestError(400, f"{path} is not an Accelerate config: {e}") from None
        if imported.invalid:
            listing = "; ".join(str(e).removesuffix(" Nothing was started.") for e in imported.invalid.values())
            raise PanelRequestError(
                400,
                f"{path} was not imported: {listing}. Fix the file, or set these fields here.",
                fields={k: e.allowed_message for k, e in imported.invalid.items()},
            )
        return {"source": str(path), "values": imported.values, "warnings": imported.warnings}

    def export_accelerate(self, body: dict) -> dict:
        """Write ``body["values"]`` as a file ``accelerate launch --config_file`` accepts."""
        raw = body.get("path") or DEFAULT_EXPORT_NAME
        path = self.resolve_client_path(raw)
        if not path.parent.is_dir():
            raise PanelRequestError(400, f"folder {self._display(path.parent)!r} does not exist")
        if path.is_dir():
            raise PanelRequestError(400, f"{raw!r} is a folder")
        if path == self.target_path().resolve():
            raise PanelRequestError(400, f"{raw!r} is nblaunch's own config file; choose another name")
        good = _validated(_values_from(body))
        text = yaml.safe_dump(accelerate_config.export_accelerate(good), sort_keys=False, default_flow_style=False)
        try:
            config.write_text_atomic(path, text)
        except OSError as e:
            raise PanelRequestError(500, f"could not write {path}: {e.strerror or e}") from None
        shown = self._display(path)
        return {
            "path": str(path),
            "display_path": shown,
            "text": text,
            "command": f"accelerate launch --config_file {shlex.quote(shown)} train.py",
        }


class _LoadedFile:
    def __init__(self, values=None, unknown=None, warnings=None, field_errors=None, error=None):
        self.values: dict = values or {}
        self.unknown: dict = unknown or {}
        self.warnings: list[str] = warnings or []
        self.field_errors: dict[str, str] = field_errors or {}
        self.error: dict | None = error


def _load_nblaunch(path: Path) -> _LoadedFile:
    """Parse an nblaunch.yaml within the kernel's limits and with its messages (``bounded_yaml``); a bad value is
    reported on its field, the other values still load."""
    try:
        text = config.read_config_text(path)
        parsed = config.parse_config_text(text, path, lenient=True)
    except LaunchConfigError as e:  # the file as a whole: unreadable, not YAML, over a limit
        return _LoadedFile(error={"message": str(e), "line": e.line, "key": None})
    if not parsed.invalid:
        return _LoadedFile(parsed.values, parsed.unknown, parsed.warnings)
    key, first = next(iter(parsed.invalid.items()))  # the one a launch would raise
    error = {"message": str(first), "line": _key_line(text, key), "key": key}
    field_errors = {k: e.allowed_message for k, e in parsed.invalid.items()}
    # The bad values stay in the form, marked, so the user sees what to fix.
    shown = {**parsed.values, **{k: _jsonable(e.value) for k, e in parsed.invalid.items()}}
    return _LoadedFile(shown, parsed.unknown, parsed.warnings, field_errors, error)


def _load_accelerate(path: Path) -> _LoadedFile:
    try:
        imported = accelerate_config.import_accelerate(path)
    except (OSError, ValueError, TypeError, UnicodeDecodeError) as e:
        return _LoadedFile(warnings=[f"Accelerate's config {path} could not be read ({e}); showing defaults."])
    shown = {**imported.values, **{k: _jsonable(e.value) for k, e in imported.invalid.items()}}
    errors = {k: e.allowed_message for k, e in imported.invalid.items()}
    return _LoadedFile(shown, {}, imported.warnings, errors)


def _jsonable(value):
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


def _key_line(text: str, key: str) -> int | None:
    pattern = re.compile(rf"^{re.escape(key)}\s*:")
    for number, line in enumerate(text.splitlines(), 1):
        if pattern.match(line):
            return number
    return None


def _values_from(body: dict) -> dict:
    values = body.get("values")
    if not isinstance(values, dict):
        raise PanelRequestError(400, f"'values' must be a JSON object of config keys, got {type(values).__name__}")
    unknown = {k: "not a setting nblaunch knows" for k in values if k not in config.FIELDS_BY_NAME}
    if unknown:
        raise PanelRequestError(400, "unknown keys: " + ", ".join(sorted(unknown)), fields=unknown)
    return values


def _validated(values: dict) -> dict:
    good, errors = config.validate(values)
    if errors:
        listing = "; ".join(f"{k}: {m}" for k, m in errors.items())
        raise PanelRequestError(400, f"{len(errors)} invalid setting(s) — {listing}", fields=errors)
    return good
