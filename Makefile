# Two commands do all set-up on a fresh machine (Python 3.11+ with venv):
#   make serve   -> the server in sim mode on port 7860 (no key needed)
#   make test    -> the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: serve test install install-dev lint bench clean

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

serve: install
	LLMSERVE_MODE=$${LLMSERVE_MODE:-sim} $(PY) -m llmserve_env.server.serving --host 0.0.0.0 --port $${PORT:-7860}

test: install-dev
	$(VENV)/bin/pytest -q

lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/hadolint Dockerfile

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
