#!/usr/bin/env bash
# make soak: SOAK_SECONDS (default 600) of `send` → `recv` on loopback with consumers killed (SIGKILL) and
# restarted every few seconds, in three languages in turn, and the producer restarted twice (the run is
# three recv lifetimes). It checks what an operator needs from an unattended receiver:
#   - every heap sent is accounted for by recv's counters: published + dropped + discarded incomplete
#     (with no kernel drops, exactly; kernel drops are reported, since a heap lost whole in the kernel is
#     invisible to any receiver);
#   - a consumer's death never stalls or crashes recv, and the last consumer of each lifetime reads to the
#     end of stream with every byte verified;
#   - recv's resident memory stays flat (the largest sample after the first 20 s within 10 % + 4 MiB of the
#     first one).
# It prints one line per lifetime and a summary, and exits non-zero if a check fails. Not part of make test.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=bin/ibvbridge
PY=/usr/bin/python3
CCONS=clients/c/build/ibvb-consume
SECONDS_TOTAL=${SOAK_SECONDS:-600}
RATE=${SOAK_RATE:-0.5}          # Gb/s offered
HEAP=${SOAK_HEAP_SIZE:-65536}
PORT=${SOAK_PORT:-7159}
RING=soak-$$
export PYTHONPATH=clients/python PYENV_VERSION=system

[[ -x $BIN && -x $CCONS ]] || { echo "soak: run make build first" >&2; exit 1; }
work=$(mktemp -d)
pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  "$BIN" rm "$RING" >/dev/null 2>&1 || true
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_consumer KIND OUT: start one consumer of the ring in the background (a child of this shell, so it
# can be waited for); its pid is in $cons, its stderr in OUT.err.
start_consumer() {
  local kind=$1 out=$2
  case $kind in
  go) "$BIN" consume --ring "$RING" --verify --timeout-ms 5000 >"$out" 2>"$out.err" & ;;
  c) "$CCONS" --ring "$RING" --verify --timeout-ms 5000 >"$out" 2>"$out.err" & ;;
  python) "$PY" -m ibvbridge.consume --ring "$RING" --verify --timeout-ms 5000 >"$out" 2>"$out.err" & ;;
  esac
  cons=$!
}

json() { "$PY" -c 'import json,sys; d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print(eval(sys.argv[2], {}, d))' "$@"; }

segment=$((SECONDS_TOTAL / 3))
heaps=$("$PY" -c "print(max(100, int($RATE * 1e9 / 8 / $HEAP * $segment)))")
failed=0
kinds=(go c python)
for life in 1 2 3; do
  "$BIN" recv --ring "$RING" --slots 256 --slot-size $((HEAP + 4096)) --hugepages off --log-format json \
    "127.0.0.1:$PORT" >"$work/recv$life.json" 2>"$work/recv$life.log" &
  recv=$!
  pids+=("$recv")
  for _ in $(seq 100); do grep -q '"receiving"' "$work/recv$life.log" && break; sleep 0.1; done
  "$BIN" send "127.0.0.1:$PORT" --heaps "$heaps" --heap-size "$HEAP" --rate "$RATE" --pattern --json \
    >"$work/send$life.json" 2>&1 &
  send=$!
  pids+=("$send")
  rss=() kills=0 k=0 start=$SECONDS
  start_consumer "${kinds[k % 3]}" "$work/cons$life-$k.json"
  while kill -0 "$send" 2>/dev/null; do
    sleep $((2 + RANDOM % 4))
    rss+=("$(ps -o rss= -p "$recv" 2>/dev/null || echo 0)")
    kill -0 "$send" 2>/dev/null || break
    kill -9 "$cons" 2>/dev/null || true
    wait "$cons" 2>/dev/null || true
    kills=$((kills + 1)) k=$((k + 1))
    start_consumer "${kinds[k % 3]}" "$work/cons$life-$k.json"
  done
  wait "$send"
  # The last consumer reads to the end of stream; recv exits once the stop heap is in.
  for _ in $(seq 300); do kill -0 "$recv" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$recv" 2>/dev/null; then
    echo "soak: lifetime $life: recv did not stop after the stream stop" >&2
    failed=1
    kill -INT "$recv"
  fi
  wait "$recv" || { echo "soak: lifetime $life: recv exited non-zero: $(tail -3 "$work/recv$life.log")" >&2; failed=1; }
  wait "$cons" 2>/dev/null || true
  pub=$(json "$work/recv$life.json" 'heaps')
  drop=$(json "$work/recv$life.json" 'dropped_heaps')
  disc=$(json "$work/recv$life.json" 'discarded_incomplete_heaps')
  kdrop=$(json "$work/recv$life.json" 'transport_counters["kernel_drops"]')
  last=$(json "$work/cons$life-$k.json" 'f"{result} verify_errors={verify_errors} heaps={heaps} {error}"' 2>/dev/null ||
    echo "no output; stderr: $(tail -c 300 "$work/cons$life-$k.json.err")")
  last="$last (${kinds[k % 3]})"
  read -r rmin rmax < <(printf '%s\n' "${rss[@]:4}" "${rss[0]:-0}" | sort -n | sed -n '1p;$p' | paste -sd' ')
  accounted=$((pub + drop + disc))
  echo "lifetime $life: sent $heaps heaps in $((SECONDS - start)) s; published $pub + dropped $drop + discarded $disc = $accounted; kernel drops $kdrop packets; consumers killed $kills; last consumer: $last; recv RSS ${rss[0]:-?}..$rmax KiB"
  if ((kdrop == 0 && accounted != heaps)); then echo "soak: lifetime $life: $((heaps - accounted)) heaps unaccounted" >&2; failed=1; fi
  if ((kdrop > 0 && accounted > heaps)); then echo "soak: lifetime $life: more heaps counted than sent" >&2; failed=1; fi
  [[ $last == eos\ verify_errors=0* ]] || { echo "soak: lifetime $life: the last consumer did not read to the end cleanly" >&2; failed=1; }
  if ((rmax > ${rss[0]:-0} * 11 / 10 + 4096)); then echo "soak: lifetime $life: recv RSS grew from ${rss[0]} to $rmax KiB" >&2; failed=1; fi
done
((failed == 0)) && echo "soak: passed" || { echo "soak: FAILED" >&2; exit 1; }
