"""Rough consumer throughput against a pre-filled fake ring (not a test; run by hand).

    /usr/bin/python3 tests/bench.py [--heaps N] [--size B] [--items K]
    /usr/bin/python3 tests/bench.py --itemgroup [--heaps N] [--rounds R]
    /usr/bin/python3 tests/bench.py --pyloop [--heaps N] [--rounds R] [--size B]

--itemgroup measures what ItemGroup.update plus reading three named items (a numpy array of 64 float32,
two immediates) adds per heap on top of ring.next(): CPU time of a loop with and without them, rounds
alternated in one process, the median difference reported.

Fills a ring with N heaps (vectorised, so the producer is not the bottleneck) plus an END_OF_STREAM
marker, then times: the per-heap iterator, next_batch, and the consume CLI in both modes. Each consumer
attaches at the oldest heap: the fake producer reclaims nothing while slots are free, so every run reads
the same N heaps.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

from fake_producer import FakeProducer, pattern  # noqa: E402
from ibvbridge import Ring, layout as L  # noqa: E402


def fill(p, n, size, items):
    sc = p.slot_count
    assert n + 1 <= sc
    pos = np.arange(n, dtype=np.uint64)
    d = p.desc[:n]
    d["seq"] = pos + 1
    d["heap_cnt"] = pos + 1
    d["heap_size"] = size
    d["received"] = size
    d["slot"] = pos
    d["flags"] = L.FLAG_COMPLETE
    d["item_count"] = items
    d["packets"] = 1
    if items:
        p.items[:n, 0] = (0x1001, 0, 5, L.ITEM_IMMEDIATE, 0)
        p.items["value"][:n, 0] = pos + 1
    for b in range(256):  # pattern payloads: heap_cnt*31 & 0xff decides the bytes
        rows = np.nonzero((((pos + 1) * 31) & 0xFF) == b)[0]
        p.payload[rows, :size] = np.frombuffer(bytes(((b + i) & 0xFF) for i in range(size)),
                                               np.uint8)
    p.desc[n] = (n + 1, 0, 0, 0, 0, n, L.FLAG_END_OF_STREAM, 0, 0, 0)
    p.head = n + 1
    p.commit()


def fill_items(p, n):
    """n heaps of three items: immediates timestamp (u48) and offset (i48), the array spectrum (64 f4)."""
    p.set_descriptors([
        type("D", (), dict(id=0x1600, name="timestamp", description="", shape=(), dtype=None,
                           format=b"u\x00\x30", order="C"))(),
        type("D", (), dict(id=0x1601, name="offset", description="", shape=(), dtype=None,
                           format=b"i\x00\x30", order="C"))(),
        type("D", (), dict(id=0x1800, name="spectrum", description="", shape=(64,), dtype=np.dtype("<f4"),
                           format=b"", order="C"))()])
    pos = np.arange(n, dtype=np.uint64)
    d = p.desc[:n]
    d["seq"] = pos + 1
    d["heap_cnt"] = pos + 1
    d["heap_size"] = d["received"] = 256
    d["slot"] = pos
    d["flags"] = L.FLAG_COMPLETE
    d["item_count"] = 3
    d["packets"] = 1
    p.items[:n, 0] = (0x1600, 0, 6, L.ITEM_IMMEDIATE, 0)
    p.items["value"][:n, 0] = pos * 4096
    p.items[:n, 1] = (0x1601, 5, 6, L.ITEM_IMMEDIATE, 0)
    p.items[:n, 2] = (0x1800, 0, 256, 0, 0)
    p.desc[n] = (n + 1, 0, 0, 0, 0, n, L.FLAG_END_OF_STREAM, 0, 0, 0)
    p.head = n + 1
    p.commit()


def fill_pyloop(p, n, size):
    """n heaps as `ibvbridge bench python` sends them: send_ns (an immediate u48) and data (size bytes, u1)."""
    p.set_descriptors([
        type("D", (), dict(id=0x1800, name="send_ns", description="", shape=(), dtype=None,
                           format=b"u\x00\x30", order="C"))(),
        type("D", (), dict(id=0x1801, name="data", description="", shape=(size,), dtype=np.dtype("|u1"),
                           format=b"", order="C"))()])
    pos = np.arange(n, dtype=np.uint64)
    d = p.desc[:n]
    d["seq"] = pos + 1
    d["heap_cnt"] = pos + 2
    d["heap_size"] = d["received"] = size
    d["slot"] = pos % 128  # recv reuses a few slots over and over (its free pool is a stack)
    d["flags"] = L.FLAG_COMPLETE
    d["item_count"] = 2
    d["packets"] = 1
    p.items[:128, 0] = (0x1800, 0, 6, L.ITEM_IMMEDIATE, 0)
    p.items["value"][:128, 0] = np.arange(128, dtype=np.uint64) * 1000
    p.items[:128, 1] = (0x1801, 0, size, 0, 0)
    p.desc[n] = (n + 1, 0, 0, 0, 0, n, L.FLAG_END_OF_STREAM, 0, 0, 0)
    p.head = n + 1
    p.commit()


def bench_pyloop(heaps, rounds, size=1024):
    """The loop body of `ibvbridge bench python` (bench/pyloop.py) over a pre-filled ring: CPU per heap."""
    from ibvbridge import ItemGroup
    sc = 1 << (heaps + 1).bit_length()
    per = []
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        p = FakeProducer(d, "pyloop", slot_count=sc, slot_size=size, max_items=2)  # 128 slots used
        fill_pyloop(p, heaps, size)
        for _ in range(rounds):
            ig = ItemGroup()
            lat = []
            time_ns = time.time_ns
            with Ring.attach(p.socket_path) as ring:
                t = time.process_time()
                for heap in ring:
                    items = ig.update(heap)
                    now = time_ns()
                    stamp = items.get("send_ns")
                    if stamp is not None:
                        lat.append((now - stamp.value) & 0xFFFFFFFFFFFF)
                per.append((time.process_time() - t) / heaps)
            assert len(lat) == heaps and ig["data"].value.shape == (size,)
        p.close()
    per.sort()
    print(f"bench python's loop, {size}-byte heaps   {per[rounds // 2] * 1e6:6.2f} µs/heap "
          f"(median of {rounds}; min {per[0] * 1e6:.2f}, max {per[-1] * 1e6:.2f})")


def bench_itemgroup(heaps, rounds):
    from ibvbridge import ItemGroup, EndOfStream
    sc = 1 << (heaps + 1).bit_length()
    plain, named = [], []
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        p = FakeProducer(d, "items", slot_count=sc, slot_size=256, max_items=3)
        fill_items(p, heaps)

        def run(with_items):
            ig = ItemGroup()
            with Ring.attach(p.socket_path) as ring:
                t = time.process_time()
                try:
                    while True:
                        with ring.next() as h:
                            if with_items:
                                ig.update(h)
                                s = ig["spectrum"].value
                                ts = ig["timestamp"].value
                                off = ig["offset"].value
                except EndOfStream:
                    pass
                dt = time.process_time() - t
            if with_items:
                assert s.shape == (64,) and ts == (heaps - 1) * 4096 and off == 5
            return dt / heaps

        for _ in range(rounds):
            plain.append(run(False))
            named.append(run(True))
        p.close()
    diffs = sorted(b - a for a, b in zip(plain, named))
    print(f"ring.next() + release            {sorted(plain)[rounds // 2] * 1e6:6.2f} µs/heap (median of {rounds})")
    print(f"  + ItemGroup.update + 3 items   {sorted(named)[rounds // 2] * 1e6:6.2f} µs/heap")
    print(f"  added by the items             {diffs[rounds // 2] * 1e6:6.2f} µs/heap (median of the pairs; "
          f"min {diffs[0] * 1e6:.2f}, max {diffs[-1] * 1e6:.2f})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--itemgroup", action="store_true")
    ap.add_argument("--pyloop", action="store_true", help="bench python's ItemGroup loop (1 KiB heaps, --size)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--heaps", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--items", type=int, default=1)
    ap.add_argument("--batch", type=int, default=4096)
    a = ap.parse_args()
    if a.itemgroup:
        bench_itemgroup(min(a.heaps, 200_000), a.rounds)
        return
    if a.pyloop:
        bench_pyloop(min(a.heaps, 200_000), a.rounds, a.size if a.size != 64 else 1024)
        return
    sc = 1 << (a.heaps + 1).bit_length()
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        p = FakeProducer(d, "bench", slot_count=sc, slot_size=max(64, (a.size + 63) // 64 * 64), max_items=2)
        fill(p, a.heaps, a.size, a.items)
        res = {}
        with Ring.attach(p.socket_path) as ring:
            t = time.perf_counter()
            n = 0
            for h in ring:
                n += 1
            res["iterate"] = n / (time.perf_counter() - t)
        with Ring.attach(p.socket_path) as ring:
            t = time.perf_counter()
            n = 0
            for b in ring.batches(a.batch):
                n += len(b)
            res["next_batch"] = n / (time.perf_counter() - t)
        for mode in ([], ["--batch", str(a.batch)], ["--verify"], ["--verify", "--batch", str(a.batch)]):
            out = subprocess.run([sys.executable, "-m", "ibvbridge.consume", "--ring", p.socket_path, *mode],
                                 capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(
                                     os.path.abspath(__file__))))
            j = json.loads(out.stdout)
            assert j["result"] == "eos" and j["heaps"] == a.heaps and j["verify_errors"] == 0, j
            res["consume " + " ".join(mode)] = j["heaps"] / j["seconds"]
        p.close()
    for k, v in res.items():
        print(f"{k:32s} {v:12,.0f} heaps/s")


if __name__ == "__main__":
    main()
