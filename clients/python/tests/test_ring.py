import mmap
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import ibvbridge
from ibvbridge import layout as L
from ibvbridge import (CorruptRing, EndOfStream, ProducerGone, Ring, RingBusy, RingError, RingNotFound, Timeout,
                       VersionMismatch)
from fake_producer import FakeProducer, addr, imm, meta_record, pattern

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
PY = sys.executable
M64 = (1 << 64) - 1


def attach(p, timeout=2.0):
    return Ring.attach(p.ctl_path, timeout=timeout)


# ------------------------------------------------------------------ layout


def test_layout_constants():
    d = L.dump()
    assert d["head"] == 512 and d["tail"] == 0x300 and d["stats"] == 1280
    assert d["desc.seq"] == 0 and d["desc.slot"] == 0x28 and d["item.value"] == 8
    assert d["ctl_size"] == 4096 and d["desc_size"] == 64 and d["item_size"] == 32
    assert d["header.stats_count"] == 0x98 and d["data_path"] == 0x100 and d["slot_count"] == 0x30
    assert d["magic_value"] == L.MAGIC and d["ctl_reserved"] == 0x600 and d["max_items_limit"] == 65536
    assert L.DESC_DTYPE.itemsize == 64 and L.ITEM_DTYPE.itemsize == 32
    assert L.DESC_DTYPE.fields["packets"][1] == 0x34
    assert L.HEADER_STRUCT.size == 0x9C
    assert L.MAGIC.to_bytes(8, "little") == b"IBVBRING"
    out = subprocess.run([PY, "-m", "ibvbridge.layout"], cwd=PKG, capture_output=True, text=True, check=True)
    lines = dict(line.split() for line in out.stdout.splitlines())
    assert {k: int(v) for k, v in lines.items()} == d


# ------------------------------------------------------------------ reading


def test_round_trip_bytes(make_producer):
    p = make_producer(slot_count=8, slot_size=256)
    sizes = [0, 1, 7, 8, 100, 256]
    for i, n in enumerate(sizes):
        p.publish_verify(i + 10, n)
    p.publish_eos()
    with attach(p) as ring:
        assert ring.session_id == p.session_id and ring.producer_pid == os.getpid()
        assert (ring.slot_count, ring.slot_size, ring.max_items) == (8, 256, 8)
        got = []
        for heap in ring:
            assert heap.complete and not heap.incomplete
            assert bytes(heap.payload) == pattern(heap.heap_cnt, heap.received)
            assert heap.payload.readonly
            got.append((heap.heap_cnt, heap.received))
        assert got == [(i + 10, n) for i, n in enumerate(sizes)]
        assert ring.tail == ring.head == len(sizes) + 1
        assert ring.stats()["end_of_stream"] == 1
        with pytest.raises(EndOfStream):
            ring.next()


def test_items_immediate_and_address(make_producer):
    p = make_producer(slot_size=128, max_items=4)
    payload = bytes(range(100))
    p.publish(7, payload, items=[imm(0x1001, 7, 6), addr(0x1600, 0, 40), addr(0x1800, 40, 60)],
              flags=L.FLAG_COMPLETE | L.FLAG_HAS_DESCRIPTORS, packets=3)
    with attach(p) as ring, ring.next() as heap:
        assert heap.packets == 3 and heap.has_descriptors and heap.item_count == 3
        ids = [it.id for it in heap.items]
        assert ids == [0x1001, 0x1600, 0x1800]
        i0 = heap.item(0x1001)
        assert i0.immediate and i0.value == 7 and i0.length == 6 and i0.data is None
        i1 = heap.find(0x1800)
        assert not i1.immediate and bytes(i1.data) == payload[40:100]
        assert heap.find(0x9999) is None
        with pytest.raises(KeyError):
            heap.item(0x9999)
        with pytest.raises(TypeError):
            heap.array(0x1001)
    assert heap.released


