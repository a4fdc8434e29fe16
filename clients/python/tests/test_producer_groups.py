"""Consumer groups (spec §14) on the Python producer (ibvbridge.Producer): assignment, reclaim per member,
the window and a departing member's group_lost, read by the Python client's members."""

import functools
import socket
import time

import numpy as np
import pytest

from ibvbridge import layout as L
from ibvbridge import Overrun, Ring, Timeout


@pytest.fixture
def make(make_public_producer):
    return functools.partial(make_public_producer, "g", slot_count=16)


def payload(cnt):
    return ((np.arange(200, dtype=np.uint32) + cnt * 31) & 0xFF).astype(np.uint8)


def publish(p, cnts, timeout=None):
    cnts = list(cnts)
    return p.publish_batch(np.stack([payload(c) for c in cnts]), cnts, items=[(0x1000, 0, 200, 0)],
                           timeout=timeout)


def drain(ring, cnts=None, hold=False):
    """heap_cnts of every heap ring can read now, each verified (released unless hold)."""
    got = [] if cnts is None else cnts
    while True:
        try:
            h = ring.next(timeout=0)
        except Timeout:
            return got
        if h.end_of_stream:
            return got
        assert bytes(h.payload[:200]) == payload(h.heap_cnt).tobytes()
        got.append(h.heap_cnt)
        if not hold:
            h.release()


def attach(p, group=None):
    return Ring.attach(p.socket_path, timeout=2.0, group=group)


def test_members_share_every_heap_once_and_an_independent_consumer_reads_all(make):
    p = make()
    a, b, mon = attach(p, "work"), attach(p, "work"), attach(p)
    got_a, got_b, got_mon = [], [], []
    for start in range(1, 101, 10):  # 100 heaps through a 16-slot ring: slots come back per member
        assert publish(p, range(start, start + 10)) == 10
        drain(a, got_a), drain(b, got_b), drain(mon, got_mon)
    assert got_a and got_b and not set(got_a) & set(got_b)
    assert sorted(got_a + got_b) == list(range(1, 101)) and got_mon == list(range(1, 101))
    assert got_a == sorted(got_a) and got_b == sorted(got_b)
    ra, rb, rm = p.row(a.consumer_index), p.row(b.consumer_index), p.row(mon.consumer_index)
    assert ra["group_id"] == rb["group_id"] == L.group_id("work") and rm["group_id"] == 0
    assert (ra["assigned"], rb["assigned"], rm["assigned"]) == (len(got_a), len(got_b), 0)
    assert p.stats()["group_lost"] == 0 and p.stats()["dropped_heaps"] == 0
    assert int.from_bytes(p.ctl[L.OFF_STATS_COUNT:L.OFF_STATS_COUNT + 4], "little") == 19
    p.end_of_stream()
    for r in (a, b, mon):
        with pytest.raises(Exception):  # EndOfStream (a member sees the marker too)
            r.next(timeout=1)
        r.close()


def test_assignment_goes_round_robin_to_the_member_with_fewest_outstanding(make):
    p = make()
    a, b = attach(p, "work"), attach(p, "work")
    publish(p, range(1, 7))
    assert drain(b, hold=True) == [2, 4, 6]  # ties alternate, a (lower row) first
    assert drain(a) == [1, 3, 5]
    publish(p, range(7, 10))  # b holds 3, a none: a gets them all
    assert drain(a) == [7, 8, 9] and drain(b) == []
    a.close(), b.close()


def test_member_leaving_loses_its_heaps_and_its_row_inherits_none(make):
    p = make(policy="drop")
    a, b = attach(p, "g"), attach(p, "g")
    ia = a.consumer_index
    publish(p, range(1, 9))
    got_b = drain(b)
    assigned_a = p.row(ia)["assigned"]
    assert got_b and assigned_a > 1 and len(got_b) + assigned_a == 8
    h = a.next(timeout=1)  # a reads one of its heaps and releases it, then leaves
    first_a = h.heap_cnt
    h.release()
    a.close()
    for _ in range(5000):  # the serving thread notices the closed socket
        if p.stats()["group_lost"] == assigned_a - 1 and p.consumers == 1:
            break
        time.sleep(0.001)
    assert p.stats()["group_lost"] == assigned_a - 1 and p.consumers == 1
    c = attach(p, "g")
    assert c.consumer_index == ia  # the departed member's row
    publish(p, range(9, 17))
    got_c = drain(c)
    drain(b, got_b)
    assert got_c and min(got_c) > 8  # nothing of the departed member's
    assert first_a not in got_b + got_c and not set(got_b) & set(got_c)
    assert len(got_b) + len(got_c) == 16 - (assigned_a - 1) - 1
    assert p.row(ia)["assigned"] == len(got_c)
    assert publish(p, range(17, 33)) == 16  # every slot came back: a whole ring more without a drop
    assert p.stats()["dropped_heaps"] == 0 and p.stats()["group_lost"] == assigned_a - 1
    b.close(), c.close()


