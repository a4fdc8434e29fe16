"""Consumer-group members (spec §14) against the fake producer, which takes the hello's group_id and lets
the test write each descriptor's assign mask."""
import pytest

from ibvbridge import layout as L
from ibvbridge import EndOfStream, Ring, RingError
from fake_producer import pattern


def member(p, name="workers"):
    p.accept_groups = True
    return Ring.attach(p.socket_path, timeout=2.0, group=name)


def publish(p, cnts_masks):
    for cnt, mask in cnts_masks:
        p.publish(cnt, pattern(cnt, 16), desc_overrides={"reserved": mask})


def test_group_id_is_fnv1a_32_with_zero_mapped_to_one():
    assert L.group_id("") == 0
    assert L.group_id("a") == 0xE40C292C  # the FNV-1a 32 test vector
    assert L.group_id("foobar") == 0xBF9CF968


def test_member_sends_group_id_and_starts_at_head(make_producer):
    p = make_producer(slot_count=8)
    p.publish(1, pattern(1, 16))  # published before the member joined: not its (spec §14)
    with member(p) as ring:
        assert p.hello_groups == [L.group_id("workers")] and ring.group_id == L.group_id("workers")
        assert ring.position == 1


def test_member_next_skips_positions_not_assigned_to_it_and_releases_them_in_order(make_producer):
    p = make_producer(slot_count=8)
    with member(p) as ring:
        mine, other = 1 << ring.consumer_index, 1 << (ring.consumer_index + 1)
        publish(p, ((1, other), (2, other), (3, mine), (4, other), (5, mine | other)))
        h = ring.next(timeout=1)
        assert (h.position, h.heap_cnt, bytes(h.payload[:16])) == (2, 3, pattern(3, 16))
        assert ring.tail == 2  # holding nothing, the member moved past positions 0 and 1 at once
        h2 = ring.next(timeout=1)
        assert (h2.position, h2.heap_cnt) == (4, 5)
        assert ring.tail == 2  # position 3 (passed over) waits for the held heap before it
        h.release()
        assert ring.tail == 4  # releasing its own heap stores the tail at once, through position 3
        h2.release()
        assert ring.tail == 5
        p.publish_eos()  # assign 0: for everyone
        with pytest.raises(EndOfStream):
            ring.next(timeout=1)
        assert ring.tail == 6


def test_member_iteration_yields_only_its_heaps(make_producer):
    p = make_producer(slot_count=8)
    with member(p) as ring:
        mine, other = 1 << ring.consumer_index, 1 << (ring.consumer_index + 1)
        publish(p, ((1, mine), (2, other), (3, other), (4, mine), (5, other)))
        p.publish_eos()
        assert [h.heap_cnt for h in ring] == [1, 4]
        assert ring.tail == 6


def test_member_refuses_batches(make_producer):
    p = make_producer(slot_count=8)
    with member(p) as ring:
        publish(p, ((1, 1 << ring.consumer_index),))
        with pytest.raises(RingError, match="group member"):
            ring.next_batch(4, timeout=1)


def test_python_producer_admits_a_member_at_head_with_its_group_in_the_row(make_producer):
    p = make_producer(slot_count=8)  # the Python producer knows groups (spec §14): no status 5
    p.publish(1, pattern(1, 16))
    with Ring.attach(p.socket_path, timeout=2.0, group="workers") as ring:
        assert ring.position == 1
        assert p.row(ring.consumer_index)["group_id"] == L.group_id("workers")
