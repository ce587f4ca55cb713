# The README's commands. Each one sets up what it needs by itself on a fresh machine.
#   make demo  - run notebooks/quickstart.ipynb and live_ranks.ipynb headless on 2 CPU workers
#   make lab   - start JupyterLab on 127.0.0.1 with nblaunch installed (no test stack, no browser)
#   make docs  - build the docs site into build/docs/html (warnings are errors)
#   make test  - lint and run the whole test suite
#   make test-fast - the tests that start no process and no server (see tests/conftest.py): the layer to run while you work
#   make test-loaded - the same suite with two busy processes beside it (its timed assertions must hold there)
#   make test-gpu   - the GPU test kit (tests/gpu/); refuses at once without a CUDA GPU
#   make gpu-wheels - the Python 3.12 wheels tests/gpu/on_device.sh installs on a GPU machine without network
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.nblaunch-installed

.PHONY: venv venv-base demo lab docs readme-images test test-fast test-loaded lint bench clean test-gpu gpu-wheels

BASE_STAMP := $(VENV)/.nblaunch-base-installed

# what JupyterLab with nblaunch needs (make lab), then the test stack on top (make venv, demo, test)
$(BASE_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e .
	touch $(BASE_STAMP)

$(STAMP): $(BASE_STAMP)
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv-base: $(BASE_STAMP)
venv: $(STAMP)

# --- frontend (JupyterLab panel) -------------------------------------------------
# Node packages from package-lock.json, the labextension (linked into the venv so a
# rebuild shows on page reload), the server extension, and Debian's Chromium for the
# browser test. Each step has a stamp, so a second `make test` redoes nothing.
NODE_STAMP := node_modules/.package-lock.json
LABEXT_STAMP := jupyter_ext/labextension/package.json
LABEXT_LINK := $(VENV)/share/jupyter/labextensions/nblaunch
CHROMIUM := /usr/bin/chromium
FRONTEND_SOURCES := $(wildcard jupyter_ext/src/*.ts jupyter_ext/style/*) package.json tsconfig.json
WITH_VENV := PATH=$(abspath $(VENV))/bin:$$PATH

.PHONY: frontend labextension frontend-test

# npm writes node_modules/.package-lock.json itself (so does the install during `pip install`).
$(NODE_STAMP): package.json package-lock.json
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(LABEXT_STAMP): $(NODE_STAMP) $(FRONTEND_SOURCES) | venv-base
	$(WITH_VENV) npm run build
	touch $@

$(CHROMIUM):
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium

# the labextension linked into the venv and the server extension enabled: all `make lab` needs
labextension: venv-base $(LABEXT_STAMP)
	@test -L $(LABEXT_LINK) || $(WITH_VENV) jupyter-builder develop --overwrite .
	@test -e $(VENV)/etc/jupyter/jupyter_server_config.d/nblaunch.json \
		|| $(VENV)/bin/jupyter server extension enable --sys-prefix jupyter_ext

# the browser tests also need Chromium (Debian's, installed as root)
frontend: venv labextension $(CHROMIUM)

frontend-test: frontend
	npm run --silent lint
	npx jest --silent

# ---------------------------------------------------------------------------------

demo: venv
	$(PY) notebooks/execute.py notebooks/quickstart.ipynb
	$(PY) notebooks/execute.py notebooks/live_ranks.ipynb
	@echo "Open them in JupyterLab to see the bars and charts: make lab, then build/notebooks/ in its file browser."

lab: labextension
	@echo "Starting JupyterLab: open the http://127.0.0.1:…/lab?token=… URL it prints below in your browser."
	$(VENV)/bin/jupyter lab --ip=127.0.0.1 --no-browser \
		--ServerApp.root_dir=$(CURDIR) --LabApp.default_url=/lab/tree/notebooks $(LAB_ARGS)

# the docs site (Sphinx + MyST) into build/docs/html; warnings are errors (broken links, images, references)
DOCS_OUT ?= build/docs
docs: venv
	$(PY) -m sphinx -W --keep-going -q -b html -d $(DOCS_OUT)/doctrees docs $(DOCS_OUT)/html
	@echo "docs: $(DOCS_OUT)/html/index.html"

# the README's pictures, from the latest browser test run (test-artifacts/); tests never write into docs/
README_IMAGES := sidebar.png dashboard.png dashboard-log.png
readme-images:
	@for f in $(README_IMAGES); do test -f test-artifacts/$$f || { echo "test-artifacts/$$f missing: run \
		.venv/bin/python -m pytest tests/panel_browser first"; exit 1; }; cp test-artifacts/$$f docs/$$f; done
	@echo "copied $(README_IMAGES) into docs/"

lint: venv
	$(VENV)/bin/ruff check kernelside jupyter_ext tests bench notebooks buildhooks
	$(VENV)/bin/ruff format --check kernelside jupyter_ext tests bench notebooks buildhooks

# TEST_WORKERS: pytest processes side by side, each test file whole in one of them (--dist loadfile: a module's
# fixtures, a Ray cluster say, start once). 0, the default: one test after another in this process. Two on 2 cores
# take the suite from about 29 to 18-20 minutes, but a browser test then ran out of time once in four full runs
# (the live_ranks notebook's Run All, 240 s), so CI stays serial until that is understood.
TEST_WORKERS ?= 0
test: venv frontend frontend-test lint
	$(PY) -m pytest tests -n $(TEST_WORKERS) --dist loadfile --durations=30

# The marks are set from the fixtures each test asks for (tests/conftest.py); `make test` runs every layer.
FAST_LAYER := not processes and not server
test-fast: venv
	$(PY) -m pytest tests -m "$(FAST_LAYER)" -q

# Two processes that each keep a core busy, started by .ci/with-load and stopped by PID when the suite ends.
test-loaded: venv frontend frontend-test lint
	.ci/with-load 2 $(PY) -m pytest tests

bench: venv
	$(PY) -m bench.launch

clean:
	rm -rf $(VENV)

# --- GPU test kit (tests/gpu/, issue 15) --------------------------------------------------
# GPU_PY: the python that runs the GPU tests (default: the venv's, which `make venv` builds
# first). The check runs before anything else and refuses with one line on a machine without
# a CUDA GPU. On a GPU machine without network: `make gpu-wheels` here, carry .gpu-wheels/,
# and run `bash tests/gpu/on_device.sh OUT` there (it installs the wheels and runs everything).
GPU_PY ?=
GPU_TEST_PY = $(or $(GPU_PY),$(PY))
GPU_TEST_TIMEOUT ?= 120
GPU_WHEELS ?= .gpu-wheels
# ray (tests/gpu/test_gpu_ray_live.py, skipped without it) only when asked: `make gpu-wheels GPU_WHEEL_EXTRA=ray`.
# Its wheel alone is 79 MB (ray 2.60, cp312), more than a GPU machine reached with 64 MiB of carried files can take.
GPU_WHEEL_EXTRA ?=
GPU_WHEEL_PACKAGES := ipython ipykernel ipywidgets jupyter_client nbclient nbformat jupyter_server \
	einops hjson msgpack ninja py-cpuinfo pydantic $(GPU_WHEEL_EXTRA)
# DeepSpeed (tests/gpu/test_gpu_deepspeed.py) publishes no wheel: one is built here without its ops (DS_BUILD_OPS=0),
# needing the packages above; ZeRO-2 with torch's AdamW compiles nothing on the GPU machine
GPU_DEEPSPEED := deepspeed>=0.15
GPU_WHEEL_PLATFORMS := --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	--platform manylinux2014_x86_64 --platform any
# a Python 3.12 to check the set with (here: pyenv's); without one, pip's resolver checks it
GPU_WHEELS_PY ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) $(shell command -v python3.12))

GPU_STAMP := $(VENV)/.nblaunch-gpu-installed

$(GPU_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test,gpu]'
	touch $(GPU_STAMP)

# The driver check needs no torch, so a machine without a GPU is refused before any venv is built.
test-gpu:
	@$(or $(GPU_PY),python3) tests/gpu/require_cuda.py --driver-only
	@$(if $(GPU_PY),,$(MAKE) --no-print-directory $(GPU_STAMP))
	@$(GPU_TEST_PY) tests/gpu/require_cuda.py
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_TEST_PY) -m pytest tests/gpu -p no:cacheprovider \
		--timeout=$(GPU_TEST_TIMEOUT) -rA $(GPU_TEST_ARGS)

gpu-wheels:
	rm -rf $(GPU_WHEELS).new && mkdir -p $(GPU_WHEELS).new
	python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
		$(GPU_WHEEL_PLATFORMS) -d $(GPU_WHEELS).new $(GPU_WHEEL_PACKAGES)
	DS_BUILD_OPS=0 $(PY) -m pip wheel -q --no-deps --no-build-isolation -w $(GPU_WHEELS).new '$(GPU_DEEPSPEED)'
	rm -rf $(GPU_WHEELS) && mv $(GPU_WHEELS).new $(GPU_WHEELS)
	@echo "$(GPU_WHEELS): $$(ls $(GPU_WHEELS) | wc -l) wheels, $$(du -sh $(GPU_WHEELS) | cut -f1)"
	@if [ -n "$(GPU_WHEELS_PY)" ] && $(GPU_WHEELS_PY) -c 'import sys; assert sys.version_info[:2] == (3, 12)'; then \
		t=$$(mktemp -d) && $(GPU_WHEELS_PY) -m pip install -q --no-index --find-links $(GPU_WHEELS) --target $$t \
			$(GPU_WHEEL_PACKAGES) && PYTHONPATH=$$t $(GPU_WHEELS_PY) -c 'import IPython, ipykernel, ipywidgets, \
			jupyter_client, jupyter_server, nbclient, nbformat; print("complete: installs with --no-index and imports under", \
			__import__("sys").version.split()[0])' ; s=$$?; rm -rf $$t; exit $$s; \
	else \
		python3 -m pip install -q --dry-run --no-index --find-links $(GPU_WHEELS) --python-version 3.12 \
			--only-binary=:all: --target $$(mktemp -d) $(GPU_WHEEL_PACKAGES) \
			&& echo "complete for pip's resolver (no Python 3.12 here to install it with)"; \
	fi
