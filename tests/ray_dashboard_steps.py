"""The Runs dashboard of a live session on a real Ray cluster, for ray_live_driver.py (its last session).

The kernel counts only its own Ray node as its machine (``NBLAUNCH_RAY_SAME_MACHINE=node``), so the ranks on
the cluster's worker nodes are "on other machines": they report their own CPU and memory. A real ``jupyter lab``
(tests/panel_browser/lab_process.py, in the driver's network namespace, reading the kernel's run folders) answers
the dashboard's routes; while a cell keeps both ranks busy, the run's route must carry each rank's figures and
their history, Chromium (if there) takes a picture of the dashboard, and Stop goes through the route as the
dashboard's button sends it. What each step showed is returned as plain data.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BROWSER = Path(__file__).with_name("panel_browser")
sys.path.insert(0, str(BROWSER))
from lab_process import ARTIFACTS, run_lab  # noqa: E402

SCREENSHOT = "ray-live-dashboard.png"
CHROMIUM = "/usr/bin/chromium"

# both ranks busy (CPU) holding 64 MiB more than at idle (memory), until Stop
BUSY_CELL = """%%distributed
import time
print('waiting', flush=True)
ballast = bytearray(64 << 20)
while True:
    sum(range(300_000))
    time.sleep(0.01)
"""


def _call(lab, path: str, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{lab.url}/nblaunch/runs/{path}",
        data=None if body is None else json.dumps(body).encode(),
        method="GET" if body is None else "POST",
        headers={"Authorization": f"token {lab.token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _figures_of_every_rank(lab, run_id: str, timeout: float = 60.0) -> dict:
    """The run's detail once every rank has CPU and memory figures and 3 samples of history (or the last seen)."""
    deadline = time.monotonic() + timeout
    detail: dict = {}
    while time.monotonic() < deadline:
        _, detail = _call(lab, run_id)
        ranks = detail.get("ranks") or []
        series = (detail.get("history") or {}).get("ranks") or {}
        sampled = [
            r
            for r in ranks
            if isinstance(r.get("cpu_percent"), (int, float))
            and r.get("rss_bytes")
            and sum(v is not None for v in series.get(str(r["rank"]), {}).get("rss_bytes", [])) >= 3
        ]
        if ranks and len(sampled) == len(ranks):
            return detail
        time.sleep(1.0)  # (the dashboard's own pace: the server samples when asked)
    return detail


def _screenshot(lab, run_id: str, tmp: Path, seen: dict) -> str:
    """The dashboard of the run in Chromium, once its ranks' charts have samples (``seen["node_titles"]``: what
    each rank's node cell says when hovered); what went wrong, or ''."""
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is missing"
    from playwright.sync_api import expect, sync_playwright

    flags = _browser_conftest().CHROMIUM_FLAGS

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=flags,
            viewport={"width": 1280, "height": 900},
        )
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(60_000)
            page.goto(lab.page_url("lab"))
            page.locator('.jp-SideBar [data-id="nblaunch-panel"]').click()
            page.locator(f'#nblaunch-panel .nblaunch-run[data-run-id="{run_id}"] .nblaunch-run-open').click()
            dash = page.locator(f"#nblaunch-dashboard-{run_id}")
            rows = dash.locator("table.nblaunch-dash-ranks tbody tr")
            expect(rows).to_have_count(2, timeout=60_000)
            for rank in range(2):  # each remote rank's CPU and memory sparklines have their samples
                spark = rows.nth(rank).locator('.nblaunch-spark[data-figure="rss_bytes"]')
                expect(spark).to_have_attribute("data-samples", _at_least(3), timeout=60_000)
            seen["node_titles"] = [rows.nth(r).locator("td").nth(2).get_attribute("title") for r in range(2)]
            time.sleep(2)  # (a picture for people: two more samples on the charts)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / SCREENSHOT), timeout=15_000)
        except Exception as e:  # noqa: BLE001 - a picture is for people: said, never the test's failure
            return f"{type(e).__name__}: {e}"[:2000]
        finally:
            context.close()
    return ""


def _browser_conftest():
    """tests/panel_browser/conftest.py (its Chromium flags), by its path: ``conftest`` alone names tests/'s."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("panel_browser_conftest", BROWSER / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _at_least(n: int):
    import re

    return re.compile("^(" + "|".join(str(i) for i in range(n, 10)) + r"|\d\d+)$")


STATUS = """
print(json.dumps([{k: r[k] for k in ("rank", "pid", "state")} for r in registry.current().status()]))
"""


def dashboard_steps(k) -> dict:
    """Run the busy cell on the kernel's live session (2 ranks on other machines), look at its dashboard and
    press its Stop through the route; then the ranks' state and pids."""
    out: dict = {}
    began = time.monotonic()
    log_dir = k.run("print(registry.current().log_dir)").ok().stdout.strip()
    run_id = os.path.basename(log_dir)
    out["entry"] = json.loads(k.run(f"print(open({os.path.join(log_dir, 'state.json')!r}).read())").ok().stdout)
    k.run("%%distributed\nheld = rank + 7").ok()
    tmp = Path(tempfile.mkdtemp(prefix="nblaunch-ray-dashboard-"))
    runs_parent = os.path.dirname(os.path.dirname(log_dir))  # runs_base(None) is $TMPDIR/nblaunch-<uid>
    try:
        with run_lab(sys.executable, tmp, "jupyter-lab-ray.log", env={"TMPDIR": runs_parent}) as lab:
            seen: dict = {}

            def while_busy(kind, content):
                if "waiting" not in content.get("text", "") or seen:
                    return
                seen["detail"] = _figures_of_every_rank(lab, run_id)
                seen["screenshot_problem"] = _screenshot(lab, run_id, tmp, seen)
                seen["t"] = time.monotonic()
                seen["stop"] = _call(lab, f"{run_id}/stop", {"from": "dashboard"})

            cell = k.run(BUSY_CELL, timeout=300, on_output=while_busy)
            out.update(seen)
            out["returned_after_stop_s"] = time.monotonic() - seen["t"] if "t" in seen else None
            out["busy"] = [cell.error["ename"], cell.error["evalue"]] if cell.error else None
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # the idle state is in state.json within PENDING_WRITE_S
                _, out["after"] = _call(lab, run_id)
                if out["after"].get("state") == "idle":
                    break
                time.sleep(0.1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["status_after"] = json.loads(k.run(STATUS).ok().stdout)
    out["status_text"] = k.run("%distributed_status").ok().stdout  # each rank's RSS, as the rank said it
    kept = k.run("%%distributed --return-from all --return h\nh = held")
    out["kept"] = k.run("print(h)").ok().stdout.strip() if kept.error is None else str(kept.error)
    with open(os.path.join(log_dir, "resources.jsonl")) as fh:
        out["resources_lines"] = [json.loads(line) for line in fh.read().splitlines()[-20:]]
    out["s"] = time.monotonic() - began  # what these steps add to the module (a lab, Chromium, the cells)
    return out
