#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the whole test suite: unit + conformance (tests/) and the
# browser end-to-end suite in headless Chromium (e2e/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# One BLAS thread: CI has 2 cores and the browser tests run beside; threaded BLAS on a busy
# machine makes small matmuls 10-100x slower.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
exec .venv/bin/python -m pytest tests e2e -q -rs "$@"
