#!/usr/bin/env bash
# make docs: the site from docs/ plus the reference pages generated from the code (scripts/docs/gen_reference.py),
# built with MkDocs + Material from Debian packages into build/docs/site. CHECK=1 also opens every page in
# headless Chromium and checks links, anchors, empty pages and the flag coverage (scripts/docs/check_site.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=/usr/bin/python3
need=()
for p in mkdocs mkdocs-material; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p"); done
if [[ ${CHECK:-0} = 1 ]]; then for p in chromium python3-websocket; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p"); done; fi
if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then echo "docs: missing Debian packages: ${need[*]} (sudo apt-get install ${need[*]})" >&2; exit 1; fi
  echo "docs: installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
src=build/docs/src
rm -rf build/docs && mkdir -p "$src"
cp -r docs/. "$src/"
cp CHANGELOG.md "$src/changelog.md"
PYTHONPATH=clients/python $PY scripts/docs/gen_reference.py bin/ibvbridge "$src/reference"
mv "$src/reference/cli-flags.json" build/docs/cli-flags.json
$PY -m mkdocs build -q -f mkdocs.yml
echo "docs: built build/docs/site ($(find build/docs/site -name '*.html' | wc -l) pages)"
if [[ ${CHECK:-0} = 1 ]]; then
  $PY scripts/docs/check_site.py build/docs/site build/docs/cli-flags.json
fi
