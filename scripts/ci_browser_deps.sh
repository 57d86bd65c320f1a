#!/usr/bin/env bash
# Installs what tests/test_dashboard_browser.py needs on a fresh Debian machine: Debian's Chromium
# and Playwright for Python. `playwright install` downloads a browser build and cannot work
# offline, so the test launches /usr/bin/chromium through Playwright's executable_path instead.
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
"$venv/bin/python" -m pip install -q "playwright>=1.40"

chromium --version 2> /dev/null || true; echo
"$venv/bin/python" -c 'from importlib.metadata import version; print("playwright", version("playwright"))'
