"""A test-only producer: the public ibvbridge.Producer plus the hooks the tests need to corrupt things.

Used in-process by the tests (FakeProducer) and as a separate process (``python fake_producer.py ...``)
where a real second process is needed (kill -9, cross-process wakes, the consume CLI).

Everything real (ring directory, lock, socket, serving thread, SO_PEERCRED gate, consumer table, reclaim
from the slowest consumer, cursor validation, drop / block, wakes, close) is ibvbridge.producer.Producer.
This file adds only what a test needs and a real producer must never do:

    refuse = (status, message)      answer every hello with this error record
    welcome_hook = f(bytes) -> bytes    rewrite the welcome record
    fds_hook = f([ctl, data, region]) -> [fds]    change the descriptors sent with it
    region_seals                    seals of each new consumer region
    header_overrides, seals, ctl_size / data_size of the memfds, page_size (constructor)
    publish(..., slot=, commit=False, desc_overrides=)    a chosen slot, a deferred head store, a bad
                                    descriptor
    detach(index, state), die(), set_stat(), row_get / row_set
and the older one-call publish(heap_cnt, payload, items) API the tests were written against. Its memory
stays mapped after close() so a test may look at it.
"""

import argparse
import os
import secrets
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

from ibvbridge import layout as L  # noqa: E402
from ibvbridge.errors import RingFull, Timeout  # noqa: E402
from ibvbridge._sys import add_seals, futex_wake  # noqa: E402
from ibvbridge.producer import SEALS_REGION, SEALS_SHARED, Producer, layout_for, new_shm  # noqa: E402
from ibvbridge.producer import meta_record  # noqa: E402,F401 - the tests build metadata records with it

M64 = (1 << 64) - 1
ROW = L.OFF_CONSUMER_TABLE


def align(v, a=4096):
    return (v + a - 1) // a * a


def imm(item_id, value, width=5):
    """An immediate item entry (id, value, length, flags)."""
    return (item_id, value, width, L.ITEM_IMMEDIATE)


def addr(item_id, offset, length):
    """An address item entry (id, offset in payload, length, flags)."""
    return (item_id, offset, length, 0)


