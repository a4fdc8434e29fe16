#!/usr/bin/env bash
# Installs what ibvbridge's build, tests and demo need on a Debian machine, and says what it does.
# Needs root for apt and hugepages; without root it reports what is missing and carries on.
set -euo pipefail

log() { printf 'setup: %s\n' "$*"; }

APT_PACKAGES=(gcc make pkg-config libc6-dev python3 python3-numpy python3-pytest mypy python3-pip python3-setuptools
  python3-wheel libibverbs-dev iproute2 systemd
  dpkg-dev file binutils lintian podman runc)  # the last line: make deb, make images and their tests (docs/deploy.md)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    log "missing Debian packages: ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})"
    exit 1
  fi
  log "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then export PATH=$PATH:/usr/local/go/bin; fi
command -v go >/dev/null 2>&1 || { log "Go is not installed (need go 1.26: https://go.dev/dl)"; exit 1; }
log "downloading Go modules"
go mod download

# Hugepages back the ring's data file; without them the ring falls back to /dev/shm with a warning.
HUGEPAGES=${IBVBRIDGE_HUGEPAGES:-512}
if [[ $(id -u) -eq 0 ]]; then
  if ! mountpoint -q /dev/hugepages 2>/dev/null; then
    log "mounting hugetlbfs at /dev/hugepages"
    mkdir -p /dev/hugepages && mount -t hugetlbfs nodev /dev/hugepages || log "could not mount hugetlbfs: rings will use /dev/shm"
  fi
  have=$(cat /proc/sys/vm/nr_hugepages)
  if ((have < HUGEPAGES)); then
    log "reserving $HUGEPAGES 2 MiB hugepages (echo $HUGEPAGES > /proc/sys/vm/nr_hugepages)"
    echo "$HUGEPAGES" >/proc/sys/vm/nr_hugepages || true
  fi
else
  log "not root: hugepages not configured (rings fall back to /dev/shm); as root: echo $HUGEPAGES > /proc/sys/vm/nr_hugepages"
fi
log "ready: $(go version | cut -d' ' -f3), hugepages free $(cat /sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages 2>/dev/null || echo 0)"
