"""Items by name in spead2's vocabulary (ibvbridge.items): ItemGroup.update, heap['name'], HeapGenerator,
and asyncio (ibvbridge.aio), against the real Python producer."""

import asyncio
import threading

import numpy as np
import pytest

import ibvbridge
from ibvbridge import EndOfStream, ItemGroup, Producer, Ring, Timeout
from ibvbridge import layout as L
from ibvbridge.items import Item, format_bytes, parse_format


from test_producer import make as _producers  # noqa: F401 - the fixture that makes (and closes) producers


@pytest.fixture
def make(_producers):
    """Producers with room for the items these tests send."""
    return lambda name="r", **kw: _producers(name, **{"slot_size": 4096, "max_items": 8, **kw})


def sender_group():
    ig = ItemGroup()
    ig.add_item(0x1600, "timestamp", "ADC sample count", (), format=[("u", 48)])
    ig.add_item(0x1601, "offset", "a signed immediate", (), format=[("i", 48)])
    ig.add_item(0x1800, "spectrum", "power per channel", (4, 2), dtype=np.float32)
    ig.add_item(0x1801, "flags", "variable length bytes", (None,), dtype=np.uint8)
    ig.add_item(0x1802, "name", "a string", (None,), format=[("c", 8)])
    ig.add_item(0x1803, "pair", "two fields", (), format=[("u", 4), ("i", 12)])
    return ig


def test_update_decodes_named_items_as_spead2_does(make):
    p = make()
    with Ring.attach(p.socket_path, timeout=2) as ring:
        sig = sender_group()
        gen = ibvbridge.HeapGenerator(sig, p)
        sig["timestamp"].value = (1 << 47) + 5
        sig["offset"].value = -3
        sig["spectrum"].value = np.arange(8, dtype=np.float32).reshape(4, 2)
        sig["flags"].value = np.array([7, 8, 9], np.uint8)
        sig["name"].value = "hello"
        sig["pair"].value = (9, -100)
        gen.publish(1)
        ig = ItemGroup()
        with ring.next(timeout=2) as heap:
            changed = ig.update(heap)
            assert set(changed) == {"timestamp", "offset", "spectrum", "flags", "name", "pair"}
            assert ig["timestamp"].value == (1 << 47) + 5 and isinstance(ig["timestamp"].value, int)
            assert ig[0x1601].value == -3
            spec = ig["spectrum"].value
            assert spec.shape == (4, 2) and spec.dtype == np.float32
            assert np.array_equal(spec, np.arange(8, dtype=np.float32).reshape(4, 2))
            assert not spec.flags.writeable and not spec.flags.owndata  # a view of the slot
            kept = spec.copy()
            assert list(ig["flags"].value) == [7, 8, 9]
            assert ig["name"].value == "hello"
            assert ig["pair"].value == (9, -100)
            assert ig["timestamp"].description == "ADC sample count"
            assert ig["flags"].shape == (None,)
            assert heap["timestamp"].value == (1 << 47) + 5  # one heap, by name
            assert list(heap[0x1801].value) == [7, 8, 9]
        assert np.array_equal(kept, np.arange(8, dtype=np.float32).reshape(4, 2))
        assert set(ig.keys()) == set(sig.keys())
        assert set(ig.ids()) == {0x1600, 0x1601, 0x1800, 0x1801, 0x1802, 0x1803}
        assert all(isinstance(v, Item) for v in ig.values())
        assert dict(ig.items())["offset"] is ig["offset"]


def test_update_returns_only_the_items_the_heap_carried(make):
    p = make()
    with Ring.attach(p.socket_path, timeout=2) as ring:
        sig = sender_group()
        gen = ibvbridge.HeapGenerator(sig, p)
        sig["timestamp"].value = 1
        sig["spectrum"].value = np.ones((4, 2), np.float32)
        gen.publish(1)
        sig["timestamp"].value = 2  # only the timestamp changed: data="stale" sends only it
        gen.publish(2)
        ig = ItemGroup()
        with ring.next(timeout=2) as h:
            assert set(ig.update(h)) == {"timestamp", "spectrum"}
        with ring.next(timeout=2) as h:
            assert set(ig.update(h)) == {"timestamp"}
            assert ig["timestamp"].value == 2


