"""Reference producer CLI: publish N test heaps into a ring, then end the stream.

    python3 -m ibvbridge.produce --ring NAME [--dir DIR] [--heaps N] [--heap-size BYTES] [--slots N]
                                 [--policy drop|block] [--hugepages auto|require|off]
                                 [--wait-consumers N] [--pattern] [--batch N]
                                 [--consumer-group NAME=UID|@GID[,...]]...

Heaps have heap_cnt 1..N and two items: address item 0x1000 (offset 0, length heap_size) and immediate
item 0x1001 (value heap_cnt, 5 bytes). --pattern: payload byte i of heap cnt is (cnt*31 + i) mod 256 (what
``python3 -m ibvbridge.consume --verify`` checks); without it each slot is filled once (byte i = i mod 256)
and heaps are published without touching the payload. --batch N publishes N heaps per publish_batch call
(vectorised: the way to millions of small heaps per second); without it, acquire/publish per heap.
--wait-consumers N waits up to 30 s for N consumers before publishing. --consumer-group NAME=WHO[,WHO...]
(repeatable) grants consumer group NAME to the uids (a number or a user name) and gids (@ and a number or a
group name) listed (spec §14.1): with any grant, only they (and root) may join that group, other groups
are closed, and a refused member gets status 2, "not permitted to join group NAME". After the last heap: the
END_OF_STREAM marker, then (block) wait until every consumer has released everything, then close.

Prints one JSON line: {"heaps", "bytes", "checksum", "dropped", "seconds", "heaps_per_s"}: heaps and
bytes published (dropped heaps excluded), checksum = wrapping uint64 sum of each published payload read as
little-endian uint64 words, the last one zero-padded (the checksum ``ibvbridge.consume`` prints). Exit 0;
1 with one line on stderr on error.
"""

import argparse
import json
import sys
import time
from typing import Dict, List, Union

import numpy as np

from . import layout as L
from .errors import NoConsumer, RingError, RingFull
from .producer import Producer

M64 = (1 << 64) - 1
ADDR_ITEM = 0x1000
IMM_ITEM = 0x1001


def _word_sums(rows):
    """Per-row wrapping uint64 sums of a (n, w) uint8 array read as LE words, last word zero-padded."""
    n, w = rows.shape
    w8 = (w + 7) & ~7
    if w8 != w:
        rows = np.concatenate((rows, np.zeros((n, w8 - w), np.uint8)), axis=1)
    return np.ascontiguousarray(rows).view("<u8").sum(axis=1, dtype=np.uint64)


def parse_consumer_groups(specs):
    """--consumer-group NAME=WHO[,WHO...] options as Producer(groups=) wants them ({NAME: [uid | "@gid" |
    user name]}), or None when there are none; ValueError naming a malformed one."""
    if not specs:
        return None
    groups: Dict[str, List[Union[int, str]]] = {}
    for spec in specs:
        name, eq, who = spec.partition("=")
        entries = [w.strip() for w in who.split(",")] if eq else []
        if not name or not entries or not all(entries):
            raise ValueError(f"--consumer-group {spec!r}: use NAME=UID|@GID[,UID|@GID...]")
        groups.setdefault(name, []).extend(int(w) if w.isdigit() else w for w in entries)
    return groups


