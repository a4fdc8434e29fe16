"""The public producer (ibvbridge.Producer) against the Python consumer (ibvbridge.Ring), the consume CLI
and, when built, the C consumer."""

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import ibvbridge
from ibvbridge import layout as L
from ibvbridge import (Detached, Interrupted, NoConsumer, NoHugePages, NoSpace, Overrun, Producer, Ring, RingFull,
                       RingInUse, Timeout, UnsafeDirectory)
from ibvbridge._sys import get_seals
from ibvbridge.producer import IMMEDIATE, SEALS_SHARED

from fake_producer import pattern, until

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
PY = sys.executable
C_CONSUME = os.path.join(PKG, "..", "c", "build", "ibvb-consume")
ENV = dict(os.environ, PYTHONPATH=PKG)


@pytest.fixture
def make(make_public_producer):
    return make_public_producer


def put(p, cnt, data, timeout=5.0):
    """One heap: pattern payload, address item 0x1000 and immediate item 0x1001 = cnt."""
    s = p.acquire(timeout=timeout)
    s.payload[:len(data)] = np.frombuffer(data, np.uint8)
    s.add_item(0x1000, 0, len(data))
    s.add_item(0x1001, cnt, 5, immediate=True)
    return p.publish(s, cnt)


def reader(ring, out, n=None):
    def run():
        try:
            for h in ring:
                out.append((h.heap_cnt, bytes(h.payload), h.item(0x1001).value))
                if n is not None and len(out) == n:
                    break
        except Exception as e:  # noqa: BLE001 - reported to the test
            out.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


# ---------------------------------------------------------------- basics
def test_every_byte_block(make):
    p = make(policy="block", slot_count=8, slot_size=512)
    with Ring.attach(p.socket_path, timeout=2) as ring:
        out = []
        t = reader(ring, out)
        sizes = [(i * 37) % 513 for i in range(1, 300)]
        for cnt, n in enumerate(sizes, 1):
            put(p, cnt, pattern(cnt, n))
        p.end_of_stream()
        p.wait_drained(timeout=5)
        t.join(5)
    assert [o[0] for o in out] == list(range(1, len(sizes) + 1))
    for (cnt, data, v), n in zip(out, sizes):
        assert data == pattern(cnt, n) and v == cnt
    st = p.stats()
    assert st["heaps"] == len(sizes) and st["bytes"] == sum(sizes) and st["end_of_stream"] == 1
    assert st["dropped_heaps"] == 0


def test_drop_without_consumer_keeps_the_newest(make):
    p = make(policy="drop", slot_count=8)
    for cnt in range(1, 21):
        put(p, cnt, pattern(cnt, 64))
    assert p.oldest == 12 and p.head == 20
    with Ring.attach(p.socket_path, timeout=2) as ring:
        got = [ring.next(timeout=1).heap_cnt for _ in range(8)]
    assert got == list(range(13, 21))


def test_drop_full_ring_drops_the_new_heap(make):
    p = make(policy="drop", slot_count=8)
    with Ring.attach(p.socket_path, timeout=2) as ring:
        for cnt in range(1, 9):
            put(p, cnt, pattern(cnt, 64))
        with pytest.raises(RingFull):
            p.acquire()
        p.add("dropped_heaps", 1)
        assert p.publish_batch(np.zeros((4, 64), np.uint8), [9, 10, 11, 12]) == 0
        assert p.stats()["dropped_heaps"] == 1
        # the one consumer still has every heap it holds, untouched
        for cnt in range(1, 9):
            with ring.next(timeout=1) as h:
                assert h.heap_cnt == cnt and bytes(h.payload) == pattern(cnt, 64)
        # released: room again
        put(p, 9, pattern(9, 64))
        assert ring.next(timeout=1).heap_cnt == 9


