"""Where tqdm's bar classes are held by name across the loaded modules, found once and then kept up to date.

A rank in widgets mode makes every tqdm class it inherited the event-sending bar (``progress.install_in_worker``),
which means finding every module global that holds one (``from tqdm.auto import tqdm`` in a library) or a
library's own bar built on the notebook bar (Lightning's ``Tqdm``). Walking every global of every loaded module
costs about 45 ms in a kernel with torch and transformers loaded, and each forked rank paid it again, at the
same time as its peers: most of a rank's start-up. The kernel (and the forkserver's template) now walks once,
before it forks (``prime``), and keeps what it found per module; a rank forked right after that look, with
nothing imported since, takes its answer as it is: even a walk that only compares the number of each module's
globals touches every module, and each page it touches is copied into the rank (about 6 ms and 1,250 page
copies per rank, all ranks at once). A rank that imported something since looks again only at modules that
are new or whose globals changed in number, and always at ``__main__``, the notebook's own namespace.

What it cannot see: a library module that rebinds an existing global to a tqdm class after it was first looked
at, without adding or removing a global (``tqdm = None`` at import, set later in a function). No library the
suite covers does that; the notebook's namespace, where users do it, is always looked at afresh.

Example::

    >>> classes = tqdm_classes()
    >>> HOLDERS.find(*classes)        # [(module globals, name), ...]   # doctest: +SKIP
"""

from __future__ import annotations

import os
import sys
import threading

ALWAYS_LOOKED_AT = "__main__"  # the notebook's namespace: rebound by users at any time, so never cached


def tqdm_classes(exclude: type | None = None) -> tuple[frozenset[int], type]:
    """The ids of tqdm's bar classes as tqdm's modules hold them now (``exclude`` left out), and the notebook bar."""
    import tqdm
    import tqdm.asyncio
    import tqdm.auto
    import tqdm.autonotebook
    import tqdm.notebook

    classes = (
        tqdm.std.tqdm,
        tqdm.tqdm,
        tqdm.auto.tqdm,
        tqdm.autonotebook.tqdm,
        tqdm.notebook.tqdm,
        tqdm.notebook.tqdm_notebook,
        tqdm.asyncio.tqdm_asyncio,
    )
    return frozenset(id(c) for c in classes if c is not exclude), tqdm.notebook.tqdm_notebook


def holds(value: object, originals: frozenset[int], notebook_bar: type) -> bool:
    """Whether ``value`` is one of tqdm's bar classes or a library's bar built on the notebook bar."""
    if id(value) in originals:  # identity only: touching other attributes can have side effects
        return True
    return issubclass(type(value), type) and issubclass(value, notebook_bar) and id(value) not in originals


class Holders:
    """Per module: the module, how many globals it had, and which of them held a bar class then."""

    def __init__(self):
        self._lock = threading.Lock()  # the kernel's warm-up thread primes while a launch may look
        self._classes: tuple[frozenset[int], int] | None = None
        self._by_module: dict[str, tuple[object, dict, int, list[tuple[dict, str]]]] = {}
        # (pid, number of loaded modules, what was found): the last look, made by ``prime`` just before a fork
        self._primed: tuple[int, int, list[tuple[dict, str]]] | None = None

    def find(self, originals: frozenset[int], notebook_bar: type, skip: str = "") -> list[tuple[dict, str]]:
        """Every (module globals, name) that holds one of ``originals`` or a subclass of ``notebook_bar``
        (not counting ``skip``, the caller's own module). What a module held when it was last looked at is
        given again without a look if it has the same number of globals: check ``d[name]`` before use."""
        with self._lock:
            if self._classes != (originals, id(notebook_bar)):
                self._classes = (originals, id(notebook_bar))
                self._by_module.clear()
                self._primed = None
            primed = self._primed
            if primed is not None and primed[0] != os.getpid() and primed[1] == len(sys.modules):
                # a rank forked after its parent's look, nothing imported since: the parent's answer without a walk
                # (each module a walk touches is a page copied into this rank, by every rank at once), but for
                # the notebook's namespace, looked at afresh
                main = getattr(sys.modules.get(ALWAYS_LOOKED_AT), "__dict__", None)
                left_out = (skip_dict(skip), main)
                found = [(d, n) for d, n in primed[2] if not any(d is x for x in left_out)]
                if isinstance(main, dict) and skip != ALWAYS_LOOKED_AT:
                    found += [(main, n) for n, v in list(main.items()) if holds(v, originals, notebook_bar)]
                return found
            by_module = self._by_module
            found: list[tuple[dict, str]] = []
            for mod_name, mod in list(sys.modules.items()):
                seen = by_module.get(mod_name)
                if seen is not None and seen[0] is mod and len(seen[1]) == seen[2] and mod_name != ALWAYS_LOOKED_AT:
                    found += seen[3]
                    continue
                d = getattr(mod, "__dict__", None)
                if not isinstance(d, dict) or mod_name == skip:
                    continue
                pairs = [(d, n) for n, v in list(d.items()) if holds(v, originals, notebook_bar)]
                by_module[mod_name] = (mod, d, len(d), pairs)
                found += pairs
            return found

    def prime(self) -> None:
        """Look now, in a process about to fork ranks: a rank forked before anything else is imported takes this
        look's answer as it is (``find``)."""
        found = self.find(*tqdm_classes())
        with self._lock:
            self._primed = (os.getpid(), len(sys.modules), found)


def skip_dict(module_name: str) -> dict | None:
    """The globals of ``module_name`` if it is loaded (what ``find(skip=...)`` leaves out)."""
    mod = sys.modules.get(module_name) if module_name else None
    return getattr(mod, "__dict__", None)


# Global on purpose: what a parent found is what its forked ranks inherit.
HOLDERS = Holders()


def prime() -> None:
    """Look once now (in a process about to fork ranks), so that each rank only looks at what changed."""
    try:
        HOLDERS.prime()
    except Exception:  # a broken tqdm install: the rank's own install says so, in the rank's log
        pass