def run(a):
    hs = a.heap_size
    slot_size = max(64, (hs + 63) // 64 * 64)
    p = Producer.create(a.ring, slot_count=a.slots, slot_size=slot_size, max_items=2, policy=a.policy,
                        hugepages=a.hugepages, directory=a.dir, groups=parse_consumer_groups(a.consumer_group))
    try:
        if a.wait_consumers:
            p.wait_consumers(a.wait_consumers, timeout=30)
        # pat2d[b] = bytes (b + i) & 0xff: heap cnt's pattern is row (cnt*31) & 0xff
        pat2d = ((np.arange(256, dtype=np.uint16)[:, None] + np.arange(hs, dtype=np.uint16)[None, :]) & 0xFF
                 ).astype(np.uint8)
        row_sum = _word_sums(pat2d) if hs else np.zeros(256, np.uint64)  # checksum of each pattern row
        if not a.pattern:
            p._payload2d[:, :hs] = pat2d[0]  # fill every slot once: byte i = i & 0xff
        checksum = 0
        heaps = dropped = 0
        t0 = time.perf_counter()
        n = a.heaps
        if a.batch:
            cnt = 1
            while cnt <= n:
                k = min(a.batch, n - cnt + 1)
                cnts = np.arange(cnt, cnt + k, dtype=np.uint64)
                b = ((cnts * np.uint64(31)) & np.uint64(0xFF)).astype(np.intp)
                items = [(ADDR_ITEM, 0, hs, 0), (IMM_ITEM, cnts, 5, L.ITEM_IMMEDIATE)]
                if a.pattern:
                    got = p.publish_batch(pat2d[b], cnts, items=items)
                    sums = row_sum[b[:got]]
                else:
                    got = p.publish_batch(None, cnts, heap_sizes=hs, items=items)
                    sums = np.full(got, row_sum[0], np.uint64)
                checksum = (checksum + int(sums.sum(dtype=np.uint64))) & M64
                heaps += got
                if got < k:
                    dropped += k - got
                    p.add("dropped_heaps", k - got)
                cnt += k
        else:
            for cnt in range(1, n + 1):
                try:
                    s = p.acquire()
                except RingFull:
                    dropped += 1
                    p.add("dropped_heaps", 1)
                    continue
                bi = (cnt * 31) & 0xFF
                if a.pattern:
                    s.payload[:hs] = pat2d[bi]
                s.add_item(ADDR_ITEM, 0, hs)
                s.add_item(IMM_ITEM, cnt, 5, immediate=True)
                p.publish(s, cnt, hs)
                checksum = (checksum + int(row_sum[bi if a.pattern else 0])) & M64
                heaps += 1
        try:
            p.end_of_stream(timeout=5.0)
        except RingFull:
            pass  # close() still marks the ring CLOSED, which consumers read as the end
        if p.policy == L.POLICY_BLOCK:
            try:
                p.wait_drained()
            except NoConsumer:
                pass
        secs = time.perf_counter() - t0
    finally:
        p.close()
    return {"heaps": heaps, "bytes": heaps * hs, "checksum": checksum, "dropped": dropped,
            "seconds": round(secs, 6), "heaps_per_s": round(heaps / secs, 1) if secs > 0 else 0.0}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m ibvbridge.produce", description=__doc__.split("\n")[0])
    ap.add_argument("--ring", required=True, help="ring name")
    ap.add_argument("--dir", default=None, help="ring directory (default: spec §1.1)")
    ap.add_argument("--heaps", type=int, default=1000)
    ap.add_argument("--heap-size", type=int, default=64)
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--policy", choices=("drop", "block"), default="block")
    ap.add_argument("--hugepages", choices=("auto", "require", "off"), default="auto")
    ap.add_argument("--wait-consumers", type=int, default=0, help="wait up to 30 s for N consumers")
    ap.add_argument("--pattern", action="store_true", help="payload byte i of heap cnt = (cnt*31 + i) & 0xff")
    ap.add_argument("--batch", type=int, default=0, help="publish_batch N heaps per call")
    ap.add_argument("--consumer-group", action="append", default=[], metavar="NAME=UID|@GID[,...]",
                    help="grant consumer group NAME to these uids and gids (repeatable; spec §14.1)")
    a = ap.parse_args(argv)
    try:
        if a.heaps < 0 or a.heap_size < 0 or a.batch < 0:
            raise ValueError("--heaps, --heap-size and --batch must not be negative")
        out = run(a)
    except (RingError, ValueError, OSError) as e:
        sys.stderr.write(f"ibvbridge.produce: {type(e).__name__}: {' '.join(str(e).split())}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("ibvbridge.produce: interrupted\n")
        return 1
    sys.stdout.write(json.dumps(out, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
