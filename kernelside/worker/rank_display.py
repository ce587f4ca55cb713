"""Rank 0's rich output: ``display()``, ``update_display()``, ``clear_output()`` and ``plt.show()``
reach the cell as the mime bundles they are, not as ``<IPython.core.display.HTML object>``.

A rank has no IPython shell (``get_ipython()`` is None there, so libraries take their script
paths), and without one IPython's ``display()`` prints a repr. In rank 0, IPython's display
functions instead format the object here, with the notebook's own formatters when the rank was
forked (figures, formatters registered in the notebook) or fresh ones when it was spawned, and
send the bundle over the event channel as a ``display`` event; the kernel publishes it in the
cell (``engines.local_bridge``). The event carries how much text the rank had written, so the
bundle lands in order with rank 0's prints.

The functions are replaced in place (their code, not their name): every reference reaches the
rank's publisher — ``from IPython.display import display`` run in a notebook cell before the
launch, ``import IPython.display as disp`` in transformers, matplotlib_inline's own import, the
``DisplayHandle`` methods — without a walk over every loaded module. In a spawned rank that has
not imported IPython yet, the replacement happens when it first is.

Example (in a ``%%distributed`` cell)::

    from IPython.display import HTML, display
    display(HTML("<b>rank 0 says hi</b>"))       # shown as HTML in the cell
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import types
import uuid

from . import output_positions

_TARGET_MODULE = "IPython.core.display_functions"
_REPLACED = ("display", "update_display", "clear_output", "publish_display_data")


class _RankDisplay:
    """Where rank 0's displays go (its event channel), the formatter that makes bundles, whether figures are hooked."""

    events = None
    formatter = None
    figures = False


# Global on purpose: a rank is one process running one launch, and the display functions replaced in
# IPython (and matplotlib's show) are process-wide: the trampolines below find their target here.
RANK_DISPLAY = _RankDisplay()


def keep_kernel_formatter(shell) -> None:
    """(fork) Keep the notebook shell's formatter before the shell is forgotten in the rank.

    It formats with what the notebook registered: the inline backend's figure formats,
    ``for_type`` printers, sympy's ``init_printing``.
    """
    formatter = getattr(shell, "display_formatter", None)
    if formatter is not None:
        RANK_DISPLAY.formatter = formatter


def install(events, rank: int) -> None:
    """Route this rank's IPython display calls to the kernel (rank 0 only; others keep IPython's repr print).

    Example::

        >>> install(current().events, rank=0)      # doctest: +SKIP
    """
    if rank != 0:
        RANK_DISPLAY.formatter = None
        return
    RANK_DISPLAY.events = events
    mod = sys.modules.get(_TARGET_MODULE)
    if mod is not None:
        _replace(mod)
    else:
        sys.meta_path.insert(0, _ReplaceOnImport())


# -- what the replaced functions do --------------------------------------------------------------


def display(
    *objs,
    include=None,
    exclude=None,
    metadata=None,
    transient=None,
    display_id=None,
    raw=False,
    clear=False,
    **kwargs,
):
    """IPython's ``display()``, formatting here and publishing through the kernel."""
    from IPython.core.display_functions import DisplayHandle

    transient = dict(transient or {})
    metadata = metadata or {}
    update = bool(kwargs.pop("update", False))
    if display_id:
        if display_id is True:
            display_id = uuid.uuid4().hex
        transient["display_id"] = display_id
    if update and "display_id" not in transient:
        raise TypeError("display_id required for update_display")
    if not objs and display_id:  # an empty output to be updated later
        objs, raw = ({},), True
    if clear:
        clear_output(wait=True)
    for obj in objs:
        if raw:
            data, md = obj, metadata
        else:
            data, md = _format(obj, include, exclude)
            if not data:  # _ipython_display_ displayed it itself
                continue
            if metadata:
                md = {**md, **metadata}
        publish_display_data(data, md, transient=transient, update=update)
    return DisplayHandle(display_id) if display_id else None


def update_display(obj, *, display_id, **kwargs):
    """IPython's ``update_display()`` in a rank."""
    kwargs["update"] = True
    display(obj, display_id=display_id, **kwargs)


def clear_output(wait=False):
    """IPython's ``clear_output()`` in a rank: clears the cell's output, as it would in the notebook."""
    _send({"op": "clear", "wait": bool(wait)})


