"""Reading a config file with limits: its size, its text, its nesting and what its YAML aliases expand to.

Anyone who can write a file the kernel or the Jupyter server reads can make it odd: 10 MB of it,
binary garbage, values nested 10,000 deep (a ``RecursionError`` in the parser, or worse in C), or a
400-byte YAML "alias bomb" whose ``*aliases`` expand to a billion values. Every one of these is
refused here, quickly and with a ``LaunchConfigError`` that names the file and where it goes wrong:
the file is read up to ``MAX_CONFIG_BYTES`` (a regular file only: a FIFO cannot hang the reader),
must be UTF-8 text, and its YAML events are counted before anything is built (``MAX_DEPTH`` levels,
``MAX_VALUES`` values with every alias counted as what it expands to). Then PyYAML's safe loader
builds it. JSON-like values from elsewhere (the panel's PUT) are held to the same depth
(``depth_of``).

Example::

    >>> load_yaml("num_processes: 2\\n", "nblaunch.yaml")
    {'num_processes': 2}
    >>> depth_of({"a": [1, {"b": 2}]})
    3
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import yaml

from ..errors import LaunchConfigError

MAX_CONFIG_BYTES = 1 << 20  # a launch config is a few hundred bytes; 1 MiB leaves room for any comments
MAX_DEPTH = 32  # levels of nesting (a DeepSpeed config needs 4)
MAX_VALUES = 10_000  # values in the file, each alias counted as what it expands to

MAX_INT_DIGITS = 100  # no setting holds more; Python's int() refuses over 4,300, with advice meant for programmers


if hasattr(yaml, "CSafeLoader"):

    class _Parser(yaml.cyaml.CParser, yaml.composer.Composer):
        """libyaml's parser, with PyYAML's own composer on top: libyaml's would build the whole tree in one C call,
        holding the GIL (and so the Jupyter server's event loop) for as long as a large file takes."""

        def __init__(self, stream):
            yaml.cyaml.CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)

        check_node = yaml.composer.Composer.check_node
        get_node = yaml.composer.Composer.get_node
        get_single_node = yaml.composer.Composer.get_single_node

else:  # PyYAML without libyaml: its parser is Python already

    class _Parser(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, yaml.composer.Composer):
        def __init__(self, stream):
            yaml.reader.Reader.__init__(self, stream)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)
            yaml.composer.Composer.__init__(self)


