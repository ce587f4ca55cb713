"""Write OUTDIR/summary.md for tests/gpu/on_device.sh: what ran, what passed, on which machine, the bench tables.

Standard library only, and every part is optional: on a machine without CUDA (or torch) it still
writes what it knows, starting with the line that says why nothing ran.

    python tests/gpu/write_summary.py OUTDIR STAGES_TSV WORKDIR START_EPOCH

STAGES_TSV holds one "stage<TAB>status<TAB>detail" line per step of on_device.sh; WORKDIR may hold
nvidia-smi.txt; the bench tables are the BENCHES' files in bench/results/ written after START_EPOCH.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# result file (bench/results/NAME.md) -> the command that writes it
BENCHES = {
    "gpu_launch": "bench/gpu_launch.py",
    "gpu_steady": "bench/gpu_steady.py",
    "gpu_steady-shared": "bench/gpu_steady.py --ranks-per-gpu 2",
    "live_recovery-nccl-quick": "bench/live_recovery.py --backend nccl --quick",
}

_VERSIONS = r"""
import importlib.metadata, importlib.util, platform, sys
print("python", platform.python_version(), sys.executable)
for dist, module in (("torch", "torch"), ("accelerate", "accelerate"), ("transformers", "transformers"),
                     ("nvidia-ml-py", "pynvml"), ("ipython", "IPython"), ("ipykernel", "ipykernel"),
                     ("jupyter_client", "jupyter_client"), ("pytest", "pytest")):
    spec = importlib.util.find_spec(module)
    if spec is None:
        print(dist, "not installed")
        continue
    try:
        origin = spec.origin or ""
        where = "wheel from .gpu-wheels" if "nblaunch-gpu-kit" in origin else "on the machine"
        print(dist, importlib.metadata.version(dist), f"({where})")
    except Exception as e:
        print(dist, "missing:", type(e).__name__, e)
try:
    import torch
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.backends.cuda.is_built() else None
    print("torch CUDA", torch.version.cuda, "NCCL", nccl)
except Exception as e:
    print("torch CUDA: unknown", e)
"""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def stages(path: str) -> list[tuple[str, str, str]]:
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return [tuple((line.rstrip("\n").split("\t") + ["", ""])[:3]) for line in fh if line.strip()]


def test_rows(junit: str) -> tuple[list[str], dict]:
    """Markdown rows (test, outcome, seconds, message) and the counts by outcome."""
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    if not os.path.exists(junit):
        return [], counts
    rows = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
                message = node.get("message") or (node.text or "")
                break
        counts[outcome] += 1
        name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        seconds = float(case.get("time") or 0)
        first = _cell(message.strip().splitlines()[0] if message.strip() else "")[:240]
        rows.append(f"| `{name}` | {outcome.upper() if outcome != 'passed' else outcome} | {seconds:.1f} | {first} |")
    return rows, counts


def versions() -> list[str]:
    try:
        run = subprocess.run([sys.executable, "-c", _VERSIONS], capture_output=True, text=True, timeout=120)
        return [line for line in run.stdout.splitlines() if line.strip()] or [run.stderr.strip()[-300:]]
    except Exception as e:
        return [f"versions unknown: {e}"]


def _commit() -> str:
    try:
        run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        return run.stdout.strip()
    except OSError:
        return ""


def bench_tables(since: float) -> list[str]:
    out = []
    for name, command in BENCHES.items():
        path = os.path.join(REPO, "bench", "results", f"{name}.md")
        if os.path.exists(path) and os.path.getmtime(path) >= since:
            with open(path) as fh:
                out += [f"### {command}", "", fh.read().strip(), ""]
        else:
            out += [f"### {command}", "", "not measured in this run (see the stages above and bench.log)", ""]
    return out


def main(outdir: str, stages_tsv: str, workdir: str, start: float) -> int:
    steps = stages(stages_tsv)
    refused = next((d for s, st, d in steps if s == "CUDA check" and st == "refused"), None)
    lines = [f"# nblaunch GPU test kit — {datetime.datetime.now().isoformat(timespec='seconds')}", ""]
    if refused:
        lines += [f"**{refused}**", "", "Nothing was run: no test, no benchmark.", ""]
    rows, counts = test_rows(os.path.join(outdir, "junit.xml"))
    if rows:
        verdict = "all passed" if counts["failed"] == counts["error"] == 0 else "FAILURES"
        lines += [
            f"**tests/gpu: {verdict}** — {counts['passed']} passed, {counts['failed']} failed, "
            f"{counts['error']} errors, {counts['skipped']} skipped (a skip is not a pass).",
            "",
        ]
    lines += ["## Stages", "", "| stage | status | detail |", "|---|---|---|"]
    lines += [f"| {s} | {st} | {_cell(d)[:400]} |" for s, st, d in steps]
    lines += ["", "## Machine", ""]
    smi = os.path.join(workdir, "nvidia-smi.txt")
    if os.path.exists(smi):
        with open(smi) as fh:
            lines += [f"- nvidia-smi: `{line.strip()}`" for line in fh if line.strip()]
    lines += [f"- {v}" for v in versions()]
    lines.append(f"- checkout: {_commit() or 'not a git checkout (a copy of the working tree)'}")
    if rows:
        lines += ["", "## Tests", "", "| test | outcome | s | message |", "|---|---|---|---|", *rows]
    if not refused:
        lines += ["", "## Benchmarks", "", *bench_tables(start)]
    with open(os.path.join(outdir, "summary.md"), "w") as fh:
        fh.write("\n".join(lines).rstrip() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])))
