import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import tempfile
import time

import numpy as np
import pytest

import ibvbridge
from ibvbridge import layout as L
from ibvbridge import ring as ring_mod
from ibvbridge import (CorruptRing, Detached, EndOfStream, Overrun, PermissionDenied, ProducerGone, ProtocolError,
                       Ring, RingBusy, RingClosing, RingError, RingNotFound, Timeout, VersionMismatch)
from ibvbridge._sys import futex_wait
from fake_producer import FakeProducer, addr, imm, meta_record, pattern

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
PY = sys.executable
M64 = (1 << 64) - 1


def attach(p, timeout=2.0, **kw):
    return Ring.attach(p.socket_path, timeout=timeout, **kw)


def region32(ring, off):
    return ring._r32[off >> 2]


# ------------------------------------------------------------------ layout


def test_layout_constants():
    d = L.dump()
    assert d["head"] == 512 and d["producer_waiting"] == 0x280 and d["oldest"] == 0x308 and d["stats"] == 1280
    assert d["consumer_table"] == 0x1000 and d["row_size"] == 128 and d["row.lost_heaps"] == 0x30
    assert d["region.tail"] == 0 and d["region.consumer_futex"] == 0x84 and d["region.wake_at"] == 0x88
    assert d["region.release_futex"] == 0x100
    assert d["desc.seq"] == 0 and d["desc.slot"] == 0x28 and d["item.value"] == 8
    assert d["desc_size"] == 64 and d["item_size"] == 32 and d["stats_count"] == 20 and d["counter.group_lost"] == 17
    assert d["row.assigned"] == 0x38 and d["row.group_id"] == 0x40  # §14
    assert (d["row.client_minor"], d["row.read"], d["row.queued"], d["row.skipped"]) == (0x44, 0x48, 0x50, 0x58)  # 2.2
    assert (d["region.read"], d["region.handed"], d["blocked_on"], d["blocked_since_ns"]) == (0x90, 0x98, 0x310, 0x318)
    assert d["counter.group_skipped"] == 18 and d["minor_value"] == 2
    assert d["header.stats_count"] == 0x98 and d["header.max_consumers"] == 0x9C and d["data_size"] == 0x50
    assert d["magic_value"] == L.MAGIC and d["major_value"] == 2 and d["max_items_limit"] == 65536
    assert d["hello_size"] == 32 and d["welcome_size"] == 64 and d["welcome.message"] == 0x10
    assert d["flag.items_cut"] == 0x80 and d["counter.consumer_errors"] == 12
    assert "ctl_size" not in d and "data_path" not in d and "tail" not in d  # 1.0 names are gone
    assert d["chunk_heaps"] == 0xA0 and d["chunk_heap_size"] == 0xA8 and d["chunk_axis_item"] == 0xC0
    assert d["feature.chunks"] == 2 and d["flag.chunk"] == 0x100 and d["counter.rejected_heaps"] == 16
    assert len(d) == 181  # 2.0's 152, then §13's six header fields, feature, flag and four counters; §14's two row
    # fields and counter; 2.2's four row fields, two region fields, two producer-info fields and a counter, and
    # the service's producer_version and its size, flag STREAM_END, item flag CUT and counter streams_ended
    assert (d["producer_version"], d["producer_version_max"], d["flag.stream_end"], d["item_flag.cut"],
            d["counter.streams_ended"]) == (0x100, 64, 0x200, 0x2, 19)
    assert L.DESC_DTYPE.itemsize == 64 and L.ITEM_DTYPE.itemsize == 32
    assert L.DESC_DTYPE.fields["packets"][1] == 0x34
    assert L.HEADER_STRUCT.size == 0xA0 and L.ROW_STRUCT.size == 128
    assert L.MAGIC.to_bytes(8, "little") == b"IBVBRING"
    assert L.ctl_size_for(1) == 8192 and L.ctl_size_for(8) == 8192 and L.ctl_size_for(64) == 12288
    out = subprocess.run([PY, "-m", "ibvbridge.layout"], cwd=PKG, capture_output=True, text=True, check=True)
    lines = dict(line.split() for line in out.stdout.splitlines())
    assert {k: int(v) for k, v in lines.items()} == d


def test_structs_follow_offsets():
    hdr = dict(zip(L.HEADER_FIELDS, range(1, 100)))
    raw = L.HEADER_STRUCT.pack(*hdr.values())
    assert int.from_bytes(raw[L.OFF_DATA_SIZE:L.OFF_DATA_SIZE + 8], "little") == hdr["data_size"]
    assert int.from_bytes(raw[L.OFF_MAX_CONSUMERS:L.OFF_MAX_CONSUMERS + 4], "little") == hdr["max_consumers"]
    h = L.pack_hello(L.ROLE_CONSUMER, L.START_HEAD)
    assert len(h) == 32 and L.unpack_hello(h) == dict(magic=L.MAGIC, major=2, minor=2, role=1, start=1)
    assert h[L.HELLO_START] == 1 and h[0x14:] == bytes(12)
    w = L.pack_welcome(3, 9, 0x1234, 8192, 65536)
    d = L.unpack_record(w)
    assert (d["consumer_index"], d["generation"], d["session_id"], d["ctl_size"], d["data_size"],
            d["region_size"]) == (3, 9, 0x1234, 8192, 65536, 4096)
    assert int.from_bytes(w[L.WELCOME_DATA_SIZE:L.WELCOME_DATA_SIZE + 8], "little") == 65536
    e = L.pack_error(L.STATUS_BUSY, "full" * 100)
    assert len(e) == 256 and e[-1] == 0
    assert L.unpack_record(e)["message"] == ("full" * 100)[:239] and L.unpack_record(e)["status"] == 3


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
    assert c.cnt == 1  # spead2's name for it


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
    p = make_producer(header_overrides={"major": 3})  # the header of a producer that welcomed us as 2.0
    with pytest.raises(VersionMismatch) as e:
        attach(p)
    assert "3.2" in str(e.value) and "2.2" in str(e.value)
    assert e.value.found == 3 and e.value.supported == 2


