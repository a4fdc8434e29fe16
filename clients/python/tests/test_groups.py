"""Consumer-group members (spec §14) against the fake producer, which takes the hello's group_id and lets
the test write each descriptor's assign mask."""
import pytest

from ibvbridge import layout as L
from ibvbridge import CorruptRing, EndOfStream, Ring, RingError
from fake_producer import pattern


def member(p, name="workers"):
    p.accept_groups = True
    return Ring.attach(p.socket_path, timeout=2.0, group=name)


def publish(p, cnts_masks):
    for cnt, mask in cnts_masks:
        p.publish(cnt, pattern(cnt, 16), desc_overrides={"assign": mask})


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


def write_desc(p, pos, cnt, mask):
    """The descriptor of position pos as a producer lapping a member would write it (no head store)."""
    p.desc[pos & p.mask] = ((pos + 1) & ((1 << 64) - 1), cnt, 16, 16, 0, pos & p.mask, L.FLAG_COMPLETE, 0, 1, mask)


def store_head(p, head):
    p._pos = head
    p.c64[L.OFF_HEAD >> 3] = head


def test_member_skips_descriptors_lapped_under_other_members_positions(make_producer):
    """Spec §14.4 (2.2): a member more than slot_count behind head, its missed positions all other
    members', moves read to head - slot_count and reads on: its own heap after the lap is handed out, and
    its read and tail tell the producer it passed over what it skipped."""
    p = make_producer(slot_count=8)
    with member(p) as ring:
        mine, other = 1 << ring.consumer_index, 1 << (ring.consumer_index + 1)
        # 12 positions through 8 descriptors: 0..3 (others') were overwritten by 8..11. Its own position 4 is
        # head - slot_count, which §14.5's window (q - u < slot_count) allows: not head - slot_count + 1.
        for pos in range(12):
            write_desc(p, pos, 100 + pos, mine if pos in (4, 11) else other)
        store_head(p, 12)
        got = []
        for _ in range(2):
            with ring.next(timeout=1) as h:
                got.append((h.position, h.heap_cnt))
        assert got == [(4, 104), (11, 111)]
        assert ring._r64[L.REG_READ >> 3] == 12 and ring.tail == 12
        assert ring._r64[L.REG_HANDED >> 3] == 2


def test_member_skips_a_descriptor_whose_seq_is_a_lap_ahead_and_waits_for_its_head(make_producer):
    """Spec §14.4: with a head cached before the lap, the descriptor at read has seq a multiple of
    slot_count ahead: the member checks its row, loads head afresh and skips to head - slot_count. Until
    the producer's head store for that seq comes, it cannot know where head is: it waits for it (at most
    LAPPED_WAIT), then reports the ring corrupt without consuming anything; once head is stored it reads on."""
    p = make_producer(slot_count=8)
    with member(p) as ring:
        mine, other = 1 << ring.consumer_index, 1 << (ring.consumer_index + 1)
        for pos in range(4):
            write_desc(p, pos, 100 + pos, mine if pos == 0 else other)
        store_head(p, 4)
        with ring.next(timeout=1) as h:
            assert h.position == 0  # its cached head is 4 now
        for pos in range(4, 13):
            write_desc(p, pos, 100 + pos, mine if pos == 12 else other)
        with pytest.raises(CorruptRing, match="position 1: seq 10"):  # head not stored yet
            ring.next(timeout=0)
        store_head(p, 13)
        with ring.next(timeout=1) as h:
            assert (h.position, h.heap_cnt) == (12, 112)
        assert ring.tail == 13


def test_member_never_hands_out_a_descriptor_rewritten_while_it_copied_it(make_producer, monkeypatch):
    """Spec §14.4: a member loads seq again after copying a descriptor. Position 1 is another member's;
    while the member copies it the producer publishes through position 9, whose descriptor replaces
    position 1's, and the copy holds the new assign (this member's bit) beside the old seq. The member must
    see the lap (the seq it loads again is 10), move on to its own position 2 and never hand out position 1."""
    import ibvbridge.ring as ring_mod

    p = make_producer(slot_count=8)
    with member(p) as ring:
        mine, other = 1 << ring.consumer_index, 1 << (ring.consumer_index + 1)
        for pos in range(3):
            write_desc(p, pos, 100 + pos, other if pos == 1 else mine)
        store_head(p, 3)
        with ring.next(timeout=1) as h:
            assert h.position == 0
        copy = ring_mod._unpack_desc
        torn = []

        def copy_torn(mm, off):
            d = copy(mm, off)
            if off == ring._desc_base + 1 * 64 and not torn:
                for pos in range(3, 10):  # the producer, meanwhile: position 9 rewrites position 1's descriptor
                    write_desc(p, pos, 100 + pos, other)
                store_head(p, 10)
                torn.append(d)
                return d[:9] + (mine,)  # the old seq beside the new assign
            return d

        monkeypatch.setattr(ring_mod, "_unpack_desc", copy_torn)
        with ring.next(timeout=1) as h:
            assert torn and torn[0][0] == 2  # the copy was made with the old seq
            assert (h.position, h.heap_cnt) == (2, 102)  # its own, after the lap; never position 1
