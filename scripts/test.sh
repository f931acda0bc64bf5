#!/usr/bin/env bash
# Set up .venv (PyTorch's CPU build, every input format's extra) and run the whole test suite: `scripts/test.sh`.
set -euo pipefail
. "$(dirname "$0")/_venv.sh" "dev,torch,all-formats,integrations"
cd "$root"
exec "$root/.venv/bin/python" -m pytest -q "$@"
