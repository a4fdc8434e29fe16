"""ItemGroup.update's plans: a heap of a shape the group met before (same item ids, lengths and flags) is
decoded by what update decided for that shape. These tests read heaps with ``for heap in ring`` (the path
plans serve) in lockstep with the producer, and check every heap's values against a fresh ItemGroup's,
which decodes it the general way: a changed descriptor, a changed item table, a cut item, an item past its
slot and a detach after identical heaps must all be decoded (or refused) as the general way does."""

import collections

import numpy as np
import pytest

from ibvbridge import CorruptRing, ItemGroup, Overrun, Ring, TruncatedItem
from ibvbridge import layout as L
from fake_producer import addr, imm

Desc = collections.namedtuple("Desc", "id name description shape dtype format order")
SEND, DATA, OTHER = 0x1800, 0x1801, 0x1802
U48, I48 = b"u\x00\x30", b"i\x00\x30"
N = 6  # identical heaps before the change: a plan is made at the second and serves the rest


def describe(p, send_fmt=U48, data_dtype="|u1", data_shape=(16,)):
    """The ring's metadata: send_ns an immediate of format send_fmt, data a numpy item."""
    p.set_descriptors([Desc(SEND, "send_ns", "", (), None, send_fmt, "C"),
                       Desc(DATA, "data", "", data_shape, np.dtype(data_dtype), b"", "C"),
                       Desc(OTHER, "other", "", (), None, U48, "C")])


def plain(k, flags=L.FLAG_COMPLETE, items=None, payload=None):
    """Heap k: send_ns an immediate of 6 bytes, data 16 bytes at offset 0."""
    if payload is None:
        payload = bytes((k * 7 + i) & 0xFF for i in range(32))
    if items is None:
        items = [imm(SEND, (1 << 47) + k, 6), addr(DATA, 0, 16)]
    return dict(heap_cnt=k + 1, payload=payload, items=items, flags=flags)


def same(got, want):
    """The dicts update returned hold the same names and equal values (numpy: dtype, shape, bytes)."""
    assert list(got) == list(want)
    for name in want:
        g, w = got[name].value, want[name].value
        if isinstance(w, np.ndarray):
            assert isinstance(g, np.ndarray) and g.dtype == w.dtype and g.shape == w.shape, name
            assert np.array_equal(g, w), name
        else:
            assert type(g) is type(w) and g == w, name


def lockstep(p, ring, heaps, check=None):
    """Publish heaps one at a time; each is read by the iterator, decoded by one ItemGroup (plans) and by a
    fresh one (the general way), and the two compared. ``heaps``: (before, publish kwargs); before(p) runs
    first (rewrites descriptors). Returns the group and how many heaps update decoded the general way."""
    ig = ItemGroup()
    general = []
    inner = ig._update
    ig._update = lambda *a: general.append(1) or inner(*a)  # counts the heaps no plan decoded
    seen = 0

    def publish(k):
        before, kw = heaps[k]
        if before is not None:
            before(p)
        p.publish(**kw)

    publish(0)
    for heap in ring:
        got = ig.update(heap)  # first: the fresh group below parses the heap's table into the heap
        want = ItemGroup().update(heap)
        same(got, want)
        if check is not None:
            check(seen, got)
        seen += 1
        if seen == len(heaps):
            break
        publish(seen)
    assert seen == len(heaps)
    return ig, len(general)


@pytest.fixture
def ring_of(make_producer):
    rings = []

    def make(**kw):
        p = make_producer(slot_count=16, slot_size=256, max_items=4, **kw)
        describe(p)
        r = Ring.attach(p.socket_path, timeout=2)
        rings.append(r)
        return p, r

    yield make
    for r in rings:
        r.close()


def test_a_descriptor_changed_after_identical_heaps_decodes_with_the_new_descriptor(ring_of):
    """N heaps of one shape, then a HAS_DESCRIPTORS heap of the same shape whose descriptors changed
    (send_ns signed, data 8 x u2 over the same 16 bytes): that heap and the ones after it decode with the
    new descriptors, as a fresh group decodes them, though their item tables look as before."""
    p, ring = ring_of()
    new = lambda p: describe(p, send_fmt=I48, data_dtype="<u2", data_shape=(8,))  # noqa: E731
    heaps = [(None, plain(k)) for k in range(N)]
    heaps.append((new, plain(N, flags=L.FLAG_COMPLETE | L.FLAG_HAS_DESCRIPTORS)))
    heaps += [(None, plain(k)) for k in range(N + 1, 2 * N)]

    def check(k, got):
        if k < N:
            assert got["data"].value.dtype == np.uint8 and got["send_ns"].value == (1 << 47) + k
        else:
            assert got["data"].value.dtype == np.dtype("<u2") and got["data"].value.shape == (8,)
            assert got["send_ns"].value == (1 << 47) + k - (1 << 48)  # the top bit now a sign

    ig, general = lockstep(p, ring, heaps, check)
    assert general <= 4  # the first heap and each new shape's first heaps: plans decoded the rest
    assert any(ig._plans.values())