def test_descriptors_are_written_to_the_metadata_once(make):
    p = make()
    with Ring.attach(p.socket_path, timeout=2) as ring:
        sig = sender_group()
        gen = ibvbridge.HeapGenerator(sig, p)
        sig["timestamp"].value = 1
        gen.publish(1)
        seq1 = int.from_bytes(bytes(ring._dmv[ring._geo.meta_offset:ring._geo.meta_offset + 8]), "little")
        sig["timestamp"].value = 2
        gen.publish(2)
        seq2 = int.from_bytes(bytes(ring._dmv[ring._geo.meta_offset:ring._geo.meta_offset + 8]), "little")
        assert seq1 == seq2 and seq1 > 0
        d = ring.descriptors()[0x1600]
        assert d.name == "timestamp" and parse_format(d.format) == [("u", 48)]


def test_a_late_consumer_still_names_items_from_the_metadata(make):
    p = make()
    sig = sender_group()
    gen = ibvbridge.HeapGenerator(sig, p)
    sig["timestamp"].value = 11
    sig["spectrum"].value = np.zeros((4, 2), np.float32)
    gen.publish(1)  # the heap that brought the descriptors: this consumer never sees it
    with Ring.attach(p.socket_path, timeout=2, start="head") as ring:
        sig["timestamp"].value = 12
        gen.publish(2)  # no HAS_DESCRIPTORS flag, descriptors were written before this consumer came
        ig = ItemGroup()
        with ring.next(timeout=2) as h:
            assert ig.update(h)["timestamp"].value == 12


def test_non_native_byte_order_is_converted_like_spead2_or_kept_with_bar(make):
    p = make()
    with Ring.attach(p.socket_path, timeout=2) as ring:
        sig = ItemGroup()
        sig.add_item(0x2000, "be", "", (3,), dtype=">u4", value=np.array([1, 2, 70000], ">u4"))
        ibvbridge.HeapGenerator(sig, p).publish(1)
        p.publish(p.acquire(), 2)
        ig = ItemGroup()
        with ring.next(timeout=2) as h:
            v = ig.update(h)["be"].value
            assert list(v) == [1, 2, 70000] and v.dtype.isnative
            kept = ig.update(h, new_order="|")["be"].value
            assert kept.dtype == np.dtype(">u4") and not kept.flags.owndata


def test_too_short_item_is_a_value_error(make):
    p = make()
    with Ring.attach(p.socket_path, timeout=2) as ring:
        p.set_descriptors([type("D", (), dict(id=0x3000, name="big", description="", shape=(100,),
                                                  dtype=np.dtype("<u8"), format=b"", order="C"))()])
        s = p.acquire()
        s.add_item(0x3000, 0, 16)
        p.publish(s, 1)
        with ring.next(timeout=2) as h:
            with pytest.raises(ValueError, match="too few"):
                ItemGroup().update(h)


def test_released_heap_is_refused(make):
    p = make()
    with Ring.attach(p.socket_path, timeout=2) as ring:
        p.publish(p.acquire(), 1)
        h = ring.next(timeout=2)
        h.release()
        with pytest.raises(ibvbridge.RingError, match="released"):
            ItemGroup().update(h)


def test_format_wire_form_round_trips_in_both_flavours():
    fmt = [("u", 48), ("i", 8)]
    assert parse_format(format_bytes(fmt, 6)) == fmt
    assert parse_format(format_bytes(fmt, 5), immediate_bytes=5) == fmt
    assert parse_format(b"") is None


def test_async_for_reads_every_heap_then_ends(make):
    p = make(policy="block")

    async def main(ring):
        ig = ItemGroup()
        seen = []
        async for heap in ring:
            ig.update(heap)
            seen.append(ig["timestamp"].value)
        return seen

    with Ring.attach(p.socket_path, timeout=2) as ring:
        sig = sender_group()
        gen = ibvbridge.HeapGenerator(sig, p)

        def produce():
            for i in range(20):
                sig["timestamp"].value = i
                gen.publish(i + 1, timeout=5)
            p.end_of_stream()

        t = threading.Thread(target=produce)
        t.start()  # the consumer awaits first: the heaps arrive while it sleeps in the executor
        assert asyncio.run(main(ring)) == list(range(20))
        t.join(5)


