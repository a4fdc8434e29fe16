#!/usr/bin/python3
"""make bench-report: runs the benchmarks the docs quote, with --json, and writes the benchmark page
(docs/reference/benchmarks.md) from what they printed — every figure with its command, date, commit and
machine, and the spread over the repeats. Figures are never typed by hand: rerun this to refresh them.

    bench_report.py [--repeats N] [--out PATH] [--only ring,peer,group]

Ratios measured in one run (against spead2, against memcpy, one consumer against a group) travel between
machines; absolute rates do not, and the page says so.
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "bin", "ibvbridge")


def sh(*args):
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT).stdout.strip()


def machine():
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    mem = next((int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal")), 0)
    commit = sh("git", "rev-parse", "--short=10", "HEAD")
    if sh("git", "status", "--porcelain", "--untracked-files=no"):
        commit += " (with uncommitted changes)"
    return {"cpu": model, "cores": os.cpu_count(), "kernel": platform.release(), "memory_gib": round(mem / 2**20),
            "commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "load_before": os.getloadavg()[0]}


def last_json(out):
    for line in reversed(out.splitlines()):
        line = line.strip()
        if line.startswith("{") or line.startswith("["):
            return json.loads(line)
    raise ValueError("no JSON line in the output")


def run(cmd, timeout=1800):
    p = subprocess.run([BIN, *cmd], capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"ibvbridge {' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    return last_json(p.stdout)


def spread(xs):
    xs = [x for x in xs if x is not None]
    return (statistics.median(xs), min(xs), max(xs)) if xs else (None, None, None)


def fmt(v, unit):
    if v is None:
        return "—"
    if unit == "M heaps/s":
        return f"{v / 1e6:.1f}"
    if unit == "GB/s":
        return f"{v / 1e9:.1f}"
    if unit in ("×", "ratio"):
        return f"{v:.2f}"
    return f"{v:.3g}"


def row(name, xs, unit):
    m, lo, hi = spread(xs)
    return f"| {name} | **{fmt(m, unit)}** {unit} | {fmt(lo, unit)} – {fmt(hi, unit)} | {len(xs)} |\n"


def ring_section(repeats):
    out = ["## The ring alone\n\n",
           "A Go producer in the benchmark's process publishes into a ring that a consumer in another process "
           "reads (every heap checked by checksum). `memcpy` is a single-core copy over a working set as large as "
           "the ring, measured in the same run: the ratio travels between machines, the rates do not.\n\n",
           "| figure | median | min – max | repeats |\n|---|---|---|---|\n"]
    cmds = []
    for title, cmd, key, unit in (
            ("Go → C consumer, 64-byte heaps", ["bench", "ring", "--consumer", "c", "--heap-size", "64"], "heaps_per_s", "M heaps/s"),
            ("Go → Python batch consumer (4096 a batch), 64-byte heaps",
             ["bench", "ring", "--consumer", "python", "--heap-size", "64", "--batch", "4096"], "heaps_per_s", "M heaps/s"),
            ("Go → C consumer, 1 MiB heaps", ["bench", "ring", "--consumer", "c", "--heap-size", "1048576"], "bytes_per_s", "GB/s"),
            ("… the same ÷ memcpy", None, "memcpy_ratio", "×")):
        if cmd is not None:
            results = [run([*cmd, "--json"]) for _ in range(repeats)]
            cmds.append("ibvbridge " + " ".join(cmd) + " --json")
        out.append(row(title, [r.get(key) for r in results], unit))
    out.append("\nCommands: " + "; ".join(f"`{c}`" for c in cmds) + f", each {repeats} times.\n\n")
    return out


def peer_section():
    if not shutil.which("spead2_recv") or not shutil.which("spead2_send"):
        return ["## recv against spead2_recv\n\nNot run: spead2_recv and spead2_send are not on this machine "
                "(build them with the spead2 build script the developers' guide names).\n\n"]
    cmd = ["bench", "udp", "--peer", "spead2", "--runs", "5", "--json"]
    res = run(cmd, timeout=3600)
    out = ["## recv against spead2_recv, on spead2_send's traffic\n\n",
           "One `spead2_send` stream per run into `recv` (with a C consumer taking every heap), into `spead2_recv` "
           "4.4.1, and into the floor (a blocking `recvmmsg` + GRO receiver that only counts bytes), alternating "
           "run by run. CPU is user + system of the receiving process over the stream.\n\n",
           "| traffic | receiver | CPU s (median) | ÷ spead2_recv | ÷ floor | every run lossless |\n|---|---|---|---|---|---|\n"]
    for shape in res if isinstance(res, list) else [res]:
        s = shape["shape"]
        rows = shape["rows"]
        peer = next((r for r in rows if r["kind"] == "spead2"), None)
        floor = next((r for r in rows if r["kind"] == "floor"), None)
        label = f"{s['heap_size'] // 1024} KiB heaps, {s['packet_size']} B packets, {s['rate_gbps']} Gb/s"
        for r in rows:
            vs = f"{r['cpu_s'] / peer['cpu_s']:.2f}×" if peer and peer["cpu_s"] else "—"
            vf = f"{r['cpu_s'] / floor['cpu_s']:.2f}×" if floor and floor["cpu_s"] else "—"
            out.append(f"| {label} | {r['receiver']} | {r['cpu_s']:.3f} | {vs} | {vf} | {'yes' if r['lossless'] else 'no'} |\n")
    out.append(f"\nCommand: `ibvbridge {' '.join(cmd)}`.\n\n")
    return out


def group_section():
    cmd = ["bench", "group", "--rounds", "5", "--json"]
    r = run(cmd, timeout=3600)
    return ["## What a consumer group buys\n\n",
            "One Python consumer against a group of four on the same chunk ring (64 × 8 KiB chunks, ~1.8 ms of "
            "numpy per chunk), rounds alternating; every chunk read exactly once. The ceiling is what the "
            "machine's cores allow after the producer's share.\n\n",
            "| figure | value |\n|---|---|\n",
            f"| group of 4 ÷ one consumer (median of {len(r.get('round_ratios') or [])} rounds) | **{r['ratio']:.2f}×** |\n",
            f"| per round | {', '.join(f'{x:.2f}' for x in r.get('round_ratios') or [])} |\n",
            f"| ceiling | {r['ceiling']:.2f}× |\n",
            f"\nCommand: `ibvbridge {' '.join(cmd)}`.\n\n"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "reference", "benchmarks.md"))
    ap.add_argument("--only", default="ring,peer,group")
    a = ap.parse_args()
    if not os.access(BIN, os.X_OK):
        sys.exit(f"bench-report: {BIN} missing: run make build")
    m = machine()
    parts = {"ring": lambda: ring_section(a.repeats), "peer": peer_section, "group": group_section}
    body = []
    for k in a.only.split(","):
        print(f"bench-report: {k} ...", flush=True)
        body += parts[k]()
    m["load_after"] = os.getloadavg()[0]
    head = ["<!-- Generated by `make bench-report` (scripts/bench_report.py) from the benchmarks' --json output: "
            "rerun it, do not edit the figures. -->\n\n# Benchmarks\n\n",
            f"Measured {m['date']} at commit `{m['commit']}` on {m['cores']} × {m['cpu']}, "
            f"{m['memory_gib']} GiB, Linux {m['kernel']} (load average {m['load_before']:.1f} before, "
            f"{m['load_after']:.1f} after).\n\n",
            "Ratios measured in one run — against spead2 on the same traffic, against memcpy in the same process, "
            "one consumer against a group — travel between machines; absolute rates do not, and on a shared or "
            "busy machine they spread widely (the min – max columns say how widely). How figures moved from "
            "release to release is in the [changelog](../changelog.md).\n\n"]
    with open(a.out, "w") as f:
        f.write("".join(head + body))
    print(f"bench-report: wrote {os.path.relpath(a.out, ROOT)}")


if __name__ == "__main__":
    main()