def test_item_tables_that_change_shape_between_identical_heaps_decode_as_a_fresh_group_does(ring_of):
    """Between runs of one shape: a wider immediate, a heap without data, the items reversed, an
    undescribed item, SPEAD's own ids, data longer than its shape, a third item; each decoded as the
    general way decodes it, and the first shape's plan serves it again afterwards."""
    p, ring = ring_of()
    variants = [
        [imm(SEND, 12345, 7), addr(DATA, 0, 16)],
        [imm(SEND, 5, 6)],
        [addr(DATA, 8, 16), imm(SEND, 6, 6)],
        [imm(SEND, 7, 6), addr(DATA, 0, 16), imm(0x1900, 1, 6)],
        [imm(SEND, 8, 6), addr(DATA, 0, 16), imm(0x6, 2, 6), addr(0x5, 16, 8)],
        [imm(SEND, 9, 6), addr(DATA, 0, 24)],
        [imm(SEND, 10, 6), addr(DATA, 16, 16), imm(OTHER, (1 << 48) - 1, 6)],
    ]
    heaps = [(None, plain(k)) for k in range(N)]
    k = N
    for v in variants:
        heaps.append((None, plain(k, items=v)))
        heaps += [(None, plain(j)) for j in range(k + 1, k + 3)]
        k += 3
    ig, general = lockstep(p, ring, heaps)
    assert general < len(heaps) // 2


def test_a_cut_item_after_identical_heaps_raises_truncated_item_and_partial_leaves_it_out(ring_of):
    p, ring = ring_of()
    ig = ItemGroup()
    for k in range(N):
        p.publish(**plain(k))
    for k in range(N, N + 3):  # three cut heaps of one shape: none may be decoded by a plan of it
        p.publish(**plain(k, flags=L.FLAG_TRUNCATED, items=[imm(SEND, k, 6), (DATA, 0, 16, L.ITEM_CUT)]))
    for k, heap in enumerate(ring):
        if k < N:
            assert set(ig.update(heap)) == {"send_ns", "data"}
            continue
        if k > N:  # the first cut heap is read with partial=True first: what it decides must not stick
            with pytest.raises(TruncatedItem):
                ig.update(heap)
        assert set(ig.update(heap, partial=True)) == {"send_ns"} and ig["send_ns"].value == k
        assert ig["data"].value.tolist() == list(plain(N - 1)["payload"][:16])  # the last whole data
        if k == N + 2:
            break


def test_an_address_item_past_its_slot_after_identical_heaps_is_a_corrupt_ring(ring_of):
    """The same item table shape as the heaps before, but data's offset puts its end past slot_size: the
    plan checks each address item's bounds (spec §9.1), so the heap is refused, not viewed."""
    p, ring = ring_of()
    ig = ItemGroup()
    for k in range(N):
        p.publish(**plain(k))
    p.publish(**plain(N, items=[imm(SEND, 3, 6), addr(DATA, 256 - 8, 16)]))
    for k, heap in enumerate(ring):
        if k < N:
            ig.update(heap)
            continue
        with pytest.raises(CorruptRing, match="past slot_size"):
            ig.update(heap)
        break


def test_a_heap_whose_consumer_was_overrun_after_it_was_handed_out_is_refused_by_update(ring_of):
    """Handed out while attached, then the producer overruns this consumer and rewrites the heap's item
    table before update reads it: update copies the table, then checks the row (spec §A), and raises
    Overrun rather than decode another heap's items as this one's."""
    p, ring = ring_of()
    ig = ItemGroup()
    for k in range(N + 1):
        p.publish(**plain(k))
    for k, heap in enumerate(ring):
        if k < N:
            ig.update(heap)
            continue
        p.detach(ring.consumer_index, L.CONSUMER_OVERRUN, lost_heaps=4)
        p.items[heap.slot, 0] = (SEND, 999, 6, L.ITEM_IMMEDIATE, 0)  # the slot's next heap
        with pytest.raises(Overrun):
            ig.update(heap)
        assert ig["send_ns"].value == (1 << 47) + N - 1  # nothing of the torn table was decoded
        break


