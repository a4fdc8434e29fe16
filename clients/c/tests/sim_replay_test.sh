#!/bin/sh
# The replayer of the ring simulation's stream, checked (tests/test_sim_replay.c): a hand-written stream,
# and, when Go is installed, one the model writes (internal/ringsim/simlog), played whole and with one
# expected value flipped. The stream lives in a temporary directory removed on exit.
set -eu
B=$1
GO=$(command -v go || { test -x /usr/local/go/bin/go && echo /usr/local/go/bin/go; } || true)
if [ -z "$GO" ]; then
	echo "sim_replay_test: no go on PATH: the model's stream is not played (the hand-written one is)"
	exec "$B/test_sim_replay" "$B/sim_replay"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
(cd ../.. && "$GO" run ./internal/ringsim/simlog -seeds 6 -steps 400 -nowrap) > "$tmp/stream.bin" 2>"$tmp/simlog.err" ||
	{ cat "$tmp/simlog.err"; exit 1; }
"$B/test_sim_replay" "$B/sim_replay" "$tmp/stream.bin"