def test_next_async_times_out_and_leaves_the_loop_free(make):
    p = make()

    async def main(ring):
        ticks = []

        async def tick():
            for _ in range(5):
                ticks.append(1)
                await asyncio.sleep(0.01)

        tt = asyncio.create_task(tick())
        with pytest.raises(Timeout):
            await ring.next_async(timeout=0.2)
        await tt
        return len(ticks)

    with Ring.attach(p.socket_path, timeout=2) as ring:
        assert asyncio.run(main(ring)) == 5
        assert ring._r32[L.REG_CONSUMER_WAITING >> 2] == 0


def test_next_async_raises_end_of_stream(make):
    p = make()
    with Ring.attach(p.socket_path, timeout=2) as ring:
        p.end_of_stream()
        with pytest.raises(EndOfStream):
            asyncio.run(ring.next_async(timeout=2))


def test_cancelled_wait_takes_no_heap(make):
    p = make()

    async def main(ring):
        task = asyncio.create_task(ring.next_async())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with Ring.attach(p.socket_path, timeout=2) as ring:
        asyncio.run(main(ring))
        p.publish(p.acquire(), 7)
        with ring.next(timeout=2) as h:
            assert h.heap_cnt == 7


def descriptor_packet(iid, name, description, fmt=b"", shape=(), dtype=b"", addr_bytes=6):
    """An item descriptor as spead2 sends it (item 0x5's value): an embedded SPEAD packet, its fields as
    address items in order, the id an immediate."""
    addr_bits = 8 * addr_bytes
    fields = [(0x10, name), (0x11, description), (0x13, fmt),
              (0x12, b"".join(b"\x00" + int(s).to_bytes(addr_bytes, "big") for s in shape))]
    if dtype:
        fields.append((0x15, dtype))
    ptrs, payload = [(1 << 63) | (0x14 << addr_bits) | iid], b""
    for fid, value in fields:
        ptrs.append((fid << addr_bits) | len(payload))
        payload += value
    hdr = bytes([0x53, 4, 8 - addr_bytes, addr_bytes, 0, 0]) + len(ptrs).to_bytes(2, "big")
    return hdr + b"".join(p.to_bytes(8, "big") for p in ptrs) + payload


def test_descriptors_carried_only_by_the_heap_are_learnt(make):
    """A heap with HAS_DESCRIPTORS whose descriptors never reached the ring's metadata (an area too small
    for them) still names its items."""
    p = make()
    with Ring.attach(p.socket_path, timeout=2) as ring:
        d1 = descriptor_packet(0x1600, b"timestamp", b"sample count", fmt=b"u\x00\x30")
        d2 = descriptor_packet(0x1800, b"spectrum", b"", dtype=b"{'descr': '<u2', 'fortran_order': False, 'shape': (4,)}")
        s = p.acquire()
        data = np.arange(4, dtype="<u2").tobytes()
        body = data + d1 + d2
        s.payload[:len(body)] = np.frombuffer(body, np.uint8)
        s.add_item(0x1600, (1 << 40) + 7, 6, immediate=True)
        s.add_item(0x1800, 0, 8)
        s.add_item(0x5, 8, len(d1))
        s.add_item(0x5, 8 + len(d1), len(d2))
        p.publish(s, 1, flags=ibvbridge.producer.COMPLETE | ibvbridge.producer.HAS_DESCRIPTORS)
        assert ring.descriptors() == {}
        ig = ItemGroup()
        with ring.next(timeout=2) as h:
            changed = ig.update(h)
            assert set(changed) == {"timestamp", "spectrum"}
            assert ig["timestamp"].value == (1 << 40) + 7 and ig["timestamp"].description == "sample count"
            assert list(ig["spectrum"].value) == [0, 1, 2, 3] and ig["spectrum"].dtype == np.dtype("<u2")