def test_welcome_of_another_major_is_a_protocol_error(make_producer):
    """Spec §1.2: a producer of another major refuses with status 1; a welcome (status 0) claiming major 3
    is malformed."""
    p = make_producer()
    p.welcome_hook = lambda rec: rec[:8] + (3).to_bytes(2, "little") + rec[10:]
    with pytest.raises(ProtocolError, match="major 3"):
        attach(p)


@pytest.mark.parametrize("extra", [8, 192])
def test_longer_welcome_of_a_later_minor_is_accepted(make_producer, extra):
    """Spec §1.2: a later minor may append fields: a welcome of 64 … 256 bytes is accepted, the rest ignored."""
    p = make_producer()
    p.welcome_hook = lambda rec: rec + b"\xa5" * extra
    p.publish(1, b"abc")
    with attach(p) as ring, ring.next() as h:
        assert bytes(h.payload) == b"abc"


def test_1_0_control_file_path_is_a_version_error(tmp_path):
    with pytest.raises(VersionMismatch, match="1.0"):
        Ring.attach(str(tmp_path / "ibvbridge.r.v1.ctl"), timeout=0)


def test_newer_minor_accepted(make_producer):
    p = make_producer(header_overrides={"minor": 7, "features": 1 << 40, "stats_count": 21})
    p.set_stat(20, 99)
    p.publish(1, b"abc")
    with attach(p) as ring:
        assert ring.minor == 7
        assert ring.stats()["counter_20"] == 99 and ring.stats()["consumer_errors"] == 0
        with ring.next() as h:
            assert bytes(h.payload) == b"abc"


def test_layout_2_0_producer_accepted(make_producer):
    # a 2.0 producer (minor 0 in the header and the welcome) interoperates with this 2.1 client
    p = make_producer(header_overrides={"minor": 0})
    p.welcome_hook = lambda rec: rec[:L.MSG_MINOR] + (0).to_bytes(2, "little") + rec[L.MSG_MINOR + 2:]
    p.publish(1, b"abc")
    with attach(p) as ring, ring.next() as h:
        assert ring.minor == 0 and bytes(h.payload) == b"abc"


def test_init_state_is_corrupt(make_producer):
    p = make_producer(header_overrides={"state": L.STATE_INIT})
    with pytest.raises(CorruptRing, match="state 0"):
        attach(p)


