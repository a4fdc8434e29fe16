#!/usr/bin/python3
"""Benchmark figures live on one generated page: fails when one is typed by hand anywhere else.

    check_bench_figures.py [ROOT]

docs/reference/benchmarks.md is written by `make bench-report` (scripts/bench_report.py) from the benchmarks'
--json output, each figure with its command, date, commit and machine. Every other doc (README.md, docs/,
clients/*/README.md) links to its sections instead. This check scans those docs for what looks like a
measured figure — a number with a rate unit (heaps/s, GB/s, Gb/s, packets/s), a cost per heap, packet, chunk
or byte (ns/heap, µs per heap, µs of CPU, s/GB), or a decimal ratio (0.55×) — and prints each with its file and
line. Defaults, geometry and spec constants (a 20 µs spin, 128 × 2 MiB, timeouts) do not match.

A hit that is not a measured figure goes in ALLOW below with its reason; keep the list small.
"""
import os
import re
import sys

GENERATED = "docs/reference/benchmarks.md"

NUM = r"(?<![\w.])\d[\d.,]*(?:\s?[–-]\s?\d[\d.,]*)?\s?"
PER = r"(?:heap|packet|chunk|byte|wake|call|datagram)s?\b"
PATTERNS = [
    ("rate", re.compile(NUM + r"(?:[kMG]\s?)?(?:\d+-byte\s)?(?:heaps|chunks|packets|datagrams|frames)/s\b")),
    ("rate", re.compile(NUM + r"[kMG]/s\b")),
    ("rate", re.compile(NUM + r"(?:[kMG]\s?)?(?:heaps|chunks|packets)\s(?:a|per)\ssecond\b")),
    ("bandwidth", re.compile(NUM + r"(?:GB|Gb|MB|Mb|GiB|MiB)/s\b")),
    ("cost", re.compile(NUM + r"(?:ns|µs)\s?(?:/|\sper\s|\sa\s|\sof\s(?:\w+\s)?CPU\s(?:per\s|a\s)?)" + PER)),
    ("cost", re.compile(NUM + r"(?:ns|µs)\sof\s(?:\w+\s)?CPU\b")),
    ("cost", re.compile(NUM + r"ns\b")),
    ("cost", re.compile(NUM + r"s/GB\b")),
    # 0.55×, 0.55 ×, 2×: not 128 × 2 MiB or 4 × sizeof(int) (geometry: a space, then a size)
    ("ratio", re.compile(r"(?<![\w.])(?:\d+\.\d+\s?|\d+)×(?!\s?\d)")),
]

# (path, text the line contains, reason). Each entry must match at least one hit, so none outlives its line.
ALLOW = [
    ("clients/python/README.md", "### Cost per heap (the goal:",
     "the chunk consumer's design goal, a target the linked measurements are judged by"),
]


# The patterns' own test, run before every check: each figure must be found, each non-figure must not.
FIGURES = ["49.7 M heaps/s", "520 k heaps a second", "18.7–19.1 GB/s", "at 6 Gb/s", "37 ns/heap", "0.12 µs\nof consumer CPU per heap",
           "6.9 µs a wake", "18–200 µs of CPU", "13.6 ns", "0.197 s/GB", "recv costs 0.57× spead2", "1.90 × one", "2× less",
           "2.6–5.8 M\n64-byte heaps/s", "22 M/s"]
NOT_FIGURES = ["spins (≤ 20 µs)", "default 20 µs", "128 × 2 MiB", "512 × 2 MiB", "`0x1000 + 128 × index`",
               "4 × sizeof(int)", "u32 ×2", "within 250 ms", "64 timestamps × 4 sources", "`--rate` (Gb/s)",
               "tens of millions of 64-byte heaps a second"]


def self_test():
    bad = [f for f in FIGURES if not any(rx.search(f) for _, rx in PATTERNS)]
    bad += [f"(not a figure) {f}" for f in NOT_FIGURES if any(rx.search(f) for _, rx in PATTERNS)]
    if bad:
        sys.exit("check_bench_figures: the patterns are wrong for: " + "; ".join(map(repr, bad)))


def docs(root):
    yield "README.md"
    for d, _, files in os.walk(os.path.join(root, "docs")):
        for f in sorted(files):
            if f.endswith(".md"):
                p = os.path.relpath(os.path.join(d, f), root)
                if p != GENERATED:
                    yield p
    cl = os.path.join(root, "clients")
    for c in sorted(os.listdir(cl)):
        if os.path.exists(os.path.join(cl, c, "README.md")):
            yield f"clients/{c}/README.md"


def hits(root):
    """Every match in every doc, with its line: the text is scanned whole, so a figure broken over two lines
    is still found."""
    for p in docs(root):
        text = open(os.path.join(root, p), encoding="utf-8").read()
        lines = text.split("\n")
        for kind, rx in PATTERNS:
            for m in rx.finditer(text):
                n = text.count("\n", 0, m.start())
                yield p, n + 1, kind, " ".join(m.group(0).split()), lines[n]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    self_test()
    used, bad, seen = set(), [], set()
    for p, n, kind, text, line in hits(root):
        if (p, n, text) in seen:
            continue
        seen.add((p, n, text))
        allowed = next((i for i, (ap, frag, _) in enumerate(ALLOW) if ap == p and frag in line), None)
        if allowed is None:
            bad.append(f"{p}:{n}: {kind} figure typed by hand: {text!r}")
        else:
            used.add(allowed)
    for i, (ap, frag, why) in enumerate(ALLOW):
        if i not in used:
            bad.append(f"check_bench_figures.py: allow-list entry matches nothing (remove it): {ap}: {frag!r} ({why})")
    if bad:
        print("\n".join(bad))
        print(f"check_bench_figures: {len(bad)} problem(s): benchmark figures belong on {GENERATED}, written by "
              "`make bench-report`; link to its sections (#ring, #spead2-recv, ...) instead", file=sys.stderr)
        sys.exit(1)
    print(f"check_bench_figures: no benchmark figure outside {GENERATED}")


if __name__ == "__main__":
    main()
