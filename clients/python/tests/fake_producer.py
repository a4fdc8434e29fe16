"""A test-only producer implementing the producer side of docs/ring-layout.md in Python.

Used in-process by the tests (FakeProducer) and as a separate process (``python fake_producer.py ...``)
where a real second process is needed (kill -9, cross-process wakes, the consume CLI).
It is deliberately simple: one heap per publish, slots from a FIFO pool, no network.
"""

import argparse
import fcntl
import mmap
import os
import secrets
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

from ibvbridge import layout as L  # noqa: E402
from ibvbridge._sys import full_fence, futex_wait, futex_wake  # noqa: E402

import ctypes  # noqa: E402

M64 = (1 << 64) - 1


def align(v, a=4096):
    return (v + a - 1) // a * a


def imm(item_id, value, width=5):
    """An immediate item entry (id, value, length, flags)."""
    return (item_id, value, width, L.ITEM_IMMEDIATE)


def addr(item_id, offset, length):
    """An address item entry (id, offset in payload, length, flags)."""
    return (item_id, offset, length, 0)


def pattern(heap_cnt, n):
    """The --verify payload: byte i = (heap_cnt*31 + i) & 0xff."""
    return ((np.arange(n, dtype=np.uint64) + np.uint64((heap_cnt * 31) & 0xFF)) & np.uint64(0xFF)).astype(
        np.uint8).tobytes()


def meta_record(item_id, name="", description="", shape=None, fmt=b"", dtype=""):
    """One stream-metadata record (spec §6)."""
    nb, db, tb = name.encode(), description.encode(), dtype.encode()
    ndim = L.NDIM_UNKNOWN if shape is None else len(shape)
    shp = b"" if shape is None else b"".join(int(s).to_bytes(8, "little", signed=True) for s in shape)
    body = shp + nb + db + fmt + tb
    size = align(L.META_RECORD_HEADER_SIZE + len(body), 8)
    hdr = L.META_RECORD_STRUCT.pack(size, ndim, item_id, len(nb), len(db), len(fmt), len(tb))
    return (hdr + body).ljust(size, b"\0")