def publish_display_data(data, metadata=None, *, transient=None, update=False, **kwargs):
    """Send one mime bundle to the kernel, which publishes it in the cell."""
    _send(
        {
            "op": "update" if update else "display",
            "data": dict(data),
            "metadata": dict(metadata or {}),
            "transient": dict(transient or {}),
        }
    )


def _send(payload: dict) -> None:
    events = RANK_DISPLAY.events
    try:
        output_positions.send_marked(events, "display", payload)  # after the text before it, before what follows
    except Exception as e:  # a bundle that cannot be pickled: show what it says as text
        text = payload.get("data", {}).get("text/plain", "")
        sys.stderr.write(f"nblaunch: rich output could not be sent to the notebook ({type(e).__name__}: {e})\n")
        if text:
            print(text)


# A widget made in a rank has its model in the rank: the frontend cannot show a view of it.
_RANK_LOCAL_MIMES = ("application/vnd.jupyter.widget-view+json",)


def bundle(obj) -> tuple[dict, dict]:
    """``obj``'s mime bundle (data, metadata) as this rank's ``display()`` would make it: the notebook's formatter
    when forked into rank 0, a fresh one else; what only a kernel could show (a widget view) left out.

    >>> bundle(1)[0]["text/plain"]
    '1'
    """
    return _format(obj, None, None)


def _format(obj, include, exclude):
    formatter = _formatter()
    if not RANK_DISPLAY.figures:
        _enable_figures(obj, formatter)
    data, md = formatter.format(obj, include=include, exclude=exclude)
    for mime in _RANK_LOCAL_MIMES:
        data.pop(mime, None)
        md.pop(mime, None)
    return data, md


def _formatter():
    if RANK_DISPLAY.formatter is None:
        from IPython.core.formatters import DisplayFormatter

        RANK_DISPLAY.formatter = DisplayFormatter()
    return RANK_DISPLAY.formatter


def _enable_figures(obj, formatter) -> None:
    """Figures are formatted as the inline backend would, also where no notebook shell set that up."""
    fig_mod = sys.modules.get("matplotlib.figure")
    if fig_mod is None or not isinstance(obj, fig_mod.Figure):
        return
    RANK_DISPLAY.figures = True
    try:
        formatter.formatters["image/png"].lookup_by_type(fig_mod.Figure)
        return  # the notebook's inline backend registered its formats already
    except KeyError:
        pass
    from IPython.core.pylabtools import select_figure_formats

    formats, kwargs = {"png"}, {"bbox_inches": "tight"}
    try:
        from matplotlib_inline.config import InlineBackend

        cfg = InlineBackend.instance()
        formats, kwargs = set(cfg.figure_formats), dict(cfg.print_figure_kwargs)
    except Exception:
        pass
    select_figure_formats(types.SimpleNamespace(display_formatter=formatter), formats, **kwargs)


# -- replacing IPython's functions ---------------------------------------------------------------

_nblaunch_rank_display = sys.modules[__name__]  # what the trampolines below look up, in IPython's globals


def _display_trampoline(*args, **kwargs):
    return _nblaunch_rank_display.display(*args, **kwargs)


def _update_display_trampoline(*args, **kwargs):
    return _nblaunch_rank_display.update_display(*args, **kwargs)


def _clear_output_trampoline(*args, **kwargs):
    return _nblaunch_rank_display.clear_output(*args, **kwargs)


def _publish_display_data_trampoline(*args, **kwargs):
    return _nblaunch_rank_display.publish_display_data(*args, **kwargs)


_TRAMPOLINES = {
    "display": _display_trampoline,
    "update_display": _update_display_trampoline,
    "clear_output": _clear_output_trampoline,
    "publish_display_data": _publish_display_data_trampoline,
}


def _replace(mod) -> None:
    mod.__dict__["_nblaunch_rank_display"] = sys.modules[__name__]
    for name in _REPLACED:
        fn = getattr(mod, name, None)
        if not isinstance(fn, types.FunctionType) or fn.__code__.co_freevars:
            continue  # an IPython whose function cannot take new code keeps its own behaviour
        code = _TRAMPOLINES[name].__code__
        names = {"co_name": name, **({"co_qualname": name} if hasattr(code, "co_qualname") else {})}
        fn.__code__ = code.replace(**names)


class _ReplaceOnImport(importlib.abc.MetaPathFinder):
    """(spawn) Replace the functions right after IPython's display module is first imported."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            _replace(module)

        loader.exec_module = exec_module
        return spec
