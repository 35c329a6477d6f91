#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the whole test suite: unit + conformance (tests/) and the
# browser end-to-end suite in headless Chromium (e2e/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest tests e2e -q -rs "$@"
