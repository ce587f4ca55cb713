"""What every benchmark script shares: ports, the torchrun command, process bookkeeping, result files.

The bench process makes itself a child subreaper (``adopt_orphans()``), so a worker whose launcher
died is re-parented to it instead of to init: ``descendants()`` then finds every process a benchmark
started, and ``stop_tree()`` ends them by pid. Nothing is ever killed by name.

Example::

    >>> adopt_orphans()
    >>> ...                                   # launches
    >>> assert not descendants(), "a launch left processes behind"
    >>> write_result("steady", quick=False, text=table)
"""

from __future__ import annotations

import ctypes
import datetime
import json
import os
import platform
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
PR_SET_CHILD_SUBREAPER = 36


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def torchrun_cmd(n: int, script: str, *args: str) -> list[str]:
    """torchrun on one machine, rendezvous on 127.0.0.1 and a free port."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={n}",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        script,
        *args,
    ]


def mark_ready(outdir: str, rank: int) -> None:
    """A rank writes the wall time at which it runs user code (start-up ends here)."""
    with open(os.path.join(outdir, f"ready{rank}"), "w") as fh:
        fh.write(repr(time.time()))


def ready_times(outdir: str, n: int) -> list[float]:
    out = []
    for rank in range(n):
        with open(os.path.join(outdir, f"ready{rank}")) as fh:
            out.append(float(fh.read()))
    return out


def bootstrap_median_interval(xs: list[float], reps: int = 4000, level: float = 0.90) -> tuple[float, float]:
    """``level`` bootstrap interval of the median of ``xs`` (e.g. paired ratios), resampling with replacement."""
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(reps))
    tail = (1 - level) / 2
    return meds[int(tail * reps)], meds[int((1 - tail) * reps) - 1]


def median(xs) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


# -- processes ------------------------------------------------------------------------------------


def adopt_orphans() -> None:
    """Become the reaper of our orphaned descendants, so none can escape ``descendants()``."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _parents() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, state) for every process we can see."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2 :].split()
        out[int(name)] = (int(rest[1]), rest[0])
    return out


def descendants(root: int | None = None, *, include_zombies: bool = False) -> list[int]:
    """Every live process below ``root`` (this process by default)."""
    root = os.getpid() if root is None else root
    table = _parents()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if include_zombies or table[pid][1] != "Z":
            found.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(found)


def reap_orphans() -> None:
    """Collect exit statuses of adopted orphans (only zombies: never a child someone still waits for)."""
    table = _parents()
    for pid, (ppid, state) in table.items():
        if ppid == os.getpid() and state == "Z":
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def stop_tree(root: int | None = None, *, spare: tuple[int, ...] = ()) -> list[int]:
    """SIGKILL every live descendant of ``root`` (and ``root`` itself unless it is us), by pid; reap. Returns them."""
    me = os.getpid()
    victims = descendants(root) + ([root] if root not in (None, me) else [])
    victims = [p for p in victims if p not in spare]
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(p in descendants() for p in victims):
        time.sleep(0.01)
    reap_orphans()
    return victims


def run_capped(cmd: list[str], timeout: float, **kwargs) -> tuple[subprocess.CompletedProcess | None, list[int]]:
    """Run ``cmd``; past ``timeout`` stop it and everything it started. (result or None, pids stopped)."""
    p = subprocess.Popen(cmd, **kwargs)
    try:
        out, err = p.communicate(timeout=timeout)
        return subprocess.CompletedProcess(cmd, p.returncode, out, err), []
    except subprocess.TimeoutExpired:
        stopped = stop_tree(p.pid)
        p.communicate()
        return None, stopped


# -- other load on the machine --------------------------------------------------------------------


