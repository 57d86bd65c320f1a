#!/usr/bin/env bash
# Installs what tests/test_dashboard_browser.py needs on a fresh Debian machine: Debian's Chromium
# and Playwright for Python. `playwright install` downloads a browser build and cannot work
# offline, so the test launches /usr/bin/chromium through Playwright's executable_path instead.
# Playwright itself is in the `dev` extra (pyproject.toml); it is installed here only for a venv
# made without it. Idempotent: on a machine that has both, it only prints their versions.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v chromium > /dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core > /dev/null
fi

venv="${VENV:-.venv}"
if ! "$venv/bin/python" -c 'import playwright.sync_api' 2> /dev/null; then
  "$venv/bin/python" -m pip install -q "playwright>=1.40"
fi

# Debian's chromium wrapper script prints a harmless shell warning on some hosts: keep stderr out.
chromium --version 2> /dev/null || true
"$venv/bin/python" -c 'from importlib.metadata import version; print("playwright", version("playwright"))'
