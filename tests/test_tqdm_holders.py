"""Where tqdm's classes are held: one walk in the parent, then only what changed (worker/tqdm_holders.py)."""

from __future__ import annotations

import os
import sys
import types

import pytest
import tqdm.auto

from kernelside.worker import tqdm_holders
from kernelside.worker.tqdm_holders import Holders, tqdm_classes

pytestmark = pytest.mark.processes  # starts ranks


@pytest.fixture
def module():
    """A module registered in sys.modules for the test, taken out after it."""
    made = []

    def make(name: str, **globals_) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__dict__.update(globals_)
        sys.modules[name] = m
        made.append(name)
        return m

    yield make
    for name in made:
        sys.modules.pop(name, None)


def _names(found) -> set[str]:
    return {name for d, name in found if d.get("__name__", "").startswith("nblaunch_test_")}


def test_finds_a_library_global_and_a_library_bar_built_on_the_notebook_bar(module):
    classes = tqdm_classes()

    class LibraryBar(tqdm.notebook.tqdm_notebook):
        pass

    module("nblaunch_test_lib", tqdm=tqdm.auto.tqdm, Bar=LibraryBar, other=int)
    assert _names(Holders().find(*classes)) == {"tqdm", "Bar"}


def test_a_second_look_sees_new_modules_and_modules_whose_globals_changed(module):
    classes = tqdm_classes()
    h = Holders()
    first = module("nblaunch_test_first", bar=tqdm.auto.tqdm)
    assert _names(h.find(*classes)) == {"bar"}
    module("nblaunch_test_late", late=tqdm.auto.tqdm)  # imported after the first look
    first.more = tqdm.std.tqdm  # a new global: the module is looked at again
    assert _names(h.find(*classes)) == {"bar", "late", "more"}
    del first.bar  # a holder gone
    assert _names(h.find(*classes)) == {"late", "more"}


def test_the_notebook_namespace_is_always_looked_at_afresh(monkeypatch):
    classes = tqdm_classes()
    h = Holders()
    main = types.ModuleType("nblaunch_test_main")
    main.bar = None
    monkeypatch.setitem(sys.modules, "__main__", main)  # the notebook's namespace, for this test
    assert _names(h.find(*classes)) == set()
    main.bar = tqdm.auto.tqdm  # rebound, same number of globals: only __main__ is looked at again for this
    assert _names(h.find(*classes)) == {"bar"}


def test_a_forked_child_inherits_the_parents_look(module):
    tqdm_holders.prime()
    module("nblaunch_test_after_prime", bar=tqdm.auto.tqdm)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the module made after the parent's look is found, the rest comes from the cache
        try:
            found = _names(tqdm_holders.HOLDERS.find(*tqdm_classes()))
            os.write(w, repr(sorted(found)).encode())
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 1000).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert got == "['bar']"


def _in_child(fn) -> str:
    """``fn()``'s repr, computed in a forked child of this process."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(w, repr(fn()).encode())
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 10000).decode()
    os.close(r)
    os.waitpid(pid, 0)
    return got


def test_a_child_forked_right_after_the_look_walks_no_module_but_the_notebooks(module, monkeypatch):
    lib = module("nblaunch_test_primed_lib", bar=tqdm.auto.tqdm)
    main = types.ModuleType("nblaunch_test_main")
    main.nb = None
    monkeypatch.setitem(sys.modules, "__main__", main)
    tqdm_holders.prime()
    main.nb = tqdm.auto.tqdm  # the notebook rebinds a name after the look: still found

    def child():
        lib.__dict__["hidden"] = tqdm.std.tqdm  # a walk would find it; the parent's answer does not have it
        return sorted(_names(tqdm_holders.HOLDERS.find(*tqdm_classes()))), sorted(
            n for d, n in tqdm_holders.HOLDERS.find(*tqdm_classes()) if d is main.__dict__
        )

    assert _in_child(child) == repr((["bar", "nb"], ["nb"]))  # no "hidden": no walk


def test_a_child_that_imported_something_since_the_look_walks_again(module):
    lib = module("nblaunch_test_primed_lib2", bar=tqdm.auto.tqdm)
    tqdm_holders.prime()

    def child():
        lib.more = tqdm.std.tqdm
        sys.modules["nblaunch_test_child_import"] = types.ModuleType("nblaunch_test_child_import")
        return sorted(_names(tqdm_holders.HOLDERS.find(*tqdm_classes())))

    assert _in_child(child) == repr(["bar", "more"])