def test_numpy_views_are_readonly_views(make_producer):
    p = make_producer(slot_size=256)
    arr = np.arange(16, dtype="<u4")
    p.publish(1, arr.tobytes() + b"xx", items=[addr(0x2000, 0, 64), addr(0x2001, 64, 2)])
    with attach(p) as ring, ring.next() as heap:
        a = heap.array(0x2000, dtype="<u4")
        assert a.tolist() == list(range(16))
        assert not a.flags.owndata and not a.flags.writeable
        base = a
        while isinstance(base, np.ndarray):
            base = base.base
        if isinstance(base, memoryview):  # numpy 1.24 keeps a memoryview of the exporter
            base = base.obj
        assert base is ring._data_mm  # the view's memory is the data mapping itself
        assert np.shares_memory(a, ring._payload2d)
        with pytest.raises(ValueError):
            a[0] = 5
        with pytest.raises(ValueError):
            a.flags.writeable = True
        m = heap.array(0x2000, dtype="<u4", shape=(4, -1))
        assert m.shape == (4, 4) and m[3, 3] == 15
        assert heap.array(0x2001).tobytes() == b"xx"
        with pytest.raises(ValueError):
            heap.array(0x2000, dtype="<u4", shape=(17,))
        with pytest.raises(TypeError):
            heap.payload[0] = 1  # read-only memoryview
        c = heap.copy()
    assert heap.released
    with pytest.raises(RingError):
        heap.payload
    assert c.array(0x2000, dtype="<u4").tolist() == list(range(16)) and c.heap_cnt == 1


def test_release_in_position_order(make_producer):
    p = make_producer()
    for i in range(3):
        p.publish(i, b"a")
    with attach(p) as ring:
        h0, h1, h2 = ring.next(), ring.next(), ring.next()
        h1.release()
        assert ring.tail == 0
        h0.release()
        assert ring.tail == 2
        h2.release()
        h2.release()  # idempotent
        assert ring.tail == 3


def test_iteration_releases_on_break(make_producer):
    p = make_producer()
    for i in range(4):
        p.publish(i, b"a")
    with attach(p) as ring:
        for heap in ring:
            if heap.heap_cnt == 1:
                break
        assert heap.released and ring.tail == 2


def test_descriptors_metadata(make_producer):
    p = make_producer()
    with attach(p) as ring:
        assert ring.descriptors() == {}
        p.set_descriptors([
            meta_record(0x1600, "timestamp", "ADC count", shape=(), fmt=b"u\x00\x00\x30"),
            meta_record(0x1800, "vis", "visibilities", shape=(2, -1),
                        dtype="{'descr': '<i2', 'fortran_order': False, 'shape': (2, 4)}"),
            meta_record(0x1900, "unknown", shape=None),
            meta_record(0x1A00, "fort", dtype="{'descr': '>u2', 'fortran_order': True, 'shape': (2, 3)}"),
        ])
        d = ring.descriptors()
        assert set(d) == {0x1600, 0x1800, 0x1900, 0x1A00}
        assert d[0x1600].name == "timestamp" and d[0x1600].description == "ADC count"
        assert d[0x1600].shape == () and d[0x1600].format == b"u\x00\x00\x30" and d[0x1600].dtype is None
        assert d[0x1800].dtype == np.dtype("<i2") and d[0x1800].shape == (2, 4)
        assert d[0x1900].shape is None
        assert d[0x1A00].order == "F"
        vis = np.arange(8, dtype="<i2")
        f = np.arange(6, dtype=">u2").reshape(2, 3, order="F")
        p.publish(1, vis.tobytes() + f.tobytes(order="F"), items=[addr(0x1800, 0, 16), addr(0x1A00, 16, 12)])
        with ring.next() as heap:
            a = heap.array(0x1800)
            assert a.shape == (2, 4) and a.dtype == np.dtype("<i2") and a.ravel().tolist() == list(range(8))
            b = heap.array(0x1A00)
            assert (b == f).all()
        # a rewrite is picked up (seq changed)
        p.set_descriptors([meta_record(0x1600, "renamed")])
        assert ring.descriptors()[0x1600].name == "renamed"


@pytest.mark.parametrize("bad", ["record_past_length", "fields_past_record", "bad_dtype", "length_too_big"])
def test_corrupt_metadata(make_producer, bad):
    p = make_producer(meta_size=4096)
    rec = bytearray(meta_record(0x10, "x", dtype="{'descr': '<u4'}"))
    if bad == "record_past_length":
        rec[0:4] = (len(rec) + 8).to_bytes(4, "little")
    elif bad == "fields_past_record":
        rec[0x10:0x14] = (1000).to_bytes(4, "little")
    elif bad == "bad_dtype":
        rec = bytearray(meta_record(0x10, "x", dtype="{'descr': __import__('os')}"))
    p.set_descriptors([bytes(rec)])
    if bad == "length_too_big":
        o = p.meta_off
        p.data[o + 8:o + 16] = (4096).to_bytes(8, "little")
    with attach(p) as ring, pytest.raises(CorruptRing):
        ring.descriptors()


