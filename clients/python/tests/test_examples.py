"""The demo's helpers: print_heaps labels item descriptors, the pipeline verdict says OK or FAILED."""

import importlib.util
import json
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_print_heaps_names_what_a_descriptor_describes():
    from test_items import descriptor_packet
    ph = load("clients/python/examples/print_heaps.py", "print_heaps")
    assert ph.described(descriptor_packet(0x1600, b"timestamp", b"", fmt=b"u\x00\x30")) == \
        "0x1600 'timestamp' (format [('u', 48)])"
    assert ph.described(descriptor_packet(0x1001, b"x", b"", dtype=b"{'descr': '|u1', 'fortran_order': False, "
                                          b"'shape': (3,)}", addr_bytes=5)) == "0x1001 'x' (dtype uint8, shape (3,))"
    assert ph.described(b"\x00" * 16) is None


def lines(stages, heaps=200, expected=42):
    out = [json.dumps({"stage": s, "result": r}) for s, r in stages]
    return out + [json.dumps({"pipeline": {"heaps": heaps, "expected_checksum": expected, "status": 0}})]


def test_pipeline_verdict_ok_and_failed_per_stage():
    v = load("examples/pipeline/verdict.py", "verdict")
    good = [("recvA", {"heaps": 200}), ("peak", {"heaps": 200, "checksum": 42, "parseval_errors": 0})]
    out, ok = v.verdicts(lines(good))
    assert ok and out[0].startswith("  OK     recvA") and out[1].startswith("  OK     peak")
    bad = [("recvA", {"heaps": 199}), ("peak", {"heaps": 200, "checksum": 41, "parseval_errors": 0})]
    out, ok = v.verdicts(lines(bad))
    assert not ok
    assert out[0].startswith("  FAILED recvA") and "199 heaps, want 200" in out[0]
    assert out[1].startswith("  FAILED peak") and "checksum 41, want 42" in out[1]
    out, ok = v.verdicts(["garbage"] + lines(good))
    assert not ok and out[0].startswith("  FAILED (no result)")
    out, ok = v.verdicts([json.dumps({"stage": "recvA", "result": {"heaps": 200}})])
    assert not ok and "no pipeline line" in out[-1]
