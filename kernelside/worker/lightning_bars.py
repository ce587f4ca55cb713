"""Lightning's Rich progress bar in a rank: nblaunch's bar in the cell, never terminal control codes.

Lightning picks ``RichProgressBar`` by default when rich is installed. In a rank, rich believes it writes to a
terminal (the kernel's ``FORCE_COLOR=1`` reaches the rank, and a rank is not a notebook), so its live bar arrives in
the cell as cursor moves and line clears. In a rank whose bars are drawn by the kernel (widgets mode):

- Lightning's default bar is ``TQDMProgressBar``, whose tqdm is already nblaunch's bar (``progress.py``);
- a ``RichProgressBar`` the code makes itself writes to a console that is not a terminal: rich then prints the
  finished bar once, as text (colours kept), instead of animating it with control codes.

Example (inside a %%distributed cell, nothing to add)::

    trainer = L.Trainer(max_epochs=2)     # its bar is drawn in the cell by nblaunch
"""

from __future__ import annotations

import functools

from .context import current as current_worker
from .import_patches import when_imported

_PACKAGES = ("lightning.pytorch", "pytorch_lightning")


def install_in_worker() -> None:
    """Patch Lightning's default bar and RichProgressBar's console in this rank (widgets mode only)."""
    ctx = current_worker()
    if ctx is None or ctx.progress_render != "widgets":
        return
    for pkg in _PACKAGES:
        when_imported(f"{pkg}.trainer.connectors.callback_connector", _default_bar_is_tqdm)
        when_imported(f"{pkg}.callbacks.progress.rich_progress", _rich_console_is_not_a_terminal)


def _default_bar_is_tqdm(module) -> None:
    # the connector's own name for the default only: RichProgressBar asked for by name stays itself
    tqdm_bar = getattr(module, "TQDMProgressBar", None)
    if tqdm_bar is not None and "RichProgressBar" in vars(module):
        module.RichProgressBar = tqdm_bar


def _rich_console_is_not_a_terminal(module) -> None:
    cls = getattr(module, "RichProgressBar", None)
    if cls is None or getattr(cls.__init__, "_nblaunch_plain", False):
        return
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self._console_kwargs = {"force_terminal": False, "force_jupyter": False, **self._console_kwargs}

    __init__._nblaunch_plain = True
    cls.__init__ = __init__