# ------------------------------------------------------------------ attach


def test_bad_magic(make_producer):
    p = make_producer(header_overrides={"magic": 0x1234})
    with pytest.raises(CorruptRing, match="magic"):
        attach(p)


def test_major_mismatch_names_both(make_producer):
    p = make_producer(header_overrides={"major": 2})
    with pytest.raises(VersionMismatch) as e:
        attach(p)
    assert "2" in str(e.value) and "1" in str(e.value)
    assert e.value.found == 2 and e.value.supported == 1


def test_newer_minor_accepted(make_producer):
    p = make_producer(header_overrides={"minor": 7, "features": 1 << 40, "stats_count": 12})
    p.set_stat(11, 99)
    p.publish(1, b"abc")
    with attach(p) as ring:
        assert ring.minor == 7
        assert ring.stats()["counter_11"] == 99
        with ring.next() as h:
            assert bytes(h.payload) == b"abc"


def test_init_state_times_out(make_producer):
    p = make_producer(header_overrides={"state": L.STATE_INIT})
    t = time.monotonic()
    with pytest.raises(Timeout):
        attach(p, timeout=0.3)
    assert 0.25 < time.monotonic() - t < 2


def test_not_found_and_late_creation(tmp_path):
    path = str(tmp_path / "ibvbridge.late.v1.ctl")
    with pytest.raises(RingNotFound):
        Ring.attach(path, timeout=0.1)
    made = []
    t = threading.Timer(0.3, lambda: made.append(FakeProducer(str(tmp_path), "late")))
    t.start()
    try:
        with Ring.attach(path, timeout=5) as ring:
            assert ring.session_id == made[0].session_id
    finally:
        t.join()
        made[0].close()


def test_name_resolution():
    assert ibvbridge.ctl_path_for("abc") == "/dev/shm/ibvbridge.abc.v1.ctl"
    for bad in (".hidden", "a/b.txt", "x" * 65, "sp ace"):
        with pytest.raises(RingError):
            ibvbridge.ctl_path_for(bad)


GEOMETRY_CORRUPTIONS = {
    "slot_count_not_pow2": {"slot_count": 6},
    "slot_count_zero": {"slot_count": 0},
    "slot_count_too_big": {"slot_count": 1 << 25},
    "slot_size_not_mul64": {"slot_size": 100},
    "slot_size_zero": {"slot_size": 0},
    "max_items_zero": {"max_items": 0},
    "max_items_too_big": {"max_items": 65537},
    "desc_size": {"desc_size": 32},
    "item_size": {"item_size": 64},
    "page_size_small": {"page_size": 2048},
    "page_size_not_pow2": {"page_size": 12288},
    "ctl_size": {"ctl_size": 8192},
    "desc_unaligned": {"desc_offset": 64},
    "payload_past_end": {"payload_offset": 1 << 30},
    "huge_slot_size_overflow": {"slot_size": 1 << 58},
    "overlap": {"items_offset": 0},
    "meta_small": {"meta_size": 8},
    "data_file_size_not_page_multiple": {"data_file_size": 4096 * 7 + 100},
    "packet_past_end": {"packet_size": 1 << 40},
}


@pytest.mark.parametrize("case", sorted(GEOMETRY_CORRUPTIONS))
def test_geometry_corruption_rejected_before_data(make_producer, case):
    # data_path points at a file that does not exist: an error about it would mean we touched the data file
    p = make_producer(header_overrides=GEOMETRY_CORRUPTIONS[case], data_path=b"/nonexistent/ibvbridge.dat")
    with pytest.raises(CorruptRing) as e:
        attach(p)
    assert "data file" not in str(e.value)
    # the consumer lock was not taken (step 5 comes after validation) and nothing leaked
    fd = os.open(p.ctl_path[:-4] + ".cons", os.O_RDWR | os.O_CREAT)
    try:
        import fcntl
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


