"""The live-rank scenarios of bench/live.py for each tool that keeps ranks alive across cells, through a real kernel.

Tools: nblaunch's live ranks (``%distributed_start -n 2``), jupyter-distributed 0.1.1 (its proxy kernel, started
the way its server extension starts it: ``python -m jupyter_distributed.kernel -f {connection_file}`` with
``JUPYTER_DISTRIBUTED_WORLD_SIZE=2`` / ``JUPYTER_DISTRIBUTED_BASE_KERNEL=python3`` and message-mode interrupts) and
ipyparallel 9.2 (``ipp.Cluster(n=2)``, controller on 127.0.0.1, ``%%px`` cells). Neither sets a process group up:
the setup cell does (gloo, 127.0.0.1, ``GLOO_SOCKET_IFNAME=lo``). Per tool, in a fresh kernel:

1. round trip of ``x = 1``: median of ``n`` cells after 3 warm-up cells;
2. interrupt: a cell sleeping 60 s on every rank, interrupted 1.5 s after it was sent (no tool streams
   ``%%px`` output, so there is no event to wait on); how long the cell takes to return, what it shows, and
   which ranks answer the next cell;
3. a rank raises while its peer waits in ``barrier()``: whether the cell returns within 30 s and what it
   shows; if not, an interrupt and 10 s more; then which ranks answer the next cell (30 s at most).

Then the tool's own teardown (when its kernel still answers) and a shutdown of the kernel as Jupyter's server does
it (a shutdown request, a kill after 5 s); whatever is still alive then is counted and stopped by pid (the bench is
a child subreaper, see bench/harness.py).

Example::

    >>> rows = [scenarios(tool, n=50) for tool in TOOLS]          # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import os
import re
import statistics
import sys
import tempfile
import time

import psutil

from bench.harness import descendants, note, start_kernel, stop_tree

BOUND_S = 30
AFTER_INTERRUPT_S = 10
# a FileStore rendezvous: torch's TCPStore server would listen on every interface whatever MASTER_ADDR says
INIT_PG = (
    "import os, torch.distributed as dist\n"
    "os.environ['GLOO_SOCKET_IFNAME'] = 'lo'\n"
    "dist.init_process_group('gloo', init_method='file://{store}', rank=rank, world_size=2)\n"
    "dist.barrier()"
)


@dataclasses.dataclass
class Tool:
    name: str
    kernel: dict  # arguments for tests/kernel.py's Kernel
    setup: list[str]  # kernel cells run once, in order ({store}: a fresh file for the process group's rendezvous)
    prefix: str  # what a cell on every rank starts with
    teardown: str  # the tool's own way to stop its ranks, run before the kernel shuts down
    probe: str = ""  # prefix of the cell that asks every rank to answer (default: ``prefix``)


TOOLS = [
    Tool(
        "nblaunch live ranks",
        {},
        ["%load_ext kernelside\n%distributed_start -n 2"],
        "%%distributed\n",
        "%distributed_stop",
        "%%distributed --output all\n",  # rank 0's output is the cell's by default
    ),
    Tool(
        "jupyter-distributed 0.1.1",
        {
            "argv": [sys.executable, "-m", "jupyter_distributed.kernel", "-f", "{connection_file}"],
            "interrupt_mode": "message",
            "env": {"JUPYTER_DISTRIBUTED_WORLD_SIZE": "2", "JUPYTER_DISTRIBUTED_BASE_KERNEL": "python3"},
        },
        ["import os\nrank = int(os.environ['RANK'])", INIT_PG],
        "",
        "",  # shutting the proxy kernel down shuts its rank kernels down
    ),
    Tool(
        "ipyparallel 9.2",
        {},
        [
            "import ipyparallel as ipp\n"
            "cluster = ipp.Cluster(n=2, controller_ip='127.0.0.1', controller_location='127.0.0.1', log_level=40)\n"
            "rc = cluster.start_and_connect_sync()\nrc.wait_for_engines(2, timeout=120)\n"
            "view = rc[:]\nview.block = True  # %%px waits for the engines, as a cell would\nview.activate()\n"
            "for i in range(2):\n    rc[i]['rank'] = i",
            "%%px\n" + INIT_PG,
        ],
        "%%px\n",
        "cluster.stop_cluster_sync()",
    ),
]


def _text(cell) -> str:
    """Everything the cell showed, as plain text (streams, results, displays, the error)."""
    parts = []
    for kind, c in cell.outputs:
        if kind == "stream":
            parts.append(c["text"])
        elif kind in ("execute_result", "display_data", "update_display_data"):
            plain = c.get("data", {}).get("text/plain", "")
            if not plain.startswith("VBox("):  # a widget's repr (nblaunch's status line): no text a reader sees
                parts.append(plain)
        elif kind == "error":
            parts.append(f"{c['ename']}: {c['evalue']}")
    if cell.reply.get("status") == "error" and not any(k == "error" for k, _ in cell.outputs):
        parts.append(f"(reply) {cell.reply.get('ename')}: {cell.reply.get('evalue')}")
    return re.sub(r"\x1b\[[0-9;]*m", "", "".join(parts))


def _shown(cell) -> str:
    """What a reader sees first: the error's name and the lines that name ranks or errors, shortened."""
    text = _text(cell)
    keep = [
        ln.strip()
        for ln in text.splitlines()
        if re.search(r"rank|error|interrupt|restart|engine", ln, re.I) and not ln.startswith("logs of every rank")
    ]
    summary = " / ".join(dict.fromkeys(keep))[:300] or text.strip()[:300] or "no output"
    return summary.replace("|", "\\|")