class FakeProducer:
    def __init__(self, directory, name, slot_count=8, slot_size=256, max_items=8, meta_size=4096,
                 packet_size=0, page_size=4096, policy=L.POLICY_DROP, start_position=0, futex_start=0,
                 header_overrides=None, data_path=None, data_file_size=None):
        self.dir, self.name = directory, name
        base = os.path.join(directory, f"ibvbridge.{name}.v1")
        self.ctl_path, self.lock_path = base + ".ctl", base + ".lock"
        self.data_path = base + ".dat"
        self.lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # 7.1 step 1
        for p in (self.ctl_path, self.data_path):  # step 2: stale files
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        self.slot_count, self.slot_size, self.max_items = slot_count, slot_size, max_items
        self.policy = policy
        off = 0
        g = {"desc_offset": off}
        off = align(off + slot_count * L.DESC_SIZE)
        g["items_offset"] = off
        off = align(off + slot_count * max_items * L.ITEM_SIZE)
        g["meta_offset"] = off
        off = align(off + meta_size)
        g["payload_offset"] = off
        off = align(off + slot_count * slot_size)
        g["packet_offset"] = off
        off = align(off + packet_size)
        g["data_file_size"] = align(off, page_size)
        self.g = g
        size = g["data_file_size"] if data_file_size is None else data_file_size
        fd = os.open(self.data_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)  # step 3
        os.ftruncate(fd, size)
        self.data = mmap.mmap(fd, size)
        os.close(fd)
        self.desc = np.frombuffer(self.data, L.DESC_DTYPE, slot_count, g["desc_offset"])
        self.items = np.frombuffer(self.data, L.ITEM_DTYPE, slot_count * max_items,
                                   g["items_offset"]).reshape(slot_count, max_items)
        self.payload = np.frombuffer(self.data, np.uint8, slot_count * slot_size,
                                     g["payload_offset"]).reshape(slot_count, slot_size)
        self.meta_off, self.meta_size = g["meta_offset"], meta_size
        # step 4: control file under a temporary name, flock, INIT, READY, rename
        tmp = self.ctl_path + f".tmp{os.getpid()}"
        self.ctl_fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
        fcntl.flock(self.ctl_fd, fcntl.LOCK_EX)
        os.ftruncate(self.ctl_fd, L.CTL_SIZE)
        self.ctl = mmap.mmap(self.ctl_fd, L.CTL_SIZE)
        self.session_id = secrets.randbits(63) | 1
        hdr = dict(magic=L.MAGIC, major=1, minor=0, ctl_size=L.CTL_SIZE, state=L.STATE_READY, policy=policy,
                   session_id=self.session_id, producer_pid=os.getpid(), producer_start_ns=time.time_ns(),
                   slot_count=slot_count, slot_size=slot_size, max_items=max_items, desc_size=L.DESC_SIZE,
                   item_size=L.ITEM_SIZE, page_size=page_size, data_file_size=g["data_file_size"],
                   desc_offset=g["desc_offset"], items_offset=g["items_offset"], meta_offset=g["meta_offset"],
                   meta_size=meta_size, payload_offset=g["payload_offset"], packet_offset=g["packet_offset"],
                   packet_size=packet_size, features=0, stats_count=L.STATS_COUNT)
        hdr.update(header_overrides or {})
        self.hdr = hdr
        final_state = hdr["state"]
        hdr["state"] = L.STATE_INIT
        L.HEADER_STRUCT.pack_into(self.ctl, 0, *(hdr[f] for f in L.HEADER_FIELDS))
        dp = os.fsencode(self.data_path) if data_path is None else data_path
        self.ctl[L.OFF_DATA_PATH:L.OFF_DATA_PATH + len(dp)] = dp
        self.c64 = memoryview(self.ctl).cast("Q")
        self.c32 = memoryview(self.ctl).cast("I")
        self.c64[L.OFF_HEAD >> 3] = start_position & M64
        self.c64[L.OFF_TAIL >> 3] = start_position & M64
        self.c32[L.OFF_CONSUMER_FUTEX >> 2] = futex_start & 0xFFFFFFFF
        self.c32[L.OFF_PRODUCER_FUTEX >> 2] = futex_start & 0xFFFFFFFF
        full_fence()
        self.c32[L.OFF_STATE >> 2] = final_state
        self._cf = ctypes.c_uint32.from_buffer(self.ctl, L.OFF_CONSUMER_FUTEX)
        self._pf = ctypes.c_uint32.from_buffer(self.ctl, L.OFF_PRODUCER_FUTEX)
        os.rename(tmp, self.ctl_path)
        self.head = start_position & M64
        self.reclaimed = self.head  # positions < reclaimed have their slots back in the pool
        self.free = list(range(slot_count))
        self.slot_of = {}
        self.dropped = 0
        self.closed = False

    # ---------------------------------------------------------------- slots
    def _reclaim(self):
        tail = self.c64[L.OFF_TAIL >> 3]
        while self.reclaimed != tail:
            self.free.append(self.slot_of.pop(self.reclaimed))
            self.reclaimed = (self.reclaimed + 1) & M64

    def _acquire(self, slot=None, timeout=5.0):
        if not self.free or (slot is not None and slot not in self.free):
            self._reclaim()
        if not self.free and self.policy == L.POLICY_BLOCK:
            deadline = time.monotonic() + timeout
            while not self.free and time.monotonic() < deadline:
                f = self.c32[L.OFF_PRODUCER_FUTEX >> 2]
                self.c32[L.OFF_PRODUCER_WAITING >> 2] = 1
                full_fence()
                self._reclaim()
                if self.free:
                    break
                futex_wait(ctypes.addressof(self._pf), f, 0.25)
                self._reclaim()
            self.c32[L.OFF_PRODUCER_WAITING >> 2] = 0
        if not self.free:
            self.dropped += 1
            self.c64[(L.OFF_STATS >> 3) + 4] = self.dropped
            return None
        if slot is None:
            return self.free.pop(0)
        self.free.remove(slot)
        return slot

    # ---------------------------------------------------------------- publishing
    def publish(self, heap_cnt, payload=b"", items=(), flags=L.FLAG_COMPLETE, heap_size=None, received=None,
                packets=1, slot=None, commit=True, desc_overrides=None, timestamp_ns=None):
        """Publish one heap; returns its position, or None when dropped (no free slot)."""
        s = self._acquire(slot)
        if s is None:
            return None
        payload = bytes(payload)
        self.payload[s, :len(payload)] = np.frombuffer(payload, np.uint8)
        for i, it in enumerate(items):
            self.items[s, i] = (it[0], it[1], it[2], it[3], 0)
        pos = self.head
        d = dict(seq=(pos + 1) & M64, heap_cnt=heap_cnt,
                 heap_size=len(payload) if heap_size is None else heap_size,
                 received=len(payload) if received is None else received,
                 timestamp_ns=time.time_ns() if timestamp_ns is None else timestamp_ns, slot=s, flags=flags,
                 item_count=len(items), packets=packets, reserved=0)
        d.update(desc_overrides or {})
        self.desc[pos & (self.slot_count - 1)] = tuple(d[f] for f in L.DESC_FIELDS)
        self.slot_of[pos] = s
        self.head = (pos + 1) & M64
        st = self.c64
        st[(L.OFF_STATS >> 3) + 2] += 1
        st[(L.OFF_STATS >> 3) + 1] += len(payload)
        if commit:
            self.commit()
        return pos

    def commit(self):
        """Release-store head, then the wake protocol (spec §7.4, producer side)."""
        self.c64[L.OFF_HEAD >> 3] = self.head
        full_fence()
        self._wake_consumer()

    def _wake_consumer(self):
        if self.c32[L.OFF_CONSUMER_WAITING >> 2] != 0:
            self.c32[L.OFF_CONSUMER_WAITING >> 2] = 0
            self.c32[L.OFF_CONSUMER_FUTEX >> 2] = (self.c32[L.OFF_CONSUMER_FUTEX >> 2] + 1) & 0xFFFFFFFF
            futex_wake(ctypes.addressof(self._cf))

    def publish_verify(self, heap_cnt, size, commit=True, **kw):
        """A heap the consume CLI's --verify accepts: pattern payload, item 0x1001 = heap_cnt."""
        return self.publish(heap_cnt, pattern(heap_cnt, size), items=[imm(0x1001, heap_cnt)], commit=commit,
                            **kw)

    def publish_eos(self):
        pos = self.publish(0, b"", flags=L.FLAG_END_OF_STREAM)
        self.c64[(L.OFF_STATS >> 3) + 2] -= 1  # a marker, not a heap
        self.c64[(L.OFF_STATS >> 3) + 9] = 1
        return pos

    def set_descriptors(self, records):
        """Rewrite the stream-metadata area (seqlock writer)."""
        body = b"".join(records)
        assert len(body) <= self.meta_size - 16
        mv = memoryview(self.data)
        o = self.meta_off
        seq = int.from_bytes(mv[o:o + 8], "little")
        mv[o:o + 8] = (seq + 1).to_bytes(8, "little")
        full_fence()
        mv[o + 16:o + 16 + len(body)] = body
        mv[o + 8:o + 16] = len(body).to_bytes(8, "little")
        full_fence()
        mv[o:o + 8] = (seq + 2).to_bytes(8, "little")
        mv.release()

    def set_stat(self, index, value):
        self.c64[(L.OFF_STATS >> 3) + index] = value

    def close(self, unlink=True):
        """Clean stop (spec §7.6): state CLOSED, bump and wake consumer_futex, unlink .ctl/.dat."""
        if self.closed:
            return
        self.closed = True
        self.c32[L.OFF_STATE >> 2] = L.STATE_CLOSED
        full_fence()
        self.c32[L.OFF_CONSUMER_FUTEX >> 2] = (self.c32[L.OFF_CONSUMER_FUTEX >> 2] + 1) & 0xFFFFFFFF
        futex_wake(ctypes.addressof(self._cf))
        if unlink:
            for p in (self.ctl_path, self.data_path):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
        self._release_fds()

    def die(self):
        """Simulate a crash in-process: drop the flocks without touching state (the kernel would do this)."""
        self.closed = True
        self._release_fds()

    def _release_fds(self):
        # mmap dup()s its fd: the control mapping must go too, or the flock's open file description lives on
        self._cf = self._pf = None
        self.c64.release()
        self.c32.release()
        self.ctl.close()
        os.close(self.ctl_fd)
        os.close(self.lock_fd)


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
    ap.add_argument("--batch", type=int, default=1, help="heaps per head store")
    ap.add_argument("--end", choices=("eos", "close", "hang", "exit"), default="eos")
    a = ap.parse_args()
    p = FakeProducer(a.dir, a.name, slot_count=a.slot_count, slot_size=a.slot_size,
                     policy=L.POLICY_BLOCK if a.policy == "block" else L.POLICY_DROP)
    print("ready", flush=True)
    time.sleep(a.start_delay)
    pats = {}
    for k in range(a.count):
        cnt = a.first + k
        pl = pats.get(cnt & 0xFF)
        if pl is None:
            pl = pats[cnt & 0xFF] = pattern(cnt, a.size)
        last = (k + 1) % a.batch == 0 or k + 1 == a.count
        if p.publish(cnt, pl, items=[imm(0x1001, cnt)], commit=last) is None and not last:
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