def test_a_malformed_heap_descriptor_is_dropped_not_fatal(make):
    p = make()
    with Ring.attach(p.socket_path, timeout=2) as ring:
        s = p.acquire()
        s.payload[:16] = np.frombuffer(b"\x53\x04\x02\x06\x00\x00\x00\x09" + b"\x00" * 8, np.uint8)  # 9 pointers
        s.add_item(0x5, 0, 16)
        p.publish(s, 1, flags=ibvbridge.producer.COMPLETE | ibvbridge.producer.HAS_DESCRIPTORS)
        with ring.next(timeout=2) as h:
            assert ItemGroup().update(h) == {}
    with pytest.raises(ValueError, match="past its"):
        ibvbridge.items.parse_descriptor_item(b"\x53\x04\x02\x06\x00\x00\x00\x09" + b"\x00" * 8)


def test_shaped_items_of_formats_numpy_lacks_decode_to_arrays_as_spead2_does(make):
    """[('u', 12)] of shape (5,) is an object array of shape (5,) (spead2's np.array of the decoded
    elements), not a list; two fields of shape (2, 2) a record array; a scalar stays a Python int."""
    p = make()
    with Ring.attach(p.socket_path, timeout=2) as ring:
        sig = ItemGroup()
        sig.add_item(0x1900, "twelve", "12-bit counts", (5,), format=[("u", 12)])
        sig.add_item(0x1901, "pairs", "two fields", (2, 2), format=[("u", 4), ("i", 12)])
        sig.add_item(0x1902, "one", "a scalar", (), format=[("u", 12)])
        gen = ibvbridge.HeapGenerator(sig, p)
        sig["twelve"].value = [1, 2, 4095, 0, 7]
        sig["pairs"].value = [[(1, -1), (2, -2)], [(15, 2047), (0, -2048)]]
        sig["one"].value = 4000
        gen.publish(1)
        ig = ItemGroup()
        with ring.next(timeout=2) as heap:
            ig.update(heap)
            v = ig["twelve"].value
            assert isinstance(v, np.ndarray) and v.dtype == object and v.shape == (5,)
            assert v.tolist() == [1, 2, 4095, 0, 7]
            pairs = ig["pairs"].value
            assert isinstance(pairs, np.ndarray) and pairs.shape == (2, 2) and len(pairs.dtype) == 2
            assert [tuple(x) for x in pairs.ravel()] == [(1, -1), (2, -2), (15, 2047), (0, -2048)]
            assert ig["one"].value == 4000 and isinstance(ig["one"].value, int)
        # what was decoded encodes again: the array goes back through HeapGenerator unchanged
        sig["twelve"].value = v
        gen.publish(2)
        with ring.next(timeout=2) as heap:
            assert ig.update(heap)["twelve"].value.tolist() == [1, 2, 4095, 0, 7]


def test_update_views_follow_each_heaps_slot_as_slots_are_reused(make):
    """ItemGroup.update reuses a numpy item's view per slot: across heaps in different slots, and again when
    a slot comes round, each heap's value is that heap's bytes, never another slot's."""
    p = make(slot_count=4)
    with Ring.attach(p.socket_path, timeout=2) as ring:
        sig = ItemGroup()
        sig.add_item(0x1800, "spectrum", "", (4, 2), dtype=np.float32)
        sig.add_item(0x1801, "flat", "", (3,), dtype=np.int16)
        gen = ibvbridge.HeapGenerator(sig, p)
        ig = ItemGroup()
        slots = set()
        for k in range(10):
            sig["spectrum"].value = np.full((4, 2), k, np.float32)
            sig["flat"].value = np.array([k, -k, 2 * k], np.int16)
            gen.publish(k + 1, data="all")
            with ring.next(timeout=2) as heap:
                slots.add(heap.slot)
                ig.update(heap)
                assert np.array_equal(ig["spectrum"].value, np.full((4, 2), k, np.float32)), (k, heap.slot)
                assert ig["flat"].value.tolist() == [k, -k, 2 * k]
        assert len(slots) > 1  # the heaps went through several slots, each more than once
