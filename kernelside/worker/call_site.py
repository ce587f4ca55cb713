"""What a rank's frame is calling right now, and the source line it stands on: the detail a stack's
frames lack when the code waits in C (``time.sleep``, ``Work.wait``, ``Tensor.item`` have no Python
frame of their own). Read from the frame's bytecode and ``linecache``; standard library only.

Example::

    >>> import sys
    >>> calling_of(sys._getframe())  # doctest: +SKIP  (inside a call: the callee's name)
    'calling_of'
"""

from __future__ import annotations

import linecache


def source_line(filename: str, lineno: int | None) -> str:
    """The stripped text of that line ('' when unknown), a cell's included (``notebook/cell.py`` caches it).

    Example::

        >>> source_line("<%%distributed cell In[3]>", 2)  # doctest: +SKIP  (in the rank)
        'time.sleep(0.1)'
    """
    if not lineno:
        return ""
    return linecache.getline(filename, lineno).strip()[:200]


_LOADS = ("LOAD_ATTR", "LOAD_METHOD", "LOAD_NAME", "LOAD_GLOBAL", "LOAD_FAST", "LOAD_DEREF")


def calling_of(frame) -> str | None:
    """The name of the function ``frame`` is calling now, read from its bytecode: a C function (``time.sleep``,
    ``Work.wait``, ``Tensor.item``) has no frame of its own to say where the code waits. None when the call
    is not a plain one (``*args``, a callee that is an expression, a branch among its arguments)."""
    import dis

    try:
        code = [i for i in dis.get_instructions(frame.f_code) if i.offset <= frame.f_lasti]
    except Exception:
        return None
    if not code or code[-1].opname != "CALL":
        return None
    nargs = code[-1].arg or 0
    k, pushed = len(code) - 2, 0
    while k >= 0 and code[k].opname in ("PRECALL", "KW_NAMES"):
        k -= 1
    while k >= 0 and pushed < nargs:  # the arguments, back to front
        ins = code[k]
        if ins.is_jump_target or "JUMP" in ins.opname or ins.opcode in dis.hasjrel + dis.hasjabs:
            return None
        try:
            pushed += (
                dis.stack_effect(ins.opcode, ins.arg)
                if ins.opcode >= dis.HAVE_ARGUMENT
                else dis.stack_effect(ins.opcode)
            )
        except ValueError:
            return None
        k -= 1
    if k < 0 or pushed != nargs or code[k].opname not in _LOADS:
        return None
    return str(code[k].argval)