@pytest.mark.parametrize("dp", [b"relative/path", b"", b"/x" * 200])
def test_bad_data_path(make_producer, dp):
    p = make_producer(data_path=dp)
    if len(dp) >= 256:
        p.ctl[0x100:0x200] = b"/" * 256  # no NUL
    with pytest.raises(CorruptRing, match="data_path"):
        attach(p)


def test_short_ctl_and_wrong_data_size(make_producer, tmp_path):
    short = tmp_path / "ibvbridge.short.v1.ctl"
    short.write_bytes(b"\0" * 100)
    with pytest.raises(CorruptRing):
        Ring.attach(str(short), timeout=0.1)
    p = make_producer()
    os.truncate(p.data_path, 4096 * 3)  # file smaller than the header's data_file_size
    with pytest.raises(CorruptRing, match="data file"):
        attach(p)


def test_data_mapping_is_read_only(make_producer):
    p = make_producer()
    with attach(p) as ring:
        with pytest.raises(TypeError):
            ring._data_mm[0] = 1
        assert ring._desc_arr.flags.writeable is False


def test_second_consumer_busy_and_reattach_at_tail(make_producer):
    p = make_producer()
    for i in range(5):
        p.publish(i, bytes([i]))
    r1 = attach(p)
    with pytest.raises(RingBusy):
        attach(p)
    r1.next().release()
    r1.next().release()
    held = r1.next()  # position 2 stays unreleased
    assert held.heap_cnt == 2
    r1.close()
    assert held.released is False
    with attach(p) as r2:
        assert r2.position == 2
        assert [h.heap_cnt for h in (r2.next(), r2.next(), r2.next())] == [2, 3, 4]


def test_consumer_info_written(make_producer):
    p = make_producer()
    with attach(p):
        assert p.c64[L.OFF_CONSUMER_PID >> 3] == os.getpid()
        assert abs(p.c64[L.OFF_CONSUMER_ATTACH_NS >> 3] - time.time_ns()) < 10e9
    assert p.c64[L.OFF_CONSUMER_PID >> 3] == 0


# ------------------------------------------------------------------ corruption in the data


DESC_CORRUPTIONS = {
    "seq": {"seq": 99},
    "slot": {"slot": 8},
    "received": {"received": 257},
    "item_count": {"item_count": 9},
}


@pytest.mark.parametrize("case", sorted(DESC_CORRUPTIONS) + ["item_past_slot", "item_overflow"])
@pytest.mark.parametrize("batch", [False, True])
def test_corrupt_descriptor(make_producer, case, batch):
    p = make_producer(slot_count=8, slot_size=256, max_items=8)
    p.publish(0, b"ok")
    if case == "item_past_slot":
        p.publish(1, b"x", items=[addr(0x10, 200, 57)])
    elif case == "item_overflow":
        p.publish(1, b"x", items=[addr(0x10, 16, M64 - 8)])
    else:
        p.publish(1, b"x", desc_overrides=DESC_CORRUPTIONS[case])
    with attach(p) as ring:
        if batch:
            with pytest.raises(CorruptRing):
                ring.next_batch(8)
        else:
            ring.next().release()
            with pytest.raises(CorruptRing):
                ring.next()


def test_head_too_far_ahead_is_corrupt(make_producer):
    p = make_producer(slot_count=8)
    p.c64[L.OFF_HEAD >> 3] = 100
    with attach(p) as ring, pytest.raises(CorruptRing):
        ring.next(timeout=0)


# ------------------------------------------------------------------ batches


def test_batch_consecutive_is_zero_copy(make_producer):
    p = make_producer(slot_count=16, slot_size=128)
    for i in range(10):
        p.publish_verify(i, 64 + i)
    with attach(p) as ring:
        with ring.next_batch(6) as b:
            assert len(b) == 6 and b.position == 0
            assert b.heap_cnt.tolist() == list(range(6)) and b.received.tolist() == [64 + i for i in range(6)]
            assert b.consecutive
            pl = b.payloads(64)
            assert pl.shape == (6, 64) and np.shares_memory(pl, ring._payload2d) and not pl.flags.writeable
            for i in range(6):
                assert pl[i].tobytes() == pattern(i, 64)
            assert np.shares_memory(b.heap_cnt, ring._desc_arr)
            found, items = b.find_item(0x1001)
            assert found.all() and items["value"].tolist() == list(range(6))
        assert ring.tail == 6
        b2 = ring.next_batch(100)
        assert len(b2) == 4 and b2.heap_cnt.tolist() == [6, 7, 8, 9]
        b2.release()
        assert ring.tail == 10
        with pytest.raises(Timeout):
            ring.next_batch(4, timeout=0.05)