def _busy_seconds() -> float:
    """CPU seconds all processes have used since boot (steal included: the hypervisor's load is load too)."""
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = f[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    """CPU seconds of this process and every descendant it has reaped (workers of finished launches)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class ForeignLoad:
    """How many cores other people's processes used while a block ran (our process tree excluded).

    Children still running at the end are not counted as ours, so use it around whole launches.

        >>> with ForeignLoad() as load:
        ...     launch()
        >>> load.cores
    """

    def __enter__(self):
        self.t0, self.busy0, self.own0 = time.monotonic(), _busy_seconds(), _own_seconds()
        return self

    def __exit__(self, *exc):
        self.seconds = wall = time.monotonic() - self.t0
        foreign = (_busy_seconds() - self.busy0) - (_own_seconds() - self.own0)
        self.cores = max(0.0, foreign) / wall if wall > 0 else 0.0
        return False


class BusyProcesses:
    """``n`` processes that each keep a core busy (a Python loop), started by this process and stopped by pid:
    the "two busy processes beside it" a benchmark or the suite must hold under.

        >>> with BusyProcesses(2):
        ...     launch()
    """

    SPIN = "import os, signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass\n"

    def __init__(self, n: int):
        self.n, self.procs = n, []

    def __enter__(self):
        self.procs = [
            subprocess.Popen([sys.executable, "-c", self.SPIN], start_new_session=True) for _ in range(self.n)
        ]
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.wait()
        self.procs = []
        return False


def wait_until_quiet(threshold: float = 0.25, max_wait: float = 60.0, sample: float = 1.0) -> float:
    """Wait (up to ``max_wait`` s) for a ``sample``-second window in which others use under ``threshold`` cores.

    Returns the foreign load of the last window.
    """
    deadline = time.monotonic() + max_wait
    while True:
        with ForeignLoad() as load:
            time.sleep(sample)
        if load.cores < threshold or time.monotonic() >= deadline:
            return load.cores


# -- a real Jupyter kernel -------------------------------------------------------------------------


def start_kernel(**kwargs):
    """A real ipykernel (tests/kernel.py's ``Kernel``, ``kwargs`` passed on), as a notebook would run the code."""
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from kernel import Kernel

    return Kernel(**kwargs)


def run_cell(k, code: str, timeout: float) -> list[tuple[str, dict]]:
    """Execute ``code`` in kernel ``k``; every iopub message of the cell as (type, content), in order.

    Raises RuntimeError with the traceback if the cell failed.
    """
    cell = k.run(code, timeout=timeout)
    if cell.error is not None:
        raise RuntimeError("cell failed:\n" + "\n".join(cell.error["traceback"]))
    return cell.messages


def cell_stdout(msgs: list[tuple[str, dict]]) -> str:
    return "".join(c["text"] for kind, c in msgs if kind == "stream" and c["name"] == "stdout")


# -- memory ---------------------------------------------------------------------------------------


def pss_bytes(pid: int) -> int:
    """Proportional set size of ``pid`` (shared pages split between their users)."""
    with open(f"/proc/{pid}/smaps_rollup") as fh:
        for line in fh:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no Pss line for pid {pid}")


def mem_available() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


# -- results --------------------------------------------------------------------------------------


def machine(accel: str = "CPU/gloo") -> str:
    load = os.getloadavg()[0]
    return (
        f"{platform.machine()} with {os.cpu_count()} cores, {mem_available() / 2**30:.0f} GiB available, "
        f"load average {load:.1f} when written, {accel}"
    )


def gpus_described() -> str:
    """'1x NVIDIA H200 (143771 MiB, driver 580.159.03)' from nvidia-smi, which leaves CUDA alone here."""
    try:
        run = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "no nvidia-smi"
    rows = [[f.strip() for f in line.split(",")] for line in run.stdout.splitlines() if line.strip()]
    if not rows:
        return "no GPU"
    name, mib, driver = rows[0][:3]
    return f"{len(rows)}x {name} ({mib} MiB, driver {driver})"


def version() -> str:
    """The commit of the code measured, and whether kernelside/ had local changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "kernelside"], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return "nblaunch (commit unknown)"
    return f"nblaunch at {head.stdout.strip()}{' with local changes to kernelside/' if dirty.stdout.strip() else ''}"


def heading(what: str, name: str, quick: bool, how: str, accel: str = "CPU/gloo", flags: str = "") -> str:
    """First line of a result file: what, when, where, which code, how many runs, the exact command."""
    cmd = f"python -m bench.{name}{' --quick' if quick else ''}{flags}"
    return f"{what}, {datetime.date.today()}, {machine(accel)}, {version()}, {how} (`{cmd}`)."


def write_result(name: str, quick: bool, text: str) -> str:
    """Write bench/results/NAME.md (NAME-quick.md for --quick), print it, return the path."""
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{name}-quick.md" if quick else f"{name}.md")
    with open(path, "w") as fh:
        fh.write(text)
    print(text)
    print(f"written to {path}", file=sys.stderr)
    return path


def note(msg: str) -> None:
    """Progress of the benchmark itself, on stderr (the table goes to stdout)."""
    print(msg, file=sys.stderr, flush=True)


class JupyterServer:
    """A real ``jupyter server`` on 127.0.0.1 in a fresh root, with or without nblaunch's extension, its code
    taken from ``source`` (a checkout; default: this one). ``started`` is when ``Popen`` was called; ``stop()``
    (or leaving the ``with``) ends it by its pid, then its session.

    Example::

        >>> with JupyterServer() as server:
        ...     server.wait_ready("/nblaunch/runs")
        ...     runs = server.get("/nblaunch/runs")
    """

    def __init__(self, *, with_extension: bool = True, source: str | None = None):
        root = tempfile.mkdtemp(prefix="nblaunch-bench-server-")
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ)
        if source is not None:
            env["PYTHONPATH"] = source + os.pathsep + env.get("PYTHONPATH", "")
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
             "--port-retries=0", f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}",
             f"--ServerApp.jpserver_extensions={{'jupyter_ext': {with_extension}}}", "--allow-root"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env, cwd=root,
        )  # fmt: skip

    def get(self, path: str, timeout: float = 60):
        """The JSON answer to ``GET path`` (``/api/status``, ``/nblaunch/runs``…)."""
        request = urllib.request.Request(self.base + path, headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def wait_ready(self, path: str = "/api/status", timeout: float = 120, every: float = 0.02) -> float:
        """Seconds from ``Popen`` until ``path`` answers; SystemExit if the server ends or ``timeout`` passes."""
        while True:
            try:
                self.get(path, timeout=5)
                return time.monotonic() - self.started
            except OSError:
                if time.monotonic() - self.started > timeout or self.process.poll() is not None:
                    raise SystemExit(f"jupyter server did not answer {path}") from None
                time.sleep(every)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)  # the session this script started, by its id
            self.process.wait(10)

    def __enter__(self) -> JupyterServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