class _Loader(_Parser, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
    """PyYAML's safe loader (no Python objects), refusing an integer no setting could hold with the line it is on."""

    def __init__(self, stream):
        _Parser.__init__(self, stream)
        yaml.constructor.SafeConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)

    def construct_yaml_int(self, node):
        if len(node.value) > MAX_INT_DIGITS:
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {len(node.value):,} digits, more than any setting holds", node.start_mark
            )
        return super().construct_yaml_int(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_LOADER = _Loader
_FIX = "Fix the file (or delete it to use the defaults)."


def read_config_text(path: str | os.PathLike) -> str:
    """The text of the config file ``path``: at most ``MAX_CONFIG_BYTES`` of UTF-8 (a BOM is dropped), never a FIFO
    (``/dev/null`` reads as empty).

    Example::

        >>> read_config_text("nblaunch.yaml")   # doctest: +SKIP
        'num_processes: 2\\n'
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # O_NONBLOCK: a FIFO cannot hang the open
    except FileNotFoundError:
        raise _file_error(
            p, f"config file {p} does not exist. Create it from the side panel, or pass an existing path."
        ) from None
    except OSError as e:
        raise _file_error(p, f"config file {p} cannot be read ({e.strerror or e}).") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode) or stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO or socket, not a file"
            raise _file_error(p, f"config file {p} is {kind}. Point to a YAML file instead.")
        if stat.S_ISREG(st.st_mode) and st.st_size > MAX_CONFIG_BYTES:
            raise _too_large(p, st.st_size)
        chunks, size = [], 0
        while size <= MAX_CONFIG_BYTES:
            chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise _file_error(p, f"config file {p} cannot be read ({e.strerror or e}).") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_CONFIG_BYTES:  # it grew while being read
        raise _too_large(p, len(data))
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise _file_error(
            p,
            f"{p} is not UTF-8 text (byte 0x{data[e.start]:02x} at line {line}, byte {e.start + 1}): a config file "
            f"is YAML text. {_FIX}",
            line,
        ) from None


def load_yaml(text: str, where: str, path: Path | None = None):
    """The value of the YAML document ``text`` (from ``where``), built only once it is within the limits.

    Example::

        >>> load_yaml("a: &x [1, 2]\\nb: *x\\n", "demo.yaml")
        {'a': [1, 2], 'b': [1, 2]}
    """
    if len(text) > MAX_CONFIG_BYTES:
        raise _too_large(path or where, len(text))
    try:
        _check_shape(text, where, path)
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader (no Python objects)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or e
        raise _file_error(path, f"{where} is not valid YAML{line}: {problem}. {_FIX}", mark and mark.line + 1) from None
    except LaunchConfigError:
        raise
    except (ValueError, OverflowError) as e:  # a scalar the safe loader cannot build (an integer of 5,000 digits)
        reason = str(e).split(";")[0]  # (not Python's advice to raise its limit)
        raise _file_error(path, f"{where} holds a value that cannot be read ({reason}). {_FIX}") from None


def depth_of(value, limit: int = MAX_DEPTH) -> int:
    """How deep ``value`` nests (a scalar 0, ``[1]`` 1, ``{"a": [1]}`` 2), found without recursion; the walk stops
    once past ``limit`` (so a value that holds itself ends too).

    Example::

        >>> depth_of([[[]]])
        3
    """
    deepest, todo = 0, [(value, 0)]
    while todo and deepest <= limit:
        v, level = todo.pop()
        if isinstance(v, dict):
            todo.extend((item, level + 1) for item in v.values())
            deepest = max(deepest, level + 1)
        elif isinstance(v, (list, tuple)):
            todo.extend((item, level + 1) for item in v)
            deepest = max(deepest, level + 1)
    return deepest


def _check_shape(text: str, where: str, path: Path | None) -> None:
    """Walk the YAML events (the parser is iterative): refuse nesting over MAX_DEPTH and, counting each alias as
    the values it stands for, more than MAX_VALUES values, before the loader builds (and expands) anything."""
    expands: dict[str, tuple[int, int]] = {}  # anchor -> (values, depth) of what it names
    still_open: set[str] = set()  # anchors of collections not closed yet: an alias to one is a cycle
    stack = [_Frame(None, False)]  # the collections open around the current event
    total, top_key = 0, None
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent, yaml.CollectionStartEvent)):
            parent = stack[-1]
            if len(stack) == 2 and parent.mapping and parent.children % 2 == 0:  # a key of the top mapping
                top_key = event.value if isinstance(event, yaml.ScalarEvent) else top_key
            parent.children += 1
        under = f", under {top_key!r}" if top_key is not None and len(stack) > 1 else ""
        line = event.start_mark.line + 1 if event.start_mark else None
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in still_open:
                raise _file_error(
                    path,
                    f"{where}: the alias *{event.anchor} (at line {line}{under}) stands for a value that holds "
                    f"itself, which no launch setting can be. {_FIX}",
                    line,
                )
            values, depth = expands.get(event.anchor, (1, 0))
        elif isinstance(event, yaml.ScalarEvent):
            values, depth = 1, 0
            if event.anchor:
                expands[event.anchor] = (1, 0)
        elif isinstance(event, yaml.CollectionStartEvent):
            total += 1
            stack.append(_Frame(event.anchor, isinstance(event, yaml.MappingStartEvent)))
            if event.anchor:
                still_open.add(event.anchor)
            values, depth = 0, 0
        elif isinstance(event, yaml.CollectionEndEvent):
            frame = stack.pop()
            values, depth = frame.values, frame.depth + 1
            if frame.anchor:
                expands[frame.anchor] = (values, depth)
                still_open.discard(frame.anchor)
            stack[-1].values += values
            stack[-1].depth = max(stack[-1].depth, depth)
            continue
        else:
            continue  # stream and document events
        if not isinstance(event, yaml.CollectionStartEvent):
            total += values
            stack[-1].values += values
            stack[-1].depth = max(stack[-1].depth, depth)
        if len(stack) - 1 + depth > MAX_DEPTH:
            raise _file_error(
                path,
                f"{where} nests values more than {MAX_DEPTH} levels deep (at line {line}{under}); a launch "
                f"config needs a few. {_FIX}",
                line,
            )
        if total > MAX_VALUES:
            raise _file_error(
                path,
                f"{where} holds more than {MAX_VALUES:,} values (at line {line}{under}), counting what each "
                f"YAML alias (*name) stands for: a launch config holds a few dozen. {_FIX}",
                line,
            )


class _Frame:
    __slots__ = ("anchor", "children", "depth", "mapping", "values")

    def __init__(self, anchor: str | None, mapping: bool):
        self.anchor, self.mapping = anchor, mapping
        self.values, self.depth, self.children = 1, 0, 0


def _too_large(where, size: int) -> LaunchConfigError:
    return _file_error(
        where if isinstance(where, Path) else None,
        f"{where} is {size:,} bytes; a launch config is at most {MAX_CONFIG_BYTES:,} ({MAX_CONFIG_BYTES >> 20} MiB). "
        "Point to the right file, or shorten it.",
    )


def _file_error(path, message: str, line: int | None = None) -> LaunchConfigError:
    """A problem with the whole file, not one key's value (``key`` None: the panel will not overwrite it unasked)."""
    error = LaunchConfigError(None, None, None, message=message, path=path)
    error.line = line
    return error
