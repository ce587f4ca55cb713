"""The docs site builds with warnings as errors (a broken link, image, heading anchor or reference fails
here), into a temporary folder, and its configuration reference lists every key of the schema."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from kernel import REPO

from kernelside.config.fields import FIELDS


def test_docs_build_with_warnings_as_errors_and_list_every_config_key(tmp_path):
    out = tmp_path / "html"
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-d", str(tmp_path / "doctrees")]
        + [os.path.join(REPO, "docs"), str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    reference = (out / "guide" / "configuration.html").read_text()
    code = r'<code class="docutils literal notranslate"><span class="pre">(\w+)</span>'
    listed = set(re.findall(code, reference))
    assert {f.name for f in FIELDS} <= listed
    assert (out / "guide" / "security.html").is_file()  # the shared-machine guide is part of the site
    api = (out / "guide" / "api.html").read_text()
    assert "notebook_launcher" in api and "log_metrics" in api


def test_readme_links_point_at_files_that_exist():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    targets = re.findall(r"\]\(((?!https?:)[^)#]+)", readme)
    assert targets, "the README links into the docs"
    missing = [t for t in targets if not os.path.exists(os.path.join(REPO, t))]
    assert missing == []
    assert len(readme.splitlines()) <= 200