def _bounded(k, code: str, bound: float):
    """(cell, seconds, finished) for ``code``, giving up after ``bound`` s (the cell may still be running)."""
    t0 = time.monotonic()
    try:
        cell = k.run(code, timeout=bound)
        return cell, time.monotonic() - t0, True
    except TimeoutError as e:
        return e.cell, time.monotonic() - t0, False


def _then_interrupt(k, cell, bound: float):
    """Interrupt a cell that has not returned; (seconds to return after the interrupt or None, the cell)."""
    t0 = time.monotonic()
    k.interrupt()
    try:
        k.wait(cell, bound)
        return time.monotonic() - t0, cell
    except TimeoutError:
        return None, cell


def _answering(k, tool: Tool) -> str:
    """Which ranks answer a cell now (30 s at most)."""
    cell, _s, done = _bounded(k, (tool.probe or tool.prefix) + "print(f'alive-{rank}', flush=True)", BOUND_S)
    ranks = sorted(set(re.findall(r"alive-(\d)", _text(cell))))
    if not done:
        return f"no return within {BOUND_S} s" + (f" (ranks {','.join(ranks)} printed)" if ranks else "")
    return f"ranks {','.join(ranks)}" if ranks else "none (the cell returned: " + _shown(cell) + ")"


def _listening_off_loopback(root: int) -> list[str]:
    out = []
    for pid in [root, *descendants(root)]:
        try:
            for c in psutil.Process(pid).net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN and c.laddr.ip not in ("127.0.0.1", "::1"):
                    out.append(f"pid {pid} {c.laddr.ip}:{c.laddr.port}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def scenarios(tool: Tool, n: int) -> dict:
    """Run the three scenarios for ``tool`` in a fresh kernel; a row of figures and what the cells showed."""
    note(f"{tool.name}: start")
    row = {"tool": tool.name}
    k = start_kernel(**tool.kernel)
    usable = False  # the kernel can still run the tool's teardown cell
    try:
        for code in tool.setup:
            store = os.path.join(tempfile.mkdtemp(prefix="nblaunch-bench-store-"), "store")
            cell, _s, done = _bounded(k, code.replace("{store}", store), 120)
            if not done or cell.error is not None:
                row["error"] = f"setup cell did not work: {_shown(cell) if done else 'no return in 120 s'}"
                return row
        row["off_loopback"] = _listening_off_loopback(k.pid)
        for _ in range(3):
            k.run(tool.prefix + "x = 1", timeout=60).ok()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            k.run(tool.prefix + "x = 1", timeout=60).ok()
            times.append(time.perf_counter() - t0)
        row["round_trip_ms"] = statistics.median(times) * 1e3

        note(f"{tool.name}: interrupt")
        from kernel import Cell  # tests/kernel.py, on sys.path since start_kernel

        cell = Cell()
        cell.msg_id = k.kc.execute(tool.prefix + "import time\nprint('sleeping', flush=True)\ntime.sleep(60)")
        time.sleep(1.5)  # %%px shows nothing before the end: no output to wait on
        back, cell = _then_interrupt(k, cell, BOUND_S)
        usable = back is not None
        row["interrupt"] = (
            f"returned {back:.2f} s after ■: {_shown(cell)}" if back is not None else f"no return within {BOUND_S} s"
        )
        row["after_interrupt"] = _answering(k, tool) if back is not None else "(cell still running)"

        note(f"{tool.name}: raise while the peer waits in barrier()")
        code = tool.prefix + "import torch.distributed as dist\nif rank == 1:\n    raise ValueError('rank 1 broke')\n"
        cell, secs, done = _bounded(k, code + "dist.barrier()", BOUND_S)
        if done:
            row["barrier"] = f"returned in {secs:.2f} s: {_shown(cell)}"
        else:
            back, cell = _then_interrupt(k, cell, AFTER_INTERRUPT_S)
            row["barrier"] = f"no return within {BOUND_S} s; " + (
                f"after ■ returned in {back:.2f} s: {_shown(cell)}"
                if back is not None
                else f"still no return {AFTER_INTERRUPT_S} s after ■"
            )
            if back is None:
                row["after_barrier"] = "(cell still running)"
                return row
        row["after_barrier"] = _answering(k, tool)
        usable = not row["after_barrier"].startswith("no return")
        return row
    except Exception as e:  # a tool that breaks in an unexpected way: say how, go on with the next
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        return row
    finally:
        if usable and tool.teardown:
            _bounded(k, tool.teardown, BOUND_S)
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=False)  # as Jupyter's server does: a shutdown request, the kill after 5 s
        # whatever the kernel started and outlived it (the bench is their reaper now), by pid
        row["left_behind"] = len(stop_tree())


def table(rows: list[dict]) -> list[str]:
    """Markdown lines for the rows of ``scenarios``."""
    out = [
        "| tool | `x = 1` round trip (median) | ■ during `time.sleep(60)` | next cell answered by | "
        "rank 1 raises while rank 0 waits in `barrier()` | next cell answered by | left after shutdown | "
        "listening off 127.0.0.1 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r and "round_trip_ms" not in r:
            out.append(f"| {r['tool']} | could not run: {r['error']} | | | | | {r.get('left_behind', '')} | |")
            continue
        out.append(
            f"| {r['tool']} | {r['round_trip_ms']:.1f} ms | {r.get('interrupt', r.get('error', ''))} | "
            f"{r.get('after_interrupt', '')} | {r.get('barrier', r.get('error', ''))} | {r.get('after_barrier', '')} | "
            f"{r['left_behind']} processes | {', '.join(r.get('off_loopback', [])) or 'nothing'} |"
        )
    return out
