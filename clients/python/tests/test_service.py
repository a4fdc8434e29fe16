"""A ring that goes on across streams (2.2 STREAM_END, recv --keep-going) and heaps cut to their slot
(TRUNCATED is never complete; a cut item raises unless partial bytes are asked for), as the Python client
reads them."""
import numpy as np
import pytest

import ibvbridge
from ibvbridge import EndOfStream, StreamEnd, TruncatedItem
from ibvbridge import layout as L


def put(p, cnt, n=16):
    s = p.acquire(timeout=5.0)
    s.payload[:n] = np.arange(n, dtype=np.uint8) + cnt
    s.add_item(0x1000, 0, n)
    return p.publish(s, cnt)


def stream_end(p, stop_cnt):
    s = p.acquire(timeout=5.0)
    return p.publish(s, stop_cnt, 0, 0, flags=L.FLAG_STREAM_END, packets=0)


def test_stream_end_is_raised_in_order_and_reading_goes_on(make_public_producer):
    p = make_public_producer("streams", slot_count=16)
    r = ibvbridge.Ring.attach("streams", directory=p.directory)
    try:
        put(p, 1)
        put(p, 2)
        stream_end(p, 3)
        put(p, 1)  # the next stream counts from 1 again
        stream_end(p, 2)
        p.end_of_stream()
        h = r.next(1.0)
        assert h.heap_cnt == 1
        h.release()
        assert r.next(1.0).heap_cnt == 2  # held: the marker waits for it
        with pytest.raises(StreamEnd) as e:
            r.next(1.0)
        assert isinstance(e.value, EndOfStream)  # a loop written for one stream ends here
        assert (e.value.heap_cnt, e.value.position) == (3, 2)
        assert [h.heap_cnt for h in r.heaps(1.0)] == [1]  # heaps() reads one stream; call again for the next
        with pytest.raises(EndOfStream) as e:
            r.next(1.0)
        assert not isinstance(e.value, StreamEnd)  # the ring's end
    finally:
        r.close()


def test_streams_iterates_stream_by_stream(make_public_producer):
    p = make_public_producer("streams2", slot_count=16)
    r = ibvbridge.Ring.attach("streams2", directory=p.directory)
    try:
        for cnt in (1, 2, 3):
            put(p, cnt)
        stream_end(p, 4)
        for cnt in (1, 2):
            put(p, cnt)
        stream_end(p, 3)
        put(p, 7)
        p.end_of_stream()
        seen = []
        for stream in r.streams(timeout=1.0):
            seen.append(([h.heap_cnt for h in stream], stream.end and stream.end.heap_cnt))
        assert seen == [([1, 2, 3], 4), ([1, 2], 3), ([7], None)]
        assert r.tail == r.head  # every marker went back with its stream
    finally:
        r.close()


def test_truncated_heap_is_never_complete_and_a_cut_item_raises(make_public_producer):
    p = make_public_producer("trunc", slot_count=8, slot_size=256)
    r = ibvbridge.Ring.attach("trunc", directory=p.directory)
    try:
        for flags in (L.FLAG_TRUNCATED, L.FLAG_TRUNCATED | L.FLAG_COMPLETE):  # the second as a 2.1 producer set it
            s = p.acquire(timeout=5.0)
            s.payload[:] = 9
            s.add_item(0x1000, 0, 64)
            s.add_item(0x1001, 64, 192, cut=True)
            p.publish(s, 1, heap_size=1 << 20, received=256, flags=flags)
        for _ in range(2):
            h = r.next(1.0)
            assert not h.complete and h.truncated
            assert h.array(0x1000).shape == (64,)  # not cut: reads as usual
            with pytest.raises(TruncatedItem):
                h.array(0x1001)
            with pytest.raises(TruncatedItem):
                h.item(0x1001).data
            part = h.array(0x1001, partial=True)
            assert part.shape == (192,) and (part == 9).all()
            assert len(h.item(0x1001).partial_data) == 192
            h.release()
    finally:
        r.close()


def test_producer_version_is_read(make_public_producer):
    p = make_public_producer("ver")
    r = ibvbridge.Ring.attach("ver", directory=p.directory)
    try:
        assert r.producer_version == f"ibvbridge.Producer {ibvbridge.__version__}"
    finally:
        r.close()


def test_item_group_reads_stream_by_stream_and_refuses_a_cut_item(make_public_producer):
    p = make_public_producer("igroup2", slot_count=16, slot_size=256)
    r = ibvbridge.Ring.attach("igroup2", directory=p.directory)
    try:
        put(p, 1)
        stream_end(p, 2)
        s = p.acquire(timeout=5.0)
        s.add_item(0x1000, 0, 16)
        s.add_item(0x1001, 16, 240, cut=True)
        p.publish(s, 1, heap_size=4096, received=256, flags=L.FLAG_TRUNCATED)
        p.end_of_stream()
        ig = ibvbridge.ItemGroup()
        ig.add_item(0x1000, "a", "", (16,), np.uint8)
        ig.add_item(0x1001, "b", "", (4080,), np.uint8)
        it = r.streams(timeout=1.0)
        first = next(it)
        assert [sorted(ig.update(h)) for h in first] == [["a"]]
        assert first.end.heap_cnt == 2
        second = next(it)
        for h in second:
            with pytest.raises(TruncatedItem):
                ig.update(h)
            assert sorted(ig.update(h, partial=True)) == ["a"]
        assert second.end is None
    finally:
        r.close()
