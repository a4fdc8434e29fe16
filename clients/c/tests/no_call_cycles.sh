#!/bin/sh
# The library's source files call one another in one direction only (no call cycles between files): from
# each object file's defined (T) and undefined (U) symbols, every file that calls into another must not be
# called back by it, directly or through others. usage: no_call_cycles.sh OBJ...
set -eu
edges=$(for o in "$@"; do
	for u in $(nm "$o" | awk '$1 == "U" {print $2}'); do
		for d in "$@"; do
			[ "$d" != "$o" ] && nm "$d" | awk -v s="$u" '$2 ~ /^[TDRB]$/ && $3 == s {found=1} END {exit !found}' &&
				echo "$(basename "$o" .o) $(basename "$d" .o)"
		done
	done
done | sort -u)
# tsort reports a cycle on stderr (and fails on some systems): either way, a cycle fails this check
if ! out=$(echo "$edges" | tsort 2>&1 >/dev/null) || [ -n "$out" ]; then
	echo "no_call_cycles: the C files call each other in a cycle:" >&2
	echo "$out" >&2
	echo "calls (caller callee):" >&2
	echo "$edges" >&2
	exit 1
fi
echo "no_call_cycles: ok ($(echo "$edges" | grep -c . ) calls between files, no cycle)"
