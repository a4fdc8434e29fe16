#!/usr/bin/env python3
"""Print the heaps of an ibvbridge ring (used by `make demo`).

    python3 examples/print_heaps.py RING_NAME_OR_SOCKET_PATH [--first N] [--timeout S] [--dir DIR]

Prints the first N heaps in full (count, size, every item: as a numpy array shaped by the stream's item
descriptors when known, else raw bytes), then one rate line per second, and stops at end of stream.
"""

import argparse
import os
import sys
import time

try:
    import ibvbridge
except ImportError:  # not installed: use the source tree next to this example
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import ibvbridge
from ibvbridge.items import DESCRIPTOR_ITEM, parse_descriptor_item, parse_format


def described(data):
    """What an item descriptor (item 0x5) describes, as one line's words; None if it does not parse."""
    try:
        d = parse_descriptor_item(data)
    except (ValueError, ibvbridge.RingError):
        return None
    what = f"{d.id:#06x}" + (f" {d.name!r}" if d.name else "")
    return what + (f" (dtype {d.dtype}, shape {d.shape})" if d.dtype is not None
                   else f" (format {parse_format(d.format)})")


def show_item(heap, it, descs):
    d = descs.get(it.id)
    name = f"{d.name} " if d and d.name else ""
    if it.id == DESCRIPTOR_ITEM and not it.immediate:
        what = described(it.data)
        return f"    item descriptor of {what} [{it.length} B]" if what else f"    item descriptor [{it.length} B]"
    if it.immediate:
        return f"    {name}{it.id:#06x} = {it.value:#x} (immediate)"
    try:
        if d is not None and d.dtype is not None:
            arr = heap.array(it.id)
            val = f"{arr.dtype}{list(arr.shape)} " + " ".join(str(arr).split())
            del arr  # the view must not outlive the heap
        else:
            val = bytes(it.data[:32])
            val = val.hex(" ") + (" ..." if it.length > 32 else "")
    except (ValueError, ibvbridge.RingError) as e:
        val = f"<{e}>"
    return f"    {name}{it.id:#06x} [{it.length} B] {val}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ring")
    ap.add_argument("--first", type=int, default=5, help="heaps printed in full")
    ap.add_argument("--timeout", type=float, default=10.0, help="attach timeout, seconds")
    ap.add_argument("--dir", default=None, help="ring directory to look the name up in")
    a = ap.parse_args()
    n = nbytes = 0
    t0 = tlast = None  # rates count from the first heap, not from attach
    last_n = last_b = 0
    try:
        with ibvbridge.Ring.attach(a.ring, timeout=a.timeout, directory=a.dir) as ring:
            print(f"attached to {ring.socket_path} as consumer {ring.consumer_index}: session "
                  f"{ring.session_id:#x}, producer pid {ring.producer_pid}, {ring.slot_count} slots x "
                  f"{ring.slot_size} B", flush=True)
            for heap in ring:
                if t0 is None:
                    t0 = tlast = time.monotonic()
                n += 1
                nbytes += heap.received
                if n <= a.first:
                    flags = ",".join(f for f in ("complete", "incomplete", "truncated", "has_descriptors",
                                                 "items_overflow") if getattr(heap, f)) or "-"
                    print(f"heap {heap.heap_cnt}: {heap.received}/{heap.heap_size} B, {heap.packets} packets, "
                          f"{flags}")
                    descs = ring.descriptors()
                    for it in heap.items:
                        print(show_item(heap, it, descs))
                now = time.monotonic()
                if now - tlast >= 1.0:
                    dt = now - tlast
                    print(f"... {n} heaps so far; the last second {(n - last_n) / dt:,.0f} heaps/s, "
                          f"{(nbytes - last_b) / dt / 1e6:,.1f} MB/s", flush=True)
                    tlast, last_n, last_b = now, n, nbytes
            st = ring.stats()
    except ibvbridge.ProducerGone as e:
        print(f"producer gone: {e}", file=sys.stderr)
        return 2
    except ibvbridge.Detached as e:  # Overrun included
        print(str(e), file=sys.stderr)
        return 4 if isinstance(e, ibvbridge.Overrun) else 5
    except KeyboardInterrupt:
        return 130
    dt = time.monotonic() - t0 if t0 is not None else 0.0
    print(f"end of stream: {n} heaps, {nbytes} bytes in {dt:.2f} s; dropped {st['dropped_heaps']}, "
          f"incomplete {st['incomplete_heaps']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
