"""Accelerate in a rank: a DeepSpeed plugin passed in the cell runs DeepSpeed, on CPU as well.

For ranks that compute on CPU, nblaunch exports what ``accelerate launch`` exports for a MULTI_CPU config, including
``ACCELERATE_USE_CPU`` (without it Accelerate would not see the ranks as distributed at all). But Accelerate ignores a
DeepSpeed plugin while that variable is set: ``Accelerator(deepspeed_plugin=...)`` would silently train with DDP. On a
CPU rank the variable decides nothing else, so when the code passes a DeepSpeed plugin (and not ``cpu=True``) it is
taken back before Accelerate reads it, as ``accelerate launch`` leaves it out for a DeepSpeed config: the rank then runs
``DeepSpeedEngine``. (DeepSpeed chosen in the config file needs nothing here: ``launch/accelerate_env.py`` already
exports DeepSpeed's variables and no ``ACCELERATE_USE_CPU``.)

Example (inside a %%distributed cell)::

    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config="ds.json"))   # DeepSpeed, on CPU too
"""

from __future__ import annotations

import functools
import inspect
import os

from .import_patches import when_imported


def install_in_worker(device: str) -> None:
    """In a rank that computes on CPU, make a DeepSpeed plugin in the code take ``ACCELERATE_USE_CPU`` back."""
    if device == "cpu":
        when_imported("accelerate.accelerator", _plugin_means_deepspeed)


def _plugin_means_deepspeed(module) -> None:
    cls = getattr(module, "Accelerator", None)
    if cls is None or getattr(cls.__init__, "_nblaunch_deepspeed", False):
        return
    original = cls.__init__
    signature = functools.cache(lambda: inspect.signature(original))  # at the first Accelerator(), not every start

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        try:
            asked = signature().bind_partial(self, *args, **kwargs).arguments
        except TypeError:  # Accelerate itself will say what is wrong with the arguments
            asked = {}
        plugin = asked.get("deepspeed_plugin", asked.get("deepspeed_plugins"))
        if plugin is not None and not asked.get("cpu"):
            os.environ.pop("ACCELERATE_USE_CPU", None)
        original(self, *args, **kwargs)

    __init__._nblaunch_deepspeed = True
    cls.__init__ = __init__