def test_batch_non_consecutive_gathers(make_producer):
    p = make_producer(slot_count=8, slot_size=64)
    order = [5, 2, 7, 0]
    for i, s in enumerate(order):
        p.publish(i, pattern(i, 64), slot=s)
    with attach(p) as ring, ring.next_batch(8) as b:
        assert b.slot.tolist() == order and not b.consecutive
        pl = b.payloads(32)
        assert not np.shares_memory(pl, ring._payload2d)
        for i in range(4):
            assert pl[i].tobytes() == pattern(i, 32)
        found, _ = b.find_item(0x1001)
        assert not found.any()


def test_batch_stops_at_wrap_point_and_eos(make_producer):
    p = make_producer(slot_count=8, slot_size=64, start_position=5)
    for i in range(6):
        p.publish(i, bytes([i]))
    p.publish_eos()
    with attach(p) as ring:
        b = ring.next_batch(100)
        assert b.position == 5 and len(b) == 3  # positions 5, 6, 7 then the descriptor ring wraps
        b.release()
        b = ring.next_batch(100)
        assert b.position == 8 and b.heap_cnt.tolist() == [3, 4, 5]  # stops before the END_OF_STREAM marker
        b.release()
        with pytest.raises(EndOfStream):
            ring.next_batch(100)
        assert ring.tail == 12
        assert list(ring.batches(4)) == []


def test_batches_iterator_and_held_release_order(make_producer):
    p = make_producer(slot_count=8)
    for i in range(5):
        p.publish(i, b"z")
    p.publish_eos()
    with attach(p) as ring:
        h = ring.next()
        b = ring.next_batch(2)
        b.release()
        assert ring.tail == 0  # h (older) still held
        h.release()
        assert ring.tail == 3
        assert [x.heap_cnt.tolist() for x in ring.batches(8)] == [[3, 4]]


# ------------------------------------------------------------------ cursors near wrap


def test_cursor_wraps_near_2_64(make_producer):
    start = M64 - 2  # positions 2^64-3 .. and then 0, 1, ...
    p = make_producer(slot_count=4, slot_size=64, start_position=start)
    with attach(p) as ring:
        assert ring.position == start
        got = []
        for k in range(10):
            p.publish(k, bytes([k]) * 8)
            with ring.next(timeout=1) as h:
                got.append((h.position, h.heap_cnt, bytes(h.payload)))
        assert [g[1] for g in got] == list(range(10))
        assert [g[0] for g in got] == [(start + k) & M64 for k in range(10)]
        assert ring.tail == (start + 10) & M64
        for k in range(3):
            p.publish(100 + k, b"b")
        cnts = []
        while sum(map(len, cnts)) < 3:
            with ring.next_batch(8, timeout=1) as b:  # position 7 is the last of the descriptor ring: 1, then 2
                cnts.append(b.heap_cnt.tolist())
        assert cnts == [[100], [101, 102]]


def test_consumer_futex_near_2_32(make_producer):
    p = make_producer(futex_start=0xFFFFFFFF)
    with attach(p) as ring:
        def later():
            time.sleep(0.2)
            p.publish(1, b"a")
            time.sleep(0.2)
            p.publish(2, b"b")
        t = threading.Thread(target=later)
        t.start()
        t0 = time.monotonic()
        assert ring.next(timeout=5).heap_cnt == 1
        assert ring.next(timeout=5).heap_cnt == 2
        t.join()
        assert time.monotonic() - t0 < 2
        assert p.c32[L.OFF_CONSUMER_FUTEX >> 2] in (0, 1)  # wrapped


# ------------------------------------------------------------------ waiting, liveness, end


def test_timeout(make_producer):
    p = make_producer()
    with attach(p) as ring:
        t = time.monotonic()
        with pytest.raises(Timeout):
            ring.next(timeout=0.3)
        assert 0.28 < time.monotonic() - t < 1.0
        with pytest.raises(Timeout):
            ring.next(timeout=0)
        assert p.c32[L.OFF_CONSUMER_WAITING >> 2] == 0


