"""Print the wheels of a folder whose distribution this interpreter lacks, one path a line.

tests/gpu/on_device.sh installs only these (``--no-deps --target``), so what the GPU machine already
has (torch, accelerate, psutil, packaging...) is used as it is and never shadowed by a second copy.

Example::

    $ python3 tests/gpu/missing_wheels.py .gpu-wheels
    .gpu-wheels/comm-0.2.3-py3-none-any.whl
    ...
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys


def distribution_name(wheel_file: str) -> str:
    """'python_dateutil-4.0.0-py3-none-any.whl' -> 'python-dateutil' (PEP 503 normalized)."""
    return re.sub(r"[-_.]+", "-", os.path.basename(wheel_file).split("-")[0]).lower()


def installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def main(folder: str) -> int:
    wheels = sorted(f for f in os.listdir(folder) if f.endswith(".whl"))
    names = [distribution_name(w) for w in wheels]
    twice = {n for n in names if names.count(n) > 1}
    if twice:
        print(f"{folder} holds more than one version of {', '.join(sorted(twice))}: keep one", file=sys.stderr)
        return 2
    for wheel, name in zip(wheels, names, strict=True):
        if not installed(name):
            print(os.path.join(folder, wheel))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
