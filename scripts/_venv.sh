# Sourced by the set-up scripts: create .venv (once) and install streambatch into it.
# Usage: . scripts/_venv.sh EXTRAS   (e.g. "test,torch")
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
if [ ! -x "$root/.venv/bin/python" ]; then
  "$python" -m venv "$root/.venv"
  "$root/.venv/bin/python" -m pip install --quiet --upgrade pip
fi
pip_install() { "$root/.venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"; }
case ",$1," in
  *,torch,*)
    # the CPU build on this machine's disk; a plain "torch" would fetch a multi-GB CUDA build
    "$root/.venv/bin/python" -c "import torch" 2>/dev/null || pip_install "torch==2.13.0" ;;
esac
pip_install -e "$root[$1]"
