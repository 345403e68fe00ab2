# The few commands a developer types. Everything runs from the project's own virtualenv in .venv/.
PY      := .venv/bin/python
STAMP   := .venv/.installed

.PHONY: install demo test test-unit lint typecheck check up down status bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)          ## the main job end to end: services, simulator, workers, two namespaces, prompts from Redis
	.venv/bin/combee demo

test: $(STAMP)          ## the whole suite against real Kafka + Redis started (and stopped) by deploy/
	$(PY) -m deploy.local exec -- $(PY) -m pytest -q

test-unit: $(STAMP)     ## the pure tests only (seconds; no services)
	$(PY) -m pytest -q tests/unit

lint: $(STAMP)
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

typecheck: $(STAMP)
	.venv/bin/mypy

check: lint typecheck test-unit

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
