# `make render` and `make test` work on a fresh machine with Python 3.11+ and make: each sets up
# .venv (the virtualenv Pulumi.yaml names) from the pinned requirements first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STACK ?= dev
OUT ?= render/$(STACK)

.PHONY: render test lint scan clean

$(VENV)/.installed: requirements.txt requirements-dev.txt constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "hidden-gpu needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt -c constraints.txt
	touch $@

render: $(VENV)/.installed
	$(PY) -m tools.render --stack $(STACK) --out $(OUT)

test: $(VENV)/.installed
	$(PY) -m pytest -q

lint: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

clean:
	rm -rf $(VENV) render .pytest_cache .mypy_cache .ruff_cache