def test_one_group_reading_two_rings_in_turn_decodes_each_rings_heaps(make_producer):
    """Plans and the views they reuse belong to one buffer: heaps of the same shape from two rings (slots of
    256 and 64 bytes), read in turn and in runs by one group, each decode to their own ring's bytes, and an
    item past the smaller ring's slot is refused though it would fit the other's."""
    ps = [make_producer(f"r{i}", slot_count=16, slot_size=256 >> (2 * i), max_items=4) for i in range(2)]
    rings = []
    try:
        for p in ps:
            describe(p)
            rings.append(Ring.attach(p.socket_path, timeout=2))
        ig = ItemGroup()
        its = [iter(r) for r in rings]
        for k, i in enumerate([0, 1] * N + [0] * N + [1] * N):
            ps[i].publish(**plain(k, payload=bytes([k + 16 * i]) * 32))
            heap = next(its[i])
            got = ig.update(heap)
            same(got, ItemGroup().update(heap))
            assert got["data"].value.tolist() == [k + 16 * i] * 16
        ps[1].publish(**plain(0, items=[imm(SEND, 1, 6), addr(DATA, 64 - 8, 16)]))
        with pytest.raises(CorruptRing, match="past slot_size 64"):
            ig.update(next(its[1]))
    finally:
        for r in rings:
            r.close()


def test_update_with_another_byte_order_choice_decodes_as_a_fresh_group_does(ring_of):
    """A big-endian item is converted (new_order '=') or kept ('|') heap by heap as asked, whichever the
    shape's plan was made with."""
    p, ring = ring_of()
    describe(p, data_dtype=">u2", data_shape=(8,))
    ig = ItemGroup()
    heaps = iter(ring)
    for k in range(2 * N):
        p.publish(**plain(k))
        heap = next(heaps)
        order = "=" if k % 4 < 2 else "|"
        got = ig.update(heap, new_order=order)
        want = ItemGroup().update(heap, new_order=order)
        same(got, want)
        assert got["data"].value.dtype.isnative == (order == "=")


def test_an_item_described_late_without_the_flag_is_learnt_after_identical_heaps(ring_of):
    """Heaps carrying an item the metadata does not describe yet, then its descriptor written to the
    metadata with no HAS_DESCRIPTORS heap (a consumer attached late; a producer that does not flag it): the
    next heap names it, as the general way learns an unknown id on the heap that carries it."""
    p, ring = ring_of()
    extra = 0x1900

    def late(p):
        p.set_descriptors([Desc(SEND, "send_ns", "", (), None, U48, "C"),
                           Desc(DATA, "data", "", (16,), np.dtype("|u1"), b"", "C"),
                           Desc(extra, "late", "", (), None, U48, "C")])

    items = lambda k: [imm(SEND, k, 6), addr(DATA, 0, 16), imm(extra, 100 + k, 6)]  # noqa: E731
    heaps = [(None, plain(k, items=items(k))) for k in range(N)]
    heaps += [(late if k == N else None, plain(k, items=items(k))) for k in range(N, N + 3)]

    def check(k, got):
        assert ("late" in got) == (k >= N) and (k < N or got["late"].value == 100 + k)

    lockstep(p, ring, heaps, check)


def test_a_variable_size_item_of_a_new_length_each_heap_decodes_right_and_stops_planning(ring_of):
    """data of shape (None,): every heap another length, so another shape. Past _MAX_PLANS shapes the
    group stops making plans (each would serve no later heap), and every heap still decodes as a fresh
    group decodes it; a changed descriptor starts planning again."""
    from ibvbridge.items import _MAX_PLANS
    p, ring = ring_of()
    describe(p, data_shape=(-1,))
    heaps = [(None, plain(k, items=[imm(SEND, k, 6), addr(DATA, 0, 1 + k % 200)], payload=bytes(range(200))))
             for k in range(_MAX_PLANS + 8)]

    def check(k, got):
        assert got["data"].value.shape == (1 + k % 200,)

    ig, general = lockstep(p, ring, heaps, check)
    assert general == len(heaps) and ig._plans is None
    ig.add_item(0x1900, "new", "", (), format=[("u", 48)])
    assert ig._plans == {}
