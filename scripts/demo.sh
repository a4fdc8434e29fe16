#!/usr/bin/env bash
# The whole receive path on loopback, stopping by itself: `ibvbridge recv` receives a SPEAD stream on
# 127.0.0.1 into ring "demo", the Python example consumer prints its heaps, `ibvbridge send` sends 2000
# heaps of 64 KiB (4 items, descriptors first, then a stream stop). Run by `make demo` after setup and build,
# and installed by the Debian package as /usr/share/ibvbridge/demo/demo.sh, where it uses the installed
# paths only (/usr/bin/ibvbridge, the system's ibvbridge Python package, libibvbridge-dev's pkg-config).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [[ -d $here/../clients/python ]]; then # the source tree
  cd "$here/.."
  BIN=bin/ibvbridge
  EXAMPLE=clients/python/examples/print_heaps.py
  PIPELINE=examples/pipeline
  export PYTHONPATH=clients/python
else # installed
  BIN=/usr/bin/ibvbridge
  EXAMPLE=$here/print_heaps.py
  PIPELINE=$here/pipeline
fi
RING=${DEMO_RING:-demo}
PORT=${DEMO_PORT:-7149}
PY=/usr/bin/python3
TIMEOUT=${DEMO_TIMEOUT:-30}
export PYENV_VERSION=system

[[ -x $BIN ]] || { echo "demo: $BIN missing: run make build" >&2; exit 1; }
work=$(mktemp -d)
recv_pid='' cons_pid=''
cleanup() {
  local rc=$?
  for p in $cons_pid $recv_pid; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_pid PID SECONDS: wait for a child to exit, bounded; returns its status (124 on timeout).
wait_pid() {
  local pid=$1 deadline=$((SECONDS + $2))
  while kill -0 "$pid" 2>/dev/null; do
    ((SECONDS < deadline)) || return 124
    sleep 0.1
  done
  wait "$pid"
}

echo "== recv: ring $RING on 127.0.0.1:$PORT"
$BIN recv --ring "$RING" --slots 256 --slot-size 128K --log-format json --stats-interval 1s "127.0.0.1:$PORT" \
  >"$work/recv.json" 2>"$work/recv.log" &
recv_pid=$!
for _ in $(seq 100); do
  $BIN stat "$RING" >/dev/null 2>&1 && break
  kill -0 "$recv_pid" 2>/dev/null || { cat "$work/recv.log" >&2; echo "demo: recv failed" >&2; exit 1; }
  sleep 0.05
done

echo "== consumer: $PY $EXAMPLE $RING"
$PY "$EXAMPLE" "$RING" --first 3 --timeout "$TIMEOUT" &
cons_pid=$!
for _ in $(seq 200); do # the stream starts once the consumer is attached
  $BIN stat --json "$RING" 2>/dev/null | grep -q '"state":"attached"' && break
  sleep 0.05
done

echo "== send: 2000 heaps of 64 KiB, 4 items, descriptors first (its summary follows the consumer's output)"
$BIN send "127.0.0.1:$PORT" --heaps 2000 --heap-size 65536 --items 4 --descriptors --rate 1 >"$work/send.out"

status=0
wait_pid "$cons_pid" "$TIMEOUT" || { echo "demo: consumer failed or timed out" >&2; status=1; }
cons_pid=''
wait_pid "$recv_pid" 5 || { echo "demo: recv did not stop at the end of stream" >&2; status=1; }
recv_pid=''
echo "== send's summary"
sed 's/^/  /' "$work/send.out"
echo "== recv's final counters"
if command -v $PY >/dev/null && [[ -s $work/recv.json ]]; then
  $PY -c 'import json,sys; d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print("  " + ", ".join(f"{k} {d[k]}" for k in ("result","packets","heaps","incomplete_heaps","dropped_heaps","malformed_packets","bytes")) + ", kernel drops %d" % d["transport_counters"]["kernel_drops"])' "$work/recv.json"
else
  cat "$work/recv.json"
fi
echo "== a local pipeline ($PIPELINE/run.sh): recv → Python numpy stage → C stage, and send --ring → recv → C stage"
if ! BIN=$BIN HEAPS=200 "$PIPELINE/run.sh" >"$work/pipeline.json" 2>"$work/pipeline.err"; then
  cat "$work/pipeline.err" >&2
  echo "demo: the pipeline failed" >&2
  status=1
fi
$PY "$PIPELINE/verdict.py" "$work/pipeline.json" || status=1
exit $status
