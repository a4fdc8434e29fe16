import json
import os
import subprocess
import sys

import pytest

from fake_producer import imm, pattern

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
PY = sys.executable
M64 = (1 << 64) - 1
KEYS = ["heaps", "bytes", "checksum", "verify_errors", "incomplete", "first_heap_cnt", "last_heap_cnt",
        "heap_cnt_out_of_order", "seconds", "result", "error", "counters", "session_id"]


def expected_checksum(heaps):
    s = 0
    for cnt, n in heaps:
        b = pattern(cnt, n) + b"\0" * 7
        for i in range(0, n, 8):
            s += int.from_bytes(b[i:i + 8], "little")
    return s & M64


def consume(*args, timeout=60):
    r = subprocess.run([PY, "-m", "ibvbridge.consume", *args], cwd=PKG, capture_output=True, text=True,
                       timeout=timeout)
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1, (r.stdout, r.stderr)
    out = json.loads(lines[0])
    assert list(out) == KEYS
    return r.returncode, out


def spawn(tmp_path, name, *args):
    proc = subprocess.Popen([PY, os.path.join(HERE, "fake_producer.py"), "--dir", str(tmp_path), "--name", name,
                             *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc, os.path.join(str(tmp_path), f"ibvbridge.{name}.v1.ctl")


@pytest.mark.parametrize("mode", [[], ["--batch", "64"], ["--hold", "3"], ["--batch", "5", "--hold", "7"]])
def test_eos_verify_checksum(tmp_path, mode):
    proc, path = spawn(tmp_path, "c", "--count", "400", "--size", "101", "--slot-count", "16", "--batch", "7")
    rc, out = consume("--ring", path, "--verify", *mode)
    proc.wait(10)
    assert rc == 0 and out["result"] == "eos" and out["error"] == ""
    assert out["heaps"] == 400 and out["bytes"] == 400 * 101 and out["verify_errors"] == 0
    assert out["checksum"] == expected_checksum([(c, 101) for c in range(1, 401)])
    assert (out["first_heap_cnt"], out["last_heap_cnt"], out["heap_cnt_out_of_order"]) == (1, 400, 0)
    assert out["counters"]["heaps"] == 400 and out["counters"]["end_of_stream"] == 1
    assert out["session_id"] > 0 and out["incomplete"] == 0


@pytest.mark.parametrize("mode", [[], ["--batch", "4"]])
def test_max_heaps(tmp_path, mode):
    proc, path = spawn(tmp_path, "m", "--count", "50", "--end", "hang")
    try:
        rc, out = consume("--ring", path, "--max-heaps", "10", *mode)
        assert rc == 0 and out["result"] == "max" and out["heaps"] == 10 and out["last_heap_cnt"] == 10
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("mode", [[], ["--batch", "8"]])
def test_producer_gone(tmp_path, mode):
    proc, path = spawn(tmp_path, "g", "--count", "30", "--end", "exit", "--slot-count", "64")
    proc.wait(10)
    rc, out = consume("--ring", path, "--verify", *mode)
    assert rc == 2 and out["result"] == "producer_gone" and out["heaps"] == 30 and out["verify_errors"] == 0
    assert "gone" in out["error"]


def test_timeout(make_producer):
    p = make_producer()
    rc, out = consume("--ring", p.ctl_path, "--timeout-ms", "200")
    assert rc == 3 and out["result"] == "timeout" and out["heaps"] == 0


def test_not_found_is_error(tmp_path):
    rc, out = consume("--ring", str(tmp_path / "ibvbridge.none.v1.ctl"), "--timeout-ms", "50")
    assert rc == 1 and out["result"] == "error" and "not found" in out["error"]


@pytest.mark.parametrize("mode", [[], ["--batch", "16"]])
def test_verify_errors_and_order(make_producer, mode):
    p = make_producer(slot_count=16, slot_size=128)
    p.publish_verify(5, 64)                                        # ok
    bad = bytearray(pattern(6, 64))
    bad[63] ^= 1
    p.publish(6, bytes(bad), items=[imm(0x1001, 6)])               # a wrong byte
    p.publish(7, pattern(7, 30), items=[imm(0x1001, 8)])           # wrong item value
    p.publish(4, pattern(4, 20), items=[(0x1001, 0, 4, 0)])        # not immediate, and out of order
    p.publish(9, pattern(9, 17))                                   # no item 0x1001: fine
    p.publish(10, pattern(10, 8), flags=2)                         # incomplete
    p.publish_eos()
    rc, out = consume("--ring", p.ctl_path, "--verify", *mode)
    assert rc == 0 and out["result"] == "eos"
    assert out["heaps"] == 6 and out["verify_errors"] == 3 and out["heap_cnt_out_of_order"] == 1
    assert out["incomplete"] == 1 and (out["first_heap_cnt"], out["last_heap_cnt"]) == (5, 10)
    heaps = [(5, pattern(5, 64)), (6, bytes(bad)), (7, pattern(7, 30)), (4, pattern(4, 20)), (9, pattern(9, 17)),
             (10, pattern(10, 8))]
    s = 0
    for _, b in heaps:
        b = b + b"\0" * 7
        s += sum(int.from_bytes(b[i:i + 8], "little") for i in range(0, len(b) - 7, 8))
    assert out["checksum"] == s & M64
    assert out["bytes"] == 64 + 64 + 30 + 20 + 17 + 8
