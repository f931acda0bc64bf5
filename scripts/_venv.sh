# Sourced by the set-up scripts: create .venv (once) and install streambatch into it, only when needed.
# Usage: . scripts/_venv.sh EXTRAS   (e.g. "test,torch")
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
# pip runs only when the installed command does not report the source's version, or something pip builds from
# (pyproject.toml, setup.py, the C sources, the extras asked for) changed since the last install (the stamp).
stamp="$root/.venv/.streambatch-install-${1//,/-}"
want="$(cd "$root" && cat pyproject.toml setup.py streambatch/*.c streambatch/*.h 2>/dev/null | cksum) $1"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/pyproject.toml" | head -n 1)"
installed="$("$root/.venv/bin/streambatch" --version 2>/dev/null | head -n 1 || true)"  # "streambatch X.Y.Z", then kernels
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ "${installed##* }" = "$version" ]; then
  return 0 2>/dev/null || exit 0
fi
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
printf '%s' "$want" > "$stamp"
