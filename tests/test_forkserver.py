"""start_method='forkserver' in a real kernel: ranks forked from a template interpreter that holds torch.

Every launch guarantee holds on this path (output, C-level output, widgets, errors, interrupt, Stop,
timeout, the Runs view's pids, nothing left behind), the kernel's state at the time of the launch
reaches the ranks, a template that died is replaced, and the template dies with its kernel. CUDA
cannot be initialized on this machine, so ``auto`` is driven to the forkserver the way the CUDA
driver is detected on a GPU machine: a ``libcuda.so.1`` (a tiny stand-in whose ``cuDeviceGetCount``
answers as an initialized driver does) mapped in the kernel.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
from harness import send_stop
from kernel import Kernel

SETUP = """
import os, sys, time, json, signal
from kernelside import notebook_launcher, last_report, progress
from kernelside.engines import forkserver
def facts():
    import torch.distributed as dist
    return {"rank": dist.get_rank(), "pid": os.getpid(), "ppid": os.getppid()}
"""


def _pids_gone(pids, timeout=5.0) -> list[int]:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture(scope="module")
def kernel(kernel_with):
    return kernel_with(SETUP)


FD_KINDS = (
    "from collections import Counter\n"
    "def _kind(fd):\n"
    "    try:\n"
    "        return os.readlink(f'/proc/self/fd/{fd}').split(':')[0]\n"
    "    except OSError:\n"
    "        return 'gone'\n"
    "print(json.dumps(Counter(k for k in map(_kind, os.listdir('/proc/self/fd')) if k in ('pipe', 'socket', "
    "'anon_inode'))))"
)


def _fd_kinds(k) -> dict:
    """How many pipes, sockets and pidfds/memfds (anon_inode) the kernel holds."""
    return json.loads(k.run(FD_KINDS).ok().stdout)


def _template_pid(k) -> int:
    return int(k.run("print(forkserver.running_template().pid)").ok().stdout)


def test_a_forkserver_cell_shows_rank0_output_and_c_output_and_records_the_real_rank_pids(kernel):
    cell = kernel.run(
        "%%distributed -n 2 --start-method forkserver\n"
        "import ctypes, torch, torch.distributed as dist\n"
        "print('python line from rank', rank, flush=True)\n"
        "libc = ctypes.CDLL(None); libc.printf(b'C line from rank %d\\n', rank); libc.fflush(None)\n"
        "t = torch.ones(1); dist.all_reduce(t)\n"
        "t.item()",
        timeout=180,
    ).ok()
    assert "python line from rank 0\n" in cell.stdout and "C line from rank 0\n" in cell.stdout
    assert "from rank 1" not in cell.stdout and cell.result["text/plain"] == "2.0"
    shown = kernel.run(
        "got = notebook_launcher(facts, num_processes=2, start_method='forkserver', return_all=True)\n"
        "print(json.dumps({'method': last_report().start_method, 'recorded': [r.pid for r in last_report().ranks],"
        " 'got': got, 'template': forkserver.running_template().pid, 'kernel': os.getpid(),"
        " 'log_dir': last_report().log_dir}))"
    ).ok()
    facts = json.loads(shown.stdout)
    assert facts["method"] == "forkserver"
    assert [g["pid"] for g in facts["got"]] == facts["recorded"]  # the Runs view's pids are the ranks' own
    assert {g["ppid"] for g in facts["got"]} == {facts["template"]} != {facts["kernel"]}  # the template's children
    state = json.loads(open(os.path.join(facts["log_dir"], "state.json")).read())
    assert [r["pid"] for r in state["ranks"]] == facts["recorded"] and state["start_method"] == "forkserver"


def test_the_kernels_cwd_sys_path_and_environment_at_launch_time_reach_the_ranks(kernel, tmp_path):
    kernel.run("notebook_launcher(facts, num_processes=1, start_method='forkserver')", timeout=180).ok()
    before = _template_pid(kernel)  # the template is up: what follows happens after it started
    (tmp_path / "added_late.py").write_text("VALUE = 41\n")
    cell = kernel.run(
        f"os.chdir({str(tmp_path)!r})\n"
        f"sys.path.append({str(tmp_path)!r})\n"
        "os.environ['NBLAUNCH_TEST_LATE'] = 'set after the template started'\n"
        "def late():\n"
        "    import added_late\n"
        "    return os.getcwd(), os.environ.get('NBLAUNCH_TEST_LATE'), added_late.VALUE + 1\n"
        "print(json.dumps(notebook_launcher(late, num_processes=2, start_method='forkserver')))\n"
        "os.chdir(os.path.expanduser('~'))",
        timeout=120,
    ).ok()
    assert json.loads(cell.stdout) == [str(tmp_path), "set after the template started", 42]
    assert _template_pid(kernel) == before


def test_a_rank_error_names_the_root_cause_and_a_timeout_ends_the_run(kernel):
    cell = kernel.run(
        "%%distributed -n 2 --start-method forkserver\n"
        "import torch.distributed as dist\n"
        "if rank == 1:\n"
        "    raise ValueError('bad batch 7')\n"
        "dist.barrier()",
        timeout=120,
    )
    assert cell.error is not None and cell.error["ename"] == "WorkerError"
    text = "\n".join(cell.error["traceback"])
    assert "rank 1 failed: ValueError: bad batch 7" in text and "line 4" in text
    start = time.monotonic()
    cell = kernel.run(
        "def forever():\n    time.sleep(600)\n"
        "notebook_launcher(forever, num_processes=2, start_method='forkserver', timeout=3)",
        timeout=120,
    )
    assert cell.error is not None and cell.error["ename"] == "LaunchTimeoutError"
    assert time.monotonic() - start < 30
    pids = kernel.run("print(*[r.pid for r in last_report().ranks])").ok().stdout.split()
    assert _pids_gone(map(int, pids)) == []


def test_interrupt_stops_forkserver_ranks_within_5s(kernel, tmp_path):
    kernel.run(
        "def park():\n"
        "    import torch.distributed as dist\n"
        f"    open(os.path.join({str(tmp_path)!r}, f'pid{{dist.get_rank()}}'), 'w').write(str(os.getpid()))\n"
        "    print('running', flush=True)\n"
        "    while True:\n"
        "        time.sleep(0.05)"
    ).ok()
    sent = {}

    def on_output(kind, content):
        if "running" in content.get("text", "") and not sent:
            sent["t"] = time.monotonic()
            kernel.interrupt()

    cell = kernel.run(
        "notebook_launcher(park, num_processes=2, start_method='forkserver')", timeout=120, on_output=on_output
    )
    assert cell.error is not None and cell.error["ename"] == "KeyboardInterrupt"
    assert time.monotonic() - sent["t"] < 5
    assert _pids_gone(int((tmp_path / f"pid{r}").read_text()) for r in range(2)) == []
    assert kernel.run("print(last_report().outcome)").ok().stdout == "interrupted\n"


def test_stop_from_the_runs_view_ends_a_forkserver_run(kernel, tmp_path):
    logs = tmp_path / "logs"
    cfg = tmp_path / "nblaunch.yaml"
    cfg.write_text(f"log_dir: {logs}\n")
    stopped = {}

    def stop_when_running():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not stopped:
            for d in logs.glob("run-*") if logs.exists() else ():
                try:
                    state = json.loads((d / "state.json").read_text())
                except (OSError, ValueError):
                    continue
                if state["state"] == "running":
                    stopped["reply"] = send_stop(d)
                    stopped["pids"] = [r["pid"] for r in state["ranks"]]
                    return
            time.sleep(0.02)

    t = threading.Thread(target=stop_when_running, daemon=True)
    t.start()
    cell = kernel.run(
        "def until_stopped():\n    time.sleep(600)\n"
        f"notebook_launcher(until_stopped, num_processes=2, start_method='forkserver', config={str(cfg)!r})",
        timeout=120,
    )
    t.join(10)
    assert stopped["reply"]["ok"] is True
    assert cell.error is not None and cell.error["ename"] == "LaunchStoppedError"
    assert _pids_gone(stopped["pids"]) == []


def test_progress_draws_a_widget_bar_from_forkserver_ranks(kernel):
    cell = kernel.run(
        "%%distributed -n 2 --start-method forkserver\nfor i in progress(range(5)):\n    time.sleep(0.01)",
        timeout=120,
    ).ok()
    opened = [c["data"]["state"] for k, c in cell.messages if k == "comm_open"]
    assert any(s.get("_model_name") == "FloatProgressModel" for s in opened)


def test_a_killed_template_is_replaced_at_the_next_launch_said_once_and_no_fd_is_left(kernel):
    kernel.run("notebook_launcher(facts, num_processes=1, start_method='forkserver')", timeout=180).ok()
    fds_before = _fd_kinds(kernel)
    old = _template_pid(kernel)
    os.kill(old, signal.SIGKILL)
    assert _pids_gone([old]) == []
    first = kernel.run(
        "print(notebook_launcher(facts, num_processes=2, start_method='forkserver')['ppid'])", timeout=180
    ).ok()
    new = _template_pid(kernel)
    assert new != old and first.stdout.count("is gone") == 1 and f"template (pid {old}) is gone" in first.stdout
    assert first.stdout.strip().splitlines()[-1] == str(new)
    again = kernel.run("print(notebook_launcher(facts, num_processes=2, start_method='forkserver')['ppid'])").ok()
    assert again.stdout == f"{new}\n"  # said once: the next launch is quiet
    after = _fd_kinds(kernel)
    assert all(after.get(kind, 0) <= n for kind, n in fds_before.items()) and set(after) <= set(fds_before), (
        fds_before,
        after,
    )


def test_a_live_session_runs_on_forkserver_ranks(kernel):
    kernel.run("%distributed_start -n 2 --start-method forkserver", timeout=180).ok()
    try:
        kernel.run("%%distributed\nx = rank + 1").ok()
        cell = kernel.run(
            "%%distributed\nimport torch, torch.distributed as dist\nt = torch.tensor([float(x)])\n"
            "dist.all_reduce(t)\n(t.item(), os.getppid())"
        ).ok()
        value, ppid = eval(cell.result["text/plain"])
        assert value == 3.0 and ppid == _template_pid(kernel)
    finally:
        kernel.run("%distributed_stop").ok()


FAKE_DRIVER = r"""
/* answers as an initialized CUDA driver does: nblaunch's cuda_guard asks exactly this */
int cuDeviceGetCount(int *count) { *count = 1; return 0; }
"""


def test_auto_picks_the_forkserver_when_the_cuda_driver_is_initialized_in_the_kernel(tmp_path, new_kernel):
    src = tmp_path / "fake_cuda.c"
    src.write_text(FAKE_DRIVER)
    lib = tmp_path / "libcuda.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    k = new_kernel(load_ext=False)
    k.run(f"%load_ext kernelside\n{SETUP}\nimport ctypes\n_driver = ctypes.CDLL({str(lib)!r})").ok()
    cell = k.run(
        "%%distributed -n 2\nmaps = open('/proc/self/maps').read()\n(os.getppid(), 'libcuda' in maps)",
        timeout=180,
    ).ok()
    assert "nblaunch: using the forkserver, not fork, because CUDA was initialized in this kernel" in cell.stdout
    assert "by a library below torch" in cell.stdout
    ppid, driver_in_rank = eval(cell.result["text/plain"])
    assert ppid == _template_pid(k) and driver_in_rank is False  # nothing of the kernel reached the rank
    assert k.run("print(last_report().start_method)").ok().stdout == "forkserver\n"


WRAPPER = """#!/bin/sh
# the interpreter, except for the forkserver template, which "cannot start" here
case "$*" in *nblaunch-forkserver*) echo "no template here" >&2; exit 3;; esac
exec {python} "$@"
"""


def test_a_template_that_cannot_start_means_spawn_said_once(tmp_path, new_kernel):
    wrapper = tmp_path / "python"
    wrapper.write_text(WRAPPER.format(python=sys.executable))
    wrapper.chmod(0o755)
    k = new_kernel(load_ext=False)
    k.run(f"%load_ext kernelside\n{SETUP}\nsys.executable = {str(wrapper)!r}").ok()
    first = k.run(
        "print(notebook_launcher(facts, num_processes=2, start_method='forkserver')['rank'], "
        "last_report().start_method)",
        timeout=180,
    ).ok()
    assert "the forkserver template could not start (it exited (exit code 3) before it was ready)" in first.stdout
    assert first.stdout.strip().splitlines()[-1] == "0 spawn"
    again = k.run(
        "print(notebook_launcher(facts, num_processes=2, start_method='forkserver')['rank'])", timeout=180
    ).ok()
    assert again.stdout == "0\n"


@pytest.mark.kernel  # it ends the kernel itself
@pytest.mark.parametrize("how", ["sigkill", "shutdown"])
def test_the_template_and_its_ranks_end_with_the_kernel(tmp_path, how):
    k = Kernel()
    try:
        k.run(
            "%load_ext kernelside\n" + SETUP + "def park():\n"
            "    import torch.distributed as dist\n"
            f"    open(os.path.join({str(tmp_path)!r}, f'pid{{dist.get_rank()}}'), 'w').write(str(os.getpid()))\n"
            "    dist.barrier()\n"
            "    print('parked', flush=True)\n"
            "    time.sleep(600)"
        ).ok()
        k.kc.execute("notebook_launcher(park, num_processes=2, start_method='forkserver')")
        while "parked" not in k.kc.get_iopub_msg(timeout=180)["content"].get("text", ""):
            pass
        ranks = [int((tmp_path / f"pid{r}").read_text()) for r in range(2)]
        template = [c.pid for c in psutil.Process(k.pid).children() if "nblaunch-forkserver" in c.cmdline()]
        assert len(template) == 1 and all(psutil.Process(r).ppid() == template[0] for r in ranks)
        if how == "sigkill":
            os.kill(k.pid, signal.SIGKILL)
        else:
            k.km.shutdown_kernel(now=False)
        assert _pids_gone(ranks + template) == [], "the template or its ranks outlived the kernel"
    finally:
        if how == "sigkill" or k.km.is_alive():
            k.shutdown()
        else:
            k.kc.stop_channels()