def test_block_waits_for_the_consumer(make):
    p = make(policy="block", slot_count=4)
    with Ring.attach(p.socket_path, timeout=2) as ring:
        for cnt in range(1, 5):
            put(p, cnt, pattern(cnt, 64))
        with pytest.raises(Timeout):
            p.acquire(timeout=0.3)
        out = []
        t = reader(ring, out)
        for cnt in range(5, 101):
            put(p, cnt, pattern(cnt, 64))
        p.end_of_stream()
        p.wait_drained(timeout=5)
        t.join(5)
    assert [o[0] for o in out] == list(range(1, 101))
    assert all(d == pattern(c, 64) for c, d, _ in out)
    assert p.row(0)["wakes"] >= 0


def test_three_consumers_each_get_every_heap(make):
    p = make(policy="block", slot_count=16)
    rings = [Ring.attach(p.socket_path, timeout=2) for _ in range(3)]
    outs = [[] for _ in rings]
    ts = [reader(r, o) for r, o in zip(rings, outs)]
    p.wait_consumers(3, timeout=2)
    for cnt in range(1, 501):
        put(p, cnt, pattern(cnt, 100))
    p.end_of_stream()
    p.wait_drained(timeout=10)
    for t in ts:
        t.join(5)
    for r in rings:
        r.close()
    for o in outs:
        assert [x[0] for x in o] == list(range(1, 501))
        assert all(d == pattern(c, 100) for c, d, _ in o)


def test_overrun_detaches_the_slowest(make):
    p = make(policy="drop", slot_count=8)
    slow = Ring.attach(p.socket_path, timeout=2)
    fast = Ring.attach(p.socket_path, timeout=2)
    try:
        for cnt in range(1, 9):
            put(p, cnt, pattern(cnt, 64))
        for cnt in range(1, 9):
            with fast.next(timeout=1) as h:
                assert h.heap_cnt == cnt
        fast._flush_release()
        put(p, 9, pattern(9, 64))  # the pool is empty: the slowest is detached, the fast one goes on
        row = p.row(slow.consumer_index)
        assert row["state"] == L.CONSUMER_OVERRUN and row["lost_heaps"] == 8
        assert p.stats()["consumer_overruns"] == 1 and p.consumers == 1
        with pytest.raises(Overrun) as e:
            slow.next(timeout=1)
        assert e.value.lost_heaps == 8
        with fast.next(timeout=1) as h:
            assert h.heap_cnt == 9 and bytes(h.payload) == pattern(9, 64)
    finally:
        slow.close()
        fast.close()


def test_bad_cursor_detaches_only_that_consumer(make):
    p = make(policy="block", slot_count=8)
    bad = Ring.attach(p.socket_path, timeout=2)
    good = Ring.attach(p.socket_path, timeout=2)
    try:
        for cnt in range(1, 4):
            put(p, cnt, pattern(cnt, 64))
        bad._r64[0] = 1000  # past head
        until(lambda: p.row(bad.consumer_index)["state"] == L.CONSUMER_BAD_CURSOR, 2)
        assert p.stats()["consumer_errors"] == 1 and p.consumers == 1
        with pytest.raises(Detached) as e:
            bad.next(timeout=1)
        assert e.value.reason == L.CONSUMER_BAD_CURSOR
        out = []
        t = reader(good, out)
        for cnt in range(4, 40):
            put(p, cnt, pattern(cnt, 64))
        p.end_of_stream()
        p.wait_drained(timeout=5)
        t.join(5)
        assert [o[0] for o in out] == list(range(1, 40))
    finally:
        bad.close()
        good.close()


def test_backwards_cursor_detaches(make):
    p = make(policy="drop", slot_count=8)
    with Ring.attach(p.socket_path, timeout=2) as r:
        for cnt in range(1, 4):
            put(p, cnt, pattern(cnt, 64))
        for _ in range(3):
            r.next(timeout=1).release()
        r._flush_release()
        until(lambda: p.row(0)["released"] == 3, 2)
        r._r64[0] = 1  # moved backwards
        until(lambda: p.row(0)["state"] == L.CONSUMER_BAD_CURSOR, 2)


