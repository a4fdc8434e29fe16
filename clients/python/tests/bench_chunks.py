"""Capacity of the saturated Python chunk consumer (not a test, run by hand).

    /usr/bin/python3 tests/bench_chunks.py [--heaps 64,256,4096] [--heap-size 8192] [--chunks N]
                                            [--heaps-per-round N] [--rounds R] [--batch N] [--ring-mib M]
                                            [--modes chunks,next,batches,consume,consume-b] [--json]

A chunk-mode ring is filled ahead by a FakeProducer (descriptors and presence maps; the payload bytes are not
written: the consumers here do not read them), then each consumer mode attaches at the oldest chunk and reads
all of them, never waiting: what is measured is the consumer's own CPU per chunk (thread CPU time of
the read loop, or the consume tool's cpu_seconds), the capacity of one Python process. Modes, rounds
alternated, medians reported:

    chunks     for c in ring.chunks(): c.heaps_present          (the per-chunk iterator)
    next       c = ring.next_chunk(); c.heaps_present; c.release()
    batches    for cb in ring.chunk_batches(N): cb.present.sum()  (N = --batch)
    consume    python3 -m ibvbridge.consume --no-touch            (the consume tool, chunk by chunk)
    consume-b  python3 -m ibvbridge.consume --no-touch --batch N  (the tool, batches when >= 64 wait)

--cold-wakes K1,K2,... measures instead what the consume tool pays per wake on cold caches (evicted, and a
sleep, before each), taking K chunks one by one or as one batch: what decides consume.CHUNK_BATCH_MIN.

A fill holds slot_count - 1 chunks (the fake producer reclaims nothing while slots are free, so every read gets
the same chunks). Each read attaches anew: its mapping's pages fault in on first touch, once per chunk here
but once per ring lap on a live ring, so the in-process modes touch the presence maps' and descriptors' pages
before the timed loop (--cold: not; the consume tool modes always pay them). The ring is at most --ring-mib (the producer reserves its memory) and its fill is read as many
times as it takes to read about --heaps-per-round heaps per mode and round, each attach outside the timed loop.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import numpy as np  # noqa: E402

from fake_producer import FakeProducer  # noqa: E402
from ibvbridge import Ring, layout as L  # noqa: E402

MODES = ("chunks", "next", "batches", "consume", "consume-b")


def chunk_ring(directory, heaps, heap_size, slots):
    """A FakeProducer in chunk mode (heaps × 1 positions of heap_size bytes per chunk)."""
    cb = heaps * heap_size
    slot_size = (cb + heaps + 63) // 64 * 64
    p = FakeProducer(directory, f"chunks{heaps}", slot_count=slots, slot_size=slot_size, max_items=1,
                     header_overrides={"features": L.FEATURE_CHUNKS})
    L.CHUNK_STRUCT.pack_into(p.ctl, L.OFF_CHUNK_HEAPS, heaps, 1, heap_size, heap_size, 0x1600, 0)
    return p, cb


def fill(p, n, heaps, cb, first_id):
    """n complete chunks (ids first_id…) in slots 0…n-1, then END_OF_STREAM: written as a producer would,
    descriptors vectorised, one presence map per slot."""
    pos = np.arange(n, dtype=np.uint64)
    d = p.desc[:n]
    d["seq"] = pos + 1
    d["heap_cnt"] = pos + np.uint64(first_id)
    d["heap_size"] = cb
    d["received"] = cb
    d["timestamp_ns"] = 0
    d["slot"] = pos
    d["flags"] = L.FLAG_CHUNK | L.FLAG_COMPLETE
    d["item_count"] = 0
    d["packets"] = heaps
    d["assign"] = 0
    p.payload[:n, cb:cb + heaps] = 1
    p.desc[n] = (n + 1, 0, 0, 0, 0, n, L.FLAG_END_OF_STREAM, 0, 0, 0)
    p.head = n + 1
    p.commit()


def read(mode, path, batch, warm=True):
    """(thread CPU seconds, chunks, heaps present) of one consumer reading the ring to its end. warm: the
    presence maps' and descriptors' pages are mapped before the timed loop (the consume tool's are not)."""
    if mode.startswith("consume"):
        args = [sys.executable, "-m", "ibvbridge.consume", "--ring", path, "--no-touch"]
        if mode == "consume-b":
            args += ["--batch", str(batch)]
        env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
        out = json.loads(subprocess.run(args, capture_output=True, text=True, env=env, check=True).stdout)
        assert out["result"] == "eos", out
        return out["cpu_seconds"], out["chunks"], out["heaps_present"]
    n = c = 0
    with Ring.attach(path) as ring:
        if warm:  # the mapping's pages as a live ring's after its first lap: mapped (no page fault per chunk)
            g = ring.chunk_geometry
            int(ring._payload2d[:, g.chunk_bytes].sum()) + int(ring._desc_raw[::4096].sum())
        t = time.thread_time()
        if mode == "chunks":
            for ch in ring.chunks(timeout=1):
                n += ch.heaps_present
                c += 1
        elif mode == "next":
            from ibvbridge import EndOfStream
            try:
                while True:
                    ch = ring.next_chunk(1)
                    n += ch.heaps_present
                    c += 1
                    ch.release()
            except EndOfStream:
                pass
        elif mode == "batches":
            for cb in ring.chunk_batches(batch, timeout=1):
                n += int(np.count_nonzero(cb.present))
                c += len(cb)
        else:
            raise ValueError(mode)
        dt = time.thread_time() - t
    return dt, c, n


def cold_wakes(path, per_wake, rounds):
    """{"one by one": [s], "batch": [s]}: thread CPU of taking per_wake chunks as the consume tool does after a
    wake (next_chunk + Stats.chunk each, or next_chunk_batch + Stats.chunk_batch), each time on cold caches:
    64 MiB touched and a 20 ms sleep before it, as a consumer sleeping between coalesced wakes finds them."""
    from ibvbridge import consume
    junk = np.ones(64 << 20, np.uint8)
    cost = {"one by one": [], "batch": []}
    for _ in range(rounds):
        with Ring.attach(path) as ring:
            g = ring.chunk_geometry
            int(ring._payload2d[:, g.chunk_bytes].sum()) + int(ring._desc_raw[::4096].sum())
            st = consume.Stats(False, ring.slot_size, touch=False)
            for _ in range((ring.slot_count - 1) // (2 * per_wake)):
                int(junk[::64].sum())
                time.sleep(0.02)
                t = time.thread_time()
                for _ in range(per_wake):
                    c = ring.next_chunk(1)
                    st.chunk(c)
                    c.release()
                cost["one by one"].append(time.thread_time() - t)
                int(junk[::64].sum())
                time.sleep(0.02)
                t = time.thread_time()
                b = ring.next_chunk_batch(per_wake, 1)
                assert len(b) == per_wake
                st.chunk_batch(b)
                b.release()
                cost["batch"].append(time.thread_time() - t)
    return cost


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heaps", default="64,256,4096", help="heaps per chunk, comma-separated")
    ap.add_argument("--heap-size", type=int, default=8192)
    ap.add_argument("--heaps-per-round", type=int, default=1 << 18, help="heaps read per mode and round (about)")
    ap.add_argument("--ring-mib", type=int, default=256, help="the ring's size bound (its memory is reserved)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--cold", action="store_true", help="time the in-process modes' first touch of each page too")
    ap.add_argument("--cold-wakes", default="", help="instead: CPU per wake on cold caches, chunks taken one by one "
                    "or as a batch, for these chunks per wake (comma-separated; 64-heap chunks)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    modes = a.modes.split(",")
    results = []
    if a.cold_wakes:
        with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
            p, cb = chunk_ring(d, 64, a.heap_size, 512)
            fill(p, 511, 64, cb, 1)
            for k in (int(x) for x in a.cold_wakes.split(",")):
                for m, v in cold_wakes(p.socket_path, k, a.rounds).items():
                    v.sort()
                    print(f"cold wake, {k:4d} chunks of 64 heaps  {m:10s} {v[len(v) // 2] * 1e6:7.0f} µs per wake "
                          f"({v[len(v) // 2] / (k * 64) * 1e9:6.1f} ns/heap; median of {len(v)})", flush=True)
            p.close()
        return
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        for heaps in (int(x) for x in a.heaps.split(",")):
            # The producer reserves the ring's memory (posix_fallocate): at most --ring-mib of it, at least 8
            # slots; the fill is read as often as it takes to read about --heaps-per-round heaps.
            slot_bytes = (heaps * a.heap_size + heaps + 63) // 64 * 64
            slots = 8
            while slots < 1024 and 2 * slots * slot_bytes <= a.ring_mib << 20:
                slots *= 2
            per_fill = slots - 1
            fills = max(1, -(-a.heaps_per_round // (per_fill * heaps)))
            p, cb = chunk_ring(d, heaps, a.heap_size, slots)
            fill(p, per_fill, heaps, cb, 1)
            cost = {m: [] for m in modes}
            for _ in range(a.rounds):
                for m in modes:
                    dt = chunks = present = 0
                    for _ in range(fills):
                        t, c, n = read(m, p.socket_path, a.batch, not a.cold)
                        assert c == per_fill and n == per_fill * heaps, (m, c, n)
                        dt, chunks, present = dt + t, chunks + c, present + n
                    cost[m].append(dt / present)
            p.close()
            for m in modes:
                v = sorted(cost[m])
                med = v[len(v) // 2]
                r = dict(heaps_per_chunk=heaps, mode=m, ns_per_heap=med * 1e9, us_per_chunk=med * heaps * 1e6,
                         mheaps_per_s=1 / med / 1e6, min_ns=v[0] * 1e9, max_ns=v[-1] * 1e9)
                results.append(r)
                if not a.json:
                    print(f"{heaps:5d} heaps/chunk  {m:10s} {r['ns_per_heap']:8.2f} ns/heap  "
                          f"{r['us_per_chunk']:7.2f} µs/chunk  {r['mheaps_per_s']:8.1f} M heaps/s   "
                          f"(min {r['min_ns']:.2f}, max {r['max_ns']:.2f}; median of {a.rounds})", flush=True)
    if a.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
