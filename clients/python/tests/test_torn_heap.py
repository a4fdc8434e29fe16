"""Layout 2.1 §A: a heap whose slot the producer reuses while this consumer holds it is never handed out as
valid. The producer detaches the consumer (row state OVERRUN, lost_heaps) and fences before it reuses the
slot; the consumer copies a descriptor and its items, checks them, then checks its row, on every heap; the
user proves the bytes read were the heap's by ``heap.valid`` / ``ring.release(heap)`` after reading."""

import signal
import subprocess
import time

import pytest

from ibvbridge import Detached, Overrun, Ring
from ibvbridge import layout as L
from fake_producer import pattern
from test_consume import PKG, PY, parse

SLOTS = 4


def attach(p, **kw):
    return Ring.attach(p.socket_path, timeout=2.0, **kw)


def lap(p, fast, first, n):
    """Publish heaps first..first+n-1 (pattern payloads) while `fast` reads each at once."""
    for i in range(first, first + n):
        assert p.publish_verify(i, 64) is not None
        with fast.next(timeout=1) as h:
            assert h.heap_cnt == i and bytes(h.payload) == pattern(i, 64)


@pytest.fixture
def drop_ring(make_producer):
    p = make_producer(slot_count=SLOTS, slot_size=64, policy=L.POLICY_DROP)
    slow, fast = attach(p), attach(p)
    yield p, slow, fast
    slow.close()
    fast.close()


def test_heap_overrun_while_held_is_invalid_and_release_raises_overrun(drop_ring):
    p, slow, fast = drop_ring
    lap(p, fast, 1, 2)
    h = slow.next(timeout=1)  # holds heap 1; heap 2 is published (cached) but not taken
    assert h.heap_cnt == 1 and h.valid and bytes(h.payload) == pattern(1, 64)
    lap(p, fast, 3, 3 * SLOTS)  # fast keeps up; slow is overrun and every slot is reused
    assert p.row_get(slow.consumer_index, "state") == L.CONSUMER_OVERRUN
    assert bytes(h.payload) != pattern(1, 64)  # the held view now shows a later heap's bytes: torn
    assert not h.valid
    with pytest.raises(Overrun) as e:
        slow.release(h)
    # lost = head when the producer detached slow (position 4: slots of 0..3 all held by slow) - its tail 0
    assert e.value.lost_heaps == SLOTS and e.value.lost_heaps == p.row_get(slow.consumer_index, "lost_heaps")
    assert h.released


def test_overrun_consumer_learns_it_at_its_next_call_not_when_head_is_reloaded(drop_ring):
    p, slow, fast = drop_ring
    lap(p, fast, 1, 2)
    h = slow.next(timeout=1)  # heap 2 is already known (cached head): 2.0 handed it out torn
    lap(p, fast, 3, 3 * SLOTS)
    with pytest.raises(Overrun) as e:
        slow.next(timeout=0)
    assert e.value.lost_heaps == SLOTS
    assert not h.valid


def test_iteration_raises_overrun_at_the_step_after_a_held_heap_was_overrun(drop_ring):
    p, slow, fast = drop_ring
    lap(p, fast, 1, 2)
    it = iter(slow)
    h = next(it)  # the iterator's fast path
    assert h.heap_cnt == 1 and h.valid
    lap(p, fast, 3, 3 * SLOTS)
    assert not h.valid
    with pytest.raises(Overrun) as e:
        next(it)
    assert e.value.lost_heaps == SLOTS


def test_copy_of_a_heap_overrun_while_held_raises_instead_of_returning_torn_bytes(drop_ring):
    p, slow, fast = drop_ring
    lap(p, fast, 1, 1)
    h = slow.next(timeout=1)
    good = h.copy()  # copied while valid: kept
    lap(p, fast, 2, 3 * SLOTS)
    with pytest.raises(Overrun):
        h.copy()
    assert bytes(good.payload) == pattern(1, 64) and good.valid


def test_batch_overrun_while_held_is_invalid(drop_ring):
    p, slow, fast = drop_ring
    lap(p, fast, 1, 2)
    b = slow.next_batch(2, timeout=1)
    assert len(b) == 2 and b.valid and b.heap_cnt.tolist() == [1, 2]
    lap(p, fast, 3, 3 * SLOTS)
    assert not b.valid
    assert b.heap_cnt.tolist() == [1, 2]  # the checked private copy, whatever the producer wrote since
    with pytest.raises(Overrun):
        slow.release(b)


def test_release_of_a_valid_heap_does_not_raise_and_valid_ends_at_release(drop_ring):
    p, slow, fast = drop_ring
    lap(p, fast, 1, 1)
    h = slow.next(timeout=1)
    assert h.valid
    slow.release(h)
    assert h.released and not h.valid  # its memory belongs to the producer again
    slow.release(h)  # idempotent


def test_release_reports_other_detach_reasons_as_detached(make_producer):
    p = make_producer(slot_count=SLOTS, slot_size=64)
    with attach(p) as ring:
        p.publish_verify(1, 64)
        h = ring.next(timeout=1)
        p.detach(ring.consumer_index, L.CONSUMER_BAD_CURSOR, lost_heaps=0)
        assert not h.valid
        with pytest.raises(Detached) as e:
            ring.release(h)
        assert not isinstance(e.value, Overrun) and e.value.reason == L.CONSUMER_BAD_CURSOR


def _stopped(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.parametrize("batch", [False, True])
def test_consume_tool_sigstopped_while_holding_a_heap_counts_overrun_not_verify_error(make_producer, batch):
    p = make_producer(slot_count=8, slot_size=256, policy=L.POLICY_DROP)
    fast = attach(p)
    p.publish_verify(1, 200)
    with fast.next(timeout=1):
        pass
    args = ["--ring", p.socket_path, "--verify", "--stop-first"] + (["--batch", "4"] if batch else [])
    proc = subprocess.Popen([PY, "-m", "ibvbridge.consume", *args], cwd=PKG, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not _stopped(proc.pid):  # it took heap 1 and stopped itself before reading its bytes
            assert proc.poll() is None and time.monotonic() < deadline, "the consume tool did not stop"
            time.sleep(0.001)
        for i in range(2, 2 + 3 * 8):  # the tool's held slot is reused: it must see the overrun
            assert p.publish_verify(i, 200) is not None
            with fast.next(timeout=1):
                pass
        assert p.stats()["consumer_overruns"] == 1
    finally:
        proc.send_signal(signal.SIGCONT)
    out, err = proc.communicate(timeout=30)
    rc, res = parse(proc.returncode, out, err)
    assert rc == 4 and res["result"] == "overrun", res
    assert res["verify_errors"] == 0 and res["overrun_heaps"] == 1 and res["heaps"] == 0, res
    fast.close()
