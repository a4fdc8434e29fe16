import json
import os
import subprocess
import sys
import time

import pytest

from ibvbridge import layout as L
from fake_producer import imm, pattern

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
PY = sys.executable
M64 = (1 << 64) - 1
KEYS = ["heaps", "bytes", "checksum", "verify_errors", "overrun_heaps", "incomplete", "first_heap_cnt", "last_heap_cnt",
        "heap_cnt_out_of_order", "seconds", "cpu_seconds", "result", "error", "counters", "session_id", "chunks",
        "heaps_present", "heap_cnt_sum", "group_id"]


def expected_checksum(heaps):
    s = 0
    for cnt, n in heaps:
        b = pattern(cnt, n) + b"\0" * 7
        for i in range(0, n, 8):
            s += int.from_bytes(b[i:i + 8], "little")
    return s & M64


def parse(rc, stdout, stderr):
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, (stdout, stderr)
    out = json.loads(lines[0])
    assert list(out) == KEYS
    assert 0 <= out["cpu_seconds"] < 60  # the stream's CPU, without start-up and exit
    if out["result"] in ("eos", "max"):
        assert stderr == ""
    else:  # a failure is also one line on stderr
        assert len(stderr.splitlines()) == 1 and stderr.endswith("\n") and out["result"] in stderr, stderr
    return rc, out


def consume(*args, timeout=60):
    r = subprocess.run([PY, "-m", "ibvbridge.consume", *args], cwd=PKG, capture_output=True, text=True,
                       timeout=timeout)
    return parse(r.returncode, r.stdout, r.stderr)


def consume_bg(*args):
    return subprocess.Popen([PY, "-m", "ibvbridge.consume", *args], cwd=PKG, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=30):
    out, err = proc.communicate(timeout=timeout)
    return parse(proc.returncode, out, err)


def spawn(tmp_path, name, *args):
    proc = subprocess.Popen([PY, os.path.join(HERE, "fake_producer.py"), "--dir", str(tmp_path), "--name", name,
                             *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc, os.path.join(str(tmp_path), name + ".v2.sock")


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
    assert out["heap_cnt_sum"] == 400 * 401 // 2 and out["group_id"] == 0


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
    # 2.0: a dead producer's memory is gone with it, so the consumer attaches first and drains after the death
    proc, path = spawn(tmp_path, "g", "--count", "30", "--end", "exit", "--slot-count", "64",
                       "--wait-consumers", "1")
    c = consume_bg("--ring", path, "--verify", *mode)
    proc.wait(10)
    rc, out = finish(c)
    assert rc == 2 and out["result"] == "producer_gone" and out["heaps"] == 30 and out["verify_errors"] == 0
    assert "gone" in out["error"]


def test_timeout(make_producer):
    p = make_producer()
    rc, out = consume("--ring", p.socket_path, "--timeout-ms", "200")
    assert rc == 3 and out["result"] == "timeout" and out["heaps"] == 0


def test_not_found_is_error(tmp_path):
    rc, out = consume("--ring", str(tmp_path / "none.v2.sock"), "--timeout-ms", "50")
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
    rc, out = consume("--ring", "r", "--dir", os.path.dirname(p.socket_path), "--verify", *mode)
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


def test_not_found_by_name(tmp_path):
    rc, out = consume("--ring", "none", "--dir", str(tmp_path), "--timeout-ms", "50")
    assert rc == 1 and out["result"] == "error" and "RingNotFound" in out["error"]


def test_bad_ring_argument():
    rc, out = consume("--ring", "/tmp/ibvbridge.old.v1.ctl", "--timeout-ms", "50")
    assert rc == 1 and out["result"] == "error" and "1.0" in out["error"]


def test_refused_is_error_with_the_producers_message(make_producer):
    p = make_producer()
    p.refuse = (L.STATUS_BUSY, "ring r busy: all 8 consumer rows are attached")
    rc, out = consume("--ring", p.socket_path, "--timeout-ms", "2000")
    assert rc == 1 and out["result"] == "error" and "RingBusy" in out["error"] and "rows are attached" in out["error"]


@pytest.mark.parametrize("mode", [[], ["--batch", "8"]])
def test_start_head(make_producer, mode):
    p = make_producer(slot_count=16)
    for i in range(5):
        p.publish_verify(100 + i, 16)
    proc = consume_bg("--ring", p.socket_path, "--start", "head", "--verify", "--timeout-ms", "5000", *mode)
    p.wait_consumers(1)
    for i in range(3):
        p.publish_verify(200 + i, 16)
    p.publish_eos()
    rc, out = finish(proc)
    assert rc == 0 and out["result"] == "eos" and out["heaps"] == 3
    assert (out["first_heap_cnt"], out["last_heap_cnt"], out["verify_errors"]) == (200, 202, 0)


@pytest.mark.parametrize("mode", [[], ["--batch", "8"]])
def test_overrun_exit_4(make_producer, mode):
    p = make_producer()
    p.publish_verify(1, 16)
    proc = consume_bg("--ring", p.socket_path, "--timeout-ms", "5000", *mode)
    p.wait_consumers(1)
    deadline = time.monotonic() + 5
    while p.consumer().tail != 1 and time.monotonic() < deadline:  # it read and released heap 1
        time.sleep(0.01)
    p.detach(p.consumer().index, L.CONSUMER_OVERRUN, lost_heaps=9)
    rc, out = finish(proc)
    assert rc == 4 and out["result"] == "overrun" and "9 heaps lost" in out["error"] and out["heaps"] == 1
    assert out["counters"]["consumer_overruns"] == 1


def test_detached_exit_5(make_producer):
    p = make_producer()
    proc = consume_bg("--ring", p.socket_path, "--timeout-ms", "5000")
    p.wait_consumers(1)
    p.detach(p.consumer().index, L.CONSUMER_BAD_CURSOR, lost_heaps=0)
    rc, out = finish(proc)
    assert rc == 5 and out["result"] == "detached" and "invalid cursor" in out["error"]


def test_two_consumer_processes_each_get_every_heap(tmp_path):
    proc, path = spawn(tmp_path, "two", "--count", "300", "--size", "40", "--slot-count", "8", "--batch", "3",
                       "--wait-consumers", "2")
    a = consume_bg("--ring", "two", "--dir", str(tmp_path), "--verify")
    b = consume_bg("--ring", path, "--verify", "--batch", "16")
    ra, oa = finish(a)
    rb, ob = finish(b)
    proc.wait(10)
    want = expected_checksum([(c, 40) for c in range(1, 301)])
    for rc, out in ((ra, oa), (rb, ob)):
        assert rc == 0 and out["result"] == "eos" and out["heaps"] == 300 and out["verify_errors"] == 0
        assert out["checksum"] == want and out["heap_cnt_out_of_order"] == 0
    assert oa["session_id"] == ob["session_id"]
