#!/bin/bash
# What one wake costs here: two parties hand a token back and forth through a futex word, each sleeping
# until the other wakes it. Per round each pays one FUTEX_WAKE and one sleep, as recv and a consumer each
# do per heap when heaps come one at a time and neither may wait (a latency-neutral receiver). Prints the
# CPU per round of each: two processes across cores and on one core; then, with 50 µs between hand-overs
# (heaps spaced by their stream's rate, the waiter idle meanwhile), two processes (recv and its consumer)
# against two threads of one process (spead2's reader thread and its Python thread).
#
#   scripts/wake-cost.sh [ROUNDS]      # default 50000
set -eu
rounds=${1:-50000}
cd "$(dirname "$0")/.."
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
cc -O2 -Wall -Werror -pthread -o "$d/pingpong" scripts/wake/pingpong.c
echo "two processes, across cores:"
"$d/pingpong" "$rounds"
echo "two processes, on one core (taskset -c 0):"
taskset -c 0 "$d/pingpong" "$rounds"
echo "two processes, 50 µs between hand-overs (the second process's figure is its wake alone):"
"$d/pingpong" $((rounds / 4)) processes 50
echo "two threads of one process, 50 µs between hand-overs:"
"$d/pingpong" $((rounds / 4)) threads 50
