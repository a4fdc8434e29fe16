"""A test-only producer implementing the producer side of docs/ring-layout.md (layout 2.0) in Python.

Used in-process by the tests (FakeProducer) and as a separate process (``python fake_producer.py ...``)
where a real second process is needed (kill -9, cross-process wakes, the consume CLI).

It is deliberately simple: one heap per publish, slots from a FIFO pool, no network. The memory is sealed
memfds; consumers attach through a SOCK_SEQPACKET socket NAME.v2.sock in the given directory, served by a
background thread (accepting, answering hellos, noticing consumers that hang up). Everything that touches
the slot pool, the consumer table or the regions runs under one lock, so attaching, reclaiming and
publishing never interleave.

Hooks for the tests (attributes, set before a consumer attaches):
    refuse = (status, message)      answer every hello with this error record
    welcome_hook = f(bytes) -> bytes    rewrite the welcome record
    fds_hook = f([ctl, data, region]) -> [fds]    change the descriptors sent with it
    region_seals                    seals of each new consumer region
and constructor arguments for the memory: header_overrides, seals, ctl_size / data_size of the memfds.
"""

import argparse
import ctypes
import mmap
import os
import secrets
import select
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

from ibvbridge import layout as L  # noqa: E402
from ibvbridge._sys import add_seals, full_fence, futex_wait, futex_wake, peer_cred  # noqa: E402

M64 = (1 << 64) - 1
SEALS_SHARED = L.F_SEAL_SHRINK | L.F_SEAL_GROW | L.F_SEAL_FUTURE_WRITE | L.F_SEAL_SEAL
SEALS_REGION = L.F_SEAL_SHRINK | L.F_SEAL_GROW | L.F_SEAL_SEAL
ROW = L.OFF_CONSUMER_TABLE


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


def memfd(name, size, seals):
    """A sealable shmem memfd of size bytes, allocated, mapped read-write, then sealed (spec §1)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.posix_fallocate(fd, 0, size)
    mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    if seals:
        add_seals(fd, seals)
    return fd, mm


class Consumer:
    """The producer's record of one attached consumer."""

    def __init__(self, sock, index, generation, region_fd, region_mm, released):
        self.sock, self.index, self.generation = sock, index, generation
        self.region_fd, self.region_mm = region_fd, region_mm
        self.r64 = memoryview(region_mm).cast("Q")
        self.r32 = memoryview(region_mm).cast("I")
        self._cf = ctypes.c_uint32.from_buffer(region_mm, L.REG_CONSUMER_FUTEX)
        self._rf = ctypes.c_uint32.from_buffer(region_mm, L.REG_RELEASE_FUTEX)
        self.cf_addr, self.rf_addr = ctypes.addressof(self._cf), ctypes.addressof(self._rf)
        self.released = released

    @property
    def tail(self):
        return self.r64[L.REG_TAIL >> 3]