def test_closed_ends_iteration_after_drain(make_producer):
    p = make_producer()
    for i in range(3):
        p.publish(i, b"q")
    p.close()  # CLOSED without an END_OF_STREAM marker, files unlinked
    with pytest.raises(RingNotFound):
        attach(p, timeout=0.05)


def test_closed_while_attached(make_producer):
    p = make_producer()
    with attach(p) as ring:
        for i in range(3):
            p.publish(i, b"q")

        def stop():
            time.sleep(0.2)
            p.close()
        t = threading.Thread(target=stop)
        t.start()
        t0 = time.monotonic()
        assert [h.heap_cnt for h in ring] == [0, 1, 2]
        assert time.monotonic() - t0 < 1.5
        t.join()


def test_producer_death_in_process(make_producer):
    p = make_producer()
    p.publish(1, b"x")
    with attach(p) as ring:
        assert ring.producer_alive()
        p.die()
        assert not ring.producer_alive()
        assert ring.next(timeout=5).heap_cnt == 1  # drained first
        t = time.monotonic()
        with pytest.raises(ProducerGone):
            ring.next(timeout=5)
        assert time.monotonic() - t < 1.0


def _spawn_producer(tmp_path, name, *args):
    proc = subprocess.Popen([PY, os.path.join(HERE, "fake_producer.py"), "--dir", str(tmp_path), "--name", name,
                             *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc, os.path.join(str(tmp_path), f"ibvbridge.{name}.v1.ctl")


def test_producer_kill9_reported_after_drain(tmp_path):
    proc, path = _spawn_producer(tmp_path, "k9", "--count", "50", "--end", "hang", "--slot-count", "64")
    try:
        assert proc.stdout.readline().strip() == "published"
        with Ring.attach(path, timeout=5) as ring:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            t = time.monotonic()
            cnts = []
            with pytest.raises(ProducerGone):
                for h in ring.heaps(timeout=10):
                    cnts.append(h.heap_cnt)
            assert cnts == list(range(1, 51))
            assert time.monotonic() - t < 1.2
    finally:
        proc.kill()
        proc.wait()


def test_wake_from_another_process(tmp_path):
    proc, path = _spawn_producer(tmp_path, "wk", "--count", "200", "--start-delay", "0.5", "--interval-us", "2000",
                                 "--slot-count", "8", "--policy", "block")
    try:
        with Ring.attach(path, timeout=5) as ring:
            t = time.monotonic()
            cnts = [h.heap_cnt for h in ring.heaps(timeout=5)]
            assert cnts == list(range(1, 201))
            assert time.monotonic() - t < 5
    finally:
        proc.wait(5)


def test_block_policy_producer_woken_by_release(tmp_path):
    # 4 slots, 300 heaps, a blocking producer: it must sleep on producer_futex and be woken by our releases
    proc, path = _spawn_producer(tmp_path, "blk", "--count", "300", "--slot-count", "4", "--policy", "block")
    try:
        with Ring.attach(path, timeout=5) as ring:
            n = 0
            for h in ring.heaps(timeout=5):
                n += 1
                if n % 50 == 0:
                    time.sleep(0.05)  # let the producer fill the ring and sleep
            assert n == 300
            assert ring.stats()["dropped_heaps"] == 0
    finally:
        proc.wait(5)


def test_ctrl_c_during_wait(make_producer):
    p = make_producer()
    code = ("import sys, time; sys.path.insert(0, %r); import ibvbridge\n"
            "r = ibvbridge.Ring.attach(%r, timeout=5)\n"
            "print('waiting', flush=True)\n"
            "try:\n    r.next()\nexcept KeyboardInterrupt:\n    print('KI', flush=True)\n") % (PKG, p.ctl_path)
    proc = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(0.3)  # well inside a futex sleep
        t = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline().strip() == "KI"
        assert time.monotonic() - t < 0.2
    finally:
        proc.kill()
        proc.wait()


def test_close_with_live_views(make_producer):
    p = make_producer()
    p.publish(1, b"abcdefgh" * 4, items=[addr(0x10, 0, 32)])
    ring = attach(p)
    h = ring.next()
    mv = h.payload
    arr = h.array(0x10)
    b = ring.next_batch  # noqa: F841 (bound method keeps nothing mapped)
    ring.close()  # must not raise although views are alive (mmap.close would raise BufferError)
    ring.close()  # idempotent
    assert ring.closed
    assert bytes(mv[:8]) == b"abcdefgh" and arr[:2].tobytes() == b"ab"  # still mapped, no crash
    with pytest.raises(RingError):
        h.payload
    h.release()  # no-op after close
    with pytest.raises(RingError):
        ring.next()
    del mv, arr
    # the consumer lock was dropped: a new consumer may attach and gets heap 1 again (never released)
    with attach(p) as r2:
        assert r2.next().heap_cnt == 1


def test_incomplete_and_flags(make_producer):
    p = make_producer()
    p.publish(3, b"ab", heap_size=10, flags=L.FLAG_INCOMPLETE | L.FLAG_TRUNCATED | L.FLAG_NO_HEAP_SIZE)
    with attach(p) as ring, ring.next() as h:
        assert h.incomplete and h.truncated and h.no_heap_size and not h.complete
        assert h.heap_size == 10 and h.received == 2


# ---- the iterator's fast path (per-heap iteration without per-heap bookkeeping)

def test_iteration_fast_path_items_and_release(make_producer):
    p = make_producer(slot_count=8)
    for i in range(6):
        p.publish(i, bytes([i]) * 8, items=[addr(0x10, 0, 8)])
    p.publish_eos()
    seen = []
    with attach(p) as ring:
        for heap in ring:
            seen.append((heap.heap_cnt, bytes(heap.payload), heap.find(0x10).length))
            assert ring._released_to == heap.position  # the previous heap went back when the loop moved on
        ring._flush_release()
        assert ring.tail == 7  # six heaps and the end-of-stream marker
    assert seen == [(i, bytes([i]) * 8, 8) for i in range(6)]


def test_iteration_mixed_with_next_keeps_position_order(make_producer):
    p = make_producer(slot_count=8)
    for i in range(4):
        p.publish(i, b"a")
    with attach(p) as ring:
        it = iter(ring)
        h0 = next(it)  # fast path
        h1 = ring.next()  # held by the caller across the loop step
        h2 = next(it)  # h0 released by the step; h1 still held, so h2 comes from next()
        assert (h0.released, h1.released, h2.heap_cnt) == (True, False, 2)
        ring._flush_release()
        assert ring.tail == 1  # h1 (position 1) still held
        h1.release()
        h3 = next(it)  # releases h2
        ring._flush_release()
        assert ring.tail == 3 and h3.heap_cnt == 3


def test_iteration_explicit_release_and_held_view(make_producer):
    p = make_producer(slot_count=8)
    for i in range(3):
        p.publish(i, b"xyz")
    p.publish_eos()
    with attach(p) as ring:
        kept = None
        for heap in ring:
            heap.release()  # releasing inside the body is allowed, and idempotent with the step's
            heap.release()
            kept = heap
        with pytest.raises(RingError):
            kept.payload  # a released heap's memory is the producer's again


def test_iteration_item_past_slot_is_corrupt_when_read(make_producer):
    p = make_producer(slot_count=8, slot_size=256, max_items=8)
    p.publish(0, b"x", items=[addr(0x10, 200, 57)])
    with attach(p) as ring:
        for heap in ring:
            with pytest.raises(CorruptRing):
                heap.find(0x10)
            break


def test_max_latency_naps_instead_of_wakes(make_producer):
    p = make_producer(slot_count=64)
    n = 40

    def trickle():
        for i in range(n):
            time.sleep(0.0005)
            p.publish(i, b"z" * 8)

    with Ring.attach(p.ctl_path, timeout=1, max_latency=0.002) as ring:
        futex0 = ring._c32[L.OFF_CONSUMER_FUTEX >> 2]
        th = threading.Thread(target=trickle)
        th.start()
        got = []
        for _ in range(n):
            with ring.next(timeout=5) as h:
                got.append(h.heap_cnt)
        th.join()
        assert got == list(range(n))
        wakes = (ring._c32[L.OFF_CONSUMER_FUTEX >> 2] - futex0) & 0xFFFFFFFF
        assert wakes <= 2, f"{wakes} producer wakes for {n} heaps of a moving stream"
        t0 = time.monotonic()
        with pytest.raises(Timeout):
            ring.next(timeout=0.1)
        assert 0.09 <= time.monotonic() - t0 < 1.0
