"""What a live cell pays to learn that the notebook values it uses did not change (issue 22): the
name cache's fingerprint (``live.names``: identity and an in-place digest for a numpy array, the value
for numbers and strings) against what it did before, a digest of each value's pickle, side by side
on the same values, interleaved, medians of 7 rounds.

    python -m bench.live_name_cache            # a 64 MiB array, a 1 MiB array, a float, a short string
    python -m bench.live_name_cache --quick    # 8 MiB

Prints one line per value: microseconds per unchanged cell for each, and the ratio.
"""

from __future__ import annotations

import hashlib
import statistics
import sys
import timeit

import numpy as np

from kernelside.live import names


def _pickle_digest(value) -> bytes:
    """The alternative: pickle the value (as it would be sent), then digest the pickle."""
    return hashlib.blake2b(names.dumps(value), digest_size=16).digest()


def main() -> None:
    big = 8 if "--quick" in sys.argv else 64
    values = {
        f"ndarray {big} MiB": np.random.default_rng(0).random(big * 2**20 // 8),
        "ndarray 1 MiB": np.random.default_rng(1).random(2**20 // 8),
        "float": 0.1,
        "str (20 chars)": "runs/2026-12-01/exp3",
    }
    print("value | cache fingerprint (us) | digest of the pickle (us) | ratio")
    for label, value in values.items():
        sender = names.NameSender()
        ns = {"v": value}
        sender.sent(sender.collect({"v"}, ns))
        number = 3 if value is values[f"ndarray {big} MiB"] else 200
        ours, theirs = [], []
        for _ in range(7):
            ours.append(timeit.timeit(lambda: sender.collect({"v"}, ns), number=number) / number)  # noqa: B023
            theirs.append(timeit.timeit(lambda: _pickle_digest(value), number=number) / number)  # noqa: B023
        a, b = statistics.median(ours) * 1e6, statistics.median(theirs) * 1e6
        print(f"{label} | {a:.1f} | {b:.1f} | {a / b:.2f}x")


if __name__ == "__main__":
    main()