class FakeProducer:
    def __init__(self, directory, name, slot_count=8, slot_size=256, max_items=8, meta_size=4096,
                 packet_size=0, page_size=4096, policy=L.POLICY_DROP, start_position=0, max_consumers=8,
                 header_overrides=None, seals=SEALS_SHARED, data_size=None, ctl_size=None, block_timeout=5.0,
                 serve=True):
        self.dir, self.name = directory, name
        self.socket_path = os.path.join(directory, name + L.SOCKET_SUFFIX)
        self.slot_count, self.slot_size, self.max_items = slot_count, slot_size, max_items
        self.policy, self.max_consumers, self.block_timeout = policy, max_consumers, block_timeout
        off = 0
        g = {"desc_offset": off}
        off = align(off + slot_count * L.DESC_SIZE)
        g["items_offset"] = off
        off = align(off + slot_count * max_items * L.ITEM_SIZE)
        g["meta_offset"] = off
        off = align(off + meta_size)
        g["payload_offset"] = off
        off = align(off + slot_count * slot_size)
        g["packet_offset"] = off if packet_size else 0
        off = align(off + packet_size)
        g["data_size"] = align(off, page_size)
        self.g = g
        # memory: sealed memfds, mapped read-write here
        self.data_size = g["data_size"] if data_size is None else data_size
        self.ctl_size = L.ctl_size_for(max_consumers) if ctl_size is None else ctl_size
        self.data_fd, self.data = memfd("ibvbridge-data", self.data_size, seals)
        self.ctl_fd, self.ctl = memfd("ibvbridge-ctl", self.ctl_size, seals)
        self.region_seals = SEALS_REGION
        self.desc = np.frombuffer(self.data, L.DESC_DTYPE, slot_count, g["desc_offset"])
        self.items = np.frombuffer(self.data, L.ITEM_DTYPE, slot_count * max_items,
                                   g["items_offset"]).reshape(slot_count, max_items)
        self.payload = np.frombuffer(self.data, np.uint8, slot_count * slot_size,
                                     g["payload_offset"]).reshape(slot_count, slot_size)
        self.meta_off, self.meta_size = g["meta_offset"], meta_size
        self.session_id = secrets.randbits(63) | 1
        hdr = dict(magic=L.MAGIC, major=L.MAJOR_VERSION, minor=L.MINOR_VERSION, ctl_size=self.ctl_size,
                   state=L.STATE_READY, policy=policy, session_id=self.session_id, producer_pid=os.getpid(),
                   producer_start_ns=time.time_ns(), slot_count=slot_count, slot_size=slot_size,
                   max_items=max_items, desc_size=L.DESC_SIZE, item_size=L.ITEM_SIZE, page_size=page_size,
                   data_size=g["data_size"], desc_offset=g["desc_offset"], items_offset=g["items_offset"],
                   meta_offset=g["meta_offset"], meta_size=meta_size, payload_offset=g["payload_offset"],
                   packet_offset=g["packet_offset"], packet_size=packet_size, features=0,
                   stats_count=L.STATS_COUNT, max_consumers=max_consumers)
        hdr.update(header_overrides or {})
        self.hdr = hdr
        L.HEADER_STRUCT.pack_into(self.ctl, 0, *(hdr[f] for f in L.HEADER_FIELDS))
        self.c64 = memoryview(self.ctl).cast("Q")
        self.c32 = memoryview(self.ctl).cast("I")
        self.head = start_position & M64
        self.c64[L.OFF_HEAD >> 3] = self.head
        self.c64[L.OFF_HEARTBEAT_NS >> 3] = time.time_ns()
        self.reclaimed = self.head  # positions < reclaimed have their slots back in the pool
        self.c64[L.OFF_OLDEST >> 3] = self.reclaimed
        self.free = list(range(slot_count))
        self.slot_of = {}
        self.dropped = 0
        self.closed = False
        self.conns = {}  # row index -> Consumer
        self.lock = threading.RLock()
        # test hooks
        self.refuse = None
        self.welcome_hook = None
        self.fds_hook = None
        self.refused = []  # (status, message) of every error record sent
        # the socket
        try:
            os.unlink(self.socket_path)  # a stale socket of a dead producer
        except FileNotFoundError:
            pass
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self.listener.bind(self.socket_path)
        os.chmod(self.socket_path, 0o600)
        self.listener.listen(64)
        self._stop_r, self._stop_w = os.pipe()
        self._thread = None
        if serve:
            self._thread = threading.Thread(target=self._serve, name=f"fake-producer-{name}", daemon=True)
            self._thread.start()

    # ---------------------------------------------------------------- the socket (spec §1.2)
    def _serve(self):
        poller = select.poll()
        poller.register(self.listener, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        watched = {}
        while True:
            with self.lock:
                live = {c.sock.fileno(): c for c in self.conns.values() if c.sock.fileno() >= 0}
            for fd in set(watched) - set(live):
                try:
                    poller.unregister(fd)
                except (KeyError, ValueError):
                    pass
                del watched[fd]
            for fd, c in live.items():
                if watched.get(fd) is not c:
                    if fd in watched:
                        poller.unregister(fd)
                    poller.register(fd, select.POLLIN | select.POLLRDHUP)
                    watched[fd] = c
            try:
                events = poller.poll(50)
            except InterruptedError:
                continue
            for fd, ev in events:
                if fd == self._stop_r:
                    return
                if fd == self.listener.fileno():
                    try:
                        conn, _ = self.listener.accept()
                    except OSError:
                        continue
                    try:
                        self._handshake(conn)
                    except OSError:
                        conn.close()
                    continue
                c = watched.get(fd)
                if c is None:
                    continue
                gone = bool(ev & (select.POLLHUP | select.POLLRDHUP | select.POLLERR | select.POLLNVAL))
                if not gone:
                    try:
                        gone = c.sock.recv(256, socket.MSG_DONTWAIT) == b""
                    except BlockingIOError:
                        pass
                    except OSError:
                        gone = True
                if gone:
                    try:
                        poller.unregister(fd)
                    except (KeyError, ValueError):
                        pass
                    del watched[fd]
                    self._consumer_left(c)

    def serve_once(self, timeout=2.0):
        """Accept and answer one connection on the caller's thread (for producers made with serve=False)."""
        self.listener.settimeout(timeout)
        conn, _ = self.listener.accept()
        self.listener.settimeout(None)
        self._handshake(conn)

    def _refuse(self, conn, status, message):
        self.refused.append((status, message))
        conn.send(L.pack_error(status, message))
        conn.close()

    def _handshake(self, conn):
        conn.settimeout(2.0)
        msg = conn.recv(256)
        if self.refuse is not None:
            return self._refuse(conn, *self.refuse)
        try:
            h = L.unpack_hello(msg)
        except ValueError:
            h = None
        if h is None or h["magic"] != L.MAGIC:
            return self._refuse(conn, L.STATUS_PROTOCOL, f"hello of {len(msg)} bytes is not an ibvbridge hello")
        if h["major"] != L.MAJOR_VERSION:
            return self._refuse(conn, L.STATUS_VERSION, f"ring {self.name} is layout {L.MAJOR_VERSION}."
                                f"{L.MINOR_VERSION}; this client speaks {h['major']}.{h['minor']}")
        pid, uid, _ = peer_cred(conn)
        if uid not in (0, os.geteuid()):
            return self._refuse(conn, L.STATUS_NOT_PERMITTED, f"uid {uid} may not read ring {self.name}")
        if self.closed or self.c32[L.OFF_STATE >> 2] == L.STATE_CLOSED:
            return self._refuse(conn, L.STATUS_CLOSING, f"ring {self.name} is closing: the stream has ended")
        if h["role"] == L.ROLE_OBSERVER:
            rec = L.pack_welcome(L.NO_CONSUMER_INDEX, 0, self.session_id, self.ctl_size, 0, 0)
            socket.send_fds(conn, [rec], [self.ctl_fd])
            conn.close()
            return
        if h["role"] != L.ROLE_CONSUMER or h["start"] not in (L.START_OLDEST, L.START_HEAD):
            return self._refuse(conn, L.STATUS_PROTOCOL, f"bad role {h['role']} or start {h['start']}")
        rfd, rmm = memfd("ibvbridge-region", L.REGION_SIZE, self.region_seals)
        with self.lock:
            free = [i for i in range(self.max_consumers) if i not in self.conns]
            if not free:
                rmm.close()
                os.close(rfd)
                return self._refuse(conn, L.STATUS_BUSY, f"ring {self.name} busy: all {self.max_consumers} "
                                    "consumer rows are attached")
            idx = free[0]
            start = self.reclaimed if h["start"] == L.START_OLDEST else self.c64[L.OFF_HEAD >> 3]
            rmm[0:8] = start.to_bytes(8, "little")
            gen = (self.row_get(idx, "generation") + 1) & 0xFFFFFFFF
            self.row_set(idx, generation=gen, pid=pid, uid=uid, attach_ns=time.time_ns(), released=start,
                         wakes=0, lost_heaps=0)
            full_fence()
            self.row_set(idx, state=L.CONSUMER_ATTACHED)  # last
            c = Consumer(conn, idx, gen, rfd, rmm, start)
            self.conns[idx] = c
            self.set_stat(10, len(self.conns))
        rec = L.pack_welcome(idx, gen, self.session_id, self.ctl_size, self.data_size, L.REGION_SIZE)
        if self.welcome_hook is not None:
            rec = self.welcome_hook(rec)
        fds = [self.ctl_fd, self.data_fd, rfd]
        if self.fds_hook is not None:
            fds = self.fds_hook(fds)
        try:
            if fds:
                socket.send_fds(conn, [rec], fds)
            else:
                conn.send(rec)
        except OSError:
            self._consumer_left(c)
        conn.setblocking(False)

    def _consumer_left(self, c):
        """The consumer's socket hung up: its row becomes gone and it stops counting (spec §7.6)."""
        with self.lock:
            if self.conns.get(c.index) is c:
                del self.conns[c.index]
                if self.row_get(c.index, "generation") == c.generation:
                    self.row_set(c.index, state=L.CONSUMER_GONE)
                self.set_stat(10, len(self.conns))
            c.sock.close()

    def detach(self, index, state, lost_heaps=None):
        """Detach consumer row index as the producer does (spec §7.2, §7.3): the row says why (state last),
        the counter counts it, the socket is closed."""
        with self.lock:
            c = self.conns.pop(index)
            if lost_heaps is None:
                lost_heaps = (self.c64[L.OFF_HEAD >> 3] - c.released) & M64
            self.row_set(index, lost_heaps=lost_heaps, released=c.released)
            full_fence()
            self.row_set(index, state=state)
            if state == L.CONSUMER_OVERRUN:
                self.set_stat(11, self.c64[(L.OFF_STATS >> 3) + 11] + 1)
            elif state == L.CONSUMER_BAD_CURSOR:
                self.set_stat(12, self.c64[(L.OFF_STATS >> 3) + 12] + 1)
            self.set_stat(10, len(self.conns))
            c.sock.close()

    def wait_consumers(self, n, timeout=5.0):
        """Wait until exactly n consumers are attached (the serve thread notices hang-ups asynchronously)."""
        deadline = time.monotonic() + timeout
        while len(self.conns) != n:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(self.conns)} consumers attached, want {n}")
            time.sleep(0.005)

    # ---------------------------------------------------------------- consumer table
    def row_off(self, index, field):
        return ROW + L.ROW_SIZE * index + getattr(L, "ROW_" + field.upper())

    def row_get(self, index, field):
        o = self.row_off(index, field)
        return self.c32[o >> 2] if field in ("state", "generation") else self.c64[o >> 3]

    def row_set(self, index, **fields):
        for field, v in fields.items():
            o = self.row_off(index, field)
            if field in ("state", "generation"):
                self.c32[o >> 2] = v & 0xFFFFFFFF
            else:
                self.c64[o >> 3] = v & M64

    # ---------------------------------------------------------------- slots (spec §7.1-7.4)
    def _check_cursors(self):
        """Read each attached consumer's tail; detach it (bad cursor) if it moved backwards or past head."""
        head = self.c64[L.OFF_HEAD >> 3]
        for c in list(self.conns.values()):
            t = c.tail
            if (t - c.released) & M64 <= (head - c.released) & M64:
                c.released = t
                self.row_set(c.index, released=t)
            else:
                self.detach(c.index, L.CONSUMER_BAD_CURSOR, lost_heaps=0)

    def _free_to(self, point):
        while self.reclaimed != point:
            self.free.append(self.slot_of.pop(self.reclaimed))
            self.reclaimed = (self.reclaimed + 1) & M64
        self.c64[L.OFF_OLDEST >> 3] = self.reclaimed

    def _reclaim(self):
        """Give back the slots every attached consumer has released: up to the lowest released cursor."""
        self._check_cursors()
        if self.conns:
            point = min((c.released for c in self.conns.values()), key=lambda r: (r - self.reclaimed) & M64)
            self._free_to(point)

    def _slowest(self):
        return min(self.conns.values(), key=lambda c: (c.released - self.reclaimed) & M64)

    def _acquire(self, slot=None):
        deadline = time.monotonic() + self.block_timeout
        while True:
            wait = None
            with self.lock:
                if not self.free or (slot is not None and slot not in self.free):
                    self._reclaim()
                if self.free and (slot is None or slot in self.free):
                    if slot is None:
                        return self.free.pop(0)
                    self.free.remove(slot)
                    return slot
                published = self.c64[L.OFF_HEAD >> 3]
                if self.policy == L.POLICY_DROP:
                    if self.conns:
                        slow = self._slowest()
                        if any(c.released != slow.released for c in self.conns.values()):
                            for c in [c for c in self.conns.values() if c.released == slow.released]:
                                self.detach(c.index, L.CONSUMER_OVERRUN)
                            continue
                    elif self.reclaimed != published:
                        self._free_to((self.reclaimed + 1) & M64)  # nobody attached: drop the oldest
                        continue
                    return self._drop()
                if time.monotonic() > deadline:
                    return self._drop()
                if self.conns:
                    c = self._slowest()
                    f = c.r32[L.REG_RELEASE_FUTEX >> 2]
                    self.c32[L.OFF_PRODUCER_WAITING >> 2] = 1
                    full_fence()
                    if c.tail == c.released:
                        wait = (c.rf_addr, f, c)
                    else:
                        self.c32[L.OFF_PRODUCER_WAITING >> 2] = 0  # it moved meanwhile: reclaim again
            if wait is None:
                if not self.conns:
                    time.sleep(0.005)  # block: wait for a consumer to attach
                continue
            futex_wait(wait[0], wait[1], min(0.25, max(0.0, deadline - time.monotonic())))
            self.c32[L.OFF_PRODUCER_WAITING >> 2] = 0

    def _drop(self):
        self.dropped += 1
        self.c64[(L.OFF_STATS >> 3) + 4] = self.dropped
        return None

    # ---------------------------------------------------------------- publishing
    def publish(self, heap_cnt, payload=b"", items=(), flags=L.FLAG_COMPLETE, heap_size=None, received=None,
                packets=1, slot=None, commit=True, desc_overrides=None, timestamp_ns=None):
        """Publish one heap; returns its position, or None when dropped (no free slot)."""
        s = self._acquire(slot)
        if s is None:
            return None
        with self.lock:
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
        """Release-store head, full fence, then wake every consumer that announced it waits (spec §7.5)."""
        with self.lock:
            self.c64[L.OFF_HEAD >> 3] = self.head
            full_fence()
            self.wake_consumers()

    def wake_consumers(self, force=False):
        for c in list(self.conns.values()):
            r32 = c.r32
            if force or r32[L.REG_CONSUMER_WAITING >> 2] != 0:
                r32[L.REG_CONSUMER_WAITING >> 2] = 0
                r32[L.REG_CONSUMER_FUTEX >> 2] = (r32[L.REG_CONSUMER_FUTEX >> 2] + 1) & 0xFFFFFFFF
                futex_wake(c.cf_addr)
                self.row_set(c.index, wakes=self.row_get(c.index, "wakes") + 1)

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

    def consumer(self, index=None):
        """The Consumer record of row index (the only one attached when index is None)."""
        if index is None:
            (c,) = self.conns.values()
            return c
        return self.conns[index]

    # ---------------------------------------------------------------- stopping
    def close(self):
        """Clean stop (spec §7.6): state CLOSED, wake every consumer, close every connection, remove the
        socket. The memory stays mapped (consumers keep theirs; the tests may look at ours)."""
        if self.closed:
            return
        self.closed = True
        with self.lock:
            self.c32[L.OFF_STATE >> 2] = L.STATE_CLOSED
            full_fence()
            self.wake_consumers(force=True)
        self._stop(unlink=True)

    def die(self):
        """Simulate a crash: every socket closes (as the kernel would), no CLOSED, the socket file stays."""
        self.closed = True
        self._stop(unlink=False)

    def _stop(self, unlink):
        os.write(self._stop_w, b"x")
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        with self.lock:
            for c in self.conns.values():
                c.sock.close()
        self.listener.close()
        if unlink:
            try:
                os.unlink(self.socket_path)
            except FileNotFoundError:
                pass
        for fd in (self._stop_r, self._stop_w, self.ctl_fd, self.data_fd):
            try:
                os.close(fd)
            except OSError:
                pass


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