def test_consumer_killed_producer_carries_on(make):
    """block: a consumer process that holds everything paces the producer; kill -9 it and the producer
    carries on with the other consumer, which loses nothing."""
    p = make(policy="block", slot_count=8)
    proc = subprocess.Popen([PY, "-m", "ibvbridge.consume", "--ring", p.socket_path, "--hold", "1000000",
                             "--timeout-ms", "30000"], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        p.wait_consumers(1, timeout=10)
        with Ring.attach(p.socket_path, timeout=2) as ring:
            out = []
            t = reader(ring, out)
            for cnt in range(1, 9):
                put(p, cnt, pattern(cnt, 64))
            with pytest.raises(Timeout):
                p.acquire(timeout=0.3)  # the process holds every slot
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
            for cnt in range(9, 101):
                put(p, cnt, pattern(cnt, 64), timeout=5)  # its death gave everything back
            p.end_of_stream()
            p.wait_drained(timeout=5)
            t.join(5)
            idx = 1 - ring.consumer_index
        assert p.row(idx)["state"] == L.CONSUMER_GONE
        assert [o[0] for o in out] == list(range(1, 101))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_consumer_killed_drop_reclaims(make):
    p = make(policy="drop", slot_count=8)
    proc = subprocess.Popen([PY, "-m", "ibvbridge.consume", "--ring", p.socket_path, "--hold", "1000000",
                             "--timeout-ms", "30000"], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        p.wait_consumers(1, timeout=10)
        for cnt in range(1, 9):
            put(p, cnt, pattern(cnt, 64))
        with pytest.raises(RingFull):
            p.acquire()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(5)
        until(lambda: p.consumers == 0, 2)
        put(p, 9, pattern(9, 64))
        assert p.row(0)["state"] == L.CONSUMER_GONE and p.stats()["consumers_attached"] == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_interrupt_wakes_an_acquire_asleep_on_a_consumer_at_once(make):
    """interrupt() wakes a producer asleep in FUTEX_WAIT on a consumer's release_futex: it raises
    Interrupted well within the 250 ms sleep slice (without the wake it would sleep the slice out), each of
    three times, interrupted only once it is asleep (its wait address is set)."""
    p = make(policy="block", slot_count=4)
    with Ring.attach(p.socket_path, timeout=2):
        for cnt in range(1, 5):
            put(p, cnt, pattern(cnt, 64))
        for _ in range(3):
            got = []

            def run():
                try:
                    p.acquire()
                except Interrupted as e:
                    got.append((e, time.monotonic()))
            t = threading.Thread(target=run)
            t.start()
            until(lambda: p._wait_addr != 0)  # asleep in futex_wait on the consumer's release_futex
            time.sleep(0.01)
            t1 = time.monotonic()
            p.interrupt()
            t.join(2)
            assert got and isinstance(got[0][0], Interrupted)
            assert got[0][1] - t1 < 0.1  # the slice is 0.25 s
        with pytest.raises(Timeout):  # the interrupt was consumed: the next wait waits again
            p.acquire(timeout=0.1)


def test_block_without_consumer_waits_for_one(make):
    p = make(policy="block", slot_count=4)
    for cnt in range(1, 5):
        put(p, cnt, pattern(cnt, 64))
    with pytest.raises(Timeout):
        p.acquire(timeout=0.2)
    with pytest.raises(NoConsumer):
        p.wait_drained(timeout=1)


# ---------------------------------------------------------------- batches
def test_publish_batch(make):
    p = make(policy="block", slot_count=64, slot_size=128)
    n = 1000
    with Ring.attach(p.socket_path, timeout=2) as ring:
        res = {}

        def run():
            cnts, pays, v = [], [], []
            for b in ring.batches(256):
                cnts.append(b.heap_cnt.copy())
                pays.append(b.payloads(64).copy())
                found, items = b.find_item(0x1001)
                assert found.all()
                v.append(items["value"].copy())
                assert (b.received == 64).all() and (b.item_count == 2).all()
            res["cnt"], res["pay"], res["v"] = np.concatenate(cnts), np.concatenate(pays), np.concatenate(v)
        t = threading.Thread(target=run)
        t.start()
        cnts = np.arange(1, n + 1, dtype=np.uint64)
        pay = ((cnts[:, None] * 31 + np.arange(64, dtype=np.uint64)[None, :]) & 0xFF).astype(np.uint8)
        done = 0
        for k in range(0, n, 100):
            done += p.publish_batch(pay[k:k + 100], cnts[k:k + 100],
                                    items=[(0x1000, 0, 64, 0), (0x1001, cnts[k:k + 100], 5, IMMEDIATE)],
                                    timeout=5)
        assert done == n
        p.end_of_stream()
        p.wait_drained(timeout=5)
        t.join(5)
    assert (res["cnt"] == cnts).all() and (res["v"] == cnts).all() and (res["pay"] == pay).all()
    assert p.stats()["heaps"] == n and p.stats()["bytes"] == 64 * n


def test_publish_batch_list_and_structured_items(make):
    p = make(policy="drop", slot_count=8, slot_size=128)
    with Ring.attach(p.socket_path, timeout=2) as ring:
        it = np.zeros(1, L.ITEM_DTYPE)
        it[0] = (0x1001, 7, 5, IMMEDIATE, 0)
        assert p.publish_batch([b"abc", b"", b"hello world"], [1, 2, 3], items=it) == 3
        got = [ring.next(timeout=1) for _ in range(3)]
        assert [bytes(h.payload) for h in got] == [b"abc", b"", b"hello world"]
        assert all(h.item(0x1001).value == 7 for h in got)
        for h in got:
            h.release()
        with pytest.raises(ValueError):
            p.publish_batch(np.zeros((1, 64), np.uint8), [1], items=[(0x1000, 100, 64, 0)])  # past the slot


def test_publish_batch_drop_publishes_what_fits(make):
    p = make(policy="drop", slot_count=8, slot_size=64)
    with Ring.attach(p.socket_path, timeout=2) as ring:
        assert p.publish_batch(np.ones((5, 64), np.uint8), np.arange(1, 6)) == 5
        assert p.publish_batch(np.ones((5, 64), np.uint8), np.arange(6, 11)) == 3
        b = ring.next_batch(16, timeout=1)
        assert list(b.heap_cnt) == list(range(1, 9))
        b.release()


def test_batch_wraps_the_descriptor_ring(make):
    p = make(policy="block", slot_count=8, slot_size=64)
    with Ring.attach(p.socket_path, timeout=2) as ring:
        out = []
        t = reader(ring, out)
        for k in range(1, 60, 5):
            cn = np.arange(k, k + 5, dtype=np.uint64)
            pay = np.stack([np.frombuffer(pattern(int(c), 64), np.uint8) for c in cn])
            p.publish_batch(pay, cn, items=[(0x1001, cn, 5, IMMEDIATE)], timeout=5)
        p.end_of_stream()
        p.wait_drained(timeout=5)
        t.join(5)
    assert [o[0] for o in out] == list(range(1, 61))
    assert all(d == pattern(c, 64) and v == c for c, d, v in out)


# ---------------------------------------------------------------- descriptors, seals, directory
def test_descriptors_readable_by_the_consumer(make):
    p = make(slot_size=256)
    D = collections.namedtuple("D", "id name description format dtype shape")
    p.set_descriptors([D(0x1800, "vis", "visibilities", b"", np.dtype("<u4"), (4, 8)),
                       D(0x1600, "timestamp", "", b"\x00\x30", None, None)])
    with Ring.attach(p.socket_path, timeout=2) as ring:
        s = p.acquire()
        arr = np.arange(32, dtype="<u4")
        s.payload[:128] = arr.view(np.uint8)
        s.add_item(0x1800, 0, 128)
        p.publish(s, 1, flags=ibvbridge.producer.COMPLETE | ibvbridge.producer.HAS_DESCRIPTORS)
        ds = ring.descriptors()
        assert ds[0x1800].name == "vis" and ds[0x1800].shape == (4, 8) and ds[0x1800].dtype == np.dtype("<u4")
        assert ds[0x1600].format == b"\x00\x30" and ds[0x1600].shape is None
        with ring.next(timeout=1) as h:
            a = h.array(0x1800)
            assert a.shape == (4, 8) and (a.ravel() == arr).all()


def test_seals_and_files(make, tmp_path):
    p = make()
    for fd in (p.ctl_fd, p.data_fd):
        assert get_seals(fd) & SEALS_SHARED == SEALS_SHARED
    assert os.stat(p.socket_path).st_mode & 0o777 == 0o600
    lock = tmp_path / ("r" + L.LOCK_SUFFIX)
    assert lock.exists() and lock.stat().st_mode & 0o777 == 0o600
    with Ring.attach(p.socket_path, timeout=2) as ring:
        with pytest.raises(TypeError):
            ring._dmv[0:1] = b"x"  # read-only for consumers
    p.close()
    assert not os.path.exists(p.socket_path) and not lock.exists()


def test_second_producer_refused(make, tmp_path):
    make()
    with pytest.raises(RingInUse, match="in use by a live producer"):
        make()


def test_stale_socket_replaced(tmp_path):
    open(tmp_path / ("r" + L.SOCKET_SUFFIX), "w").close()
    with Producer.create("r", directory=str(tmp_path), hugepages="off", slot_count=4, slot_size=64) as p:
        with Ring.attach(p.socket_path, timeout=2) as ring:
            assert ring.session_id == p.session_id


def test_unsafe_directories_refused(tmp_path):
    kw = dict(hugepages="off", slot_count=4, slot_size=64)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(UnsafeDirectory, match="writable by group or others"):
        Producer.create("r", directory=str(open_dir), **kw)
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(UnsafeDirectory, match=f"{link} is a symbolic link"):
        Producer.create("r", directory=str(link), **kw)
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(UnsafeDirectory, match=f"{f} is not a directory"):
        Producer.create("r", directory=str(f), **kw)
    # a planted symlink where the lock goes
    target = tmp_path / "victim"
    target.write_text("keep")
    (real / ("r" + L.LOCK_SUFFIX)).symlink_to(target)
    with pytest.raises(UnsafeDirectory, match="symbolic link"):
        Producer.create("r", directory=str(real), **kw)
    assert target.read_text() == "keep"
    assert not os.path.exists(real / ("r" + L.SOCKET_SUFFIX))


def test_attack_parent_symlink_of_another_user_is_not_followed(tmp_path):
    # --dir /tmp/x/y/z where /tmp/x is another user's symlink: nothing is created through it
    kw = dict(hugepages="off", slot_count=4, slot_size=64)
    target = tmp_path / "attacker"
    target.mkdir()
    os.chown(target, 65534, 65534)
    link = tmp_path / "x"
    link.symlink_to(target)
    os.chown(link, 65534, 65534, follow_symlinks=False)
    with pytest.raises(UnsafeDirectory, match=f"^ring directory {link}/y/z: {link} is a symbolic link$"):
        Producer.create("r", directory=str(link / "y" / "z"), **kw)
    assert os.listdir(target) == []


def test_directory_component_owned_by_another_user_is_refused(tmp_path):
    kw = dict(hugepages="off", slot_count=4, slot_size=64)
    other = tmp_path / "other"
    other.mkdir(mode=0o755)
    os.chown(other, 65534, 65534)
    with pytest.raises(UnsafeDirectory, match=f"{other} is owned by uid 65534, not {os.geteuid()} or root"):
        Producer.create("r", directory=str(other / "ring"), **kw)
    assert os.listdir(other) == []


def test_bad_names_and_geometry(tmp_path):
    for bad in (".x", "a/b", "x" * 65, ""):
        with pytest.raises(ibvbridge.RingError):
            Producer.create(bad, directory=str(tmp_path), hugepages="off")
    with pytest.raises(ValueError):
        Producer.create("r", directory=str(tmp_path), hugepages="off", slot_count=3)
    with pytest.raises(ValueError):
        Producer.create("r", directory=str(tmp_path), hugepages="off", slot_size=100)


def test_memory_larger_than_available_refused_up_front(tmp_path):
    with pytest.raises(NoSpace, match="MiB"):
        Producer.create("r", directory=str(tmp_path), hugepages="off", slot_count=1 << 20, slot_size=1 << 20)
    assert not os.path.exists(tmp_path / ("r" + L.LOCK_SUFFIX))


def test_small_memfds_skip_the_memory_available_reading(monkeypatch):
    """new_shm asks what memory is available only past SMALL_SHM: a consumer's region (a page) does not
    read the three files (they cost more than the rest of an admission); a larger memfd is refused up front
    when more than what they say."""
    import ibvbridge.producer as P
    asked = []
    monkeypatch.setattr(P, "shm_available", lambda: asked.append(1) or 4096)
    fd, mm = P.new_shm("t", L.REGION_SIZE)
    mm.close()
    os.close(fd)
    assert asked == []
    with pytest.raises(NoSpace, match="MiB"):
        P.new_shm("t", P.SMALL_SHM + 4096)
    assert asked == [1]


def test_hugepages_require(tmp_path):
    with pytest.raises(NoHugePages, match="MiB"):
        Producer.create("r", directory=str(tmp_path), hugepages="require", slot_count=1 << 16, slot_size=1 << 20)
    try:
        p = Producer.create("h", directory=str(tmp_path), hugepages="require", slot_count=8, slot_size=4096)
    except NoHugePages as e:
        pytest.skip(f"no hugepages here: {e}")
    with p:
        assert p.huge and p.page_size >= 2 << 20 and p.data_size % p.page_size == 0
        with Ring.attach(p.socket_path, timeout=2) as ring:
            assert ring.page_size == p.page_size if hasattr(ring, "page_size") else True
            put(p, 1, pattern(1, 100))
            assert bytes(ring.next(timeout=1).payload) == pattern(1, 100)


def test_closed_ring_ends_the_consumer(make):
    p = make()
    ring = Ring.attach(p.socket_path, timeout=2)
    put(p, 1, pattern(1, 10))
    p.close()
    assert ring.next(timeout=1).heap_cnt == 1
    with pytest.raises(ibvbridge.EndOfStream):
        ring.next(timeout=1)
    ring.close()


# ---------------------------------------------------------------- command line
def _produce(tmp_path, name, *args):
    return subprocess.Popen([PY, "-m", "ibvbridge.produce", "--ring", name, "--dir", str(tmp_path),
                             "--hugepages", "off", *args], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("mode", [[], ["--batch", "100"]])
def test_produce_cli_into_consume_cli(tmp_path, mode):
    prod = _produce(tmp_path, "c", "--heaps", "3000", "--heap-size", "61", "--slots", "64", "--pattern",
                    "--wait-consumers", "1", *mode)
    sock = str(tmp_path / ("c" + L.SOCKET_SUFFIX))
    until(lambda: os.path.exists(sock), 10)
    cons = subprocess.run([PY, "-m", "ibvbridge.consume", "--ring", sock, "--verify", "--timeout-ms", "20000"],
                          env=ENV, capture_output=True, text=True, timeout=60)
    out, err = prod.communicate(timeout=60)
    assert prod.returncode == 0, err
    pj, cj = json.loads(out), json.loads(cons.stdout)
    assert set(pj) == {"heaps", "bytes", "checksum", "dropped", "seconds", "heaps_per_s"}
    assert pj["heaps"] == cj["heaps"] == 3000 and pj["dropped"] == 0 and cj["verify_errors"] == 0
    assert pj["checksum"] == cj["checksum"] and pj["bytes"] == cj["bytes"] == 3000 * 61
    assert cj["result"] == "eos"


def test_produce_cli_drop_without_consumer(tmp_path):
    prod = _produce(tmp_path, "d", "--heaps", "100", "--slots", "16", "--policy", "drop")
    out, err = prod.communicate(timeout=60)
    assert prod.returncode == 0, err
    j = json.loads(out)
    assert j["heaps"] == 100 and j["dropped"] == 0  # nobody attached: drop keeps the newest


def test_produce_cli_error(tmp_path):
    os.chmod(tmp_path, 0o777)
    try:
        prod = _produce(tmp_path, "e", "--heaps", "1")
        out, err = prod.communicate(timeout=60)
    finally:
        os.chmod(tmp_path, 0o700)
    assert prod.returncode == 1 and out == "" and len(err.strip().splitlines()) == 1
    assert "writable by group or others" in err


@pytest.mark.skipif(not os.access(C_CONSUME, os.X_OK), reason="clients/c/build/ibvb-consume is not built")
@pytest.mark.parametrize("mode", [[], ["--batch", "512"]])
def test_produce_cli_into_c_consumer(tmp_path, mode):
    prod = _produce(tmp_path, "cc", "--heaps", "20000", "--heap-size", "100", "--slots", "256", "--pattern",
                    "--wait-consumers", "1", *mode)
    sock = str(tmp_path / ("cc" + L.SOCKET_SUFFIX))
    until(lambda: os.path.exists(sock), 10)
    cons = subprocess.run([C_CONSUME, "--ring", sock, "--verify", "--timeout-ms", "20000"], capture_output=True,
                          text=True, timeout=60)
    out, err = prod.communicate(timeout=60)
    assert prod.returncode == 0, err
    pj, cj = json.loads(out), json.loads(cons.stdout)
    assert cj["result"] == "eos" and cj["verify_errors"] == 0 and cj["heaps"] == pj["heaps"] == 20000
    assert cj["checksum"] == pj["checksum"]


def test_group_socket_mode(tmp_path):
    gid = os.getgid()
    with Producer.create("g", directory=str(tmp_path), hugepages="off", slot_count=4, slot_size=64,
                         group=gid) as p:
        st = os.stat(p.socket_path)
        assert st.st_mode & 0o777 == 0o660 and st.st_gid == gid
        with Ring.attach(p.socket_path, timeout=2):
            pass


def test_hugepages_auto_falls_back_with_a_warning(tmp_path, monkeypatch):
    import ibvbridge.producer as prod
    real = os.memfd_create

    def no_huge(name, flags=0):
        if flags & os.MFD_HUGETLB:
            raise OSError(28, "No space left on device")
        return real(name, flags)
    monkeypatch.setattr(prod.os, "memfd_create", no_huge)
    with pytest.warns(ibvbridge.HugePageWarning, match="ordinary shared memory"):
        p = Producer.create("w", directory=str(tmp_path), hugepages="auto", slot_count=4, slot_size=64)
    with p:
        assert not p.huge and p.page_size == 4096


def test_slot_context_manager_returns_the_slot_on_an_exception_under_block(tmp_path):
    with Producer.create("slot", slot_count=2, slot_size=64, policy="block", hugepages="off",
                         directory=str(tmp_path)) as p:
        for _ in range(10):  # 10 failures on a 2-slot ring: any leaked slot would make acquire time out
            with pytest.raises(ValueError, match="fill failed"):
                with p.acquire(timeout=1) as slot:
                    slot.payload[:4] = 7
                    raise ValueError("fill failed")
            assert not slot.live
        with p.acquire(timeout=1) as slot:
            pass  # left without publishing: given back too
        assert not slot.live
        with Ring.attach(p.socket_path, timeout=2) as ring:
            with p.acquire(timeout=1) as slot:
                slot.payload[:3] = np.frombuffer(b"abc", np.uint8)
                p.publish(slot, heap_cnt=1, received=3)
            assert not slot.live
            with ring.next(timeout=1) as h:
                assert h.heap_cnt == 1 and bytes(h.payload) == b"abc"
            with p.acquire(timeout=1), p.acquire(timeout=1):
                pass  # both slots free again


def test_nothing_is_published_after_end_of_stream(make):
    """END_OF_STREAM is final (spec §4.1): a slot taken before the marker cannot be published after it; acquire,
    publish_batch and a second marker raise StreamEnded; the consumer reads the marker and nothing after."""
    p = make("eosfinal")
    with Ring.attach(p.socket_path, timeout=2) as ring:
        early = p.acquire()
        p.end_of_stream(5)
        head = p.head
        free = p._nfree()
        with pytest.raises(ibvbridge.StreamEnded, match="END_OF_STREAM is final"):
            p.publish(early, 6, 8)
        assert p._nfree() == free + 1  # the refused slot went back to the pool
        with pytest.raises(ibvbridge.StreamEnded):
            p.acquire()
        with pytest.raises(ibvbridge.StreamEnded):
            p.publish_batch(np.zeros((2, 8), np.uint8), [7, 8])
        with pytest.raises(ibvbridge.StreamEnded):
            p.end_of_stream(9)
        assert p.head == head  # nothing followed the marker
        with pytest.raises(ibvbridge.EndOfStream):
            ring.next(timeout=1)


def _hello_status(sock_path, mutate, keep=False):
    """Send a consumer hello changed by mutate(bytearray) -> bytes; the answer's status (None: no record),
    descriptors closed; with keep the socket is returned too."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(sock_path)
    s.send(mutate(bytearray(L.pack_hello(L.ROLE_CONSUMER, L.START_OLDEST))))
    s.settimeout(5)
    msg, fds, _, _ = socket.recv_fds(s, 256, 4)
    for fd in fds:
        os.close(fd)
    status = int.from_bytes(msg[12:16], "little") if len(msg) >= 16 else None
    if keep:
        return status, s
    s.close()
    return status


def test_hello_answers_as_specified(make):
    """Spec §1.2: status 5 for a wrong role or start, non-zero reserved bytes or a wrong size; a welcome for
    a group_id (§14); status 1 for another major; a welcome for any minor; a record sent after the welcome
    ends the attachment."""
    p = make("hello")

    def put32(off, v):
        def f(b):
            b[off:off + 4] = v.to_bytes(4, "little")
            return bytes(b)
        return f
    assert _hello_status(p.socket_path, put32(0x0C, 3)) == L.STATUS_PROTOCOL
    assert _hello_status(p.socket_path, put32(0x10, 2)) == L.STATUS_PROTOCOL
    assert _hello_status(p.socket_path, put32(0x14, 1)) == 0  # group_id 1: a member (spec §14)
    assert _hello_status(p.socket_path, put32(0x18, 1)) == L.STATUS_PROTOCOL
    assert _hello_status(p.socket_path, put32(0x1C, 1 << 24)) == L.STATUS_PROTOCOL
    assert _hello_status(p.socket_path, lambda b: bytes(b[:31])) == L.STATUS_PROTOCOL
    assert _hello_status(p.socket_path, put32(0x08, 3)) == L.STATUS_VERSION  # major 3, minor 0
    status, s = _hello_status(p.socket_path, put32(0x08, L.MAJOR_VERSION | 99 << 16), keep=True)
    try:
        assert status == 0  # minor 99 is welcomed
        until(lambda: p.consumers == 1)
        s.send(b"stray")
        until(lambda: p.consumers == 0)  # the stray record ended the attachment
    finally:
        s.close()
