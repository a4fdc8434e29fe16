#!/usr/bin/env bash
# The three-stage example pipeline on loopback, every stage a separate process, rings between them:
#
#   ibvbridge send --pattern ──UDP──▶ ibvbridge recv ──ring A──▶ spectrum.py (numpy FFT) ──ring B──┬─▶ peak (C)
#                                                                                                   └─▶ ibvbridge send --ring B ──UDP──▶ recv ──ring C──▶ peak (C)
#
# HEAPS (default 1000) heaps of SAMPLES (4096) 8-bit complex samples. Prints one JSON line per stage, then
# {"pipeline": ...} with the sums a test checks: every spectrum reaches the C stage on ring B and, through
# the network again (with its item descriptors), the one on ring C, byte for byte, each right by Parseval.
#
# From the source tree it builds the C stage against clients/c; installed (the Debian package's
# /usr/share/ibvbridge/demo/pipeline) against libibvbridge-dev through pkg-config.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [[ -d $here/../../clients/c ]]; then # the source tree
  cd "$here/../.."
  export PYTHONPATH=clients/python
  C_LIB=(-I clients/c clients/c/build/libibvbridge.a -lpthread)
  DEFAULT_BIN=bin/ibvbridge
else # installed: nothing written next to the installed files (no __pycache__ for dpkg to trip on)
  export PYTHONDONTWRITEBYTECODE=1
  read -ra C_LIB <<<"$(pkg-config --cflags --libs ibvbridge)"
  DEFAULT_BIN=/usr/bin/ibvbridge
fi
HEAPS=${HEAPS:-1000}
SAMPLES=${SAMPLES:-4096}
RATE=${RATE:-0.1}
BIN=${BIN:-$DEFAULT_BIN}
PY=/usr/bin/python3
export PYENV_VERSION=system
work=$(mktemp -d)
dir=$work/rings
mkdir -m 0700 "$dir"
export IBVBRIDGE_RING_DIR=$dir
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { $PY -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
p1=$(free_port); p2=$(free_port)
cc -O2 "$here/peak.c" "${C_LIB[@]}" -lm -o "$work/peak"

"$BIN" recv --ring A --slots 256 --slot-size 64K --log-format json "127.0.0.1:$p1" >"$work/recvA.json" 2>"$work/recvA.log" & pids+=($!)
while [[ ! -S $dir/A.v2.sock ]]; do sleep 0.01; done
$PY "$here/spectrum.py" --input A --output B --samples "$SAMPLES" --wait-consumers 2 >"$work/spectrum.json" 2>"$work/spectrum.log" & spectrum=$!; pids+=($spectrum)
while [[ ! -S $dir/B.v2.sock ]]; do sleep 0.01; done
"$work/peak" --ring B --check-pattern >"$work/peak.json" 2>"$work/peak.log" & peak=$!
"$BIN" recv --ring C --slots 256 --slot-size 64K --log-format json "127.0.0.1:$p2" >"$work/recvC.json" 2>"$work/recvC.log" & pids+=($!)
while [[ ! -S $dir/C.v2.sock ]]; do sleep 0.01; done
"$work/peak" --ring C --check-pattern >"$work/peakC.json" 2>"$work/peakC.log" & cons=$!
"$BIN" send --ring B "127.0.0.1:$p2" --json >"$work/relay.json" 2>"$work/relay.log" & relay=$!
for _ in $(seq 500); do  # both consumers of B attached: spectrum.py waits for them
  n=$("$BIN" stat B --json 2>/dev/null | $PY -c 'import json,sys; print(sum(c["state"]=="attached" for c in json.load(sys.stdin)["consumers"]))' 2>/dev/null || echo 0)
  [[ $n -ge 2 ]] && break
  sleep 0.02
done
"$BIN" send "127.0.0.1:$p1" --heaps "$HEAPS" --heap-size $((2 * SAMPLES)) --pattern --rate "$RATE" >/dev/null
status=0
wait "$peak" || status=1
wait "$relay" || status=1
wait "$cons" || status=1
wait "$spectrum" || status=1 # it prints its result after the end of stream its readers have already seen
for f in recvA spectrum peak relay peakC; do printf '{"stage":"%s","result":%s}\n' "$f" "$(tail -n 1 "$work/$f.json")"; done
if [[ $status != 0 ]]; then
  for f in recvA spectrum peak relay recvC peakC; do echo "== $f" >&2; tail -n 5 "$work/$f.log" >&2; done
fi
expected=$($PY - "$HEAPS" "$SAMPLES" "$here" <<'PYEOF'
import sys, numpy as np
sys.path.insert(0, sys.argv[3])
from spectrum import power_spectrum
heaps, samples = int(sys.argv[1]), int(sys.argv[2])
total = 0
for cnt in range(1, heaps + 1):
    x = ((cnt * 31 + np.arange(2 * samples)) % 256).astype(np.uint8)
    out = np.empty(samples, np.float32)
    power_spectrum(x, out)
    total = (total + int(out.view("<u8").sum(dtype=np.uint64))) % (1 << 64)
print(total)
PYEOF
)
printf '{"pipeline":{"heaps":%s,"expected_checksum":%s,"status":%s}}\n' "$HEAPS" "$expected" "$status"
exit $status
