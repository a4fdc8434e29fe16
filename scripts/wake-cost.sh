#!/bin/bash
# What one wake costs here: two processes hand a token back and forth through a futex word in shared
# memory, each sleeping until the other wakes it. Per round each process pays one FUTEX_WAKE and one sleep,
# as recv and a consumer each do per heap when heaps come one at a time and neither may wait (a
# latency-neutral receiver). Prints the CPU per round of each process, across cores and on one core.
#
#   scripts/wake-cost.sh [ROUNDS]      # default 50000
set -eu
rounds=${1:-50000}
cd "$(dirname "$0")/.."
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
cc -O2 -Wall -Werror -o "$d/pingpong" scripts/wake/pingpong.c
echo "across cores:"
"$d/pingpong" "$rounds"
echo "on one core (taskset -c 0):"
taskset -c 0 "$d/pingpong" "$rounds"
