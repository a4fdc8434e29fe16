#!/usr/bin/env bash
# The Debian packages end to end (make test-deb, part of make test): lintian passes them (each remaining
# tag is overridden with its reason in deploy/debian/*.lintian-overrides); dpkg installs all four; the
# installed files are where Debian puts them; the demo runs from the installed paths only (a clean
# environment, an empty working directory, no source tree on any path); purge leaves nothing behind: no
# file of the packages, no __pycache__, no user or group, no dpkg state.
# Needs root and dpkg; refuses to touch a machine where ibvbridge packages are already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
DEBS=${DEBS:-build/deb}
SONAME=$(sed -n 's/^SONAME *:= *//p' clients/c/Makefile) # libibvbridge.so.N: the library's package is libibvbridgeN
LIB=libibvbridge${SONAME##*.so.}
PKGS=(ibvbridge "$LIB" libibvbridge-dev python3-ibvbridge)
say() { printf 'test-deb: %s\n' "$*"; }
fail() { say "FAIL: $*" >&2; exit 1; }

if [[ $(id -u) -ne 0 ]]; then say "SKIP: not root (dpkg -i needs root)"; exit 0; fi
if ! command -v dpkg >/dev/null; then say "SKIP: no dpkg on this machine"; exit 0; fi
for p in "${PKGS[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -qv 'not-installed'; then
    say "SKIP: $p is already installed here ($(dpkg-query -W -f='${Status}' "$p")): not replacing it"
    exit 0
  fi
done
debs=()
for p in "${PKGS[@]}"; do
  f=$(ls -t "$DEBS/${p}"_*.deb 2>/dev/null | head -n 1)
  [[ -n $f ]] || fail "no $DEBS/${p}_*.deb: run make deb"
  debs+=("$f")
done
passed=0
ok() { passed=$((passed + 1)); say "ok: $*"; }

if command -v lintian >/dev/null; then
  # --fail-on warning: an error or a warning not overridden fails; info tags are printed only.
  lt=$(mktemp -d)  # lintian's own temporary files (its MLDBM caches) go here, and go with it
  if ! out=$(TMPDIR=$lt lintian --fail-on error,warning --tag-display-limit 0 "${debs[@]}" 2>&1); then
    rm -rf "$lt"
    echo "$out" >&2
    fail "lintian"
  fi
  rm -rf "$lt"
  out=$(grep -v "running with root privileges" <<<"$out" || true)
  [[ -n $out ]] && echo "$out" | sed "s/^/  lintian: /"
  ok "lintian: no error or warning that is not overridden with its reason"
else
  say "lintian not installed (apt-get install lintian): not checked"
fi

work=$(mktemp -d)
passwd0=$(sha256sum /etc/passwd /etc/group)
installed=0
cleanup() {
  local rc=$?
  if ((installed)); then dpkg --purge "${PKGS[@]}" >/dev/null 2>&1 || true; fi
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT

dpkg -i "${debs[@]}" >"$work/dpkg-i.log" 2>&1 || { cat "$work/dpkg-i.log" >&2; installed=1; fail "dpkg -i"; }
installed=1
for p in "${PKGS[@]}"; do dpkg -L "$p"; done | sort -u >"$work/files"
for p in "${PKGS[@]}"; do
  [[ $(dpkg-query -W -f='${Status}' "$p") == "install ok installed" ]] || fail "$p: $(dpkg-query -W -f='${Status}' "$p")"
done
ok "dpkg -i: ${PKGS[*]} installed ($(wc -l <"$work/files") paths)"

MA=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
so=$(readlink "/usr/lib/$MA/$SONAME") || fail "no /usr/lib/$MA/$SONAME link"
[[ -f /usr/lib/$MA/$so ]] || fail "$SONAME points at a missing $so"
[[ $(readlink "/usr/lib/$MA/libibvbridge.so") == "$SONAME" ]] || fail "the dev link libibvbridge.so does not point at the soname"
ldconfig -p | grep -Eq "$SONAME .*=> (/usr)?/lib/$MA/$SONAME\$" || fail "ldconfig does not know $SONAME"
[[ $(objdump -p "/usr/lib/$MA/$SONAME" | awk '/SONAME/{print $2}') == "$SONAME" ]] || fail "SONAME"
ok "$LIB: /usr/lib/$MA/$SONAME -> $so, in ldconfig's cache; libibvbridge-dev's link"

[[ $(pkg-config --variable=libdir ibvbridge) == /usr/lib/$MA ]] || fail "ibvbridge.pc's libdir is $(pkg-config --variable=libdir ibvbridge)"
cat >"$work/use.c" <<'C'
#include <ibvbridge.h>
#include <errno.h>
int main(void) { struct ibvb_ring *r; return ibvb_attach(&r, "test-deb-no-such-ring", 0) == -ENOENT ? 0 : 1; }
C
# shellcheck disable=SC2046 # pkg-config's words
cc -std=c11 "$work/use.c" -o "$work/use" $(pkg-config --cflags --libs ibvbridge) || fail "building against the installed headers and .pc"
objdump -p "$work/use" | grep -q "NEEDED *$SONAME" || fail "the program does not link $SONAME dynamically"
IBVBRIDGE_RING_DIR=$work/none "$work/use" || fail "the program linked against the installed library did not run"
ok "pkg-config ibvbridge: a C program builds against /usr/include and links $SONAME; it runs"

py=$(cd "$work" && env -i PATH=/usr/bin:/bin /usr/bin/python3 -c 'import ibvbridge, ibvbridge.ring, numpy; print(ibvbridge.__file__)')
[[ $py == /usr/lib/python3/dist-packages/ibvbridge/__init__.py ]] || fail "python3 imports ibvbridge from $py"
grep -q '/usr/lib/python3/dist-packages/ibvbridge/__pycache__/' "$work/files" && fail "__pycache__ shipped in the package"
ls /usr/lib/python3/dist-packages/ibvbridge/__pycache__/*.pyc >/dev/null 2>&1 || fail "postinst did not byte-compile the package (py3compile)"
/usr/bin/ibvbridge-consume --help >/dev/null || fail "/usr/bin/ibvbridge-consume --help"
ok "python3-ibvbridge: import ibvbridge from /usr/lib/python3/dist-packages, byte-compiled by postinst; ibvbridge-consume runs"

unit=/lib/systemd/system/ibvbridge@.service
grep -q '^ExecStart=/usr/bin/ibvbridge recv' $unit || fail "$unit does not start /usr/bin/ibvbridge"
if command -v systemd-analyze >/dev/null; then
  out=$(systemd-analyze verify --man=no "$unit" 2>&1 || true)
  [[ -z $out ]] || fail "systemd-analyze verify $unit: $out"
fi
getent passwd ibvbridge >/dev/null && getent group ibvbridge >/dev/null || fail "postinst did not create the ibvbridge user and group"
[[ -e /etc/sysctl.d/60-ibvbridge.conf ]] && fail "the package enabled the hugepage sysctl by itself"
[[ -f /usr/share/ibvbridge/sysctl.d/60-ibvbridge.conf ]] || fail "no sysctl file for the administrator to enable"
ok "ibvbridge: unit verified at /usr/bin, user and group made, sysctl shipped but not enabled"

# The demo from the installed paths: an empty directory, a clean environment, its own ring directory.
mkdir -m 0700 "$work/run" "$work/rings"
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
if ! (cd "$work/run" && env -i PATH=/usr/bin:/bin HOME="$work/run" IBVBRIDGE_RING_DIR="$work/rings" DEMO_PORT="$port" \
  bash /usr/share/ibvbridge/demo/demo.sh >"$work/demo.out" 2>&1); then
  cat "$work/demo.out" >&2
  fail "the installed demo"
fi
# UDP on a loaded machine may lose packets in the kernel (recv counts them); what recv published, the
# consumer must have read, to the stream's stop.
published=$(sed -n 's/.*result stream_stop, packets [0-9]*, heaps \([0-9]*\),.*/\1/p' "$work/demo.out")
[[ -n $published ]] || { cat "$work/demo.out" >&2; fail "the installed demo's recv did not end at the stream's stop"; }
grep -q "^end of stream: $published heaps" "$work/demo.out" ||
  { cat "$work/demo.out" >&2; fail "the installed demo's Python consumer did not read the $published heaps recv published"; }
grep -Eq '(^|[^A-Z])FAILED' "$work/demo.out" && { cat "$work/demo.out" >&2; fail "a pipeline stage FAILED"; }
grep -q -- '/work\|clients/python\|bin/ibvbridge ' "$work/demo.out" && say "note: the demo's output names a path: $(grep -m1 -- '/work\|clients/python' "$work/demo.out")"
ok "the installed demo: recv → Python consumer, and the pipeline with the C stage built through pkg-config"
grep -E '^end of stream|result stream_stop|^  OK' "$work/demo.out" | sed 's/^ */  demo: /' || true

dpkg --purge "${PKGS[@]}" >"$work/purge.log" 2>&1 || { cat "$work/purge.log" >&2; fail "dpkg --purge"; }
installed=0
grep -i 'warning' "$work/purge.log" && fail "dpkg --purge warned (a directory not empty?)"
left=()
while IFS= read -r f; do
  [[ -e $f || -L $f ]] || continue
  [[ -d $f ]] && continue # a directory other packages share (/., /lib, /usr/bin …); ours are checked below
  left+=("$f")
done <"$work/files"
((${#left[@]} == 0)) || fail "left behind after purge: ${left[*]}"
for f in /usr/lib/python3/dist-packages/ibvbridge /usr/lib/python3/dist-packages/ibvbridge-*.dist-info /etc/ibvbridge /run/ibvbridge \
  /usr/share/ibvbridge /usr/share/doc/{ibvbridge,"$LIB",libibvbridge-dev,python3-ibvbridge}; do
  [[ -e $f ]] && fail "$f left behind after purge"
done
[[ $(sha256sum /etc/passwd /etc/group) == "$passwd0" ]] || fail "/etc/passwd or /etc/group differ after purge"
for p in "${PKGS[@]}"; do
  st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ -z $st || $st == *not-installed* ]] || fail "$p still known to dpkg: $st"
done
ok "dpkg --purge: none of the $(wc -l <"$work/files") paths left (but shared directories), no user, group or dpkg state"
echo "test-deb: $passed passed, 0 failed"
