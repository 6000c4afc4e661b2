# The two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CONFIG ?= config/demo
HOST   ?= 127.0.0.1
PORT   ?= 8080

.PHONY: run test lint typecheck unit bench check-config clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.installed

# Escaped for the double-quoted echo below.
TRY_BODY := {\"model\": \"reasoning\", \"messages\": [{\"role\": \"user\", \"content\": \"hello\"}], \"stream\": true}

run: $(VENV)/.installed
	@echo "microscheduler: serving $(CONFIG) on http://$(HOST):$(PORT) (Ctrl-C stops it and its backends)."
	@echo "Open http://$(HOST):$(PORT)/ for the control page. Once the log says 'backend ready',"
	@echo "try (the first request wakes the lazy reasoning model):"
	@echo "  curl -sN http://$(HOST):$(PORT)/v1/chat/completions -H 'content-type: application/json' -d '$(TRY_BODY)'"
	@echo
	$(BIN)/microscheduler serve --config $(CONFIG) --host $(HOST) --port $(PORT)

check-config: $(VENV)/.installed
	$(BIN)/microscheduler check-config --config $(CONFIG)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check app tests bench
	$(BIN)/ruff format --check app tests bench

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

unit: $(VENV)/.installed-dev
	$(BIN)/pytest

test: lint typecheck unit

bench: $(VENV)/.installed-dev
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/wake.py
	$(BIN)/python bench/soak.py
	$(BIN)/python bench/keys.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
