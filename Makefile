# The README's commands. Each one sets up what it needs by itself on a fresh machine.
#   make demo  - run notebooks/quickstart.ipynb headless on 2 CPU workers
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
# (filled in by the panel work: node packages, labextension build, Chromium)
frontend: venv

# ---------------------------------------------------------------------------------

demo: venv
	$(PY) notebooks/execute.py notebooks/quickstart.ipynb

lab: venv frontend
	cd notebooks && ../$(VENV)/bin/jupyter lab --ip=127.0.0.1 --no-browser

lint: venv
	$(VENV)/bin/ruff check kernelside jupyter_ext tests bench
	$(VENV)/bin/ruff format --check kernelside jupyter_ext tests bench

test: venv frontend lint
	$(PY) -m pytest tests

bench: venv
	$(PY) -m bench.launch

clean:
	rm -rf $(VENV)
