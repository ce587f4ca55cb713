"""A real IPython kernel for tests, driven through jupyter_client."""

from __future__ import annotations

import collections
import os
import queue
import subprocess
import sys
import time

import psutil
from jupyter_client.manager import KernelManager

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the running template's pid, read without importing anything the kernel has not imported itself
TEMPLATE_PID = (
    "(lambda m: m and m.running_template() and m.running_template().pid)"
    "(__import__('sys').modules.get('kernelside.engines.forkserver'))"
)


# set by tests/conftest.py while a test not marked ``kernel`` runs: its node id (then no kernel may start)
UNMARKED_TEST_ENV = "NBLAUNCH_TEST_NOT_MARKED_KERNEL"


def refuse_kernel_in_unmarked_test() -> None:
    """Raises while a test that is not marked ``kernel`` runs, in pytest's process or in one it started, so a kernel
    test never lands in ``make test-fast`` (``pytest -m "not kernel"``) unnoticed."""
    test = os.environ.get(UNMARKED_TEST_ENV)
    if test:
        raise RuntimeError(
            f"{test} starts a kernel but is not marked 'kernel', so `make test-fast` would run it: ask for the "
            "`kernel`, `kernel_with` or `new_kernel` fixture (tests/conftest.py), or mark it @pytest.mark.kernel"
        )


