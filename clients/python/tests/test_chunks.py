"""Chunks (docs/ring-layout.md §13): geometry validated at attach, every descriptor checked as a chunk from
its private copy, data / present views in place, validity and release as for heaps."""

import numpy as np
import pytest

from ibvbridge import CorruptRing, EndOfStream, Overrun, Ring, RingError
from ibvbridge import layout as L

H, A, S = 4, 2, 16  # heaps along time, axis, bytes per heap position
CB, NP = H * A * S, H * A  # chunk bytes, positions
SLOT = 192  # >= CB + NP rounded to 64


def chunk_producer(make_producer, heaps=H, axis=A, heap_size=S, step=4, slot_size=SLOT, **kw):
    """A FakeProducer whose header says CHUNKS with this geometry (written before any consumer attaches)."""
    p = make_producer(slot_size=slot_size, header_overrides={"features": L.FEATURE_CHUNKS}, **kw)
    L.CHUNK_STRUCT.pack_into(p.ctl, L.OFF_CHUNK_HEAPS, heaps, axis, heap_size, step, 0x1600, 0x4101)
    return p


def chunk_bytes(cid, present):
    """A chunk's slot bytes: position k holds bytes (cid*64 + k*8 + i) & 0xff, then the presence map."""
    data = bytes(((cid * 64 + k * 8 + i) & 0xFF) for k in range(NP) for i in range(S))
    return data + bytes(present)


def publish_chunk(p, cid, present, flags=None, **kw):
    if flags is None:
        flags = L.FLAG_CHUNK | (L.FLAG_COMPLETE if all(b == 1 for b in present) else L.FLAG_INCOMPLETE)
    kw.setdefault("heap_size", CB)
    kw.setdefault("received", S * sum(1 for b in present if b == 1))
    return p.publish(cid, chunk_bytes(cid, present), flags=flags, **kw)


def attach(p, **kw):
    return Ring.attach(p.socket_path, timeout=2.0, **kw)


