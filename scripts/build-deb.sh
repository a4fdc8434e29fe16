#!/usr/bin/env bash
# Builds the Debian binary packages of ibvbridge with dpkg-deb (make deb): ibvbridge (recv/send, the C
# tools, the systemd unit, docs, the demo), libibvbridgeN (the shared library, N its soname), libibvbridge-dev (headers,
# static library, .so link, ibvbridge.pc) and python3-ibvbridge (the Python client in dist-packages).
# Control data: deploy/debian. Output: OUT (default build/deb), one .deb per package.
#
# Reproducible: the same commit builds the same bytes (SOURCE_DATE_EPOCH defaults to the commit's date;
# files are owned by root and dated then; Go builds with -trimpath, C with dpkg-buildflags' file-prefix map).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
ROOT=$PWD
OUT=${OUT:-$ROOT/build/deb}
PY=/usr/bin/python3
log() { printf 'build-deb: %s\n' "$*"; }

for t in dpkg-deb dpkg-buildflags dpkg-shlibdeps dpkg-architecture; do
  command -v "$t" >/dev/null || { echo "build-deb: $t missing (Debian package dpkg-dev)" >&2; exit 1; }
done

export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
# The product's version: the Python package's (the one version a user sees), plus the commit when not tagged.
base=$(sed -n 's/^version = "\(.*\)"/\1/p' clients/python/pyproject.toml)
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
VERSION=${DEB_VERSION:-$base+git$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y%m%d).$commit}
ARCH=$(dpkg-architecture -qDEB_HOST_ARCH)
MA=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
SONAME=$(sed -n 's/^SONAME *:= *//p' clients/c/Makefile)          # libibvbridge.so.N
SOVER=${SONAME##*.so.}
LIB=libibvbridge$SOVER                                             # the library's package: named after its soname
PACKAGES=(ibvbridge "$LIB" libibvbridge-dev python3-ibvbridge)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
st=$work/stage
for p in "${PACKAGES[@]}"; do mkdir -p "$st/$p"; done
mkdir -p "$OUT"
rm -f "$OUT"/{ibvbridge,libibvbridge[0-9]*,libibvbridge-dev,python3-ibvbridge}_*.deb # an earlier build's

# Hardening and reproducibility flags as Debian builds its own packages.
# Go's -trimpath does what their file-prefix map does, and the cgo flags go into the binary's build
# information: without the map they name no directory.
export DEB_BUILD_MAINT_OPTIONS=hardening=+all
nomap() { sed 's/ *-ffile-prefix-map=[^ ]*//g'; }

log "Go binary (version $VERSION)"
CGO_CFLAGS="$(dpkg-buildflags --get CFLAGS | nomap)" CGO_LDFLAGS="$(dpkg-buildflags --get LDFLAGS)" go build -trimpath -buildvcs=false -buildmode=pie \
  -ldflags="-s -w -buildid=" -o "$st/ibvbridge/usr/bin/ibvbridge" ./cmd/ibvbridge

log "C library and tools"
cp -r clients/c "$work/c"
rm -rf "$work/c/build"
(cd "$work/c" && eval "$(dpkg-buildflags --export=sh)" &&
  make -s install DESTDIR="$st/libibvbridge-dev" PREFIX=/usr LIBDIR="/usr/lib/$MA" >/dev/null)
dev=$st/libibvbridge-dev
mkdir -p "$st/$LIB/usr/lib/$MA" "$st/ibvbridge/usr/bin"
mv "$dev/usr/lib/$MA/$SONAME".* "$dev/usr/lib/$MA/$SONAME" "$st/$LIB/usr/lib/$MA/"
mv "$dev/usr/bin/ibvb-consume" "$dev/usr/bin/ibvb-produce" "$st/ibvbridge/usr/bin/"
rmdir "$dev/usr/bin"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$st/$LIB/usr/lib/$MA/$SONAME".*
chmod 0644 "$st/$LIB/usr/lib/$MA/$SONAME".*
strip --remove-section=.comment --remove-section=.note "$st/ibvbridge/usr/bin/ibvb-consume" "$st/ibvbridge/usr/bin/ibvb-produce"
strip --strip-debug --enable-deterministic-archives "$dev/usr/lib/$MA/libibvbridge.a"

log "Python package"
cp -r clients/python "$work/py"
rm -rf "$work/py/build" "$work/py"/*.egg-info
pyst=$st/python3-ibvbridge
(cd "$work/py" && PIP_NO_INDEX=1 PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install -q --no-deps --no-build-isolation --no-compile \
  --no-warn-script-location --root "$pyst" --prefix /usr . 2>&1 | grep -v -e 'running pip as the .root' -e '^$' || true)
site=$(find "$pyst" -type d -name ibvbridge -path '*-packages/ibvbridge' | head -n 1)
[[ -n $site ]] || { echo "build-deb: pip installed no ibvbridge package under $pyst" >&2; exit 1; }
if [[ $site != "$pyst/usr/lib/python3/dist-packages/ibvbridge" ]]; then # the system's dist-packages
  mkdir -p "$pyst/usr/lib/python3/dist-packages"
  mv "$(dirname "$site")"/* "$pyst/usr/lib/python3/dist-packages/"
  find "$pyst/usr" -depth -type d -empty -delete
fi
if [[ -d $pyst/usr/local/bin ]]; then # Debian's pip puts a --prefix /usr install's scripts under /usr/local
  mkdir -p "$pyst/usr/bin"
  mv "$pyst"/usr/local/bin/* "$pyst/usr/bin/"
  rm -rf "$pyst/usr/local"
fi
[[ -d $pyst/usr/local ]] && { echo "build-deb: pip installed into /usr/local: $(find "$pyst/usr/local" -type f)" >&2; exit 1; }
# dpkg owns these files: no RECORD (pip will not remove them), no build path (direct_url.json), as dh_python3.
for d in "$pyst"/usr/lib/python3/dist-packages/*.dist-info; do
  rm -f "$d/RECORD" "$d/direct_url.json" "$d/REQUESTED"
  echo debian >"$d/INSTALLER"
done
find "$pyst" -name __pycache__ -prune -exec rm -rf {} +

log "unit, configuration examples, demo, docs"
ib=$st/ibvbridge
install -D -m 0644 /dev/stdin "$ib/lib/systemd/system/ibvbridge@.service" \
  < <(sed 's#/usr/local/bin/ibvbridge#/usr/bin/ibvbridge#; s#(README "Running#(/usr/share/doc/ibvbridge/deploy.md "Debian package"; README "Running#; s#make install-systemd#the package#' deploy/systemd/ibvbridge@.service)
install -D -m 0644 deploy/etc/sysctl.conf "$ib/usr/share/ibvbridge/sysctl.d/60-ibvbridge.conf"
install -D -m 0644 deploy/etc/example.conf "$ib/usr/share/doc/ibvbridge/examples/example.conf"
install -d -m 0755 "$ib/etc/ibvbridge"
install -D -m 0755 scripts/demo.sh "$ib/usr/share/ibvbridge/demo/demo.sh"
install -D -m 0644 clients/python/examples/print_heaps.py "$ib/usr/share/ibvbridge/demo/print_heaps.py" # run as python3 FILE
install -D -m 0755 examples/pipeline/run.sh "$ib/usr/share/ibvbridge/demo/pipeline/run.sh"
install -m 0644 examples/pipeline/peak.c examples/pipeline/spectrum.py examples/pipeline/verdict.py \
  "$ib/usr/share/ibvbridge/demo/pipeline/"
install -D -m 0644 README.md "$ib/usr/share/doc/ibvbridge/README.md"
while IFS= read -r f; do install -D -m 0644 "$f" "$ib/usr/share/doc/ibvbridge/$f"; done < <(find docs -name '*.md' | sort)
[[ -f CHANGELOG.md ]] && install -D -m 0644 CHANGELOG.md "$ib/usr/share/doc/ibvbridge/CHANGELOG.md"
install -D -m 0644 clients/c/README.md "$dev/usr/share/doc/libibvbridge-dev/README.md"
install -D -m 0644 clients/python/README.md "$pyst/usr/share/doc/python3-ibvbridge/README.md"
date_rfc=$(date -u -R -d "@$SOURCE_DATE_EPOCH")
for p in "${PACKAGES[@]}"; do
  d=$st/$p/usr/share/doc/$p
  install -D -m 0644 deploy/debian/copyright "$d/copyright"
  printf '%s (%s) unstable; urgency=medium\n\n  * Built from commit %s; the product'"'"'s history is in\n    /usr/share/doc/ibvbridge/CHANGELOG.md.gz.\n\n -- ibvbridge maintainers <maintainers@ibvbridge.org>  %s\n' \
    "$p" "$VERSION" "$commit" "$date_rfc" >"$d/changelog"
  find "$d" -name '*.md' -size +4k -exec gzip -9n {} +
  gzip -9n "$d/changelog"
done
install -D -m 0644 deploy/debian/ibvbridge.lintian-overrides "$ib/usr/share/lintian/overrides/ibvbridge"
install -D -m 0644 deploy/debian/python3-ibvbridge.lintian-overrides "$pyst/usr/share/lintian/overrides/python3-ibvbridge"

log "control data"
# What each package's ELF files link (dpkg-shlibdeps against the installed system and our own library).
mkdir -p "$work/sh/debian"
printf 'Source: ibvbridge\n\nPackage: ibvbridge\nArchitecture: any\n' >"$work/sh/debian/control"
printf 'libibvbridge %s %s (>= %s)\n' "$SOVER" "$LIB" "$VERSION" >"$work/shlibs"
shlibs_of() { # files...
  local out
  out=$(cd "$work/sh" && dpkg-shlibdeps -O -L"$work/shlibs" -l"$st/$LIB/usr/lib/$MA" "$@" 2>"$work/shlibdeps.err") ||
    { cat "$work/shlibdeps.err" >&2; echo "build-deb: dpkg-shlibdeps $*" >&2; return 1; }
  sed -n 's/^shlibs:Depends=//p' <<<"$out"
}
for p in "${PACKAGES[@]}"; do
  d=$st/$p
  mkdir -p "$d/DEBIAN"
  elves=()
  while IFS= read -r f; do file -b "$f" | grep -q '^ELF' && elves+=("$f"); done < <(find "$d" -type f ! -name '*.a' | sort)
  shl=''
  if ((${#elves[@]})); then shl=$(shlibs_of "${elves[@]}"); fi
  size=$(du -s --apparent-size -k --exclude=DEBIAN "$d" | cut -f1)
  sed "s/@SOVER@/$SOVER/g" deploy/debian/control | awk -v p="$p" 'BEGIN{RS=""; ORS="\n"} /^#/{sub(/^(#[^\n]*\n)+/,"")} $0 ~ "^Package: " p "\n"' |
    sed -e "s/@VERSION@/$VERSION/g" -e "s/@ARCH@/$ARCH/g" -e "s/@SIZE@/$size/" -e "s/@SHLIBS@/$shl/" \
      -e 's/^Depends: , /Depends: /' -e '/^Depends: $/d' >"$d/DEBIAN/control"
  for s in postinst prerm postrm triggers; do
    src=deploy/debian/$p.$s
    [[ $p == "$LIB" ]] && src=deploy/debian/libibvbridge.$s
    if [[ -f $src ]]; then install -m "$([[ $s == triggers ]] && echo 0644 || echo 0755)" "$src" "$d/DEBIAN/$s"; fi
  done
  if [[ $p == "$LIB" ]]; then install -m 0644 "$work/shlibs" "$d/DEBIAN/shlibs"; fi
  (cd "$d" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0r md5sum) >"$d/DEBIAN/md5sums"
  chmod 0644 "$d/DEBIAN/md5sums" "$d/DEBIAN/control"
  find "$d" -type d -exec chmod 0755 {} +
  find "$d" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
  deb=$OUT/${p}_${VERSION}_$(sed -n 's/^Architecture: //p' "$d/DEBIAN/control").deb
  dpkg-deb --root-owner-group -Zxz --build "$d" "$deb" >/dev/null
  log "$(basename "$deb") ($(du -k "$deb" | cut -f1) KiB)"
done