class Kernel:
    """One ipykernel started with this interpreter; ``run(code)`` returns what the cell showed."""

    def __init__(self, cwd: str | None = None, pythonpath: str = REPO, *, argv=None, interrupt_mode=None, env=None):
        """``argv`` / ``interrupt_mode`` / ``env``: another kernel command, as a kernel spec or server would set it
        (bench/live_others.py starts jupyter-distributed's proxy kernel this way)."""
        refuse_kernel_in_unmarked_test()
        self.km = KernelManager()
        self.km.kernel_spec_manager  # noqa: B018 - loads specs
        self.km.kernel_name = "python3"
        if argv is not None:
            self.km.kernel_spec.argv = list(argv)
        if interrupt_mode is not None:
            self.km.kernel_spec.interrupt_mode = interrupt_mode
        # the kernel imports kernelside from ``pythonpath`` (its working directory is on sys.path too);
        # a PYTHONPATH already set (the GPU kit's wheels, say) stays after it
        path = os.pathsep.join(p for p in (pythonpath, os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, **(env or {}), "PYTHONPATH": path}
        self.km.start_kernel(cwd=cwd or pythonpath, extra_arguments=[], env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        # IOPub messages read by someone else (tests/kernel_debugger.py's event reader) that a cell's wait still needs
        self.pending_iopub: collections.deque = collections.deque()
        self.on_stray = None  # sees IOPub messages of no cell being waited on (debug_event, say)

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def template_pid(self) -> int | None:
        """The pid of this kernel's forkserver template (kernelside/engines/forkserver.py), or None if none runs.

        On a machine with an NVIDIA GPU ``%load_ext kernelside`` starts the template at once
        (``prestart_if_useful``): it is a child of the kernel that no launch leaves behind. Asked as a user
        expression of a cell that stores no history, so the notebook's execution count does not move."""
        cell = Cell()
        cell.msg_id = self.kc.execute("", silent=False, store_history=False, user_expressions={"pid": TEMPLATE_PID})
        self.wait(cell, 30)
        answer = cell.reply["user_expressions"]["pid"]
        assert answer["status"] == "ok", answer
        return eval(answer["data"]["text/plain"])

    def children(self) -> list[psutil.Process]:
        """The kernel's descendants but its forkserver template (its own children count): what launches left."""
        template = self.template_pid()
        return [c for c in psutil.Process(self.pid).children(recursive=True) if c.pid != template]

    def process_counts(self) -> tuple:
        """What must stay flat across a live session's failures: the pids, fd counts and thread counts of the
        kernel's descendants (its ranks; not the forkserver template), and the kernel's own thread count."""
        procs = sorted(self.children(), key=lambda p: p.pid)
        own = psutil.Process(self.pid).num_threads()
        return [p.pid for p in procs], [p.num_fds() for p in procs], [p.num_threads() for p in procs], own

    def run(self, code: str, timeout: float = 120, *, on_output=None, on_input=None) -> Cell:
        """Execute ``code`` and wait for it; past ``timeout`` a TimeoutError whose ``cell`` has what it showed
        so far (``wait(cell)`` waits on). ``on_input(prompt, password) -> str`` answers its input requests,
        as a frontend does (the request then allows stdin, as JupyterLab's do); without it stdin is not
        allowed, as with nbclient."""
        cell = Cell()
        cell.msg_id = self.kc.execute(code, allow_stdin=on_input is not None)
        return self.wait(cell, timeout, on_output=on_output, on_input=on_input)

    def wait(self, cell: Cell, timeout: float = 120, *, on_output=None, on_input=None, on_message=None) -> Cell:
        """Wait for ``cell`` to end; ``on_message(kind, content)`` sees every IOPub message of it as it comes
        (``execute_input`` included: the moment the kernel starts the cell's code)."""
        msg_id = cell.msg_id
        deadline = time.monotonic() + timeout
        while True:
            if on_input is not None:
                self._answer_input(msg_id, cell, on_input)
            try:
                wait = 0.05 if on_input is not None else max(0.1, deadline - time.monotonic())
                msg = self.next_iopub(wait)
            except queue.Empty:
                if time.monotonic() < deadline and on_input is not None:
                    continue
                err = TimeoutError(f"cell did not finish in {timeout}s; outputs so far: {cell.outputs}")
                err.cell = cell
                raise err from None
            if msg["parent_header"].get("msg_id") != msg_id:
                if self.on_stray is not None:
                    self.on_stray(msg)
                continue
            kind, content = msg["msg_type"], msg["content"]
            if on_message is not None:
                on_message(kind, content)
            if kind == "status" and content["execution_state"] == "idle":
                break
            cell.messages.append((kind, content))
            if kind in ("stream", "execute_result", "display_data", "error", "update_display_data"):
                cell.outputs.append((kind, content))
                cell.output_dates.append(msg["header"]["date"])
                if on_output is not None:
                    on_output(kind, content)
        cell.reply = self.reply_to(msg_id)["content"]
        return cell

    def next_iopub(self, timeout: float) -> dict:
        """The next IOPub message: one put back by another reader first, else the socket's (queue.Empty)."""
        if self.pending_iopub:
            return self.pending_iopub.popleft()
        return self.kc.get_iopub_msg(timeout=timeout)

    def reply_to(self, msg_id: str, timeout: float = 30) -> dict:
        """The shell reply to ``msg_id``. Replies to other requests are skipped: jupyter_client's
        wait_for_ready() sends kernel_info requests until one is answered, and a slow start leaves
        the extra replies queued."""
        deadline = time.monotonic() + timeout
        while True:
            msg = self.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg

    def _answer_input(self, msg_id: str, cell: Cell, on_input) -> None:
        try:
            msg = self.kc.get_stdin_msg(timeout=0)
        except queue.Empty:
            return
        if msg["msg_type"] != "input_request" or msg["parent_header"].get("msg_id") != msg_id:
            return
        content = msg["content"]
        cell.input_requests.append(content)
        cell.input_request_dates.append(msg["header"]["date"])
        self.kc.input(on_input(content["prompt"], content["password"]))

    def interrupt(self) -> None:
        self.km.interrupt_kernel()

    def shutdown(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


class Cell:
    def __init__(self):
        self.outputs: list[tuple[str, dict]] = []
        self.messages: list[tuple[str, dict]] = []  # every iopub message of the cell (comms included)
        self.input_requests: list[dict] = []  # stdin input_request contents, in order
        # when the kernel sent each output and input request (header dates): the kernel's own order, which
        # the client's separate iopub and stdin sockets do not keep
        self.output_dates: list = []
        self.input_request_dates: list = []
        self.reply: dict = {}
        self.msg_id: str | None = None

    @property
    def stdout(self) -> str:
        return "".join(c["text"] for k, c in self.outputs if k == "stream" and c["name"] == "stdout")

    @property
    def stderr(self) -> str:
        return "".join(c["text"] for k, c in self.outputs if k == "stream" and c["name"] == "stderr")

    def widget_states(self) -> list[dict]:
        """The state of every widget the cell opened (comm_open), with its later updates applied."""
        states = {}
        for kind, c in self.messages:
            if kind == "comm_open":
                states[c["comm_id"]] = dict(c["data"]["state"])
            elif kind == "comm_msg" and c["comm_id"] in states and c["data"].get("method") == "update":
                states[c["comm_id"]].update(c["data"]["state"])
        return list(states.values())

    @property
    def error(self) -> dict | None:
        for k, c in self.outputs:
            if k == "error":
                return c
        return None

    @property
    def result(self) -> dict | None:
        for k, c in self.outputs:
            if k == "execute_result":
                return c["data"]
        return None

    def ok(self) -> Cell:
        assert self.error is None, "cell failed:\n" + "\n".join(self.error["traceback"]) + "\n" + self.stderr
        return self


def run_terminal_ipython(script_path: str) -> subprocess.CompletedProcess:
    """Run an .ipy file in a terminal IPython shell (no kernel, no widgets), from the repo."""
    return subprocess.run(
        [sys.executable, "-m", "IPython", "--quick", "--no-banner", str(script_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


__all__ = ["Kernel", "Cell", "run_terminal_ipython", "refuse_kernel_in_unmarked_test", "UNMARKED_TEST_ENV"]