def test_unknown_header_or_row_state_is_corrupt(make_producer):
    """A minor never adds a header or row state (spec §8): an unknown one is a corrupt ring — at attach, while
    waiting, and in the consumer's row — not a timeout or a detach."""
    with pytest.raises(CorruptRing, match="state 5"):
        attach(make_producer("a", header_overrides={"state": 5}))
    p = make_producer("b")
    with attach(p) as ring:
        words = memoryview(p.ctl).cast("I")
        words[0x10 // 4] = 7
        with pytest.raises(CorruptRing, match="unknown header state 7"):
            ring.next(timeout=0.05)
        words[0x10 // 4] = L.STATE_READY
        words[(L.OFF_CONSUMER_TABLE + L.ROW_SIZE * ring.consumer_index) // 4] = 9
        with pytest.raises(CorruptRing, match="unknown state 9"):
            ring.next(timeout=0.05)
        words[(L.OFF_CONSUMER_TABLE + L.ROW_SIZE * ring.consumer_index) // 4] = L.CONSUMER_ATTACHED
        words.release()


def test_no_answer_times_out(make_producer):
    p = make_producer(serve=False)  # listens (connect succeeds) but never answers the hello
    t = time.monotonic()
    with pytest.raises(Timeout):
        attach(p, timeout=0.3)
    assert 0.25 < time.monotonic() - t < 2


def test_missing_ring_fails_at_once_and_wait_true_waits_for_a_late_producer(tmp_path):
    path = str(tmp_path / "late.v2.sock")
    t = time.monotonic()
    with pytest.raises(RingNotFound, match=f"ring {path} not found \\(looked in {tmp_path}\\)"):
        Ring.attach(path, timeout=30)  # no wait: at once, not after the timeout
    with pytest.raises(RingNotFound, match=f"ring late not found \\(looked in {tmp_path}\\)"):
        Ring.attach("late", directory=str(tmp_path), timeout=30)
    assert time.monotonic() - t < 5
    with pytest.raises(RingNotFound, match="not found"):
        Ring.attach("late", directory=str(tmp_path), timeout=0.05, wait=True)
    # The producer starts only once the client has looked and found nothing (its first lookup opens the
    # directory; the second is after a 10 ms retry): deterministic, whatever the machine's load.
    made, opens = [], []
    real_open = ibvbridge.shared.open_trusted_dir

    def open_dir(d, *a):
        opens.append(d)
        if len(opens) == 2:
            made.append(FakeProducer(str(tmp_path), "late"))
        return real_open(d, *a)
    ibvbridge.shared.open_trusted_dir = open_dir
    try:
        with Ring.attach(path, timeout=5, wait=True) as ring:
            assert len(opens) == 2 and ring.session_id == made[0].session_id
    finally:
        ibvbridge.shared.open_trusted_dir = real_open
        for p in made:
            p.close()


def test_stale_socket_is_retried_then_named_stale(tmp_path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(str(tmp_path / "stale.v2.sock"))
    s.close()  # the file stays, nobody listens: ECONNREFUSED, retried until the timeout
    t = time.monotonic()
    with pytest.raises(RingNotFound, match=f"ring stale: stale socket {tmp_path}/stale.v2.sock \\(no producer; "
                       "`ibvbridge rm --stale` removes it\\)"):
        Ring.attach("stale", directory=str(tmp_path), timeout=0.3)
    assert time.monotonic() - t >= 0.3  # retried: a producer may be restarting


def test_name_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv("IBVBRIDGE_RING_DIR", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert ibvbridge.default_dir() == ("/run/ibvbridge" if os.geteuid() == 0 else f"/dev/shm/ibvbridge-{os.geteuid()}")
    assert ibvbridge.lookup_dirs() == ([L.RUN_DIR] if os.geteuid() == 0 else
                                       [ibvbridge.default_dir(), f"/tmp/ibvbridge-{os.geteuid()}", L.RUN_DIR])
    assert ibvbridge.socket_path_for("abc", "/x") == "/x/abc.v2.sock"
    assert ibvbridge.socket_path_for("/some/where/abc.v2.sock") == "/some/where/abc.v2.sock"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    # spec §1.1: should a stranger have made /dev/shm/ibvbridge-1000 first, the producer uses the next one
    assert ibvbridge.lookup_dirs() == ["/dev/shm/ibvbridge-1000", "/tmp/ibvbridge-1000", "/run/ibvbridge"]
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")  # layout 2.1: the per-user default moves there
    assert ibvbridge.lookup_dirs() == ["/run/user/1000/ibvbridge", "/run/ibvbridge"]
    assert ibvbridge.default_dir() == "/run/user/1000/ibvbridge"
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative/dir")  # only an absolute XDG_RUNTIME_DIR counts
    assert ibvbridge.lookup_dirs() == ["/dev/shm/ibvbridge-1000", "/tmp/ibvbridge-1000", "/run/ibvbridge"]
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("IBVBRIDGE_RING_DIR", str(tmp_path))
    assert ibvbridge.lookup_dirs() == [str(tmp_path)] and ibvbridge.default_dir() == str(tmp_path)
    assert ibvbridge.lookup_dirs("/given") == ["/given"]
    monkeypatch.setenv("IBVBRIDGE_RING_DIR", "")
    assert ibvbridge.lookup_dirs()[0] == "/dev/shm/ibvbridge-1000"
    for bad in (".hidden", "x" * 65, "sp ace", "a/b.txt", "/dir/r.v1.sock", "r\n", "r\u00e9"):  # ASCII only, all of it
        with pytest.raises(RingError):
            ibvbridge.socket_path_for(bad)


def test_lookup_first_directory_holding_the_socket_wins(tmp_path, monkeypatch):
    own, run = tmp_path / "own", tmp_path / "run"
    own.mkdir()
    run.mkdir()
    monkeypatch.delenv("IBVBRIDGE_RING_DIR", raising=False)
    monkeypatch.setattr(ibvbridge.shared, "own_default_dirs", lambda: [str(own)])
    monkeypatch.setattr(L, "RUN_DIR", str(run))
    assert ibvbridge.lookup_dirs() == [str(own), str(run)]
    p = FakeProducer(str(run), "r")
    try:
        assert ibvbridge.socket_path_for("r") == str(run / "r.v2.sock")
        with Ring.attach("r", timeout=2) as ring:
            assert ring.socket_path == str(run / "r.v2.sock") and ring.session_id == p.session_id
    finally:
        p.close()


def test_env_dir_attach_by_name(make_producer, tmp_path, monkeypatch):
    p = make_producer()
    p.publish(5, b"x")
    monkeypatch.setenv("IBVBRIDGE_RING_DIR", str(tmp_path))
    with Ring.attach("r", timeout=2) as ring, ring.next() as h:
        assert h.heap_cnt == 5


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
    "ctl_size": {"ctl_size": 4096},
    "max_consumers_zero": {"max_consumers": 0},
    "max_consumers_too_big": {"max_consumers": 65},
    "max_consumers_vs_ctl_size": {"max_consumers": 40},
    "desc_unaligned": {"desc_offset": 64},
    "payload_past_end": {"payload_offset": 1 << 30},
    "huge_slot_size_overflow": {"slot_size": 1 << 58},
    "overlap": {"items_offset": 0},
    "meta_small": {"meta_size": 8},
    "data_size_not_page_multiple": {"data_size": 4096 * 7 + 100},
    "data_size_not_the_welcomes": {"data_size": 4096},
    "session_not_the_welcomes": {"session_id": 77},
    "packet_past_end": {"packet_size": 1 << 40},
}


@pytest.fixture
def mapped(monkeypatch):
    """Records every mapping attach makes: (size, writable)."""
    calls = []
    real = ring_mod._map

    def spy(fd, size, writable):
        calls.append((size, writable))
        return real(fd, size, writable)
    monkeypatch.setattr(ring_mod, "_map", spy)
    return calls


@pytest.mark.parametrize("case", sorted(GEOMETRY_CORRUPTIONS))
def test_geometry_corruption_rejected_before_data(make_producer, mapped, case):
    p = make_producer(header_overrides=GEOMETRY_CORRUPTIONS[case])
    with pytest.raises(CorruptRing):
        attach(p)
    assert mapped == [(p.ctl_size, False)]  # only the control memory, read-only: the data was never mapped
    p.wait_consumers(0)  # the failed consumer closed its socket, so its row is free again


def test_consumer_index_past_max_consumers(make_producer):
    p = make_producer(header_overrides={"max_consumers": 1})  # the table really has 8 rows
    with attach(p):
        with pytest.raises(CorruptRing, match="consumer_index 1"):
            attach(p)


@pytest.mark.parametrize("which", ["ctl", "data", "region"])
def test_missing_seals_are_corrupt(make_producer, mapped, which):
    if which == "region":
        p = make_producer()
        p.region_seals = 0
    else:
        p = make_producer(seals=0)
    with pytest.raises(CorruptRing, match="not sealed"):
        attach(p)
    assert mapped == []


def test_future_write_seal_is_required(make_producer):
    p = make_producer(seals=L.F_SEAL_SHRINK | L.F_SEAL_GROW | L.F_SEAL_SEAL)  # writable by the producer's peers
    with pytest.raises(CorruptRing, match="not sealed"):
        attach(p)


@pytest.mark.parametrize("field", ["ctl_size", "data_size", "region_size"])
def test_size_mismatch_is_rejected(make_producer, mapped, field):
    p = make_producer()
    off = {"ctl_size": L.WELCOME_CTL_SIZE, "data_size": L.WELCOME_DATA_SIZE,
           "region_size": L.WELCOME_REGION_SIZE}[field]

    def hook(rec):
        v = int.from_bytes(rec[off:off + 8], "little") + 4096
        return rec[:off] + v.to_bytes(8, "little") + rec[off + 8:]
    p.welcome_hook = hook
    exc = ProtocolError if field == "region_size" else CorruptRing
    with pytest.raises(exc):
        attach(p)
    assert mapped == []


MALFORMED_WELCOMES = {
    "short": lambda rec: rec[:40],
    "too_long": lambda rec: rec + bytes(300 - len(rec)),  # past the 256-byte buffer: MSG_TRUNC
    "magic": lambda rec: b"NOTARING" + rec[8:],
    "observer_index": lambda rec: rec[:0x10] + (0xFFFFFFFF).to_bytes(4, "little") + rec[0x14:],
    "tiny": lambda rec: rec[:6],
    "unknown_status": lambda rec: rec[:0xC] + (77).to_bytes(4, "little") + b"what\0",
}


@pytest.mark.parametrize("case", sorted(MALFORMED_WELCOMES))
def test_malformed_welcome_is_protocol_error(make_producer, case):
    p = make_producer()
    p.welcome_hook = MALFORMED_WELCOMES[case]
    with pytest.raises(ProtocolError):
        attach(p)


@pytest.mark.parametrize("nfds", [0, 1, 2, 4])
def test_wrong_descriptor_count_is_protocol_error(make_producer, received_fds, nfds):
    p = make_producer()
    p.fds_hook = lambda fds: (fds + [fds[0]])[:nfds]
    with pytest.raises(ProtocolError, match="descriptors"):
        attach(p)
    assert len(received_fds) == nfds and all(closed(fd) for fd in received_fds)  # none leaked


def test_producer_hangs_up_without_answer(make_producer):
    p = make_producer()
    p.welcome_hook = lambda rec: b""  # an empty record: EOF-like
    p.fds_hook = lambda fds: []
    with pytest.raises(ProtocolError):
        attach(p)


ERROR_STATUSES = {
    L.STATUS_VERSION: VersionMismatch, L.STATUS_NOT_PERMITTED: PermissionDenied, L.STATUS_BUSY: RingBusy,
    L.STATUS_CLOSING: RingClosing, L.STATUS_PROTOCOL: ProtocolError,
}


@pytest.mark.parametrize("status", sorted(ERROR_STATUSES))
def test_error_status_maps_to_exception(make_producer, status):
    p = make_producer()
    msg = f"the producer says no ({status}) ✓"
    p.refuse = (status, msg)
    with pytest.raises(ERROR_STATUSES[status]) as e:
        attach(p)
    assert msg in str(e.value) and isinstance(e.value, RingError)


def test_hello_is_what_the_spec_says(make_producer):
    p = make_producer(serve=False)
    got = []

    def serve():
        conn, _ = p.listener.accept()
        got.append(conn.recv(256))
        conn.send(L.pack_error(L.STATUS_CLOSING, "bye"))
        conn.close()
    t = threading.Thread(target=serve)
    t.start()
    with pytest.raises(RingClosing, match="bye"):
        attach(p, start="head")
    t.join()
    assert got[0] == L.pack_hello(L.ROLE_CONSUMER, L.START_HEAD) and len(got[0]) == 32
    assert L.unpack_hello(got[0])["minor"] == 2  # layout 2.2


def test_untrusted_producer_uid(tmp_path):
    # root's 0700 directory; a socket bound there by root but listened on (and so served) by uid 65534
    d = tmp_path / "ring"
    d.mkdir(mode=0o700)
    path = str(d / "evil.v2.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(path)
    code = ("import os, socket, sys, time\n"
            "s = socket.socket(fileno=int(sys.argv[1]))\n"
            "s.listen(4)\n"
            "print('ready', flush=True)\n"
            "c, _ = s.accept()\n"
            "time.sleep(5)\n")
    proc = subprocess.Popen([PY, "-c", code, str(s.fileno())], pass_fds=[s.fileno()], user=65534,
                            stdout=subprocess.PIPE, text=True)
    s.close()
    try:
        assert proc.stdout.readline().strip() == "ready"
        with pytest.raises(PermissionDenied, match="uid 65534.*not trusted"):
            Ring.attach(path, timeout=2)
    finally:
        proc.kill()
        proc.wait()


def test_uid_trust_rules(tmp_path):
    d = tmp_path / "d"
    d.mkdir(mode=0o755)
    sock = str(d / "r.v2.sock")
    assert ibvbridge.uid_trusted(0, sock, euid=1000)
    assert ibvbridge.uid_trusted(1000, sock, euid=1000)
    assert not ibvbridge.uid_trusted(65534, sock, euid=1000)  # dir owned by root
    os.chown(d, 65534, -1)
    assert ibvbridge.uid_trusted(65534, sock, euid=1000)  # the owner of a dir nobody else can write
    os.chmod(d, 0o775)
    assert not ibvbridge.uid_trusted(65534, sock, euid=1000)  # group-writable: anyone in it could plant it
    os.chmod(d, 0o757)
    assert not ibvbridge.uid_trusted(65534, sock, euid=1000)
    assert not ibvbridge.uid_trusted(65534, str(tmp_path / "missing" / "r.v2.sock"), euid=1000)


def test_mappings_ctl_and_data_read_only_region_writable(make_producer):
    p = make_producer()
    p.publish(1, b"abcd", items=[addr(0x10, 0, 4)])
    with attach(p) as ring:
        with pytest.raises(TypeError):
            ring._data_mm[0] = 1
        with pytest.raises(TypeError):
            ring._ctl_mm[0] = 1
        with pytest.raises(TypeError):
            ring._c64[L.OFF_HEAD >> 3] = 5  # the memoryview of the control memory is read-only too
        assert ring._desc_arr.flags.writeable is False and ring._payload2d.flags.writeable is False
        with ring.next() as h:
            with pytest.raises(TypeError):
                h.payload[0] = 0
            a = h.array(0x10)
            with pytest.raises(ValueError):
                a[0] = 0
        ring._region_mm[0x200] = 1  # our own region is ours to write
        assert p.consumer().region_mm[0x200] == 1
        ring._region_mm[0x200] = 0
        with pytest.raises(OSError):  # the sealed memory cannot be resized by anybody
            os.ftruncate(p.data_fd, 0)


def test_max_consumers_busy_and_reattach(make_producer):
    p = make_producer(max_consumers=1)
    for i in range(5):
        p.publish(i, bytes([i]))
    r1 = attach(p)
    with pytest.raises(RingBusy, match="busy"):
        attach(p)
    r1.next().release()
    r1.next().release()
    held = r1.next()  # position 2 stays unreleased
    assert held.heap_cnt == 2
    r1.close()
    assert held.released is False
    p.wait_consumers(0)
    # layout 2.1 §D: the producer reads the final tail at detach (positions 0 and 1 were released)
    assert p.row_get(0, "state") == L.CONSUMER_GONE and p.row_get(0, "released") == 2
    # a new consumer starts at the oldest heap the ring still holds: nothing was reclaimed, so position 0
    with attach(p) as r2:
        assert r2.position == p.reclaimed == r2.oldest == 0 and r2.generation == 2 and r2.consumer_index == 0
        assert [h.heap_cnt for h in (r2.next(), r2.next(), r2.next())] == [0, 1, 2]


def test_start_at_head(make_producer):
    p = make_producer()
    for i in range(3):
        p.publish(i, b"old")
    with attach(p, start="head") as ring:
        assert ring.position == 3
        with pytest.raises(Timeout):
            ring.next(timeout=0)
        p.publish(7, b"new")
        with ring.next(timeout=1) as h:
            assert h.heap_cnt == 7 and bytes(h.payload) == b"new"
    with pytest.raises(ValueError):
        attach(p, start="middle")


def test_consumer_row_written(make_producer):
    p = make_producer()
    with attach(p) as ring:
        row = ring.row()
        assert row["state"] == L.CONSUMER_ATTACHED and row["generation"] == ring.generation == 1
        assert row["pid"] == os.getpid() and row["uid"] == os.geteuid()
        assert abs(row["attach_ns"] - time.time_ns()) < 10e9
        assert ring.stats()["consumers_attached"] == 1
        assert ring._r64[L.REG_SPIN_BUDGET_NS >> 3] == 20_000  # the default spin budget
    # The producer's thread marks the row gone when it reads the connection's end: wait for that (at most
    # 5 s), not for "at least 0 consumers", which holds at once.
    deadline = time.monotonic() + 5
    while p.row_get(0, "state") != L.CONSUMER_GONE and time.monotonic() < deadline:
        time.sleep(0.005)
    assert p.row_get(0, "state") == L.CONSUMER_GONE
    assert p.c64[(L.OFF_STATS >> 3) + 10] == 0


@pytest.fixture
def received_fds(monkeypatch):
    """Records the descriptors every welcome brought."""
    got = []
    real = socket.recv_fds

    def spy(*a, **kw):
        r = real(*a, **kw)
        got.extend(r[1])
        return r
    monkeypatch.setattr(ring_mod.socket, "recv_fds", spy)
    return got


def closed(fd):
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_attach_closes_the_descriptors(make_producer, received_fds):
    p = make_producer()
    with attach(p) as ring:
        assert len(received_fds) == 3 and ring._fds == []
        assert all(closed(fd) for fd in received_fds)  # the mappings keep the memory; the socket stays
        assert ring.producer_alive()
    p.wait_consumers(0)


# ------------------------------------------------------------------ several consumers


@pytest.mark.parametrize("n", [2, 3])
def test_every_consumer_gets_every_heap(make_producer, n):
    p = make_producer(slot_count=8, slot_size=64, policy=L.POLICY_BLOCK)
    rings = [attach(p) for _ in range(n)]
    assert sorted(r.consumer_index for r in rings) == list(range(n))
    got = [[] for _ in range(n)]
    count = 100

    def read(k):
        for h in rings[k].heaps(timeout=5):
            got[k].append((h.heap_cnt, bytes(h.payload)))

    threads = [threading.Thread(target=read, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for i in range(count):  # 100 heaps through 8 slots: each slot is reused only when all n released it
        assert p.publish_verify(i, 8 + i % 50) is not None
    p.publish_eos()
    for t in threads:
        t.join(10)
    want = [(i, pattern(i, 8 + i % 50)) for i in range(count)]
    for k in range(n):
        assert got[k] == want
    assert p.c64[(L.OFF_STATS >> 3) + 4] == 0  # nothing dropped
    for r in rings:
        r.close()


def test_detach_of_one_consumer_does_not_disturb_another(make_producer):
    p = make_producer(slot_count=4, policy=L.POLICY_BLOCK, block_timeout=3)
    a, b = attach(p), attach(p)
    for i in range(4):
        p.publish(i, b"x")
    assert [h.heap_cnt for h in (a.next(), a.next())] == [0, 1]  # a holds two heaps and leaves
    a.close()
    p.wait_consumers(1)
    assert p.row_get(a.consumer_index, "state") == L.CONSUMER_GONE
    got = []
    for i in range(4, 12):  # needs a's slots: possible only because a no longer counts
        with b.next(timeout=1) as h:
            got.append(h.heap_cnt)
        assert p.publish(i, b"y") is not None
    assert got == list(range(8))
    assert b.row()["state"] == L.CONSUMER_ATTACHED and b.stats()["consumers_attached"] == 1
    b.close()


def test_overrun_row_raises_overrun_with_lost_heaps(make_producer):
    p = make_producer()
    p.publish(1, b"a")
    with attach(p) as ring, attach(p) as other:
        assert ring.next().heap_cnt == 1
        p.detach(ring.consumer_index, L.CONSUMER_OVERRUN, lost_heaps=7)
        p.publish(2, b"b")
        with pytest.raises(Overrun) as e:
            ring.next(timeout=1)
        assert e.value.lost_heaps == 7 and "7 heaps lost" in str(e.value) and "overrun" in str(e.value)
        assert isinstance(e.value, Detached) and e.value.reason == L.CONSUMER_OVERRUN
        with pytest.raises(Overrun):  # it must stop reading
            ring.next(timeout=0)
        with pytest.raises(Overrun):
            list(ring)
        assert ring.stats()["consumer_overruns"] == 1  # still readable: the control memory is mapped
        assert [h.heap_cnt for h in (other.next(), other.next())] == [1, 2]  # the other reads on


def test_overrun_noticed_while_waiting(make_producer):
    p = make_producer()
    with attach(p) as ring:
        threading.Timer(0.2, lambda: p.detach(ring.consumer_index, L.CONSUMER_OVERRUN, lost_heaps=3)).start()
        t = time.monotonic()
        with pytest.raises(Overrun) as e:
            ring.next(timeout=5)
        assert e.value.lost_heaps == 3 and time.monotonic() - t < 1.0


def test_real_overrun_under_drop(make_producer):
    # two consumers, a drop producer and 4 slots: the one that stops reading is detached as overrun, the
    # other loses nothing
    p = make_producer(slot_count=4, policy=L.POLICY_DROP)
    slow, fast = attach(p), attach(p)  # slow never reads
    got = []
    for i in range(10):
        assert p.publish(i, b"z") is not None
        with fast.next(timeout=1) as h:
            got.append(h.heap_cnt)
    assert got == list(range(10))
    assert p.row_get(slow.consumer_index, "state") == L.CONSUMER_OVERRUN
    with pytest.raises(Overrun) as e:
        slow.next(timeout=1)
    assert e.value.lost_heaps == 4 and fast.stats()["consumer_overruns"] == 1
    slow.close()
    fast.close()


def test_bad_cursor_detaches(make_producer):
    p = make_producer(slot_count=4)
    with attach(p) as ring:
        p.publish(0, b"a")
        ring._r64[L.REG_TAIL >> 3] = 1000  # past head: invalid
        for i in range(1, 6):
            p.publish(i, b"b")  # the producer reads the cursor when it reclaims
        assert p.row_get(ring.consumer_index, "state") == L.CONSUMER_BAD_CURSOR
        with pytest.raises(Detached, match="invalid cursor") as e:
            ring.next(timeout=1)
        assert not isinstance(e.value, Overrun) and e.value.reason == L.CONSUMER_BAD_CURSOR
        assert ring.stats()["consumer_errors"] == 1


def test_row_reused_by_another_consumer_is_detached(make_producer):
    p = make_producer()
    with attach(p) as ring:
        p.row_set(ring.consumer_index, generation=ring.generation + 1)
        p.publish(1, b"a")
        with pytest.raises(Detached, match="another consumer"):
            ring.next(timeout=1)


def test_corrupt_descriptor_of_a_detached_consumer_reports_the_detach(make_producer):
    p = make_producer()
    p.publish(0, b"ok", desc_overrides={"seq": 99})
    with attach(p) as ring:
        ring._available()
        p.detach(ring.consumer_index, L.CONSUMER_OVERRUN, lost_heaps=1)
        with pytest.raises(Overrun):
            ring.next(timeout=1)


def test_release_wakes_a_waiting_producer(make_producer):
    p = make_producer()
    for i in range(3):
        p.publish(i, b"a")
    with attach(p) as ring:
        c = p.consumer()
        f0 = c.r32[L.REG_RELEASE_FUTEX >> 2]
        # without producer_waiting a release bumps nothing
        ring.next().release()
        ring._flush_release()
        assert c.tail == 1 and c.r32[L.REG_RELEASE_FUTEX >> 2] == f0
        # a producer sleeping on release_futex (spec §7.4) is woken by the next release
        p.c32[L.OFF_PRODUCER_WAITING >> 2] = 1
        woke = []

        def sleeper():
            t = time.monotonic()
            futex_wait(c.rf_addr, f0, 5.0)
            woke.append(time.monotonic() - t)
        th = threading.Thread(target=sleeper)
        th.start()
        time.sleep(0.2)
        ring.next().release()
        ring._flush_release()
        th.join(5)
        assert c.tail == 2 and c.r32[L.REG_RELEASE_FUTEX >> 2] == (f0 + 1) & 0xFFFFFFFF
        assert woke and woke[0] < 1.0  # woken, not timed out
        assert p.c32[L.OFF_PRODUCER_WAITING >> 2] == 1  # the consumer never writes the control memory


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
            # descriptors are a private copy (spec §A): a producer rewriting them cannot change what was checked
            assert not np.shares_memory(b.heap_cnt, ring._desc_arr) and not b.descs.flags.writeable
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
    p = make_producer()
    with attach(p) as ring:
        p.consumer().r32[L.REG_CONSUMER_FUTEX >> 2] = 0xFFFFFFFF  # before the consumer ever sleeps on it
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
        assert p.consumer().r32[L.REG_CONSUMER_FUTEX >> 2] in (0, 1)  # wrapped


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
        assert p.consumer().r32[L.REG_CONSUMER_WAITING >> 2] == 0


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


def test_wait_polls_producer_liveness_once_per_slice_not_once_per_wake(make_producer):
    """A moving stream wakes the consumer once per heap: the liveness poll (a syscall) is made when due, once
    per MAX_WAIT_SLICE, not before every sleep (spec §7.6 asks for detection within a slice)."""
    p = make_producer(slot_count=64)
    n = 60
    with attach(p, spin_budget=0) as ring:
        polls, sleeps = [0], [0]
        alive, sleep = ring.producer_alive, ring._futex_wait

        def counting_alive():
            polls[0] += 1
            return alive()

        def counting_sleep(f, t):
            sleeps[0] += 1
            return sleep(f, t)
        ring.producer_alive, ring._futex_wait = counting_alive, counting_sleep

        def publish():
            for k in range(1, n + 1):
                time.sleep(0.002)
                p.publish(k, b"x")
        t = threading.Thread(target=publish)
        t0 = time.monotonic()
        t.start()
        try:
            cnts = [ring.next(timeout=5).heap_cnt for _ in range(n)]
        finally:
            t.join()
        elapsed = time.monotonic() - t0
    assert cnts == list(range(1, n + 1))
    assert sleeps[0] >= n // 2  # the consumer did sleep for most heaps: the count below means something
    assert polls[0] <= elapsed / L.MAX_WAIT_SLICE + 2, (polls[0], sleeps[0], elapsed)


def test_producer_death_just_after_a_poll_is_noticed_when_the_next_sleep_times_out(make_producer):
    """A death just after a liveness poll: the wait does not poll again before it sleeps (the poll was
    recent), but a dead producer wakes nobody, so the sleep times out within a slice and the poll after it
    reports ProducerGone (spec §7.6), after the heap published before the death was read."""
    p = make_producer()
    p.publish(1, b"x")
    with attach(p, spin_budget=0) as ring:
        assert ring.next(timeout=1).heap_cnt == 1
        with pytest.raises(Timeout):
            ring.next(timeout=0.01)  # polls (before reporting the Timeout): alive, the next poll a slice later
        polled = ring._poll_due - L.MAX_WAIT_SLICE
        p.die()
        with pytest.raises(ProducerGone):
            ring.next(timeout=5)
        assert ring._poll_due - L.MAX_WAIT_SLICE >= polled + L.MAX_WAIT_SLICE * 0.9  # after a whole slice
        assert time.monotonic() - polled < 1.0  # generous for a loaded machine: a slice is 0.25 s


def test_next_without_waiting_reports_a_dead_producer_not_a_timeout(make_producer):
    """next(timeout=0) (what the asyncio wait uses) polls before it reports Timeout: a dead producer is
    ProducerGone even right after a poll that found it alive."""
    p = make_producer()
    with attach(p, spin_budget=0) as ring:
        with pytest.raises(Timeout):
            ring.next(timeout=0)
        p.die()
        with pytest.raises(ProducerGone):
            ring.next(timeout=0)


def _spawn_producer(tmp_path, name, *args):
    proc = subprocess.Popen([PY, os.path.join(HERE, "fake_producer.py"), "--dir", str(tmp_path), "--name", name,
                             *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc, os.path.join(str(tmp_path), name + ".v2.sock")


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
            "try:\n    r.next()\nexcept KeyboardInterrupt:\n    print('KI', flush=True)\n") % (PKG, p.socket_path)
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


def test_max_latency_coalesces_wakes(make_producer):
    p = make_producer(slot_count=64)
    n = 40

    def trickle():
        for i in range(n):
            time.sleep(0.0005)
            p.publish(i, b"z" * 8)

    # A 50 ms bound, a hundred of the publisher's steps: only a stall that long makes the stream look idle
    # (a wake per heap after it), so a loaded machine's late sleeps do not.
    with Ring.attach(p.socket_path, timeout=1, max_latency=0.05) as ring:
        futex0 = ring._r32[L.REG_CONSUMER_FUTEX >> 2]
        th = threading.Thread(target=trickle)
        th.start()
        got = []
        for _ in range(n):
            with ring.next(timeout=5) as h:
                got.append(h.heap_cnt)
        th.join()
        assert got == list(range(n))
        wakes = (ring._r32[L.REG_CONSUMER_FUTEX >> 2] - futex0) & 0xFFFFFFFF
        assert wakes <= 2, f"{wakes} producer wakes for {n} heaps of a moving stream"
        t0 = time.monotonic()
        with pytest.raises(Timeout):
            ring.next(timeout=0.1)
        assert 0.09 <= time.monotonic() - t0 < 1.0


def test_coalesced_wake_on_half_ring_and_end_of_stream(make_producer):
    """A coalesced sleep (spec §7.5) does not hold heaps for its whole bound (30 s here) when they pile up:
    the producer wakes the consumer once half the ring waits; after an idle spell the first heap wakes it
    at once; the end of the stream wakes it whatever it asked."""
    p = make_producer(slot_count=16)
    with Ring.attach(p.socket_path, timeout=1, max_latency=30) as ring:
        t = threading.Timer(0.02, lambda: p.publish(1, b"a" * 8))
        t.start()
        with ring.next(timeout=5) as h:
            assert h.heap_cnt == 1
        t.join()
        got = queue.Queue()

        def reader():
            try:
                with ring.next(timeout=10) as h:
                    got.put(h.heap_cnt)
            except Exception as e:  # noqa: BLE001 - handed to the test thread
                got.put(e)
        th = threading.Thread(target=reader)
        th.start()
        time.sleep(0.02)
        for i in range(2, 9):  # 7 heaps: under half of 16, no wake
            p.publish(i, b"b" * 8)
        with pytest.raises(queue.Empty):
            got.get(timeout=0.05)
        p.publish(9, b"b" * 8)
        assert got.get(timeout=5) == 2
        th.join()
        for i in range(3, 10):
            with ring.next(timeout=1) as h:
                assert h.heap_cnt == i
        threading.Timer(0.02, p.publish_eos).start()
        t0 = time.monotonic()
        with pytest.raises(EndOfStream):
            ring.next(timeout=10)
        assert time.monotonic() - t0 < 5


def test_refuses_unsupported_machines(monkeypatch, tmp_path):
    """Spec §11: a machine with no known futex number, or one whose ordering needs libibvbridge's fences
    when the library cannot be loaded, is refused in one line by attach and create."""
    from ibvbridge import _sys
    monkeypatch.setattr(_sys, "MACHINE", "sparc64")
    monkeypatch.setattr(_sys, "_SYS_FUTEX", None)
    for call in (lambda: ibvbridge.Ring.attach("nope", directory=str(tmp_path), timeout=0),
                 lambda: ibvbridge.Producer.create("nope", directory=str(tmp_path))):
        with pytest.raises(ibvbridge.RingError, match="does not know this machine .sparc64."):
            call()
    monkeypatch.setattr(_sys, "MACHINE", "aarch64")
    monkeypatch.setattr(_sys, "_SYS_FUTEX", 98)
    monkeypatch.setattr(_sys, "ORDERED", True)
    monkeypatch.setattr(_sys, "_fence_lib", None)
    monkeypatch.setattr(_sys, "_fence_error", "libibvbridge not found")
    for call in (lambda: ibvbridge.Ring.attach("nope", directory=str(tmp_path), timeout=0),
                 lambda: ibvbridge.Producer.create("nope", directory=str(tmp_path))):
        with pytest.raises(ibvbridge.RingError, match="on aarch64 needs libibvbridge .*IBVBRIDGE_LIB"):
            call()


def test_suite_with_library_fences():
    """The ordering a non-TSO machine uses (libibvbridge's acquire / release / full fences after and before
    every publishing load and store) runs the producer, consumer and consume-tool tests here too: every
    fence call site is exercised, and the fences are really the library's."""
    lib = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "c", "build", "libibvbridge.so")
    if not os.path.exists(lib):
        if os.environ.get("IBVBRIDGE_REQUIRE_CLIENTS"):
            pytest.fail(f"{lib} not built")
        pytest.skip("libibvbridge not built (make -C clients/c)")
    env = dict(os.environ, IBVBRIDGE_PY_FENCES="lib", IBVBRIDGE_LIB=os.path.abspath(lib))
    here = os.path.dirname(os.path.abspath(__file__))
    probe = subprocess.run([sys.executable, "-c", "from ibvbridge import _sys; print(_sys.ORDERED, _sys.FENCES)"],
                           env=dict(env, PYTHONPATH=os.path.join(here, "..")), capture_output=True, text=True,
                           timeout=60)
    assert probe.stdout.startswith("True libibvbridge fences"), probe.stdout + probe.stderr
    # A short basetemp of its own, removed after: not /tmp/pytest-of-USER (pytest keeps it), and short enough
    # for the tests' socket paths (108 bytes).
    with tempfile.TemporaryDirectory(prefix="ibvb") as base:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                            "--basetemp", os.path.join(base, "t"),
                            "-k", "not library_fences and not unsupported_machines",
                            "test_ring.py", "test_producer.py", "test_consume.py"],
                           cwd=here, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def test_metadata_reader_gives_up_busy_and_keeps_last_record(make_producer):
    """Spec §6: an id described twice keeps its last record; strings decode with replacement; an area the
    producer never finishes rewriting raises MetadataBusy after 1000 tries and 10 ms."""
    p = make_producer()
    with attach(p) as ring:
        p.set_descriptors([meta_record(0x1600, "first"), meta_record(0x1700, "other"),
                           meta_record(0x1600, "lastZ").replace(b"lastZ", b"last\xff")])
        d = ring.descriptors()
        assert set(d) == {0x1600, 0x1700} and d[0x1600].name == "last\ufffd"
        words = memoryview(p.data).cast("Q")
        words[p.meta_off >> 3] |= 1  # a producer stuck mid-rewrite: the sequence stays odd
        words.release()
        t0 = time.monotonic()
        with pytest.raises(ibvbridge.MetadataBusy, match="metadata area busy"):
            ring.descriptors()
        assert time.monotonic() - t0 >= 0.010


@pytest.mark.parametrize("where,ok", [("payload_end-32", True), ("data_size-8", True), ("data_size", True),
                                      ("data_size+1", False)])
def test_zero_size_region_needs_only_offset_within_data(make_producer, where, ok):
    """Spec §9 step 5: a region of size 0 is checked only for offset <= data_size, not alignment or overlap
    (§2.1: an empty packet area may be left at the unaligned end of the payload slots)."""
    probe = make_producer("probe")
    h = probe.hdr
    pe = h["payload_offset"] + h["slot_count"] * h["slot_size"]
    ds = h["data_size"]
    off = {"payload_end-32": pe - 32, "data_size-8": ds - 8, "data_size": ds, "data_size+1": ds + 1}[where]
    p = make_producer("zero", header_overrides={"packet_offset": off, "packet_size": 0})
    if ok:
        with attach(p) as ring:
            assert ring.consumer_index >= 0
    else:
        with pytest.raises(CorruptRing, match="packet area"):
            attach(p)


def test_stats_reads_as_spead2s_stream_stats(make_producer):
    p = make_producer()
    for i in range(3):
        p.publish(i, b"a")
    with attach(p) as ring:
        st = ring.stats
        assert st["heaps"] == st.heaps == 3  # by our name, as a mapping and as an attribute
        assert st.incomplete_heaps_evicted == st["incomplete_heaps"]  # spead2's name for the same counter
        assert ring.stats() == st  # the older call form
        with pytest.raises(AttributeError, match="no counter 'worker_blocked'"):
            st.worker_blocked  # a spead2 counter with no counterpart here is not silently 0
