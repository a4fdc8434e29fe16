#!/usr/bin/env bash
# Builds the two container images of ibvbridge without a container engine and without pulling anything
# (make images): each root filesystem is unpacked (dpkg-deb -x) from exactly the Debian packages it needs
# (apt-get download) and from this tree's own packages (make deb), checked (every ELF file's libraries
# resolve inside it, the Python imports work inside it), then written as an OCI image layout by
# deploy/images/mkimage (go-containerregistry): root-owned files dated SOURCE_DATE_EPOCH in byte order, so
# the same packages give the same digest.
#
#   ibvbridge-recv      /usr/bin/ibvbridge, glibc, rdma-core's libibverbs1 and providers (the ibverbs
#                       transport loads them at run time), nothing else: no shell, no package manager.
#   ibvbridge-python    python3.11 with its standard library, numpy (reference BLAS/LAPACK), the ibvbridge
#                       Python package and libibvbridgeN: the base of a Python consumer.
#
# Both run as 65532:65532 (ibvbridge) by default; /run/ibvbridge is theirs, for the ring directory volume.
# OUT (default build/images) gets recv/ and python/ (OCI layouts) and digests.json.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
ROOT=$PWD
OUT=${OUT:-$ROOT/build/images}
DEBS=${DEBS:-$ROOT/build/deb}
APT_CACHE=${APT_CACHE:-$ROOT/build/images/apt}
log() { printf 'build-images: %s\n' "$*"; }
die() { printf 'build-images: %s\n' "$*" >&2; exit 1; }

RECV_DEBIAN=(libc6 libgcc-s1 libibverbs1 ibverbs-providers libnl-3-200 libnl-route-3-200)
PYTHON_DEBIAN=(libc6 libgcc-s1 python3-minimal python3.11-minimal libpython3.11-minimal libpython3.11-stdlib
  libffi8 zlib1g libexpat1 libbz2-1.0 liblzma5 python3-numpy libblas3 liblapack3 libgfortran5 libquadmath0)

