#!/usr/bin/env python3
"""Stage 2 of the example pipeline: power spectra of 8-bit complex samples, from ring A into ring B.

    python3 examples/pipeline/spectrum.py --input A --output B [--samples 4096] [--wait-consumers 2] [--dir DIR]

Each heap of ring A carries interleaved 8-bit (re, im) samples (its payload); this stage writes the power
spectrum |FFT(x)|^2 of each heap as float32 straight into a slot of ring B (a numpy view of the slot: the
stage's own result is the only copy), with the input's heap cnt as an immediate item, and item
descriptors so consumers of B can name and shape the spectrum. Ring B uses the block policy: every
consumer of B (the C stage, `ibvbridge send --ring B`) gets every spectrum. The stream's end is passed on.
Prints one JSON line at the end: {"heaps": N, "skipped": K, "seconds": S}.
"""

import argparse
import json
import os
import sys
import time
import types

try:
    import ibvbridge
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))
    import ibvbridge

import numpy as np

SPECTRUM_ID = 0x2000
CNT_ID = 0x1001


def power_spectrum(samples, out):
    """|FFT(x)|^2 of interleaved int8 (re, im) samples, written into out (float32, len(samples)//2)."""
    x = samples.view(np.int8).astype(np.float32).view(np.complex64)
    f = np.fft.fft(x)
    np.square(f.real, out=out, casting="unsafe")
    out += np.square(f.imag)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", required=True, help="ring A: name or socket path")
    ap.add_argument("--output", required=True, help="ring B: the name to create")
    ap.add_argument("--samples", type=int, default=4096, help="complex samples per heap (heap payload = 2x bytes)")
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--dir", default=None, help="ring directory (default: the spec's)")
    ap.add_argument("--wait-consumers", type=int, default=0, help="wait for this many consumers of B first")
    ap.add_argument("--timeout", type=float, default=30.0)
    a = ap.parse_args()
    out_bytes = 4 * a.samples
    heaps = skipped = 0
    start = time.monotonic()
    with ibvbridge.Ring.attach(a.input, directory=a.dir, timeout=a.timeout) as ring_a, \
            ibvbridge.Producer.create(a.output, slot_count=a.slots, slot_size=out_bytes, max_items=4,
                                      policy="block", directory=a.dir) as ring_b:
        ring_b.set_descriptors([types.SimpleNamespace(
            id=SPECTRUM_ID, name="power", description="power spectrum |FFT(x)|^2 of the heap's 8-bit complex samples",
            format=b"", dtype=np.dtype("<f4"), shape=(a.samples,))])
        deadline = time.monotonic() + a.timeout
        while ring_b.consumers < a.wait_consumers:
            if time.monotonic() > deadline:
                sys.exit(f"spectrum: {a.wait_consumers} consumers did not attach to {a.output} within {a.timeout} s")
            time.sleep(0.01)
        stop_cnt = 0
        try:
            for heap in ring_a:
                x = np.frombuffer(heap.payload, dtype=np.uint8)
                if not heap.complete or len(x) != 2 * a.samples:
                    skipped += 1  # holes or another shape: not a spectrum; counted, not hidden
                    continue
                slot = ring_b.acquire()
                power_spectrum(x, slot.payload[:out_bytes].view(np.float32))
                slot.add_item(SPECTRUM_ID, value=0, length=out_bytes)
                slot.add_item(CNT_ID, value=heap.heap_cnt, length=5, immediate=True)
                ring_b.publish(slot, heap.heap_cnt, heap_size=out_bytes)
                ring_b.add("heaps", 1)
                ring_b.add("bytes", out_bytes)
                heaps += 1
                stop_cnt = heap.heap_cnt + 1
        except ibvbridge.ProducerGone:
            pass  # the upstream recv died: end our stream all the same
        ring_b.add("discarded_incomplete_heaps", skipped)
        ring_b.end_of_stream(stop_heap_cnt=stop_cnt, timeout=a.timeout)
        try:
            ring_b.wait_drained(timeout=a.timeout)
        except ibvbridge.NoConsumer:
            pass  # every reader took the end of the stream and left already: nothing is left to wait for
    print(json.dumps({"heaps": heaps, "skipped": skipped, "seconds": round(time.monotonic() - start, 6)}))


if __name__ == "__main__":
    main()