def until(cond, timeout=5.0):
    """Wait until cond() is true (polling every 5 ms); AssertionError after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.005)


def pattern(heap_cnt, n):
    """The --verify payload: byte i = (heap_cnt*31 + i) & 0xff."""
    return ((np.arange(n, dtype=np.uint64) + np.uint64((heap_cnt * 31) & 0xFF)) & np.uint64(0xFF)).astype(
        np.uint8).tobytes()


class FakeProducer(Producer):
    _unmap_on_close = False  # the tests may look at the memory after close()

    def __init__(self, directory, name, slot_count=8, slot_size=256, max_items=8, meta_size=4096,
                 packet_size=0, page_size=4096, policy=L.POLICY_DROP, start_position=0, max_consumers=8,
                 header_overrides=None, seals=SEALS_SHARED, data_size=None, ctl_size=None, block_timeout=5.0,
                 serve=True):
        self._fake = dict(page_size=page_size, header_overrides=header_overrides or {}, seals=seals,
                          data_size=data_size, ctl_size=ctl_size)
        self.dir = directory
        self.block_timeout = block_timeout
        self.refuse = None
        self.welcome_hook = None
        self.fds_hook = None
        self.region_seals = SEALS_REGION
        self.dropped = 0
        # accept_groups: take a hello's group_id (spec §14) instead of refusing it as the Python producer
        # does; the test then writes each descriptor's assign mask itself (publish(desc_overrides=
        # {"assign": mask})). hello_groups lists the group_ids received.
        self.accept_groups = False
        self.hello_groups = []
        super().__init__(name, slot_count=slot_count, slot_size=slot_size, max_items=max_items,
                         meta_size=meta_size, policy=policy, hugepages="off", directory=directory,
                         max_consumers=max_consumers, packet_size=packet_size, start_position=start_position,
                         serve=serve)

    # ---------------------------------------------------------------- memory with corruptions
    def _create_memory(self, hugepages):
        f = self._fake
        g = layout_for(self.slot_count, self.slot_size, self.max_items, self.meta_size, self.packet_size,
                       f["page_size"])
        self.g, self.page_size, self.huge = g, f["page_size"], False
        self.data_size = g["data_size"] if f["data_size"] is None else f["data_size"]
        self.ctl_size = L.ctl_size_for(self.max_consumers) if f["ctl_size"] is None else f["ctl_size"]
        self.data_fd, self.data = new_shm("ibvbridge-data", self.data_size)
        self.ctl_fd, self.ctl = new_shm("ibvbridge-ctl", self.ctl_size)
        self.session_id = secrets.randbits(63) | 1
        hdr = dict(magic=L.MAGIC, major=L.MAJOR_VERSION, minor=L.MINOR_VERSION, ctl_size=self.ctl_size,
                   state=L.STATE_READY, policy=self.policy, session_id=self.session_id, producer_pid=os.getpid(),
                   producer_start_ns=time.time_ns(), slot_count=self.slot_count, slot_size=self.slot_size,
                   max_items=self.max_items, desc_size=L.DESC_SIZE, item_size=L.ITEM_SIZE,
                   page_size=f["page_size"], data_size=g["data_size"], desc_offset=g["desc_offset"],
                   items_offset=g["items_offset"], meta_offset=g["meta_offset"], meta_size=self.meta_size,
                   payload_offset=g["payload_offset"], packet_offset=g["packet_offset"],
                   packet_size=self.packet_size, features=0, stats_count=L.STATS_COUNT,
                   max_consumers=self.max_consumers)
        hdr.update(f["header_overrides"])
        self.hdr = hdr
        L.HEADER_STRUCT.pack_into(self.ctl, 0, *(hdr[k] for k in L.HEADER_FIELDS))
        if f["seals"]:
            add_seals(self.ctl_fd, f["seals"])
            add_seals(self.data_fd, f["seals"])

    # ---------------------------------------------------------------- handshake hooks
    def _refuse_hook(self, conn):
        if self.refuse is None:
            return False
        self._refuse(conn, *self.refuse)
        return True

    def _answer(self, conn, msg):
        if self.accept_groups and len(msg) == L.HELLO_SIZE:
            self.hello_groups.append(int.from_bytes(msg[L.HELLO_GROUP_ID:L.HELLO_GROUP_ID + 4], "little"))
            msg = msg[:L.HELLO_GROUP_ID] + bytes(4) + msg[L.HELLO_GROUP_ID + 4:]
        return super()._answer(conn, msg)

    def _welcome_hook(self, rec, fds):
        if self.welcome_hook is not None:
            rec = self.welcome_hook(rec)
        if self.fds_hook is not None:
            fds = self.fds_hook(fds)
        return rec, fds

    @property
    def _region_seals(self):
        return self.region_seals

    @property
    def listener(self):
        return self._listener

    @property
    def closed(self):
        return self._closed

    @property
    def payload(self):
        return self._payload2d

    @property
    def reclaimed(self):
        return self._reclaim

    @property
    def head(self):
        return self._pos

    @head.setter
    def head(self, v):
        self._pos = v & M64

    def serve_once(self, timeout=2.0):
        """Accept and answer one connection on the caller's thread (for producers made with serve=False)."""
        self._listener.settimeout(timeout)
        conn, _ = self._listener.accept()
        self._listener.settimeout(None)
        self._handshake(conn)

    def detach(self, index, state, lost_heaps=None):
        """Detach consumer row index as the producer does (spec §7.2, §7.3)."""
        with self.lock:
            m = self.conns[index]
            if lost_heaps is None:
                lost_heaps = (self.c64[L.OFF_HEAD >> 3] - m.released) & M64
            self._detach_locked(m, state, lost_heaps)

    def wait_consumers(self, n, timeout=60.0):
        """Wait until exactly n consumers are attached (the serve thread notices hang-ups asynchronously). The
        bound is generous: a consumer process that imports numpy on a loaded machine takes seconds to attach."""
        deadline = time.monotonic() + timeout
        while len(self.conns) != n:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(self.conns)} consumers attached, want {n}")
            time.sleep(0.005)

    def consumer(self, index=None):
        """The Member record of row index (the only one attached when index is None)."""
        if index is None:
            (c,) = self.conns.values()
            return c
        return self.conns[index]

    def set_stat(self, index, value):
        self.c64[(L.OFF_STATS >> 3) + index] = value

    # ---------------------------------------------------------------- the tests' publish
    def _take(self, slot=None):
        """A free slot (the given one if asked), or None when dropped (counted)."""
        try:
            if slot is None:
                return self.acquire(timeout=self.block_timeout).index
            while True:
                sc = self.slot_count
                free = [int(self._free[(self._free_r + i) % sc]) for i in range(self._nfree())]
                if slot in free:
                    i = (self._free_r + free.index(slot)) % sc
                    j = self._free_r % sc
                    self._free[i], self._free[j] = self._free[j], self._free[i]
                    self._free_r += 1
                    return slot
                self._refill(self._nfree() + 1, self.block_timeout)
        except (RingFull, Timeout):
            self.dropped += 1
            self.add("dropped_heaps", 1)
            return None

    def publish(self, heap_cnt, payload=b"", items=(), flags=L.FLAG_COMPLETE, heap_size=None, received=None,
                packets=1, slot=None, commit=True, desc_overrides=None, timestamp_ns=None):
        """Publish one heap; returns its position, or None when dropped (no free slot)."""
        s = self._take(slot)
        if s is None:
            return None
        self._taken.discard(s)
        payload = bytes(payload)
        self._payload2d[s, :len(payload)] = np.frombuffer(payload, np.uint8)
        for i, it in enumerate(items):
            self.items[s, i] = (it[0], it[1], it[2], it[3], 0)
        pos = self._pos
        d = dict(seq=(pos + 1) & M64, heap_cnt=heap_cnt,
                 heap_size=len(payload) if heap_size is None else heap_size,
                 received=len(payload) if received is None else received,
                 timestamp_ns=time.time_ns() if timestamp_ns is None else timestamp_ns, slot=s, flags=flags,
                 item_count=len(items), packets=packets, assign=0)
        d.update(desc_overrides or {})
        self.desc[pos & self.mask] = tuple(d[f] for f in L.DESC_FIELDS)
        self._pos_slot[pos & self.mask] = s
        self._pos = (pos + 1) & M64
        if not flags & L.FLAG_END_OF_STREAM:
            self.add("heaps", 1)
            self.add("bytes", len(payload))
        if commit:
            self.commit()
        return pos

    def commit(self):
        """Release-store head, full fence, then wake every consumer that announced it waits (spec §7.5)."""
        self._commit()

    def wake_consumers(self, force=False):
        for c in list(self.conns.values()):
            r32 = c.r32
            if force or r32[L.REG_CONSUMER_WAITING >> 2] != 0:
                r32[L.REG_CONSUMER_WAITING >> 2] = 0
                r32[L.REG_CONSUMER_FUTEX >> 2] = (r32[L.REG_CONSUMER_FUTEX >> 2] + 1) & 0xFFFFFFFF
                futex_wake(c.cf_addr)

    def publish_verify(self, heap_cnt, size, commit=True, **kw):
        """A heap the consume CLI's --verify accepts: pattern payload, item 0x1001 = heap_cnt."""
        return self.publish(heap_cnt, pattern(heap_cnt, size), items=[imm(0x1001, heap_cnt)], commit=commit,
                            **kw)

    def publish_eos(self):
        self.set("end_of_stream", 1)
        pos = self.publish(0, b"", flags=L.FLAG_END_OF_STREAM)
        self._commit(force=True)  # as Producer.end_of_stream: coalesced sleepers too
        return pos

    def die(self):
        """Simulate a crash: every socket closes (as the kernel would), no CLOSED, the socket file stays,
        the lock is released."""
        self._interrupted = True
        self._stop_serving()
        self._release(unlink=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--slot-count", type=int, default=64)
    ap.add_argument("--slot-size", type=int, default=256)
    ap.add_argument("--first", type=int, default=1)
    ap.add_argument("--policy", choices=("drop", "block"), default="block")
    ap.add_argument("--interval-us", type=float, default=0)
    ap.add_argument("--start-delay", type=float, default=0)
    ap.add_argument("--wait-consumers", type=int, default=0, help="wait for N consumers before publishing")
    ap.add_argument("--batch", type=int, default=1, help="heaps per head store")
    ap.add_argument("--end", choices=("eos", "close", "hang", "exit"), default="eos")
    a = ap.parse_args()
    p = FakeProducer(a.dir, a.name, slot_count=a.slot_count, slot_size=a.slot_size, block_timeout=30.0,
                     policy=L.POLICY_BLOCK if a.policy == "block" else L.POLICY_DROP)
    print("ready", flush=True)
    if a.wait_consumers:
        p.wait_consumers(a.wait_consumers, timeout=30)
    time.sleep(a.start_delay)
    pats = {}
    for k in range(a.count):
        cnt = a.first + k
        pl = pats.get(cnt & 0xFF)
        if pl is None:
            pl = pats[cnt & 0xFF] = pattern(cnt, a.size)
        last = (k + 1) % a.batch == 0 or k + 1 == a.count
        if p.publish(cnt, pl, items=[imm(0x1001, cnt)], commit=last) is None and last:
            p.commit()
        if a.interval_us:
            time.sleep(a.interval_us / 1e6)
    print("published", flush=True)
    if a.end == "eos":
        p.publish_eos()
        p.close()
    elif a.end == "close":
        p.close()
    elif a.end == "exit":
        os._exit(0)
    else:
        while True:
            time.sleep(1)


if __name__ == "__main__":
    main()