def test_chunks_view_every_position_in_place_and_presence_reads_only_1_as_present(make_producer):
    p = chunk_producer(make_producer)
    publish_chunk(p, 0, [1] * NP)
    absent = [1, 0, 1, 2, 1, 1, 0, 1]  # a 2 is a corrupt presence byte: not present
    publish_chunk(p, 2, absent)
    p.publish_eos()
    with attach(p) as ring:
        g = ring.chunk_geometry
        assert (g.heaps, g.axis, g.heap_size, g.step, g.time_item, g.axis_item) == (H, A, S, 4, 0x1600, 0x4101)
        assert g.positions == NP and g.chunk_bytes == CB
        seen = []
        for c in ring.chunks(timeout=1):
            want = np.frombuffer(chunk_bytes(c.chunk_id, [1] * NP)[:CB], np.uint8).reshape(H, A, S)
            assert c.data.shape == (H, A, S) and c.data.dtype == np.uint8
            assert not c.data.flags.writeable
            assert np.shares_memory(c.data, ring._payload2d)  # a view of the slot, not a copy
            pres = c.present
            assert pres.dtype == np.bool_ and pres.shape == (H, A)
            np.testing.assert_array_equal(c.data[pres], want[pres])
            assert (c.heap(1, 1) == want[1, 1]).all()
            i16 = c.data_as(np.int16)
            assert i16.shape == (H, A, S // 2)
            np.testing.assert_array_equal(i16, want.view(np.int16))
            assert c.data_as("<u2", (2, 4)).shape == (H, A, 2, 4)
            assert c.valid
            seen.append((c.chunk_id, c.complete, c.incomplete, pres.ravel().tolist(), c.heaps_present))
        assert seen == [(0, True, False, [True] * NP, NP),
                        (2, False, True, [b == 1 for b in absent], 5)]
        with pytest.raises(EndOfStream):
            ring.next_chunk(timeout=0)


def test_complete_chunk_presence_is_read_from_its_descriptor_not_the_slot(make_producer):
    # Spec §13.3: COMPLETE means every presence byte is 1, so a client takes the flag (its private descriptor
    # copy) for the map and never touches the slot's map page. A map that says otherwise beside COMPLETE
    # (here zeros) proves which was read; an INCOMPLETE chunk's map is still read byte by byte.
    p = chunk_producer(make_producer)
    zeros = [0] * NP
    publish_chunk(p, 0, zeros, flags=L.FLAG_CHUNK | L.FLAG_COMPLETE, received=CB)
    publish_chunk(p, 1, zeros, flags=L.FLAG_CHUNK | L.FLAG_COMPLETE, received=CB)
    publish_chunk(p, 2, [1, 0] * (NP // 2))
    p.publish_eos()
    with attach(p) as ring:
        c = ring.next_chunk(timeout=1)
        assert c.heaps_present == NP and c.present.all() and c.present.shape == (H, A)
        assert not c.present.flags.writeable
        c.release()
        with ring.next_chunk_batch(2, timeout=1) as b:
            assert b.chunk_id.tolist() == [1, 2]
            assert b.present[0].all()  # the COMPLETE one, from its flag
            assert b.present[1].ravel().tolist() == [True, False] * (NP // 2)  # from its map
        with pytest.raises(EndOfStream):
            ring.next_chunk_batch(1, timeout=1)


def test_chunk_released_by_with_and_views_refused_after(make_producer):
    p = chunk_producer(make_producer)
    publish_chunk(p, 0, [1] * NP)
    publish_chunk(p, 1, [1] * NP)
    with attach(p) as ring:
        with ring.next_chunk(timeout=1) as c:
            assert c.chunk_id == 0 and c.valid
        assert c.released and not c.valid
        with pytest.raises(RingError, match="released"):
            c.data
        c2 = ring.next_chunk(timeout=1)
        d, pr = c2.copy()
        ring.release(c2)  # attached throughout: no Overrun
        assert d[0, 0, 0] == 64 and pr.all()


def test_data_as_refuses_a_dtype_that_does_not_divide_a_heap_position(make_producer):
    p = chunk_producer(make_producer)
    publish_chunk(p, 0, [1] * NP)
    with attach(p) as ring, ring.next_chunk(timeout=1) as c:
        with pytest.raises(ValueError, match="whole number"):
            c.data_as(np.dtype("V3"))


@pytest.mark.parametrize("geo,why", [
    ((0, A, S, 1), "at least 1"),
    ((H, 0, S, 1), "at least 1"),
    ((H, A, 0, 1), "at least 1"),
    ((H, A, S, 0), "at least 1"),
    ((H, A, 24, 1), "do not fit"),  # 8 × 24 + 8 = 200 > slot_size 192
    ((H, A, 1 << 61, 1), "do not fit"),  # 8 × 2^61 overflows u64
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF, 1), "do not fit"),
])
def test_bad_chunk_geometry_refused_at_attach(make_producer, geo, why):
    h, a, s, step = geo
    p = chunk_producer(make_producer, heaps=h, axis=a, heap_size=s, step=step)
    with pytest.raises(CorruptRing, match=why):
        attach(p)


def test_chunk_presence_map_exactly_at_the_slot_end_is_accepted(make_producer):
    p = chunk_producer(make_producer, heap_size=23)  # 8 × 23 + 8 = 192 = slot_size
    with attach(p) as ring:
        assert ring.chunk_geometry.chunk_bytes + ring.chunk_geometry.positions == ring.slot_size


def test_chunk_geometry_ignored_without_the_feature_bit(make_producer):
    p = make_producer(slot_size=SLOT)
    L.CHUNK_STRUCT.pack_into(p.ctl, L.OFF_CHUNK_HEAPS, 0, 7, 0, 0, 0, 0)  # garbage, but no CHUNKS feature
    p.publish(1, b"x")
    with attach(p) as ring:
        assert ring.chunk_geometry is None
        with pytest.raises(RingError, match="not in chunk mode"):
            ring.next_chunk(timeout=0)
        assert ring.next(timeout=1).heap_cnt == 1  # still an ordinary ring


@pytest.mark.parametrize("kw,why", [
    (dict(flags=L.FLAG_COMPLETE), "flags 0x1"),
    (dict(heap_size=CB - 1), f"heap_size {CB - 1}"),
    (dict(heap_size=CB + 1), f"heap_size {CB + 1}"),
    (dict(received=CB + 1), f"received {CB + 1}"),
])
def test_chunk_descriptor_not_a_chunk_is_corrupt(make_producer, kw, why):
    p = chunk_producer(make_producer)
    publish_chunk(p, 0, [1] * NP, **kw)
    with attach(p) as ring:
        with pytest.raises(CorruptRing, match=why):
            ring.next_chunk(timeout=1)


def test_chunk_overrun_while_held_fails_valid_and_release(make_producer):
    p = chunk_producer(make_producer)
    publish_chunk(p, 0, [1] * NP)
    publish_chunk(p, 1, [1] * NP)
    with attach(p) as ring:
        c = ring.next_chunk(timeout=1)
        assert c.data.sum() >= 0 and c.valid
        p.detach(ring.consumer_index, L.CONSUMER_OVERRUN, lost_heaps=2)
        assert not c.valid  # read, then check: the bytes may be another chunk's
        with pytest.raises(Overrun) as e:
            ring.release(c)
        assert e.value.lost_heaps == 2 and c.released


def test_chunk_iteration_raises_overrun_at_the_next_step(make_producer):
    p = chunk_producer(make_producer)
    for cid in range(3):
        publish_chunk(p, cid, [1] * NP)
    with attach(p) as ring:
        ids = []
        with pytest.raises(Overrun):
            for c in ring.chunks(timeout=1):
                ids.append(c.chunk_id)
                p.detach(ring.consumer_index, L.CONSUMER_OVERRUN, lost_heaps=3)
        assert ids == [0]


def pattern_chunk(cid, present, wrong=()):
    """A chunk as send --pattern --timestamp-step makes it: position k holds heap cnt cid × NP + k + 1's
    pattern; positions in ``wrong`` get one byte flipped."""
    from fake_producer import pattern
    data = bytearray(b"".join(pattern(cid * NP + k + 1, S) for k in range(NP)))
    for k in wrong:
        data[k * S + 3] ^= 0x40
    return bytes(data) + bytes(present)


@pytest.mark.parametrize("batch", [[], ["--batch", "16"], ["--batch", "2"]])
@pytest.mark.parametrize("touch", [[], ["--no-touch"]])
def test_consume_tool_counts_chunks_and_verifies_present_heaps(make_producer, touch, batch):
    import os
    from test_consume import consume
    p = chunk_producer(make_producer)
    absent = [1, 1, 0, 1, 1, 1, 1, 0]
    p.publish(0, pattern_chunk(0, [1] * NP), flags=L.FLAG_CHUNK | L.FLAG_COMPLETE, heap_size=CB, received=CB)
    # position 2 is absent (its wrong bytes do not count), position 5 present and wrong
    p.publish(1, pattern_chunk(1, absent, wrong=(2, 5)), flags=L.FLAG_CHUNK | L.FLAG_INCOMPLETE,
              heap_size=CB, received=6 * S)
    p.publish(3, pattern_chunk(3, [1] * NP), flags=L.FLAG_CHUNK | L.FLAG_COMPLETE, heap_size=CB, received=CB)
    p.publish_eos()
    rc, out = consume("--ring", "r", "--dir", os.path.dirname(p.socket_path), "--verify", *batch, *touch)
    assert rc == 0 and out["result"] == "eos", out
    assert (out["heaps"], out["chunks"], out["heaps_present"]) == (3, 3, NP + 6 + NP)
    assert (out["first_heap_cnt"], out["last_heap_cnt"], out["incomplete"]) == (0, 3, 1)
    assert out["bytes"] == CB + 6 * S + CB
    if touch:
        assert out["verify_errors"] == 0 and out["checksum"] == 0
    else:
        assert out["verify_errors"] == 1
        s = 0
        for cid, pres, wrong in ((0, [1] * NP, ()), (1, absent, (2, 5)), (3, [1] * NP, ())):
            d = pattern_chunk(cid, pres, wrong)
            s += sum(int.from_bytes(d[k * S + i:k * S + i + 8], "little")
                     for k in range(NP) if pres[k] == 1 for i in range(0, S, 8))
        assert out["checksum"] == s % (1 << 64)


@pytest.mark.parametrize("mode", [[], ["--batch", "2"], ["--hold", "1"]])
def test_consume_tool_stops_at_max_heaps_on_a_chunk_ring(make_producer, mode):
    # No flag: the ring's chunk iterator (read_chunks); --batch / --hold: the tool's general loop.
    import os
    from test_consume import consume
    p = chunk_producer(make_producer)
    for cid in range(4):
        publish_chunk(p, cid, [1] * NP)
    p.publish_eos()
    rc, out = consume("--ring", "r", "--dir", os.path.dirname(p.socket_path), "--max-heaps", "2", *mode)
    assert rc == 0 and out["result"] == "max", out
    assert (out["heaps"], out["chunks"], out["first_heap_cnt"], out["last_heap_cnt"]) == (2, 2, 0, 1)


@pytest.mark.parametrize("mode", [[], ["--batch", "8"]])
def test_consume_tool_no_touch_counts_heaps_without_reading_them(make_producer, mode):
    import os
    from test_consume import consume
    from fake_producer import pattern
    p = make_producer(slot_count=16, slot_size=128)
    for cnt in range(1, 6):
        p.publish(cnt, pattern(cnt + 1, 40))  # wrong bytes: --verify would count them, --no-touch reads none
    p.publish_eos()
    rc, out = consume("--ring", "r", "--dir", os.path.dirname(p.socket_path), "--verify", "--no-touch", *mode)
    assert rc == 0 and out["result"] == "eos"
    assert (out["heaps"], out["bytes"], out["checksum"], out["verify_errors"]) == (5, 200, 0, 0)
    assert (out["first_heap_cnt"], out["last_heap_cnt"], out["chunks"]) == (1, 5, 0)


def test_chunk_batch_views_many_chunks_and_checks_each_descriptor(make_producer):
    p = chunk_producer(make_producer)
    absent = [1, 0, 1, 2, 1, 1, 0, 1]
    publish_chunk(p, 0, [1] * NP)
    publish_chunk(p, 1, absent)
    publish_chunk(p, 4, [1] * NP)
    publish_chunk(p, 5, [1] * NP, heap_size=CB + 1)  # not a chunk of this geometry
    with attach(p) as ring:
        with ring.next_chunk_batch(3, timeout=1) as b:
            assert len(b) == 3 and b.chunk_id.tolist() == [0, 1, 4]
            assert b.present.shape == (3, H, A) and b.present.dtype == np.bool_
            assert b.present[1].ravel().tolist() == [x == 1 for x in absent] and b.present[0].all()
            assert b.data.shape == (3, H, A, S)
            for i, cid in enumerate((0, 1, 4)):
                want = np.frombuffer(chunk_bytes(cid, [1] * NP)[:CB], np.uint8).reshape(H, A, S)
                np.testing.assert_array_equal(b.chunk(i)[b.present[i]], want[b.present[i]])
                np.testing.assert_array_equal(b.data[i], b.chunk(i))
            assert np.shares_memory(b.chunk(2), ring._payload2d)
            assert b.valid
        assert b.released
        with pytest.raises(CorruptRing, match=f"heap_size {CB + 1}"):
            ring.next_chunk_batch(8, timeout=1)


@pytest.mark.parametrize("override,why", [
    (dict(flags=L.FLAG_COMPLETE), "flags 0x1"),
    (dict(heap_size=CB - 1), f"heap_size {CB - 1}"),
    (dict(heap_size=CB + (1 << 40)), f"heap_size {CB + (1 << 40)}"),
    (dict(received=CB + 1), f"received {CB + 1}"),
    (dict(received=1 << 63), f"received {1 << 63}"),
    (dict(seq=99), "seq 99"),
    (dict(slot=8), "slot 8"),
    (dict(slot=1 << 31), f"slot {1 << 31}"),
    (dict(item_count=9), "item_count 9"),
])
def test_chunk_batch_one_pass_check_refuses_each_bad_field_at_its_position(make_producer, override, why):
    """next_chunk_batch checks a run of descriptors in one vectorised pass: a descriptor wrong in any one field
    (seq, slot, CHUNK flag, heap_size, received, item_count), in the middle of the run, is still found and
    reported at its own position, after the chunks before it were not handed out."""
    p = chunk_producer(make_producer, slot_count=8, max_items=8)
    publish_chunk(p, 0, [1] * NP)
    publish_chunk(p, 1, [1] * NP)
    kw = dict(desc_overrides=override) if set(override) & {"seq", "slot", "item_count"} else override
    publish_chunk(p, 2, [1] * NP, **kw)
    publish_chunk(p, 3, [1] * NP)
    with attach(p) as ring:
        with pytest.raises(CorruptRing, match=f"position 2: .*{why}"):
            ring.next_chunk_batch(4, timeout=1)


def test_chunk_batch_stops_before_the_end_of_stream_marker(make_producer):
    p = chunk_producer(make_producer)
    publish_chunk(p, 0, [1] * NP)
    publish_chunk(p, 1, [1] * NP)
    p.publish_eos()
    with attach(p) as ring:
        with ring.next_chunk_batch(8, timeout=1) as b:
            assert b.chunk_id.tolist() == [0, 1] and b.present.all()
        with pytest.raises(EndOfStream):
            ring.next_chunk_batch(8, timeout=1)


def test_chunk_batches_raise_overrun_after_a_batch_held_while_overrun(make_producer):
    p = chunk_producer(make_producer)
    for cid in range(4):
        publish_chunk(p, cid, [1] * NP)
    with attach(p) as ring:
        got = []
        with pytest.raises(Overrun):
            for b in ring.chunk_batches(2, timeout=1):
                got.append(b.chunk_id.tolist())
                p.detach(ring.consumer_index, L.CONSUMER_OVERRUN, lost_heaps=4)
                assert not b.valid
        assert got == [[0, 1]]


@pytest.mark.parametrize("batch", [[], ["--batch", "64"]])
def test_consume_tool_batches_chunks_when_enough_wait(make_producer, batch):
    import os
    from test_consume import consume
    p = chunk_producer(make_producer, slot_count=128)
    wrong = {7: (1,), 90: (6,)}  # one wrong present position in chunks 7 and 90
    for cid in range(100):
        p.publish(cid, pattern_chunk(cid, [1] * NP, wrong.get(cid, ())), flags=L.FLAG_CHUNK | L.FLAG_COMPLETE,
                  heap_size=CB, received=CB)
    p.publish_eos()
    rc, out = consume("--ring", "r", "--dir", os.path.dirname(p.socket_path), "--verify", *batch)
    assert rc == 0 and out["result"] == "eos", out
    assert (out["heaps"], out["chunks"], out["heaps_present"], out["verify_errors"]) == (100, 100, 100 * NP, 2)
    s = 0
    for cid in range(100):
        d = pattern_chunk(cid, [1] * NP, wrong.get(cid, ()))
        s += sum(int.from_bytes(d[i:i + 8], "little") for i in range(0, CB, 8))
    assert out["checksum"] == s % (1 << 64) and (out["first_heap_cnt"], out["last_heap_cnt"]) == (0, 99)
