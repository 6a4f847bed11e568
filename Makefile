# Two commands do all set-up: `make run` (the default job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The MNIST/Shakespeare copy shared with every checkout, when present.
SHARED_DATA ?= $(abspath ../shared/data)
DATA_ENV := $(if $(wildcard $(SHARED_DATA)/mnist),FEDFORGE_DATA=$(SHARED_DATA),)
CONFIG ?= configs/default.yaml
ARGS ?=

.PHONY: run test test-slow test-cuda test-wheel lint typecheck docs venv clean proto chromium

# `make run` installs the core alone (what a simulation needs: the slim install a
# user gets from `pip install fedforge`); `make test` adds every extra and the dev
# tools (`.[dev]`) into the same .venv.
$(VENV)/.core: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned to the CPU wheel, so nothing pulls a CUDA build.
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.installed: $(VENV)/.core
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

# The dashboard's browser tests drive the system's Chromium (Playwright never
# downloads a browser here): installed with apt-get when missing. As root (CI, on
# a fresh Debian machine) a failed install fails; otherwise it is tried with
# `sudo -n`, and without it those tests skip, saying why.
chromium:
	@if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
		else \
			(sudo -n apt-get update -qq && sudo -n apt-get install -y -qq chromium) \
				|| echo "make: no chromium (not root): the dashboard's browser tests will skip"; \
		fi; \
	fi

# Bytecode for the editable install (pip compiles only what it copies): without it
# every start recompiles fedforge's sources, 0.13 s here where the environment sets
# PYTHONDONTWRITEBYTECODE. Redone when a source changes; stale files are ignored.
$(VENV)/.bytecode: $(VENV)/.core $(shell find src -name '*.py')
	$(PY) -m compileall -q src
	touch $@

venv: $(VENV)/.installed $(VENV)/.bytecode

run: $(VENV)/.core $(VENV)/.bytecode
	$(DATA_ENV) $(VENV)/bin/fedforge run --config $(CONFIG) $(ARGS)

# One worker process per usable core (nproc reads the CPU affinity; xdist's `auto`
# counts the host's physical cores where psutil is installed), a test module whole
# on one worker (its module-scoped fixtures, e.g. a Ray cluster, start once);
# `TEST_WORKERS=0` runs it in one process.
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo auto)

test: venv chromium lint typecheck docs
	$(DATA_ENV) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

test-slow: venv chromium
	$(DATA_ENV) $(PY) -m pytest -m slow

# The wheel as a user installs it: built, installed into a fresh venv, and its
# `fedforge run`, `server`/`client`, `report` and `dashboard` run from there (.ci/test_wheel.py).
test-wheel: venv
	$(PY) .ci/test_wheel.py

test-cuda: venv
	$(DATA_ENV) $(PY) -m pytest -m cuda

lint: venv
	$(VENV)/bin/ruff check src tests benchmarks .ci
	$(VENV)/bin/ruff format --check src tests benchmarks .ci
	$(VENV)/bin/lint-imports --no-cache

typecheck: venv
	$(VENV)/bin/mypy

# The site (mkdocs.yml): README's guides, the design map, the results, the
# changelog and the API reference from the docstrings, offline, in build/site;
# --strict: a docstring or a page that references what is not there fails the
# build (and `make test`).
docs: venv
	$(VENV)/bin/mkdocs build --quiet

# The gRPC code of the wire's schema, committed (tests/test_proto.py checks it matches).
proto: venv
	$(PY) -m grpc_tools.protoc -Iproto --python_out=src --pyi_out=src --grpc_python_out=src \
		proto/fedforge/transport/pb/federation.proto

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