def test_member_a_ring_behind_is_overrun_not_overwritten(make):
    p = make(policy="drop")
    a, b = attach(p, "g"), attach(p, "g")
    held, got_b = None, []
    for cnt in range(1, 41):
        assert publish(p, [cnt]) == 1
        if held is None:
            try:
                held = a.next(timeout=0)  # a holds this heap and reads nothing more
            except Timeout:
                pass
        if cnt == 16:
            assert p.stats()["consumer_overruns"] == 0
        drain(b, got_b)
    assert held is not None
    st = p.stats()
    assert st["consumer_overruns"] == 1 and st["dropped_heaps"] == 0
    assert st["group_lost"] >= 1 and len(got_b) + st["group_lost"] == 40
    assert not held.valid
    with pytest.raises(Overrun):
        a.next(timeout=0)
    a.close(), b.close()


def test_member_holding_under_a_quarter_never_stalls_block(make):
    """Spec §14's starvation rule: a member that keeps its last 3 heaps (under a quarter of 16 slots) and reads
    a fourth before it releases the oldest, beside one that releases at once, is handed its next heap before
    the ring fills (else publish would wait for a release that never comes: Timeout)."""
    p = make(policy="block")
    a, b = attach(p, "g"), attach(p, "g")
    held, got = [], []
    for cnt in range(1, 301):
        assert publish(p, [cnt], timeout=10) == 1
        drain(b, got)
        while True:
            try:
                h = a.next(timeout=0)
            except Timeout:
                break
            assert bytes(h.payload[:200]) == payload(h.heap_cnt).tobytes()
            got.append(h.heap_cnt)
            held.append(h)
        while len(held) > 3:
            held.pop(0).release()
    assert sorted(got) == list(range(1, 301))
    a.close(), b.close()


def test_group_holes_are_not_read_by_a_new_consumer(make):
    """Positions are freed out of order (spec §14), so an independent consumer attaching with start = 0
    begins at oldest, where every published position still holds its slot: member a holds heap 1, member b
    released heaps 2 and 4, and the new consumer reads from heap 5 on, never the freed holes."""
    p = make(policy="drop")
    a, b = attach(p, "g"), attach(p, "g")
    publish(p, range(1, 5))
    ha = a.next(timeout=0)
    assert ha.heap_cnt == 1  # held
    assert drain(b) == [2, 4]
    publish(p, [5])  # its commit reclaims what b released
    assert p.oldest == 4
    mon = attach(p)
    publish(p, [6])
    assert drain(mon) == [5, 6]
    assert ha.valid and bytes(ha.payload[:200]) == payload(1).tobytes()
    h = a.next(timeout=0)  # a's other heap (3) kept its slot
    assert h.heap_cnt == 3 and bytes(h.payload[:200]) == payload(3).tobytes()
    mon.close(), a.close(), b.close()


def test_observer_in_a_group_and_nonzero_reserved_bytes_are_refused_status_5(make):
    p = make()

    def status(hello):
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.connect(p.socket_path)
            s.send(hello)
            msg, _, _, _ = socket.recv_fds(s, 1024, 4)
            return int.from_bytes(msg[12:16], "little")

    assert status(L.pack_hello(role=L.ROLE_OBSERVER, group_id=7)) == L.STATUS_PROTOCOL
    bad = bytearray(L.pack_hello(group_id=7))
    bad[0x18] = 1
    assert status(bytes(bad)) == L.STATUS_PROTOCOL
    assert status(L.pack_hello(group_id=7)) == 0  # a member is welcome
