#!/usr/bin/env bash
# A consumer group on one ring (docs/ring-layout.md §14): `ibvbridge recv` receives a SPEAD stream on
# 127.0.0.1 into ring "groups-demo"; four `ibvbridge consume --group-name work` processes share it (each heap
# read by exactly one of them) while one independent `consume` monitor reads every heap. At the end it prints
# each process's result and checks that the members' heaps add up to the monitor's, each heap once (heap
# count and heap-counter sum). Usage: examples/groups/run.sh [path/to/ibvbridge]
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-./bin/ibvbridge}
[[ -x $BIN ]] || { echo "build it first (make) or pass the binary" >&2; exit 2; }
RING=groups-demo.$$
PORT=$((20000 + $$ % 20000))
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

$BIN recv --ring "$RING" --slots 256 --slot-size 64K --policy block "127.0.0.1:$PORT" >"$work/recv.json" 2>"$work/recv.log" &
recv=$!
pids+=("$recv")
for _ in $(seq 100); do $BIN stat "$RING" >/dev/null 2>&1 && break; sleep 0.05; done
for i in 1 2 3 4; do
  $BIN consume --ring "$RING" --group-name work --verify --timeout-ms 20000 >"$work/member$i.json" &
  pids+=($!)
done
$BIN consume --ring "$RING" --verify --timeout-ms 20000 >"$work/monitor.json" &
pids+=($!)
for _ in $(seq 200); do
  [[ $($BIN stat --json "$RING" 2>/dev/null | grep -o '"state":"attached"' | wc -l) -ge 5 ]] && break
  sleep 0.05
done
$BIN stat "$RING" | grep -E 'consumers|\[' || true
$BIN send "127.0.0.1:$PORT" --heaps 20000 --heap-size 8192 --pattern --rate 0.2 >/dev/null
wait "${pids[@]:1}" || true
wait "$recv" || true
/usr/bin/python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
members = [json.load(open(f"{w}/member{i}.json")) for i in range(1, 5)]
mon = json.load(open(f"{w}/monitor.json"))
for i, m in enumerate(members, 1):
    print(f"member {i}: {m['heaps']} heaps, verify errors {m['verify_errors']}, result {m['result']}")
print(f"monitor:  {mon['heaps']} heaps, verify errors {mon['verify_errors']}, result {mon['result']}")
ok = sum(m["heaps"] for m in members) == mon["heaps"] and sum(m["heap_cnt_sum"] for m in members) == mon["heap_cnt_sum"]
print("every heap processed exactly once across the group" if ok else "MISMATCH between the group and the monitor")
sys.exit(0 if ok else 1)
PY