export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
REVISION=${REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
own_deb() { # package name → newest matching .deb of make deb
  local f
  f=$(ls -t "$DEBS/$1"_*.deb 2>/dev/null | head -n 1)
  [[ -n $f ]] || die "no $DEBS/$1_*.deb: run make deb first"
  echo "$f"
}
VERSION=$(dpkg-deb -f "$(own_deb ibvbridge)" Version)

# apt-get download of exactly these packages, once (the cache keeps them: same inputs, same digest).
mkdir -p "$APT_CACHE"
need=()
for p in $(printf '%s\n' "${RECV_DEBIAN[@]}" "${PYTHON_DEBIAN[@]}" | sort -u); do
  ls "$APT_CACHE/${p}"_*.deb >/dev/null 2>&1 || need+=("$p")
done
if ((${#need[@]})); then
  log "apt-get download ${need[*]}"
  if ! (cd "$APT_CACHE" && apt-get download -q "${need[@]}" >/dev/null 2>&1); then
    apt-get update -qq || true
    (cd "$APT_CACHE" && apt-get download -q "${need[@]}" >/dev/null) || die "apt-get download ${need[*]} failed"
  fi
fi
debian_deb() { ls "$APT_CACHE/$1"_*.deb | sort -V | tail -n 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go build -C deploy/images -o "$work/mkimage" ./mkimage

# unpack DIR DEB...: the packages' files, without documentation, manuals, locales or lintian data.
unpack() {
  local dir=$1 d
  shift
  mkdir -p "$dir"
  for d in "$@"; do dpkg-deb -x "$d" "$dir"; done
  rm -rf "$dir"/usr/share/{doc,man,info,lintian,locale,bug,doc-base,gdb} "$dir"/usr/lib/python3/dist-packages/*.dist-info/direct_url.json
  find "$dir" -depth -type d -empty -delete
}

# The system layer's own files: users, /tmp, the ring directory's mount point.
etc_layer() { # DIR
  local d=$1
  mkdir -p "$d/etc" "$d/tmp" "$d/run/ibvbridge" "$d/home/ibvbridge"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nibvbridge:x:65532:65532:ibvbridge:/home/ibvbridge:/sbin/nologin\n' >"$d/etc/passwd"
  printf 'root:x:0:\nibvbridge:x:65532:\n' >"$d/etc/group"
  chmod 1777 "$d/tmp"
  chmod 0755 "$d/run/ibvbridge" "$d/home/ibvbridge"
}

# check_libs ROOTFS: every ELF file's needed libraries resolve inside ROOTFS (its own loader, chrooted).
check_libs() {
  local r=$1 label=$2 f out bad=0 n=0
  [[ $(id -u) -eq 0 ]] || { log "not root: library check skipped (needs chroot)"; return 0; }
  while IFS= read -r -d '' f; do
    head -c 4 "$f" | grep -q $'^\x7fELF' || continue
    n=$((n + 1))
    out=$(chroot "$r" /lib64/ld-linux-x86-64.so.2 --list "/${f#"$r"/}" 2>&1) || true
    if grep -q 'not found' <<<"$out"; then
      echo "  ${f#"$r"}: $(grep 'not found' <<<"$out" | tr -s ' \t\n' ' ')" >&2
      bad=1
    fi
  done < <(find "$r" -type f \( -perm -u+x -o -name '*.so*' \) -print0)
  ((bad == 0)) || die "$label: libraries missing (above)"
  log "$label: the needed libraries of all $n ELF files resolve inside the image"
}

manifest=()
build() { # NAME TAG ENTRYPOINT CMD DEBIAN-PKGS... -- OWN-PKGS...
  local name=$1 tag=$2 entry=$3 cmd=$4
  shift 4
  local debian=() own=() p into=debian
  for p in "$@"; do
    if [[ $p == -- ]]; then into=own; continue; fi
    if [[ $into == debian ]]; then debian+=("$(debian_deb "$p")"); else own+=("$(own_deb "$p")"); fi
  done
  local r=$work/$name
  unpack "$r/debian" "${debian[@]}"
  unpack "$r/own" "${own[@]}"
  etc_layer "$r/etc"
  case $name in
  recv) # the binary only: the C tools and the demo are the Debian package's, not the image's
    find "$r/own" -mindepth 1 -maxdepth 3 ! -path "$r/own/usr" ! -path "$r/own/usr/bin" ! -path "$r/own/usr/bin/ibvbridge" -exec rm -rf {} +
    ;;
  python) # what update-alternatives would make for the BLAS and LAPACK numpy loads
    ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
    ln -s blas/libblas.so.3 "$r/debian/usr/lib/$ma/libblas.so.3"
    ln -s lapack/liblapack.so.3 "$r/debian/usr/lib/$ma/liblapack.so.3"
    ;;
  esac
  # The checks run on the merged tree (a copy: nothing they do reaches the layers).
  mkdir -p "$r/check"
  cp -a "$r/debian/." "$r/own/." "$r/etc/." "$r/check/"
  check_libs "$r/check" "$name"
  if [[ $name == python && $(id -u) -eq 0 ]]; then
    chroot --userspec=65532:65532 "$r/check" /usr/bin/python3 -c \
      'import ibvbridge, ibvbridge.ring, ibvbridge.producer, ibvbridge.chunks, ibvbridge.consume, ibvbridge.aio, numpy; numpy.fft.rfft(numpy.ones(8)); numpy.linalg.inv(numpy.eye(2)); print("python", ibvbridge.__file__, "numpy", numpy.__version__)' |
      sed 's/^/build-images: python: imports: /' || die "python: the imports fail inside the image"
  fi
  if [[ $name == recv && $(id -u) -eq 0 ]]; then
    # devices dlopens libibverbs.so.1 and asks it for RDMA devices: it fails if the library or its own
    # dependencies are missing, and says there are none on a machine without them.
    out=$(chroot --userspec=65532:65532 "$r/check" /usr/bin/ibvbridge devices 2>&1) || die "recv: ibvbridge devices inside the image: $out"
    log "recv: /usr/bin/ibvbridge devices, as 65532 inside the image (libibverbs loaded): ${out:0:120}"
  fi
  local caps="udp: none (IPC_LOCK lets it lock ring memory); xdp: NET_ADMIN NET_RAW BPF IPC_LOCK; ibv: NET_RAW NET_ADMIN IPC_LOCK"
  "$work/mkimage" -out "$OUT/$name" -tag "$tag:${VERSION//+/-}" -entrypoint "$entry" -cmd "$cmd" -user 65532:65532 \
    -layer "debian=$r/debian" -layer "ibvbridge=$r/own" -layer "etc=$r/etc" \
    -owner run/ibvbridge=65532:65532 -owner home/ibvbridge=65532:65532 \
    -env PATH=/usr/local/bin:/usr/bin:/bin -env IBVBRIDGE_RING_DIR=/run/ibvbridge/rings \
    -label "org.opencontainers.image.title=$tag" -label "org.opencontainers.image.version=$VERSION" \
    -label "org.opencontainers.image.source=https://github.com/ibvbridge/ibvbridge" \
    -label "org.opencontainers.image.revision=$REVISION" \
    -label "io.ibvbridge.capabilities=$caps" \
    -label "io.ibvbridge.debian-packages=$(for d in "${debian[@]}" "${own[@]}"; do basename "$d" .deb; done | tr '\n' ' ' | sed 's/ $//')" \
    >"$work/$name.json"
  manifest+=("\"$name\": $(cat "$work/$name.json")")
  log "$name: $tag:${VERSION//+/-} $(sed 's/.*"digest":"\([^"]*\)".*/\1/' "$work/$name.json") ($(du -sk "$OUT/$name" | cut -f1) KiB)"
}

mkdir -p "$OUT"
build recv ibvbridge-recv /usr/bin/ibvbridge "" "${RECV_DEBIAN[@]}" -- ibvbridge
LIB=libibvbridge$(sed -n 's/^SONAME *:= *libibvbridge.so.//p' clients/c/Makefile)
build python ibvbridge-python /usr/bin/python3 "" "${PYTHON_DEBIAN[@]}" -- python3-ibvbridge "$LIB"
(
  IFS=,
  printf '{%s}\n' "${manifest[*]}"
) >"$OUT/digests.json"
