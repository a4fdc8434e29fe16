#!/usr/bin/env python3
"""OK or FAILED for each stage of examples/pipeline/run.sh's output (used by `make demo`).

    python3 examples/pipeline/verdict.py PIPELINE_JSON

A stage is OK when every heap went through (the pipeline's HEAPS), nothing was skipped, and, for the C
stages, there are no Parseval errors and the checksum equals the one computed from the input pattern.
Prints a line per stage; exits 1 if any stage FAILED or printed no result.
"""
import json
import sys


def verdicts(lines):
    """(printed lines, all OK) for run.sh's output lines."""
    stages, expected, heaps, out, bad = [], None, None, [], False
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:  # a stage that failed printed no result (its log went to stderr)
            out.append(f"  FAILED (no result) {line.strip()[:100]}")
            bad = True
            continue
        if "stage" in d:
            stages.append((d["stage"], d["result"]))
        else:
            expected, heaps = d["pipeline"]["expected_checksum"], d["pipeline"]["heaps"]
    if heaps is None:
        return out + ["  FAILED no pipeline line (run.sh did not finish)"], False
    for name, r in stages:
        why = []
        if r.get("heaps") != heaps:
            why.append(f"{r.get('heaps')} heaps, want {heaps}")
        if r.get("skipped"):
            why.append(f"{r['skipped']} skipped")
        if r.get("parseval_errors"):
            why.append(f"{r['parseval_errors']} parseval errors")
        if "parseval_errors" in r and r.get("checksum") != expected:
            why.append(f"checksum {r.get('checksum')}, want {expected}")
        bad = bad or bool(why)
        out.append(f"  {'FAILED' if why else 'OK':6s} {name:9s} heaps {r.get('heaps')}"
                   + (f", checksum {r['checksum']}" if "checksum" in r else "")
                   + ("  <- " + "; ".join(why) if why else ""))
    out.append(f"  expected checksum {expected} (computed from the input pattern)")
    return out, not bad


def main():
    with open(sys.argv[1]) as f:
        out, ok = verdicts(f)
    print("\n".join(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
