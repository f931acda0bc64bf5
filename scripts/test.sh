#!/usr/bin/env bash
# Set up .venv (with PyTorch's CPU build) and run the whole test suite: `scripts/test.sh`.
set -euo pipefail
. "$(dirname "$0")/_venv.sh" "dev,torch"
cd "$root"
exec "$root/.venv/bin/python" -m pytest -q "$@"
