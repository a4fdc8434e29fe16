"""asyncio for a Ring: ``await ring.next_async()`` and ``async for heap in ring``.

    async for heap in ring:          # released when the loop advances, as `for heap in ring`
        ig.update(heap)

The waiting rules are Ring.next's (EndOfStream, ProducerGone, Timeout, Detached; spec §7.5). How it waits,
and why: a heap that is already published is taken on the event loop's thread with no hop at all
(``ring.next(timeout=0)``). Only when the ring is empty does the consumer announce itself (``wake_at``,
``consumer_waiting``, as Ring._wait does) and sleep in ``FUTEX_WAIT`` on a thread of the loop's default
executor, for at most ``MAX_WAIT_SLICE`` (0.25 s), then come back to the loop and look again. So:

* no thread per ring: an executor thread is borrowed only while a ring is idle, and given back within a
  slice; an event loop with many rings shares the executor's threads;
* the executor thread touches no ring state (one syscall on the region's futex word): taking a heap,
  releasing heaps and flushing the tail stay on the loop's thread, so a task that releases a heap while
  another awaits cannot race the wait;
* cancelling the awaiting task leaves nothing taken: the thread's futex wait ends within a slice;
* the async wait asks for a wake per heap (``wake_at`` = the next position): attach's ``max_latency``
  coalescing applies to ``next()`` / ``for``, not here.

The alternative, an eventfd read by ``loop.add_reader`` and written by a waiter thread blocked in the futex,
needs one thread per ring for the ring's lifetime; the wake latency is the same (one futex wake plus one
thread hand-off).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, AsyncIterator, Optional

from . import layout as L
from ._sys import full_fence, futex_wait
from .errors import EndOfStream, Timeout

if TYPE_CHECKING:
    from .ring import Heap, Ring

_M64 = (1 << 64) - 1


def _announce(ring: "Ring") -> Optional[int]:
    """Announce that this consumer sleeps (spec §7.5: read consumer_futex, set wake_at and
    consumer_waiting, fence, re-read head). Returns the futex value to wait on, or None when a heap was
    published meanwhile (then nothing is announced)."""
    r32, r64 = ring._r32, ring._r64
    if ring._group_bit:
        ring._publish_progress()  # a member's read and handed before consumer_waiting = 1 (spec §14.2)
    f = r32[L.REG_CONSUMER_FUTEX >> 2]
    r64[L.REG_WAKE_AT >> 3] = (ring._read + 1) & _M64
    r32[L.REG_CONSUMER_WAITING >> 2] = 1
    full_fence()
    if ring._c64[L.OFF_HEAD >> 3] != ring._read:
        r32[L.REG_CONSUMER_WAITING >> 2] = 0
        return None
    return f


async def next_async(ring: "Ring", timeout: Optional[float] = None) -> "Heap":
    """The next heap, awaiting it without blocking the event loop (see the module comment)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    loop = asyncio.get_running_loop()
    addr = ring._cfutex_addr
    while True:
        try:
            return ring.next(timeout=0)  # checks closed / detached / producer gone / end of stream
        except Timeout:
            pass
        left = L.MAX_WAIT_SLICE
        if deadline is not None:
            left = min(left, deadline - time.monotonic())
            if left <= 0:
                raise Timeout(f"no heap within {timeout} s")
        f = _announce(ring)
        if f is None:
            continue
        try:
            await loop.run_in_executor(None, futex_wait, addr, f, left)
        finally:
            if not ring._closed:
                ring._r32[L.REG_CONSUMER_WAITING >> 2] = 0


async def heaps_async(ring: "Ring", timeout: Optional[float] = None) -> AsyncIterator["Heap"]:
    """Heaps until the end of stream, each released when the loop advances or is left."""
    while True:
        try:
            heap = await next_async(ring, timeout)
        except EndOfStream:
            return
        try:
            yield heap
        finally:
            heap.release()
