"""The loggers training code already calls feed the live chart, without a change to that code.

Inside a worker that shows metrics (rank 0, or every rank with ``progress="all"``: the rule of
``log_metrics()``), ``install_in_worker()`` wraps the methods the frameworks log through:

========================================================  ==========================================
``Accelerator.log(values, step=...)``                      with or without ``init_trackers``
``transformers.Trainer.log(logs)``                         loss, learning_rate, grad_norm, epoch...
Lightning's logger connector ``log_metrics(metrics, step)`` ``self.log(...)`` in a LightningModule
``Fabric.log_dict(metrics, step)`` (``fabric.log`` too)
``SummaryWriter.add_scalar / add_scalars``                 torch.utils.tensorboard and tensorboardX
========================================================  ==========================================

Each wrapper calls the framework's own method first and unchanged (TensorBoard still writes its
event files, Trainer's callbacks still get their logs), then records the numbers through the
same buffer and throttle as ``log_metrics()``: the points reach the run report (``.metrics``,
``.metrics_frame()``) and the chart. A framework that logs *through* another captured one
(Trainer's TensorBoard callback, Lightning's TensorBoardLogger, Accelerate's tensorboard tracker)
is recorded once, at the outermost call.

A library imported before the launch (in the kernel, inherited by fork) is patched at install;
one imported later, inside the rank, is patched as its module finishes importing (``import_patches.py``:
an import hook). ``metrics="off"`` (``--metrics off``, the ``metrics`` config key) installs nothing;
``log_metrics()`` called explicitly keeps drawing, since the user asked for it by name.

Example (inside a %%distributed cell, nothing to add)::

    accelerator = Accelerator()
    ...
    accelerator.log({"loss": loss.item()}, step=step)     # drawn in the cell's chart
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping

from . import progress
from .context import current as current_worker
from .import_patches import when_imported


class _Capture:
    """This rank's capture: its rank, whether every rank's points are shown, loggers found unreadable, and
    how deep in captured calls the rank is (a logger calling another records once, at the outermost)."""

    def __init__(self):
        self.rank, self.every_rank, self.depth = 0, False, 0
        self.broken: set[str] = set()
        self.tensor = None  # torch.Tensor, set at install (torch is imported in every worker by then)


# Global on purpose: the frameworks' logging methods are patched once per process (a rank runs one
# launch), and a patched method has only this module to find its rank by.
CAPTURE = _Capture()


# -- recording -------------------------------------------------------------------------------------


_record_point = progress.record_point  # log_metrics()'s own buffer and throttle


def record(step, values) -> None:
    """One point (the numbers of ``values`` at ``step``) into ``log_metrics()``'s buffer and throttle.

    Example::

        >>> record(10, {"loss": 0.25, "lr": torch.tensor(1e-3)})   # doctest: +SKIP
    """
    _emit(point(step, values))


def point(step, values, prefix: str = "", out: dict | None = None) -> dict:
    """``{"step": step, name: float, ...}`` from a logged mapping: numbers, and tensors or numpy scalars of one
    element; nested mappings become ``outer/inner``; text, images and histograms are left to the framework.
    A metric named ``step`` is the step when none is given (Lightning's convention)."""
    out = {"step": step} if out is None else out
    if type(values) is not dict and not isinstance(values, Mapping):
        return out
    for k, v in values.items():
        t = type(v)
        key = k if not prefix and type(k) is str else f"{prefix}{k}"
        if t is float:
            pass
        elif t is CAPTURE.tensor:  # what Lightning and Accelerate users log most, after floats
            if v.numel() != 1:
                continue
            v = float(v.item())
        elif t is int or t is bool:
            v = float(v)
        elif t is dict or isinstance(v, Mapping):
            point(None, v, f"{key}/", out)
            continue
        elif t is not str and hasattr(v, "item") and hasattr(v, "ndim"):
            try:
                if not (v.ndim == 0 or getattr(v, "size", None) == 1 or v.numel() == 1):
                    continue
                v = float(v.item())
            except (TypeError, ValueError, AttributeError, RuntimeError):
                continue
        else:
            continue
        if key == "step" or key == "rank":
            if key == "step" and out["step"] is None:
                out["step"] = int(v) if v == int(v) else v
            continue
        out[key] = v
    return out


def _emit(p: dict) -> None:
    if len(p) == 1:
        return  # nothing numeric was logged
    if CAPTURE.every_rank:
        p["rank"] = CAPTURE.rank
    _record_point(p)


# -- what each framework's method looks like: (self, args, kwargs) of the call, after the framework ran ---


def _accelerate_log(self, args, kwargs):  # log(values, step=None, log_kwargs=None)
    _emit(point(args[1] if len(args) > 1 else kwargs.get("step"), args[0] if args else kwargs.get("values")))


def _trainer_log(self, args, kwargs):  # log(logs, start_time=None); Trainer.log added the epoch to logs
    _emit(point(self.state.global_step, args[0] if args else kwargs.get("logs")))


def _lightning_connector(self, args, kwargs):  # log_metrics(metrics, step=None)
    p = point(args[1] if len(args) > 1 else kwargs.get("step"), args[0] if args else kwargs.get("metrics"))
    if len(p) > 1 and p["step"] is None:  # as the connector does for its loggers
        trainer = self.trainer
        p.setdefault("epoch", float(trainer.current_epoch))
        loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
        step = getattr(loop, "_batches_that_stepped", None)
        p["step"] = trainer.global_step if step is None else step
    _emit(p)


def _fabric_log_dict(self, args, kwargs):  # log_dict(metrics, step=None); fabric.log calls it
    _emit(point(args[1] if len(args) > 1 else kwargs.get("step"), args[0] if args else kwargs.get("metrics")))


def _add_scalar(self, args, kwargs):  # add_scalar(tag, scalar_value, global_step=None, ...)
    tag = args[0] if args else kwargs.get("tag")
    value = args[1] if len(args) > 1 else kwargs.get("scalar_value")
    _emit(point(args[2] if len(args) > 2 else kwargs.get("global_step"), {tag: value}))


def _add_scalars(self, args, kwargs):  # add_scalars(main_tag, tag_scalar_dict, global_step=None, ...)
    main = args[0] if args else kwargs.get("main_tag")
    values = args[1] if len(args) > 1 else kwargs.get("tag_scalar_dict")
    _emit(point(args[2] if len(args) > 2 else kwargs.get("global_step"), values, f"{main}/"))


# module -> [(class name, method, capture or None: only mark the call so what it logs inside is not recorded)]
_PATCHES: dict[str, list[tuple[str, str, object]]] = {
    "accelerate.accelerator": [("Accelerator", "log", _accelerate_log)],
    "transformers.trainer": [("Trainer", "log", _trainer_log)],
    "torch.utils.tensorboard.writer": [
        ("SummaryWriter", "add_scalar", _add_scalar),
        ("SummaryWriter", "add_scalars", _add_scalars),
    ],
    "tensorboardX.writer": [
        ("SummaryWriter", "add_scalar", _add_scalar),
        ("SummaryWriter", "add_scalars", _add_scalars),
    ],
}
for _pkg in ("lightning.pytorch", "pytorch_lightning"):
    _PATCHES[f"{_pkg}.trainer.connectors.logger_connector.logger_connector"] = [
        ("_LoggerConnector", "log_metrics", _lightning_connector)
    ]
for _pkg in ("lightning.fabric", "lightning_fabric"):
    _PATCHES[f"{_pkg}.fabric"] = [("Fabric", "log_dict", _fabric_log_dict)]
    # TensorBoardLogger writes a placeholder hp_metric=-1 with the hyperparameters: not a metric of the run
    _PATCHES[f"{_pkg}.loggers.tensorboard"] = [("TensorBoardLogger", "log_hyperparams", None)]


# -- patching --------------------------------------------------------------------------------------


def _broken(what: str, exc: BaseException) -> None:
    """Say once that a logger could not be read (the framework's own logging already ran)."""
    if what not in CAPTURE.broken:
        CAPTURE.broken.add(what)
        sys.stderr.write(
            f"nblaunch: could not record the metrics logged through {what} ({type(exc).__name__}: {exc}); "
            "the framework's own logging is unaffected, the chart leaves these out. Use log_metrics() instead.\n"
        )


def _wrap(owner: type, name: str, capture) -> None:
    original = owner.__dict__.get(name)
    if original is None or getattr(original, "_nblaunch_capture", False):
        return
    what = f"{owner.__name__}.{name}"

    def wrapper(self, *args, **kwargs):
        CAPTURE.depth += 1
        try:
            result = original(self, *args, **kwargs)
        finally:
            CAPTURE.depth -= 1
        if capture is not None and not CAPTURE.depth:
            try:
                capture(self, args, kwargs)
            except Exception as e:  # a logger we misread must never break the user's training
                _broken(what, e)
        return result

    functools.update_wrapper(wrapper, original)
    wrapper._nblaunch_capture = True
    setattr(owner, name, wrapper)


def _patch_module(module) -> None:
    for cls_name, method, capture in _PATCHES.get(module.__name__, ()):
        owner = module.__dict__.get(cls_name)
        if isinstance(owner, type):
            _wrap(owner, method, capture)


def install_in_worker(enabled: bool = True) -> bool:
    """Capture the frameworks' loggers in this worker, if it shows metrics and capture is on. True if installed."""
    ctx = current_worker()
    if ctx is None or not enabled:
        return False
    every_rank = ctx.progress_scope == "all"
    if ctx.rank != 0 and not every_rank:
        return False  # log_metrics() would drop these ranks' points anyway: their calls cost nothing extra
    CAPTURE.rank, CAPTURE.every_rank = ctx.rank, every_rank
    import torch

    CAPTURE.tensor = torch.Tensor
    for name in _PATCHES:
        when_imported(name, _patch_module)
    return True
