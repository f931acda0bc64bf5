#!/usr/bin/env bash
# Set up .venv and print the chapter's worked epoch: `scripts/demo.sh` (add --trace for the trace).
set -euo pipefail
. "$(dirname "$0")/_venv.sh" "progress"
exec "$root/.venv/bin/streambatch" demo "$@"
