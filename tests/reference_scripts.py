"""What a reference script run under the real launchers (torchrun, ``accelerate launch``) ends with.

Tests compare nblaunch with what those launchers give: a script's output, its losses, the files it writes.
How the script's interpreter tears down is not part of that, and with torch 2.13 it can fail on its own: a
rank whose gloo process group (or a DDP/DeepSpeed model holding it) is still alive at exit is sometimes
aborted by the group's destructor ("terminate called without an active exception", SIGABRT; issue 19
measured torchrun aborting 2 of 10 such exits, and this suite saw it under ``accelerate launch`` too). So a
reference script ends as nblaunch's exported scripts do: its output flushed, then ``os._exit(0)``.

Example::

    >>> (root / "train.py").write_text(SCRIPT + LEAVE)   # doctest: +SKIP
"""

# appended to a script's text: it runs only when the script got to its end (an error still exits 1, torch's way)
LEAVE = "\nimport os as _os, sys as _sys\n_sys.stdout.flush()\n_sys.stderr.flush()\n_os._exit(0)\n"
