# The README's commands. Each one sets up what it needs by itself on a fresh machine.
#   make demo  - run notebooks/quickstart.ipynb and live_ranks.ipynb headless on 2 CPU workers
#   make lab   - start JupyterLab on 127.0.0.1 with nblaunch installed
#   make test  - lint and run the whole test suite
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.nblaunch-installed

.PHONY: venv demo lab test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

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

.PHONY: frontend frontend-test

# npm writes node_modules/.package-lock.json itself (so does the install during `pip install`).
$(NODE_STAMP): package.json package-lock.json
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(LABEXT_STAMP): $(NODE_STAMP) $(FRONTEND_SOURCES) | venv
	$(WITH_VENV) npm run build
	touch $@

$(CHROMIUM):
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium

frontend: venv $(LABEXT_STAMP) $(CHROMIUM)
	@test -L $(LABEXT_LINK) || $(WITH_VENV) jupyter-builder develop --overwrite .
	@test -e $(VENV)/etc/jupyter/jupyter_server_config.d/nblaunch.json \
		|| $(VENV)/bin/jupyter server extension enable --sys-prefix jupyter_ext

frontend-test: frontend
	npm run --silent lint
	npx jest --silent

# ---------------------------------------------------------------------------------

demo: venv
	$(PY) notebooks/execute.py notebooks/quickstart.ipynb
	$(PY) notebooks/execute.py notebooks/live_ranks.ipynb

lab: venv frontend
	cd notebooks && ../$(VENV)/bin/jupyter lab --ip=127.0.0.1 --no-browser $(LAB_ARGS)

lint: venv
	$(VENV)/bin/ruff check kernelside jupyter_ext tests bench notebooks
	$(VENV)/bin/ruff format --check kernelside jupyter_ext tests bench notebooks

test: venv frontend frontend-test lint
	$(PY) -m pytest tests

bench: venv
	$(PY) -m bench.launch

clean:
	rm -rf $(VENV)
