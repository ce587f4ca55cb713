"""Sphinx configuration of nblaunch's docs: MyST Markdown pages under docs/, built by `make docs`
(warnings are errors, so a broken link, image or reference fails the build and tests/test_docs.py)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.join(HERE, "_ext")]

project = "nblaunch"
author = "the nblaunch developers"
extensions = ["myst_parser", "sphinx.ext.autodoc", "config_reference"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links resolve, and fail the build when the heading goes
myst_enable_extensions = ["colon_fence"]
html_theme = "alabaster"
html_static_path = []
autodoc_member_order = "bysource"
suppress_warnings = ["myst.header"]  # the guides begin at "#", then "###" in a few moved sections
html_theme_options = {"page_width": "1240px", "sidebar_width": "220px"}  # the config table fits
