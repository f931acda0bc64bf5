#!/usr/bin/env bash
# Render an HTML (or SVG) file to PNG with headless Chromium.
#
#   scripts/screenshot.sh PAGE.html OUT.png [WIDTH HEIGHT]
#
# Needs Debian's chromium package (apt-get install -y chromium) or CHROMIUM=/path/to/chrome.
set -euo pipefail
if [[ $# -lt 2 ]]; then
    echo "usage: $0 PAGE.html OUT.png [WIDTH HEIGHT]" >&2
    exit 2
fi
page=$(realpath "$1")
out=$(realpath -m "$2")
width=${3:-1200}
height=${4:-900}
browser=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)}
if [[ -z "$browser" ]]; then
    echo "$0: chromium not found; apt-get install -y chromium (or set CHROMIUM=...)" >&2
    exit 2
fi
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --hide-scrollbars --user-data-dir="$profile" --screenshot="$out" \
    --window-size="$width,$height" "file://$page" >/dev/null 2>&1
[[ -s "$out" ]] || { echo "$0: chromium wrote no $out" >&2; exit 1; }
echo "wrote $out (${width}x${height})"
