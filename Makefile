# Quickstart: `make run` (default experiment into runs/demo) and `make test` (whole suite);
# `make docs` builds the documentation and API reference into site/.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.installed

$(VENV)/.installed-docs: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $@ $(VENV)/.installed

run: $(VENV)/.installed
	$(BIN)/fedsec run --out runs/demo --force

# Two pytest workers (pytest-xdist), one test file each at a time: the suite's single-process tests
# use one core, so the second core of a 2-core machine runs the other half.
test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

docs: $(VENV)/.installed-docs
	$(BIN)/mkdocs build

clean:
	rm -rf $(VENV) runs site .pytest_cache .hypothesis
