#!/bin/bash
# What a ring of small slots rides out: recv takes 200 000 heaps of 1 KiB at 0.8 Gb/s (100 000 heaps/s)
# into 1 KiB slots, a C consumer reads them and is stopped (SIGSTOP) for PAUSE_MS in the middle; recv's
# dropped_heaps says what the pause cost. SLOTS: a slot count (--slots), or "auto" (recv's default for
# the slot size). Loopback only; everything it makes is in a temporary directory, removed at the end.
#
#   scripts/pause-consumer.sh 128      # the old default
#   scripts/pause-consumer.sh auto     # 16384 slots of 1 KiB
set -eu
slots=${1:?usage: scripts/pause-consumer.sh SLOTS|auto [PAUSE_MS]}
pause_ms=${2:-50}
port=${PORT:-47123}
cd "$(dirname "$0")/.."
d=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$d"' EXIT
extra=()
[ "$slots" != auto ] && extra=(--slots "$slots")
bin/ibvbridge recv --ring pause --dir "$d" --slot-size 1K --hugepages off "${extra[@]}" --log-format json \
	"127.0.0.1:$port" >"$d/recv.out" 2>"$d/recv.err" &
rp=$!
pids+=("$rp")
for _ in $(seq 100); do [ -S "$d/pause.v2.sock" ] && break; sleep 0.05; done
clients/c/build/ibvb-consume --ring "$d/pause.v2.sock" --timeout-ms 10000 >"$d/consume.out" &
cp=$!
pids+=("$cp")
sleep 0.3
bin/ibvbridge send --heap-size 1024 --rate 0.8 --heaps 200000 "127.0.0.1:$port" >/dev/null 2>&1 &
sp=$!
pids+=("$sp")
sleep 0.8
kill -STOP "$cp"
sleep "$(awk "BEGIN{print $pause_ms/1000}")"
kill -CONT "$cp"
wait "$sp"
sleep 0.5
kill -INT "$rp" 2>/dev/null || true
wait "$rp" || true
slotsline=$(grep -oh '"slots":[0-9]*' "$d/recv.err" "$d/recv.out" | head -1)
tail -1 "$d/recv.out" | python3 -c '
import json, sys
j = json.load(sys.stdin)
print(sys.argv[1], "heaps", j["heaps"], "dropped_heaps", j["dropped_heaps"],
      "kernel_drops", j["transport_counters"]["kernel_drops"])' "$slotsline"
