"""A rank's output cannot pass for nblaunch's own channel, and any line length keeps the output budget
(issue 28). Real kernels and real ranks: what a rank prints that looks like nblaunch's ordering mark reaches
the cell as text at once (before, it froze the rank's output until the run ended, and 5,000 digits raised
in the kernel's loop); rich output still lands in order; 300 KB lines come in messages of at most 64 KiB
and within the 1 MiB burst + 256 KiB/s budget, every byte in the rank's log."""

from __future__ import annotations

import os
import time

import pytest
from kernel import Kernel

from kernelside.display.output import HELD_TAIL_BYTES, MAX_MESSAGE_BYTES, SHOW_BURST_BYTES, SHOW_RATE_BYTES

pytestmark = pytest.mark.kernel  # starts kernels


FORGED = ["\x1b]nblaunch;1\x07", "\x1b]nblaunch;" + "9" * 5000 + "\x07", "\x1b]nblaunch;" + "f" * 32 + ";2\x07"]


@pytest.fixture
def kernel(tmp_path):
    k = Kernel(cwd=str(tmp_path), env={"TMPDIR": str(tmp_path)})
    k.run("%load_ext kernelside").ok()
    yield k
    k.shutdown()


def test_mark_like_text_a_rank_prints_reaches_the_cell_as_text_at_once_and_rich_output_stays_in_order(kernel, tmp_path):
    # each forged sequence, then 'tick i'; the rank waits until 'tick i' has reached the notebook
    code = (
        "%%distributed -n 2\nimport os, time, sys\nfrom IPython.display import display, HTML\nif rank == 0:\n"
        f"    for i, forged in enumerate({FORGED!r}):\n"
        "        print(forged + f'tick {i}', flush=True)\n"
        "        deadline = time.monotonic() + 60\n"
        f"        while not os.path.exists({str(tmp_path)!r} + f'/seen{{i}}') and time.monotonic() < deadline:\n"
        "            time.sleep(0.01)\n"
        f"        print('seen' if os.path.exists({str(tmp_path)!r} + f'/seen{{i}}') else 'held back', i, flush=True)\n"
        "    display(HTML('<b>rich</b>'))\n    print('after', flush=True)\n"
    )

    def on_output(kind, content):
        for i in range(len(FORGED)):
            if kind == "stream" and f"tick {i}" in content.get("text", ""):
                (tmp_path / f"seen{i}").touch()  # 'tick i' reached the notebook while the rank ran

    cell = kernel.run(code, timeout=300, on_output=on_output).ok()
    for i, forged in enumerate(FORGED):
        assert f"{forged}tick {i}\nseen {i}\n" in cell.stdout, cell.stdout[-300:]
    joined = [
        "rich" if k == "display_data" else c["text"]
        for k, c in cell.outputs
        if (k == "stream" and c["text"].strip()) or (k == "display_data" and "<b>rich" in str(c["data"]))
    ]
    assert joined.index("rich") > next(i for i, o in enumerate(joined) if f"seen {len(FORGED) - 1}" in o)
    assert "after" in "".join(joined[joined.index("rich") + 1 :])


def test_300_kb_lines_come_in_messages_of_at_most_64_kib_within_the_budget_every_byte_in_the_log(kernel, tmp_path):
    code = (
        "%%distributed -n 2\nimport sys\nif rank == 0:\n"
        "    for i in range(20):\n        sys.stdout.write(str(i % 10) * 300_000 + '\\n'); sys.stdout.flush()\n"
        "print('done', rank)"
    )
    t0 = time.monotonic()
    cell = kernel.run(code, timeout=300).ok()
    took = time.monotonic() - t0
    streams = [c["text"] for k, c in cell.messages if k == "stream"]
    assert max(len(t.encode()) for t in streams) <= MAX_MESSAGE_BYTES
    shown = sum(len(t) for t in streams)
    # the burst, what the rate allows for the cell's time, the held-back note(s) and the tail at the end
    assert shown <= SHOW_BURST_BYTES + SHOW_RATE_BYTES * took + HELD_TAIL_BYTES + 4096, (shown, took)
    assert "not shown here" in cell.stdout and "done 0" in cell.stdout
    base = tmp_path / f"nblaunch-{os.getuid()}"
    (log,) = [p for p in base.glob("run-*/rank0.log")]
    assert log.stat().st_size == 20 * 300_001 + len("done 0\n")
