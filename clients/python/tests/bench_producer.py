"""Producer throughput: ibvbridge.produce (Python) into the C consumer and the Python consumer (not a test;
run by hand).

    /usr/bin/python3 tests/bench_producer.py [--heaps N] [--size B] [--batch K] [--slots S] [--runs R]
                                           [--pattern] [--hugepages off|auto|require] [--members N]

Each run starts ``python3 -m ibvbridge.produce --policy block --wait-consumers 1`` and one consumer
(clients/c/build/ibvb-consume if built; ``python3 -m ibvbridge.consume --batch K``), checks that both
checksums agree and every heap arrived, and records the producer's heaps/s (first publish to everything
released, END_OF_STREAM included). Prints median and range per pair.

--members N: N consumers join one consumer group (spec §14) instead of one independent consumer, so the
producer assigns every heap (its group path); their heap counts and checksums must add up to the producer's.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
C_CONSUME = os.path.normpath(os.path.join(PKG, "..", "c", "build", "ibvb-consume"))
ENV = dict(os.environ, PYTHONPATH=PKG)


def one(consumer, a, d, name):
    n = max(1, a.members)
    prod = subprocess.Popen([sys.executable, "-m", "ibvbridge.produce", "--ring", name, "--dir", d,
                             "--heaps", str(a.heaps), "--heap-size", str(a.size), "--slots", str(a.slots),
                             "--policy", "block", "--wait-consumers", str(n), "--hugepages", a.hugepages,
                             *(["--batch", str(a.batch)] if a.batch else []), *(["--pattern"] if a.pattern else [])],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sock = os.path.join(d, name + ".v2.sock")
    while not os.path.exists(sock):
        time.sleep(0.01)
    if consumer == "c":
        cmd = [C_CONSUME, "--ring", sock, "--timeout-ms", "60000"]
    else:
        cmd = [sys.executable, "-m", "ibvbridge.consume", "--ring", sock, "--timeout-ms", "60000"]
        if not a.members:  # a member reads heap by heap (a batch would hold other members' positions)
            cmd += ["--batch", str(a.consumer_batch)]
    if a.members:
        cmd += ["--group-name", "bench"]
    conss = [subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(n)]
    outs = [c.communicate() for c in conss]
    out, err = prod.communicate()
    pj, cjs = json.loads(out), [json.loads(o) for o, _ in outs]
    assert prod.returncode == 0, err
    heaps = sum(cj["heaps"] for cj in cjs)
    assert all(cj["result"] == "eos" for cj in cjs) and heaps == pj["heaps"] == a.heaps, (pj, cjs)
    assert sum(cj["checksum"] for cj in cjs) % (1 << 64) == pj["checksum"], (pj, cjs)
    return pj["heaps_per_s"], heaps / max(cj["seconds"] for cj in cjs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heaps", type=int, default=2_000_000)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--consumer-batch", type=int, default=4096)
    ap.add_argument("--slots", type=int, default=65536)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--hugepages", default="off")
    ap.add_argument("--consumers", default="c,python", help="which consumers: c, python or both")
    ap.add_argument("--pattern", action="store_true", help="write each payload (produce --pattern)")
    ap.add_argument("--members", type=int, default=0, help="N consumers in one consumer group (spec §14)")
    a = ap.parse_args()
    want = a.consumers.split(",")
    pairs = (["c"] if "c" in want and os.access(C_CONSUME, os.X_OK) else []) + (["python"] if "python" in want else [])
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        for consumer in pairs:
            prod_rates, cons_rates = [], []
            for i in range(a.runs):
                p, c = one(consumer, a, d, f"bench{i}")
                prod_rates.append(p)
                cons_rates.append(c)
            print(f"python producer (batch {a.batch}{', pattern' if a.pattern else ''}) -> {consumer:6s} consumer, "
                  f"{a.size}-byte heaps, {f'{a.members} group members, ' if a.members else ''}"
                  f"{a.heaps} heaps x {a.runs} runs: producer median {statistics.median(prod_rates):,.0f} "
                  f"heaps/s (range {min(prod_rates):,.0f} - {max(prod_rates):,.0f}); consumer median "
                  f"{statistics.median(cons_rates):,.0f} heaps/s")


if __name__ == "__main__":
    main()
