# Two commands do all set-up on a fresh machine (Python 3.11+ with venv):
#   make serve   -> the server in sim mode on port 7860 (no key needed)
#   make test    -> the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: serve test install install-dev presubmit typecheck lint bench clean

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e '.[dev]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# Loopback only by default: without LLMSERVE_TRACE_DIR any client could replay (or probe for) any
# file the server can read. HOST=0.0.0.0 make serve exposes it (set LLMSERVE_TRACE_DIR too); the
# Docker image and the Space bind 0.0.0.0 with LLMSERVE_TRACE_DIR=/app/traces.
HOST ?= 127.0.0.1

serve: install
	LLMSERVE_MODE=$${LLMSERVE_MODE:-sim} $(VENV)/bin/uvicorn server.app:app --host $(HOST) --port $${PORT:-7860}

test: install-dev
	$(VENV)/bin/pytest -q

# The pre-submission check's arguments: no Docker build by default (most machines have no engine);
# PRESUBMIT_ARGS= builds the image too, PRESUBMIT_ARGS="--space-url https://NAME.hf.space" checks a Space.
PRESUBMIT_ARGS ?= --skip-docker

presubmit: install-dev
	$(PY) scripts/pre_submission_check.py $(PRESUBMIT_ARGS)

# mypy on the package as `llmserve_env` (the repository root is the package: a link in a temporary
# folder gives it its import name). Configured in pyproject.toml ([tool.mypy]).
typecheck: install-dev
	@link=$$(mktemp -d) && ln -s "$(CURDIR)" "$$link/llmserve_env" && \
	MYPYPATH=$$link $(VENV)/bin/mypy -p llmserve_env; rc=$$?; rm -rf "$$link"; exit $$rc

lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/hadolint Dockerfile

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
