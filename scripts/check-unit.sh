#!/usr/bin/env bash
# Checks deploy/systemd/ibvbridge@.service with systemd-analyze verify, pointing ExecStart at this tree's
# binary (the unit's /usr/local/bin/ibvbridge is not installed on a build machine). Part of make test.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v systemd-analyze >/dev/null; then
  echo "check-unit: SKIP: systemd-analyze not installed (Debian package systemd)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s#/usr/local/bin/ibvbridge#$PWD/bin/ibvbridge#" deploy/systemd/ibvbridge@.service >"$tmp/ibvbridge@ci.service"
out=$(systemd-analyze verify --man=no "$tmp/ibvbridge@ci.service" 2>&1 || true)
if [[ -n "$out" ]]; then
  echo "check-unit: systemd-analyze verify deploy/systemd/ibvbridge@.service:"
  echo "$out"
  exit 1
fi
echo "check-unit: deploy/systemd/ibvbridge@.service verified"
