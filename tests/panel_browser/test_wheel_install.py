"""From a wheel, as a user installs it: the README's install lines build the wheel from a copy of this tree
(``npm ci``: the Node packages package-lock.json names), install it with torch 2.13.0 into a new venv, and the
README's check lines pass there; ``jupyter lab`` from that venv shows the panel in Chromium, with no version
note, and a 2-rank ``%%distributed`` cell runs in a kernel of that venv; the install guide's uninstall line
takes all of it away again. Slow (about three minutes: the wheel's
npm ci and webpack build, pip installing torch and JupyterLab from the local wheels), so it is marked ``slow``;
``make test`` runs it. Screenshot: test-artifacts/wheel-lab.png."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lab_notebooks import write_notebook
from lab_process import run_lab
from playwright.sync_api import expect

from kernelside.versions import installed_version

REPO = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"  # the one torch of this project; pip takes it from the local wheels (PIP_FIND_LINKS)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
expect.set_options(timeout=60_000)


def _readme_block(containing: str, page: str = "README.md") -> list[str]:
    """The command lines (comments kept) of the page's bash block that contains ``containing``."""
    blocks = BASH_BLOCK.findall((REPO / page).read_text(encoding="utf-8"))
    block = next(b for b in blocks if containing in b)
    return [line for line in block.splitlines() if line.strip()]


def _run(line: str, cwd: Path, venv: Path, timeout: float = 600, answer: str | None = None) -> str:
    """One README line run by bash as written, with ``venv``'s bin first on PATH (as after activating it)."""
    env = dict(os.environ, PATH=f"{venv / 'bin'}:{os.environ['PATH']}", VIRTUAL_ENV=str(venv))
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, input=answer
    )  # fmt: skip
    out = ANSI.sub("", proc.stdout + proc.stderr)
    assert proc.returncode == 0, f"{line!r} failed ({proc.returncode}):\n{out[-4000:]}"
    return out


def _tree_copy(dest: Path) -> Path:
    """The files a clone of this branch has (tracked, and new ones git does not ignore): no node_modules, no
    labextension build, no venv, so the wheel is built from nothing, and this tree is left as it was."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, files):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory, starts_processes) -> Path:
    """A new venv with torch 2.13.0 and the wheel the README's lines built from a copy of this tree."""
    base = tmp_path_factory.mktemp("wheel")
    src = _tree_copy(base / "src")
    venv = base / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], check=True)
    install = _readme_block("pip wheel")
    wheel_line = next(line for line in install if line.startswith("pip wheel"))
    _run(wheel_line.split("#")[0], src, venv)  # the build, as written, by the new venv's pip
    assert re.search(r"npm ci\b", (src / "buildhooks" / "labextension.py").read_text())
    assert (src / "node_modules" / ".package-lock.json").is_file()  # npm ci installed the lock file's packages
    _run(f"pip install -q {TORCH}", src, venv)  # "install the build of torch that fits your GPUs first"
    wheel_install = next(line for line in install if line.startswith("pip install dist/"))
    _run(wheel_install.split("#")[0], src, venv)  # the wheel, as written (its file name is this version's)
    return venv


def test_the_readme_check_lines_pass_in_a_new_venv_with_the_wheel(wheel_venv):
    torch_version = subprocess.run(
        [wheel_venv / "bin" / "python", "-c", "import torch; print(torch.__version__)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert torch_version.split("+")[0] == "2.13.0"
    lines = _readme_block("labextension list")
    assert len(lines) == 3
    for line in lines:
        command, _, expected = line.partition("#")
        out = _run(command, wheel_venv, wheel_venv)
        expected = expected.strip() or "kernelside ok"
        assert expected in out, f"README line {line!r}: {expected!r} not in\n{out}"
    assert f"nblaunch v{installed_version()} enabled OK" in _run("jupyter labextension list", wheel_venv, wheel_venv)


def test_jupyter_lab_from_the_wheel_venv_shows_the_panel_and_runs_a_two_rank_cell_in_its_kernel(
    wheel_venv, tmp_path, browser_page, snapshot, starts_kernels
):
    page = browser_page
    page.set_default_timeout(60_000)
    path = {"PATH": f"{wheel_venv / 'bin'}:{os.environ['PATH']}", "VIRTUAL_ENV": str(wheel_venv)}
    with run_lab(str(wheel_venv / "bin" / "python"), tmp_path, "wheel-jupyter-lab.log", env=path) as lab:
        cell = "%%distributed -n 2\nimport sys\nprint(f'rank {rank} of {world_size} in {sys.prefix}')\nworld_size * 10"
        probe = "import sys, torch; print('kernel in', sys.prefix, 'torch', torch.__version__)"
        write_notebook(lab.root / "wheel.ipynb", [probe, "%load_ext kernelside", cell])
        try:
            page.goto(lab.page_url("lab/tree/wheel.ipynb"))
            page.locator('.jp-SideBar [data-id="nblaunch-panel"]').click()
            panel = page.locator("#nblaunch-panel")
            expect(panel.locator(".nblaunch-path")).to_contain_text("nblaunch.yaml")
            expect(panel.locator(".nblaunch-version-mismatch")).to_be_hidden()  # labextension and server agree

            page.locator(".jp-NotebookPanel .jp-Cell").first.click()
            page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
            outputs = page.locator(".jp-NotebookPanel .jp-OutputArea-output")
            expect(outputs.filter(has_text=f"kernel in {wheel_venv} torch 2.13.0")).to_have_count(1, timeout=150_000)
            expect(outputs.filter(has_text=f"rank 0 of 2 in {wheel_venv}")).to_have_count(1, timeout=150_000)
            expect(outputs.filter(has_text=re.compile(r"^\s*20\s*$"))).to_have_count(1)  # the cell's result
            expect(outputs.filter(has_text="rank 1 of 2")).to_have_count(0)  # rank 1's output goes to its log
            expect(page.locator(".jp-OutputArea-output a.nblaunch-run-link")).to_have_count(1)
        finally:
            snapshot(page, "wheel-lab.png")


def test_the_install_guide_uninstall_line_takes_the_package_labextension_and_server_extension_away(wheel_venv):
    """Last in this module: the venv has no nblaunch afterwards."""
    (line,) = _readme_block("pip uninstall", page="docs/guide/install.md")
    _run(line, wheel_venv, wheel_venv, answer="y\n")  # pip asks "Proceed (Y/n)?"
    assert "nblaunch" not in _run("jupyter labextension list", wheel_venv, wheel_venv)
    assert "jupyter_ext" not in _run("jupyter server extension list", wheel_venv, wheel_venv)
    assert not (wheel_venv / "etc" / "jupyter" / "jupyter_server_config.d" / "nblaunch.json").exists()
    assert not (wheel_venv / "share" / "jupyter" / "labextensions" / "nblaunch").exists()
