#!/bin/bash
# install_test.sh — `make install PREFIX=…` after an earlier build installs a .pc that names that prefix,
# and a program built with nothing but `pkg-config --cflags --libs ibvbridge` against the installed copy
# (shared library, no rpath of its own, no LD_LIBRARY_PATH) compiles, links and runs: the .pc carries the
# rpath for a prefix outside the loader's directories. Its pkg-config version is ibvbridge's one version. Run from clients/c by `make test`; everything lands in a temporary directory, removed.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d /tmp/ibvb-install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }
make -s all >/dev/null                               # the earlier build, default PREFIX
make -s install PREFIX="$tmp/prefix" >/dev/null
pc="$tmp/prefix/lib/pkgconfig/ibvbridge.pc"
[ -f "$pc" ] || fail "no $pc"
grep -qx "prefix=$tmp/prefix" "$pc" || fail ".pc says $(grep '^prefix=' "$pc"), want prefix=$tmp/prefix"
grep -qx "includedir=$tmp/prefix/include" "$pc" || fail ".pc says $(grep '^includedir=' "$pc")"
cat > "$tmp/use.c" <<'C'
#include <ibvbridge.h>
#include <stdio.h>
int main(void) { struct ibvb_ring *r; return ibvb_attach(&r, "install-test-no-such-ring", 0) == -ENOENT ? 0 : 1; }
C
flags=$(PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --cflags --libs ibvbridge)
# shellcheck disable=SC2086 # the flags are words
env -u LD_LIBRARY_PATH cc -std=c11 "$tmp/use.c" -o "$tmp/use" $flags || fail "build against the installed library: $flags"
readelf -d "$tmp/use" | grep -q "NEEDED.*libibvbridge.so" || fail "not linked against the shared library"
env -u LD_LIBRARY_PATH "$tmp/use" || fail "the program built with pkg-config's flags alone did not run: $flags"
want=$(sed -n 's/^const Version = "\(.*\)"/\1/p' ../../internal/version/version.go)
got=$(PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --modversion ibvbridge)
[ "$got" = "$want" ] || fail "pkg-config version $got, ibvbridge is $want"
echo "install_test: ok (.pc follows PREFIX after an earlier build; pkg-config build against it runs)"
