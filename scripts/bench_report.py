#!/usr/bin/python3
"""make bench-report: runs the benchmarks the docs quote, with --json, and writes the benchmark page
(docs/reference/benchmarks.md) from what they printed — every figure with its command, date, commit and
machine (cpu, cores, kernel, load average before the run), the median and the spread over the repeats, and
whether the runs were lossless. Figures are never typed by hand: rerun this to refresh them.

    bench_report.py [--repeats N] [--out PATH] [--only ring,spead2-recv,...]

Each section of the page is written between markers of its own, with its own date, commit, machine and
load: --only rewrites the sections it names and keeps the others as they were. Other docs link to the
sections' anchors (#ring, #spead2-recv, ...), which stay stable; scripts/docs/check_bench_figures.py keeps
benchmark figures out of every other doc.

Ratios measured in one run (against spead2, against memcpy, one consumer against a group) travel between
machines; absolute rates do not, and the page says so.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "bin", "ibvbridge")
PY = "/usr/bin/python3"


def sh(*args):
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT).stdout.strip()


def commit():
    c = sh("git", "rev-parse", "--short=10", "HEAD")
    if sh("git", "status", "--porcelain", "--untracked-files=no"):
        c += " (with uncommitted changes)"
    return c


def machine():
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    mem = next((int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal")), 0)
    return f"{os.cpu_count()} × {model}, {round(mem / 2**20)} GiB, Linux {platform.release()}"


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def last_json(out):
    for line in reversed(out.splitlines()):
        line = line.strip()
        if line.startswith("{") or line.startswith("["):
            return json.loads(line)
    raise ValueError("no JSON line in the output")


class Section:
    """One section of the page: its commands, run with the load recorded before each, and its text."""

    def __init__(self, key, title, intro):
        self.key, self.title, self.intro = key, title, intro
        self.cmds, self.loads, self.body, self.start = [], [], [], now()
        self.t0 = time.monotonic()

    def run(self, argv, times=1, timeout=1800, env=None):
        """Runs argv (ibvbridge's arguments, or a full command line starting with a path) and returns the
        JSON it printed last, once per time; the command and the load before each run are recorded."""
        full = argv if argv[0].startswith("/") or argv[0].endswith(".py") else [BIN, *argv]
        shown = " ".join(("ibvbridge" if a == BIN else os.path.relpath(a, ROOT) if a.startswith(ROOT)
                          else f'"{a}"' if " " in a else a) for a in full)
        self.cmds.append((shown, times))
        out = []
        for _ in range(times):
            self.loads.append(os.getloadavg()[0])
            p = subprocess.run(full, capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                               env={**os.environ, **(env or {})})
            if p.returncode != 0:
                raise RuntimeError(f"{shown}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
            out.append((last_json(p.stdout), p.stderr))
        return out

    def text(self):
        loads = f"{min(self.loads):.1f}–{max(self.loads):.1f}" if self.loads else "—"
        cmds = "\n".join(f"    {c}" + (f"   # {n} times" if n > 1 else "") for c, n in self.cmds)
        head = [f"<!-- bench-report:{self.key} -->\n", f"## {self.title} {{#{self.key}}}\n\n", self.intro, "\n\n"]
        prov = [f"Measured {self.start} at commit `{commit()}` on {machine()}; load average (1 min) "
                f"{loads} before the runs; {time.monotonic() - self.t0:.0f} s. "
                + ("Command:" if len(self.cmds) == 1 else "Commands:") + "\n\n" + cmds + "\n\n"] if self.cmds else []
        return "".join(head + self.body + ["\n"] + prov + [f"<!-- /bench-report:{self.key} -->\n"])


def spread(xs):
    xs = [x for x in xs if x is not None]
    return (statistics.median(xs), min(xs), max(xs)) if xs else (None, None, None)


def num(v, digits=3):
    if v is None:
        return "—"
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:,.0f}".replace(",", " ")
    return f"{v:.{digits}g}"


def med_range(xs, scale=1.0, digits=3):
    m, lo, hi = spread([x * scale if x is not None else None for x in xs])
    return f"**{num(m, digits)}**", f"{num(lo, digits)} – {num(hi, digits)}"


def table_head(s, *cols):
    s.body.append("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n")


def size_label(n):
    return f"{n // 1048576} MiB" if n >= 1 << 20 and n % 1048576 == 0 else f"{n // 1024} KiB" if n % 1024 == 0 else f"{n} B"


def lossless_runs(flags):
    return f"{sum(1 for f in flags if f)}/{len(flags)}"


# ---------------------------------------------------------------------------------------------- sections

def ring_section(a):
    s = Section("ring", "The ring alone",
                "A Go producer in the benchmark's process publishes into a ring that a consumer in another process "
                "reads, every heap checked by checksum. `memcpy` is a single-core copy over a working set as large "
                "as the ring, measured in the same run: the ratio travels between machines, the rates do not. The "
                "idle CPU is the consumer's while it waits for heaps that do not come (1 s before each run).")
    table_head(s, "consumer, heaps", "figure", "median", "min – max", "runs", "heaps lost")
    cases = (("C, 64-byte heaps", ["--consumer", "c", "--heap-size", "64"], ("heaps_per_s", 1e-6, "M heaps/s")),
             ("Python `next_batch(4096)`, 64-byte heaps", ["--consumer", "python", "--heap-size", "64", "--batch", "4096"],
              ("heaps_per_s", 1e-6, "M heaps/s")),
             ("Python `for heap in ring`, 64-byte heaps", ["--consumer", "python", "--heap-size", "64", "--heaps", "1000000"],
              ("heaps_per_s", 1e-6, "M heaps/s")),
             ("Go, 64-byte heaps", ["--consumer", "go", "--heap-size", "64"], ("heaps_per_s", 1e-6, "M heaps/s")),
             ("C, 1 MiB heaps", ["--consumer", "c", "--heap-size", "1048576"], ("bytes_per_s", 1e-9, "GB/s")))
    for label, args, (key, scale, unit) in cases:
        rs = [r for r, _ in s.run(["bench", "ring", *args, "--repeat", "1", "--json"], times=a.repeats)]
        lost = sum(r.get("heaps_lost", 0) for r in rs)
        ok = all(r.get("checksum_ok") for r in rs)
        m, rng = med_range([r.get(key) for r in rs], scale)
        s.body.append(f"| {label} | {unit} | {m} | {rng} | {len(rs)} | {lost}{'' if ok else ', checksum FAILED'} |\n")
        if key == "bytes_per_s":
            m, rng = med_range([r.get("memcpy_ratio") for r in rs])
            s.body.append(f"| {label} | ÷ memcpy in the same run | {m}× | {rng} | {len(rs)} | |\n")
        if label.startswith("C, 64"):
            m, rng = med_range([r.get("idle_cpu_percent") for r in rs], digits=2)
            s.body.append(f"| {label} | idle consumer, % of a core | {m} | {rng} | {len(rs)} | |\n")
    return s


def produce_pair(s, producer, consumer, heaps, size, slots, batch, hugepages):
    """One producer process into one consumer process on a ring in a fresh directory: the producer's JSON
    after both checked out (every heap arrived, the checksums agree)."""
    import tempfile
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "clients", "python")}
    with tempfile.TemporaryDirectory(prefix="ibvb-bench-report-") as d:
        prod = producer + ["--ring", "bench", "--dir", d, "--heaps", str(heaps), "--heap-size", str(size),
                           "--slots", str(slots), "--policy", "block", "--wait-consumers", "1", "--hugepages", hugepages]
        if batch:
            prod += ["--batch", str(batch)]
        s.loads.append(os.getloadavg()[0])
        pp = subprocess.Popen(prod, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sock = os.path.join(d, "bench.v2.sock")
        t = time.monotonic()
        while not os.path.exists(sock):
            if pp.poll() is not None or time.monotonic() - t > 30:
                raise RuntimeError(f"{' '.join(prod)}: no ring: {pp.stderr.read()[-400:]}")
            time.sleep(0.01)
        cons = consumer + ["--ring", sock, "--timeout-ms", "60000"]
        cp = subprocess.run(cons, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        out, err = pp.communicate(timeout=600)
        if pp.returncode or cp.returncode:
            raise RuntimeError(f"{' '.join(prod)} | {' '.join(cons)}: {err[-300:]} {cp.stderr[-300:]}")
        pj, cj = last_json(out), last_json(cp.stdout)
        if cj["heaps"] != pj["heaps"] or cj["checksum"] != pj["checksum"] or pj["heaps"] != heaps:
            raise RuntimeError(f"producer and consumer disagree: {pj} {cj}")
        return pj


def producers_section(a):
    s = Section("producers", "The C and Python producers",
                "A producer process publishes into a ring (block policy) that one consumer process "
                "reads; each run is checked: every heap arrived and the producer's and consumer's checksums agree. "
                "The rate is the producer's, from its first publish to everything released. The Go producer's "
                "figures are in [the ring alone](#ring).")
    c_prod = os.path.join(ROOT, "clients/c/build/ibvb-produce")
    c_cons = os.path.join(ROOT, "clients/c/build/ibvb-consume")
    py_prod = [PY, "-m", "ibvbridge.produce"]
    py_cons = [PY, "-m", "ibvbridge.consume", "--batch", "4096"]
    table_head(s, "producer → consumer, heaps", "figure", "median", "min – max", "runs")
    cases = (("C → C, 64-byte heaps, 4096 slots", [c_prod], [c_cons], 20_000_000, 64, 4096, 0, "heaps_per_s", 1e-6, "M heaps/s"),
             ("C → C, 1 MiB heaps, 256 slots", [c_prod], [c_cons], 5000, 1 << 20, 256, 0, "bytes_per_s", 1e-9, "GB/s"),
             ("Python `publish_batch` (4096 a call) → C, 64-byte heaps", py_prod, [c_cons], 2_000_000, 64, 65536, 4096,
              "heaps_per_s", 1e-6, "M heaps/s"),
             ("Python `publish_batch` (4096 a call) → Python batch consumer, 64-byte heaps", py_prod, py_cons, 2_000_000,
              64, 65536, 4096, "heaps_per_s", 1e-6, "M heaps/s"),
             ("Python `acquire`/`publish` per heap → C, 64-byte heaps", py_prod, [c_cons], 200_000, 64, 65536, 0,
              "heaps_per_s", 1e-6, "M heaps/s"))
    for label, prod, cons, heaps, size, slots, batch, key, scale, unit in cases:
        hugepages = "auto" if prod[0] == c_prod else "off"
        shown = lambda argv: ("PYTHONPATH=clients/python " if argv[0] == PY else "") + " ".join(
            os.path.relpath(x, ROOT) if x.startswith(ROOT) else x for x in argv)
        s.cmds.append((f"{shown(prod)} --ring bench --dir D --heaps {heaps} --heap-size {size} --slots {slots} "
                       f"--policy block --wait-consumers 1 --hugepages {hugepages}{f' --batch {batch}' if batch else ''} & "
                       f"{shown(cons)} --ring D/bench.v2.sock --timeout-ms 60000", a.repeats))
        rs = [produce_pair(s, prod, cons, heaps, size, slots, batch, hugepages) for _ in range(a.repeats)]
        for r in rs:
            r["bytes_per_s"] = r["bytes"] / r["seconds"] if r.get("seconds") else None
        m, rng = med_range([r.get(key) for r in rs], scale)
        s.body.append(f"| {label} | {unit} | {m} | {rng} | {len(rs)} |\n")
    return s


def spead2_recv_section(a):
    s = Section("spead2-recv", "recv against spead2_recv, on spead2_send's traffic",
                "One `spead2_send` stream per run, alternating run by run, into `recv` (defaults plus `--policy block`, "
                "as spead2_recv's ring blocks; a C consumer, `ibvb-consume --no-touch`, takes and releases every heap "
                "unread), into `spead2_recv` (`--ring --mem-pool --ring-heaps 64 --quiet`) and into the floor "
                "(`ibvbridge bench floor`: a blocking `recvmmsg` + `UDP_GRO` receiver that only counts bytes — what the "
                "kernel alone costs). Every receiver has a 32 MiB socket buffer. CPU is user + system of the receiving "
                "process over the stream (median and min – max over the runs; recv's consumer's CPU beside it); heaps "
                "and GB per CPU-second are the stream's heaps and payload bytes over that median CPU: what one core "
                "of that receiver would take at this heap size.")
    if not shutil.which("spead2_recv") or not shutil.which("spead2_send"):
        s.body.append("spead2 not measured: `spead2_recv` and `spead2_send` are not on PATH here, so `ibvbridge send` "
                      "sends and the rows are recv's and the floor's alone.\n\n")
    (res, _), = s.run(["bench", "udp", "--peer", "spead2", "--runs", str(max(a.repeats, 5)), "--json"], timeout=3600)
    table_head(s, "stream", "receiver", "CPU s (median)", "min – max", "+ consumer", "÷ spead2_recv", "÷ floor",
               "heaps per CPU-second", "GB per CPU-second", "lossless runs")
    for shape in res["results"]:
        sh_ = shape["shape"]
        rows = shape["rows"]
        peer = next((r for r in rows if r["kind"] == "spead2"), None)
        floor = next((r for r in rows if r["kind"] == "floor"), None)
        label = f"{size_label(sh_['heap_size'])} heaps, {sh_['packet_size']} B packets, {sh_['rate_gbps']:g} Gb/s, {sh_['heaps']} heaps"
        for r in rows:
            cpu = r["cpu_s"]
            runs = r.get("runs") or []
            m, rng = med_range([x["cpu_s"] for x in runs])
            cons = f"{r['consumer_cpu_s']:.3f}" if r["kind"] == "recv" else ""
            vs = f"{cpu / peer['cpu_s']:.2f}×" if peer and peer["cpu_s"] and r is not peer else "—"
            vf = f"{cpu / floor['cpu_s']:.2f}×" if floor and floor["cpu_s"] and r is not floor else "—"
            hps = num(sh_["heaps"] / cpu) if cpu else "—"
            gbs = num(sh_["heaps"] * sh_["heap_size"] / cpu / 1e9) if cpu else "—"
            s.body.append(f"| {label} | {r['receiver']} | {m} | {rng} | {cons} | {vs} | {vf} | {hps} | {gbs} | "
                          f"{lossless_runs([x['lossless'] for x in runs])} |\n")
    return s


def python_rows(res, s, with_ratio, names=None):
    table_head(s, "stream", "receiver", "CPU µs/heap (median)", "min – max", "of which the Python loop", "latency median µs",
               "p99 µs (min – max)", "lossless runs", *(["CPU ÷ spead2"] if with_ratio else []))
    for shape in res["results"]:
        sh_ = shape["shape"]
        label = f"{size_label(sh_['heap_size'])} @ {sh_['rate_gbps']:g} Gb/s"
        if sh_.get("chunk_heaps"):
            label += f", chunks of {sh_['chunk_heaps']}"
        for r in shape["rows"]:
            lo, hi = r["cpu_us_per_heap_spread"]
            plo, phi = r["latency_p99_us_spread"]
            ratio = ""
            if with_ratio:
                ratio = f" {r['ratios_to_spead2']['cpu']:.2f}× |" if r.get("ratios_to_spead2") else " — |"
            name = (names or {}).get(r["receiver"], r["receiver"])
            if r["receiver"] == "floor":  # no decoding, no Python: no loop share, no latency
                s.body.append(f"| {label} | {name} | **{num(r['cpu_us_per_heap'])}** | {num(lo)} – {num(hi)} | — | — | — | "
                              f"{lossless_runs([x['lossless'] for x in r['runs']])} |{ratio}\n")
                continue
            s.body.append(f"| {label} | {name} | **{num(r['cpu_us_per_heap'])}** | {num(lo)} – {num(hi)} | "
                          f"{num(r['loop_cpu_us_per_heap'])} | {num(r['latency_median_us'])} | {num(r['latency_p99_us'])} "
                          f"({num(plo)} – {num(phi)}) | {lossless_runs([x['lossless'] for x in r['runs']])} |{ratio}\n")


def spead2_python_missing(s, err, rest):
    """Say in section s why spead2's Python receiver was not measured: bench python's one line about it on
    stderr err, then rest."""
    why = next((l for l in err.splitlines() if "spead2" in l), "spead2's Python package does not import")
    why = why.strip().removeprefix("bench python: ").removesuffix(": ibvbridge alone")
    s.body.append(f"spead2's Python receiver not measured: {why.strip()}. {rest}\n\n")


def spead2_python_section(a):
    s = Section("spead2-python", "recv + the Python client against spead2's Python receiver",
                "A Go sender stamps each heap with its send time and sends the same traffic, alternating run by run (each "
                "heap alone at its time; heaps leave in batches only once the sender is 64 heaps' time behind), "
                "to recv (its defaults, the block policy) read by the Python client's `ItemGroup` loop, and to spead2's "
                "Python receiver (`spead2.recv.Stream`, a memory pool, a 128-heap ring) running the same loop "
                "(`bench/pyloop.py`), and to the floor (`ibvbridge bench floor`: a blocking `recvmmsg` that counts bytes "
                "and decodes nothing — what the kernel alone costs a receiver that reads each datagram as it comes, with "
                "no consumer and no Python: no receiver that hands each heap on as it arrives costs less; in chunk "
                "mode recv reads many heaps a wake, and can). CPU is that of every receiving process (recv + Python, or spead2's one process) "
                "per heap; latency is the loop's receive time minus the send stamp. The chunks row (`--chunks 64`) is "
                "recv's chunk mode placing by heap cnt, read with `ring.chunks()`, against `spead2.recv.ChunkRingStream` "
                "placing alike with a compiled `chunk_place`, both loops counting each chunk's presence map; its "
                "latency is each chunk's, from its last heap's send time, and includes when each receiver publishes a "
                "full chunk (recv at once, spead2 when the next chunk but one opens).")
    runs = str(max(a.repeats, 5))
    (res, err), = s.run(["bench", "python", "--peer", "spead2", "--floor", "--runs", runs, "--seconds", "1", "--json"], timeout=3600)
    (chunks, _), = s.run(["bench", "python", "--peer", "spead2", "--floor", "--chunks", "64", "--runs", str(a.repeats),
                          "--seconds", "1", "--json"], timeout=3600)
    if not res.get("peer"):
        spead2_python_missing(s, err, "The rows are ibvbridge's alone.")
    python_rows({"results": res["results"] + chunks["results"]}, s, bool(res.get("peer")))
    return s


def max_rate_section(a):
    s = Section("max-rate", "The highest lossless rate of 1 KiB heaps into a Python ItemGroup loop",
                "The sender of the section above, 1 KiB heaps, into recv + the Python client's `ItemGroup` loop and into "
                "spead2's Python receiver with the same loop, in bursts: once late at all, heaps leave 64 at a time, as a "
                "NIC's interrupt moderation hands them over (sent one by one, at these rates the sender would spend the "
                "receivers' cores on the receiving stack's work, which loopback charges to it). From 10 k heaps/s each "
                "receiver is probed at half as much again while every run of a probe is lossless, then three probes "
                "narrow the gap to the first loss (to within 5 %); the receivers take turns probe by probe. A probe the "
                "sender could not keep (it shares the machine's cores with both) ends that search: its highest rate is then a lower bound.")
    (r, err), = s.run(["bench", "python", "--peer", "spead2", "--max-rate", "1K", "--json"], timeout=3600)
    res = r["max_rate"]
    if not r.get("peer"):
        spead2_python_missing(s, err, "The row is ibvbridge's alone.")
    table_head(s, "receiver", "highest lossless heaps/s", "what bounds it", "probes, heaps/s (runs lossless)")
    for row in res["rows"]:
        if row["lowest_lossy_heaps_per_s"]:
            bound = f"lost heaps at {num(row['lowest_lossy_heaps_per_s'])}"
        elif row["sender_behind_at_heaps_per_s"]:
            bound = "at least"
        else:
            bound = f"at least: none lost up to {num(res['options']['cap_heaps_per_s'])}"
        if row["sender_behind_at_heaps_per_s"]:
            bound += f"; the sender could not keep {num(row['sender_behind_at_heaps_per_s'])}"
        probes = ", ".join(f"{num(p['heaps_per_s'])} ({p['lossless_runs']}/{p['runs']})" for p in row["probes"])
        s.body.append(f"| {row['receiver']} | **{num(row['highest_lossless_heaps_per_s'])}** | {bound} | {probes} |\n")
    if res.get("highest_ratio_to_spead2"):
        s.body.append(f"\nibvbridge's highest lossless rate is **{res['highest_ratio_to_spead2']:.1f}×** spead2's.\n")
    return s


def coalesce_section(a):
    s = Section("coalesce", "recv's coalescing settings, from Python",
                "The same benchmark as above without spead2, each `--coalesce` setting a row alternating run by run "
                "with the default (`heap`): what each setting costs in CPU and buys or costs in latency.")
    (res, _), = s.run(["bench", "python", "--shapes", "8K@1,1K@0.2", "--runs", str(a.repeats), "--seconds", "1",
                       "--variant", "c1ms=--coalesce 1ms", "--variant", "c0=--coalesce 0", "--json"], timeout=3600)
    python_rows(res, s, False, {"ibvbridge": "default (`--coalesce heap`)", "c1ms": "`--coalesce 1ms`", "c0": "`--coalesce 0`"})
    return s


def group_section(a):
    s = Section("group", "What a consumer group buys",
                "One Python consumer against a group of four on the same chunk ring (64 heaps of 8 KiB a chunk, "
                "`--work 1`: about 1.8 ms of numpy per chunk), rounds alternating; every chunk read exactly once. The "
                "ceiling is what the machine's cores allow after the producer's share.")
    (r, _), = s.run(["bench", "group", "--rounds", str(max(a.repeats, 5)), "--json"], timeout=3600)
    rr = r.get("round_ratios") or []
    m, rng = med_range(rr)
    table_head(s, "figure", "median", "min – max", "rounds")
    s.body.append(f"| group of {r['group']['members']} ÷ one consumer, chunks/s | {m}× | {rng} | {len(rr)} |\n")
    s.body.append(f"| one consumer, chunks/s (last round) | {num(r['one']['chunks_per_s'])} | | |\n")
    s.body.append(f"| the group, chunks/s (last round) | {num(r['group']['chunks_per_s'])} | | |\n")
    s.body.append(f"| ceiling | {r['ceiling']:.2f}× | | |\n")
    s.body.append(f"| the group's shares of {sum(r['group'].get('shares') or [])} chunks (last round) | "
                  f"{', '.join(str(x) for x in r['group'].get('shares') or [])} | | |\n")
    return s


def chunk_mode_section(a):
    s = Section("chunk-mode", "Chunk mode: what a Python consumer pays per heap, live",
                "recv in chunk mode (`--chunk-heaps N`) against recv in heap mode on the same traffic (8 KiB one-packet "
                "heaps at 2.5 Gb/s with a timestamp item), alternating run by run; the consumer is the Python consume "
                "tool with `--no-touch` (presence maps only, no payload reads). Its CPU per heap present, recv's CPU "
                "per byte in chunk mode over heap mode. T is the consumer's latency bound (`Ring.attach(…, "
                "max_latency=T)`, `--max-latency-us`): 0 is a wake per chunk.")
    table_head(s, "chunks", "T", "Python ns/heap, chunk mode (median)", "min – max", "heap mode",
               "recv CPU per byte, chunk ÷ heap", "lossless runs (chunk / heap)")
    for label, extra, lat in (("64 heaps", [], "0"), ("64 heaps", ["--consumer-max-latency", "250ms"], "250 ms"),
                              ("64 × 64 heaps (`--chunk-axis 64`)", ["--chunk-axis", "64"], "0")):
        (res, _), = s.run(["bench", "udp", "--rate", "2.5", "--heap-sizes", "8K", "--chunk-heaps", "64", *extra,
                           "--bytes", "512M", "--consumer", "python", "--runs", str(a.repeats),
                           "--consumer-args=--no-touch", "--json"], timeout=3600)
        for c in res["comparisons"]:
            ours, base = c["ours"], c["baseline"]
            m, rng = med_range([x.get("consumer_cpu_ns_per_heap") for x in ours["runs"]])
            s.body.append(f"| {label} | {lat} | {m} | {rng} | {num(base.get('consumer_cpu_ns_per_heap'))} | "
                          f"{c['recv_cpu_per_byte_ratio']:.2f}× | {lossless_runs([x['lossless'] for x in ours['runs']])}"
                          f" / {lossless_runs([x['lossless'] for x in base['runs']])} |\n")
    return s


def chunk_capacity_section(a):
    s = Section("chunk-capacity", "Chunk mode: the saturated Python consumer",
                "A chunk ring filled ahead (descriptors and presence maps; no payload reads), read by one Python process "
                "that never waits: its own thread CPU per heap present, the capacity of one Python process. "
                "`chunks` is `for chunk in ring.chunks()`, `batches` is `ring.chunk_batches(4096)`.")
    (res, _), = s.run([PY, os.path.join(ROOT, "clients/python/tests/bench_chunks.py"), "--heaps", "64,4096",
                       "--modes", "chunks,batches", "--rounds", str(max(a.repeats, 5)), "--json"], timeout=1800)
    table_head(s, "heaps per chunk", "mode", "ns/heap (median)", "min – max", "M heaps/s")
    for r in res:
        s.body.append(f"| {r['heaps_per_chunk']} | {r['mode']} | **{num(r['ns_per_heap'])}** | {num(r['min_ns'])} – "
                      f"{num(r['max_ns'])} | {num(r['mheaps_per_s'])} |\n")
    return s


def wakes_section(a):
    s = Section("consumer-wakes", "What a consumer's wakes cost at a modest heap rate",
                "64-byte heaps at 0.036 Gb/s (about 70 000 heaps a second) through `send` and `recv` into a C consumer "
                "that waits for each heap (a latency bound of 0) or sets a bound of 1 ms (`--max-latency-us`): the "
                "consumer's CPU per heap, and recv's per packet.")
    table_head(s, "consumer's bound", "consumer ns/heap (median)", "min – max", "recv ns/packet", "lossless runs")
    for lat in ("0", "1ms"):
        (res, _), = s.run(["bench", "udp", "--rate", "0.036", "--heap-sizes", "64", "--packet-size", "1472", "--bytes", "16M",
                           "--runs", str(a.repeats), "--consumer-max-latency", lat, "--json"], timeout=1800)
        for z in res["sizes"]:
            m, rng = med_range([x.get("consumer_cpu_ns_per_heap") for x in z["runs"]])
            s.body.append(f"| {'none (a wake per heap)' if lat == '0' else lat} | {m} | {rng} | "
                          f"{num(z.get('recv_cpu_ns_per_packet'))} | {lossless_runs([x['lossless'] for x in z['runs']])} |\n")
    return s


SECTIONS = {"ring": ring_section, "producers": producers_section, "spead2-recv": spead2_recv_section, "spead2-python": spead2_python_section, "max-rate": max_rate_section,
            "coalesce": coalesce_section, "group": group_section, "chunk-mode": chunk_mode_section,
            "chunk-capacity": chunk_capacity_section, "consumer-wakes": wakes_section}

HEAD = ("<!-- Generated by `make bench-report` (scripts/bench_report.py) from the benchmarks' --json output: "
        "rerun it, do not edit the figures. -->\n\n# Benchmarks\n\n"
        "Every figure on this page was written by `make bench-report` from what the benchmark printed with `--json`; "
        "no figure is typed by hand. Each section says when, at which commit, on what machine and under what load "
        "it was measured, and the exact commands; `scripts/bench_report.py --only SECTION` refreshes one section.\n\n"
        "Ratios measured in one run — against spead2 on the same traffic, against memcpy in the same process, one "
        "consumer against a group, chunk mode against heap mode — travel between machines; absolute rates do not, "
        "and on a shared or busy machine they spread widely (the min – max columns say how widely). How figures "
        "moved from release to release is in the [changelog](../changelog.md).\n\n")


def split_sections(text):
    out = {}
    for m in re.finditer(r"<!-- bench-report:([a-z0-9-]+) -->\n.*?<!-- /bench-report:\1 -->\n", text, re.S):
        out[m.group(1)] = m.group(0)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "reference", "benchmarks.md"))
    ap.add_argument("--only", default=",".join(SECTIONS), help="sections to measure: " + ",".join(SECTIONS))
    a = ap.parse_args()
    if not os.access(BIN, os.X_OK):
        sys.exit(f"bench-report: {BIN} missing: run make build")
    only = [k for k in a.only.split(",") if k]
    bad = [k for k in only if k not in SECTIONS]
    if bad:
        sys.exit(f"bench-report: unknown section {','.join(bad)} (want {','.join(SECTIONS)})")
    old = split_sections(open(a.out).read()) if os.path.exists(a.out) else {}
    t0 = time.monotonic()
    for k in only:
        print(f"bench-report: {k} ...", flush=True)
        t = time.monotonic()
        old[k] = SECTIONS[k](a).text()
        print(f"bench-report: {k} took {time.monotonic() - t:.0f} s", flush=True)
    body = [old[k] + "\n" for k in SECTIONS if k in old]
    with open(a.out, "w") as f:
        f.write(HEAD + "".join(body))
    print(f"bench-report: wrote {os.path.relpath(a.out, ROOT)} in {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
