"""The launch configuration: one schema (``fields``, ``launch_rules``), its file (``files``, read within
``bounded_yaml``'s limits), where values come from (``resolve``).

Everything that reads or writes ``nblaunch.yaml`` goes through this package: the engine
(``notebook_launcher`` / ``%%distributed``), the JupyterLab server extension and, through
the server's JSON, the side panel. Key names follow Accelerate's ``default_config.yaml``
where they mean the same thing (``accelerate.py`` converts both ways).

Example::

    >>> cfg = resolve_config({"num_processes": 4})
    >>> cfg.values["num_processes"], cfg.sources["num_processes"]
    (4, 'argument')
"""

from .bounded_yaml import MAX_CONFIG_BYTES, MAX_DEPTH, MAX_VALUES, depth_of, read_config_text
from .field_checks import check_value, validate
from .fields import (
    ACCELERATE_PASSTHROUGH,
    FIELDS,
    FIELDS_BY_NAME,
    MIXED_PRECISION,
    Field,
    defaults,
    schema,
)
from .files import (
    CONFIG_FILENAME,
    ENV_CONFIG,
    ConfigFile,
    dump_config_text,
    find_config_path,
    load_config_file,
    parse_config_text,
    save_config_file,
    write_text_atomic,
)
from .launch_rules import ALIASES, DEFAULT_PORT, arguments
from .resolve import ResolvedConfig, resolve_config

__all__ = [
    "ACCELERATE_PASSTHROUGH",
    "ALIASES",
    "CONFIG_FILENAME",
    "DEFAULT_PORT",
    "ENV_CONFIG",
    "FIELDS",
    "FIELDS_BY_NAME",
    "MAX_CONFIG_BYTES",
    "MAX_DEPTH",
    "MAX_VALUES",
    "MIXED_PRECISION",
    "ConfigFile",
    "Field",
    "ResolvedConfig",
    "arguments",
    "check_value",
    "defaults",
    "depth_of",
    "dump_config_text",
    "find_config_path",
    "load_config_file",
    "parse_config_text",
    "read_config_text",
    "resolve_config",
    "save_config_file",
    "schema",
    "validate",
    "write_text_atomic",
]
