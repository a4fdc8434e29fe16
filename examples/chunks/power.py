#!/usr/bin/python3
"""Average power per channel over the chunks of a chunk-mode ring, with numpy (docs/ring-layout.md §13).

Each heap of the stream holds CHANNELS complex samples as interleaved int8 (re, im) pairs — the heap size
is 2 × CHANNELS bytes. recv places the heaps by timestamp (and antenna / source) into chunks; this consumer
gets one descriptor per chunk, views the whole chunk as an int8 array [time, axis, channel, re/im] without
copying it, and averages |x|² per channel over the heaps the presence map says arrived.

    ibvbridge recv --ring ch --chunk-heaps 8 --chunk-by 0x1600:4096 --chunk-axis 0x4101:4 \\
        --chunk-heap-size 8K 127.0.0.1:7148 &
    python3 examples/chunks/power.py --ring ch &
    ibvbridge send 127.0.0.1:7148 --heaps 320 --heap-size 8K --pattern --timestamp-step 4096 \\
        --axis 0x4101:4

Prints one JSON line per chunk — {"chunk", "present", "total_power", "peak_channel", "peak_mean_power"}:
the sum of |x|² over every present heap and channel, the channel with the largest mean power over the
present heaps (the first of equals) and that mean, "%.3f" — then a summary line {"chunks", "heaps",
"overrun_chunks"}. A chunk found invalid after it was read (the producer overran this consumer) is
counted in overrun_chunks, not printed: its bytes may be a later chunk's.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))

import numpy as np  # noqa: E402

import ibvbridge  # noqa: E402


def chunk_power(chunk):
    """(present heaps, per-channel power summed over them as int64 [channels]) of one chunk."""
    x = chunk.data_as(np.int8, (-1, 2))  # [time, axis, channel, re/im]: a view of the ring
    present = chunk.present              # [time, axis] bool
    heaps = x[present].astype(np.int32)  # [n, channel, re/im]: the present heaps only
    power = (heaps * heaps).sum(axis=-1)  # [n, channel]
    return int(present.sum()), power.sum(axis=0, dtype=np.int64)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ring", required=True, help="ring name or socket path")
    ap.add_argument("--dir", default=None, help="ring directory to look the name up in")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for the ring and each chunk")
    ap.add_argument("--max-latency", type=float, default=0.0,
                    help="seconds a chunk may wait to be read, so that one wake reads several (0: a wake per "
                         "chunk; small chunks at a high rate: 0.25, the spec's longest)")
    a = ap.parse_args(argv)
    ring = ibvbridge.Ring.attach(a.ring, timeout=a.timeout, directory=a.dir, wait=True, max_latency=a.max_latency)
    if ring.chunk_geometry is None:
        sys.exit(f"power.py: ring {a.ring} is not in chunk mode (recv --chunk-heaps)")
    if ring.chunk_geometry.heap_size % 2:
        sys.exit(f"power.py: heaps of {ring.chunk_geometry.heap_size} bytes are not int8 (re, im) pairs")
    chunks = heaps = overrun = 0
    status = 0
    with ring:
        try:
            for chunk in ring.chunks(timeout=a.timeout):
                n, per_channel = chunk_power(chunk)
                if not chunk.valid:  # read, then check: the bytes were the chunk's only if still valid
                    overrun += 1
                    continue
                chunks += 1
                heaps += n
                line = {"chunk": chunk.chunk_id, "present": n, "total_power": int(per_channel.sum())}
                if n:
                    peak = int(per_channel.argmax())
                    line.update(peak_channel=peak, peak_mean_power="%.3f" % (per_channel[peak] / n))
                print(json.dumps(line), flush=True)
        except ibvbridge.Overrun as e:  # the loop's next step after an overrun chunk: stop reading
            print(f"power.py: {e}", file=sys.stderr)
            status = 4
    print(json.dumps({"chunks": chunks, "heaps": heaps, "overrun_chunks": overrun}), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
