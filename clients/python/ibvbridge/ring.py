"""Consumer side of the ibvbridge shared-memory heap ring (docs/ring-layout.md, layout 1.x).

A Ring is attached to a control file (read-write mapping: cursors, wake words, counters) and a data file
(read-only mapping: descriptors, item tables, stream metadata, payload slots). Heaps are handed out as
zero-copy views into the data mapping; a view is valid until its heap is released (spec §10).

Supported platform: Linux x86-64. Plain loads and stores through memoryview / ctypes are single aligned
moves there, which have acquire / release semantics under x86-64's TSO memory model; full fences are a
locked instruction (an uncontended threading.Lock).

A Ring is not thread-safe: use it from one thread.
"""

import ast
import collections
import ctypes
import errno
import fcntl
import mmap
import os
import re
import time

from . import layout as L
from ._sys import full_fence, futex_wait, futex_wake
from .errors import (CorruptRing, EndOfStream, ProducerGone, RingBusy, RingError, RingNotFound, Timeout,
                     VersionMismatch)

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy is optional until a view is asked for
    np = None

__all__ = ["Ring", "Heap", "Item", "Batch", "ItemDescriptor", "Geometry", "ctl_path_for", "validate_geometry"]

_M64 = (1 << 64) - 1
_NAME_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$")
DEFAULT_DIR = "/dev/shm"
SPIN_SECONDS = 50e-6  # spin before sleeping (spec §7.4)
ACTIVE_NAPS = 8  # a stream whose head moved within this many naps is active (max_latency)

# word indexes into the control file, for memoryview.cast("Q") / cast("I")
_Q_HEAD = L.OFF_HEAD >> 3
_Q_TAIL = L.OFF_TAIL >> 3
_Q_CONSUMER_PID = L.OFF_CONSUMER_PID >> 3
_Q_CONSUMER_ATTACH_NS = L.OFF_CONSUMER_ATTACH_NS >> 3
_Q_HEARTBEAT_NS = L.OFF_HEARTBEAT_NS >> 3
_Q_STATS = L.OFF_STATS >> 3
_Q_MAGIC = L.OFF_MAGIC >> 3
_I_STATE = L.OFF_STATE >> 2
_I_CONSUMER_WAITING = L.OFF_CONSUMER_WAITING >> 2
_I_CONSUMER_FUTEX = L.OFF_CONSUMER_FUTEX >> 2
_I_PRODUCER_WAITING = L.OFF_PRODUCER_WAITING >> 2
_I_PRODUCER_FUTEX = L.OFF_PRODUCER_FUTEX >> 2

_unpack_desc = L.DESC_STRUCT.unpack_from
_iter_items = L.ITEM_STRUCT.iter_unpack


def _need_numpy():
    if np is None:
        raise RingError("numpy is required for array views (apt install python3-numpy)")


def ctl_path_for(name_or_path, directory=DEFAULT_DIR):
    """The control file of a ring name, or the path itself when given a path (anything with a '/')."""
    s = os.fspath(name_or_path)
    if "/" in s:
        if not s.endswith(".ctl"):
            raise RingError(f"control file {s}: path must end in .ctl")
        return s
    if not _NAME_RE.match(s):
        raise RingError(f"ring name {s!r}: use 1-64 characters from [A-Za-z0-9_.-], not starting with '.'")
    return os.path.join(directory, f"ibvbridge.{s}.v{L.MAJOR_VERSION}.ctl")


class Geometry(collections.namedtuple("Geometry", (
        "slot_count", "slot_size", "max_items", "page_size", "data_file_size", "desc_offset", "items_offset",
        "meta_offset", "meta_size", "payload_offset", "packet_offset", "packet_size"))):
    """Where everything lies in the data file (spec §3)."""


def validate_geometry(hdr):
    """Check a decoded header's geometry as spec §7.2 step 4 requires; return a Geometry or raise CorruptRing.

    Python integers do not overflow, so every size below is exact; anything beyond data_file_size (a u64)
    is rejected.
    """
    def bad(msg):
        return CorruptRing("corrupt ring geometry: " + msg)

    sc, ss, mi = hdr["slot_count"], hdr["slot_size"], hdr["max_items"]
    if sc == 0 or sc > L.MAX_SLOT_COUNT or sc & (sc - 1):
        raise bad(f"slot_count {sc} is not a power of two in 1..{L.MAX_SLOT_COUNT}")
    if ss == 0 or ss % 64:
        raise bad(f"slot_size {ss} is not a non-zero multiple of 64")
    if mi == 0 or mi > L.MAX_ITEMS:
        raise bad(f"max_items {mi} not in 1..{L.MAX_ITEMS}")
    if hdr["desc_size"] != L.DESC_SIZE:
        raise bad(f"desc_size {hdr['desc_size']}, want {L.DESC_SIZE}")
    if hdr["item_size"] != L.ITEM_SIZE:
        raise bad(f"item_size {hdr['item_size']}, want {L.ITEM_SIZE}")
    ps = hdr["page_size"]
    if ps < 4096 or ps & (ps - 1):
        raise bad(f"page_size {ps} is not a power of two >= 4096")
    dfs = hdr["data_file_size"]
    if dfs == 0 or dfs % ps:
        raise bad(f"data_file_size {dfs} is not a non-zero multiple of page_size {ps}")
    if hdr["meta_size"] < L.META_HEADER_SIZE:
        raise bad(f"meta_size {hdr['meta_size']} < {L.META_HEADER_SIZE}")
    regions = (
        ("descriptors", hdr["desc_offset"], sc * L.DESC_SIZE),
        ("item tables", hdr["items_offset"], sc * mi * L.ITEM_SIZE),
        ("metadata", hdr["meta_offset"], hdr["meta_size"]),
        ("payload", hdr["payload_offset"], sc * ss),
        ("packet area", hdr["packet_offset"], hdr["packet_size"]),
    )
    for i, (name, off, size) in enumerate(regions):
        if off % L.REGION_ALIGN:
            raise bad(f"{name} offset {off} is not {L.REGION_ALIGN}-aligned")
        if off + size > dfs:
            raise bad(f"{name} [{off}, +{size}) runs past data_file_size {dfs}")
        for oname, ooff, osize in regions[:i]:
            if size and osize and off < ooff + osize and ooff < off + size:
                raise bad(f"{name} overlaps {oname}")
    return Geometry(sc, ss, mi, ps, dfs, hdr["desc_offset"], hdr["items_offset"], hdr["meta_offset"],
                    hdr["meta_size"], hdr["payload_offset"], hdr["packet_offset"], hdr["packet_size"])


class ItemDescriptor(collections.namedtuple("ItemDescriptor",
                                            ("id", "name", "description", "shape", "dtype", "format",
                                             "order", "dtype_header"))):
    """A SPEAD item descriptor from the stream-metadata area (spec §6).

    shape: tuple (-1 for a variable dimension) or None when unknown; dtype: numpy dtype parsed from the
    numpy header text (None when the stream gave none, or numpy is missing); format: the raw SPEAD format
    field (bytes); order: 'C' or 'F'; dtype_header: the raw numpy header text.
    """


def _parse_metadata(buf):
    """Parse the records of the stream-metadata area into {id: ItemDescriptor}; CorruptRing if malformed."""
    out = {}
    off, n = 0, len(buf)
    while off < n:
        if n - off < L.META_RECORD_HEADER_SIZE:
            raise CorruptRing(f"metadata record at {off} shorter than its header")
        rsize, ndim, iid, nlen, dlen, flen, tlen = L.META_RECORD_STRUCT.unpack_from(buf, off)
        if rsize < L.META_RECORD_HEADER_SIZE or rsize % 8 or off + rsize > n:
            raise CorruptRing(f"metadata record at {off}: record_size {rsize} invalid or past length {n}")
        nshape = 0 if ndim == L.NDIM_UNKNOWN else ndim
        need = L.META_RECORD_HEADER_SIZE + 8 * nshape + nlen + dlen + flen + tlen
        if need > rsize:
            raise CorruptRing(f"metadata record at {off}: fields ({need} bytes) run past record_size {rsize}")
        p = off + L.REC_SHAPE
        shape = None if ndim == L.NDIM_UNKNOWN else tuple(
            int.from_bytes(buf[p + 8 * k:p + 8 * k + 8], "little", signed=True) for k in range(ndim))
        p += 8 * nshape
        name = bytes(buf[p:p + nlen]).decode("utf-8", "replace"); p += nlen
        desc = bytes(buf[p:p + dlen]).decode("utf-8", "replace"); p += dlen
        fmt = bytes(buf[p:p + flen]); p += flen
        header = bytes(buf[p:p + tlen]).decode("ascii", "replace")
        dtype, order = None, "C"
        if header:
            try:
                h = ast.literal_eval(header)
                if not isinstance(h, dict):
                    raise ValueError("not a dict")
                if h.get("fortran_order"):
                    order = "F"
                if "shape" in h and h["shape"] is not None:
                    shape = tuple(int(x) for x in h["shape"])
                if np is not None:
                    dtype = np.dtype(h["descr"])
            except (ValueError, SyntaxError, TypeError, KeyError, MemoryError, RecursionError) as e:
                raise CorruptRing(f"metadata record for item {iid:#x}: bad numpy header {header!r}: {e}")
        out[iid] = ItemDescriptor(iid, name, desc, shape, dtype, fmt, order, header)
        off += rsize
    return out


class Item:
    """One item pointer of a heap (spec §5). For an immediate item ``value`` is the item; for an address
    item ``value`` is the offset of its bytes in the payload, ``length`` their count and ``data`` a
    read-only zero-copy memoryview of them."""

    __slots__ = ("id", "value", "length", "flags", "_heap")

    def __init__(self, heap, iid, value, length, flags):
        self._heap = heap
        self.id = iid
        self.value = value
        self.length = length
        self.flags = flags

    @property
    def immediate(self):
        return bool(self.flags & L.ITEM_IMMEDIATE)

    @property
    def data(self):
        if self.flags & L.ITEM_IMMEDIATE:
            return None
        h = self._heap
        h._check_live()
        start = h._base + self.value
        return h._mv[start:start + self.length]

    def __repr__(self):
        if self.immediate:
            return f"Item(id={self.id:#x}, immediate, value={self.value:#x})"
        return f"Item(id={self.id:#x}, offset={self.value}, length={self.length})"


class Heap:
    """A heap read from the ring. Its payload and item views are valid until ``release()`` (or the end of a
    ``with`` block, or the next step of ``for heap in ring``); ``copy()`` what must outlive it."""

    __slots__ = ("_ring", "_entry", "_buf", "_mv", "_base", "_raw", "_items_off", "position", "heap_cnt",
                 "heap_size", "received", "timestamp_ns", "slot", "flags", "item_count", "packets", "_released",
                 "_descmap")

    @property
    def _raw_items(self):
        """The item table as (id, value, length, flags) tuples, parsed and checked on first use (spec §7.3:
        an address item past the slot is a corrupt ring), so a loop that never looks at items pays
        nothing for them."""
        raw = self._raw
        if raw is None:
            self._check_live()
            n = self.item_count
            o = self._items_off
            raw = [t[:4] for t in _iter_items(self._mv[o:o + n * L.ITEM_SIZE])] if n else []
            ss = self._ring._geo.slot_size
            for iid, value, length, iflags in raw:
                if not iflags & L.ITEM_IMMEDIATE and (value > ss or length > ss - value):
                    raise CorruptRing(f"corrupt descriptor at position {self.position}: item {iid:#x} "
                                      f"[{value}, +{length}) past slot_size {ss}")
            self._raw = raw
        return raw

    # ----- flags
    complete = property(lambda self: bool(self.flags & L.FLAG_COMPLETE))
    incomplete = property(lambda self: bool(self.flags & L.FLAG_INCOMPLETE))
    truncated = property(lambda self: bool(self.flags & L.FLAG_TRUNCATED))
    end_of_stream = property(lambda self: bool(self.flags & L.FLAG_END_OF_STREAM))
    has_descriptors = property(lambda self: bool(self.flags & L.FLAG_HAS_DESCRIPTORS))
    items_overflow = property(lambda self: bool(self.flags & L.FLAG_ITEMS_OVERFLOW))
    no_heap_size = property(lambda self: bool(self.flags & L.FLAG_NO_HEAP_SIZE))

    def _check_live(self):
        if self._released:
            raise RingError(f"heap at position {self.position} was released: its memory belongs to the producer")
        if self._ring is not None and self._ring._closed:
            raise RingError("ring is closed")

    @property
    def released(self):
        return self._released

    @property
    def payload(self):
        """payload[0:received] as a read-only memoryview into the data mapping (no copy)."""
        self._check_live()
        return self._mv[self._base:self._base + self.received]

    @property
    def items(self):
        return [Item(self, *t) for t in self._raw_items]

    def find(self, item_id):
        """The first item with this id, or None."""
        for t in self._raw_items:
            if t[0] == item_id:
                return Item(self, *t)
        return None

    def item(self, item_id):
        """The first item with this id; KeyError if the heap has none."""
        it = self.find(item_id)
        if it is None:
            raise KeyError(f"heap {self.heap_cnt} has no item {item_id:#x}")
        return it

    def array(self, item_id, dtype=None, shape=None):
        """An address item as a read-only numpy array VIEW into the data mapping (no copy).

        dtype / shape default to the stream's item descriptor (spec §6) when known, else uint8 / 1-D.
        A -1 in the shape is the variable dimension. ValueError when the item is too short for the shape.
        """
        _need_numpy()
        self._check_live()
        it = self.find(item_id)
        if it is None:
            raise KeyError(f"heap {self.heap_cnt} has no item {item_id:#x}")
        if it.flags & L.ITEM_IMMEDIATE:
            raise TypeError(f"item {item_id:#x} is immediate: use heap.item({item_id:#x}).value")
        order = "C"
        if dtype is None or shape is None:
            d = (self._ring.descriptors() if self._ring is not None else self._descmap or {}).get(item_id)
            if d is not None:
                if dtype is None:
                    dtype = d.dtype
                if shape is None:
                    shape = d.shape
                order = d.order
        dt = np.dtype(np.uint8 if dtype is None else dtype)
        if dt.itemsize == 0:
            raise ValueError(f"dtype {dt} has no size")
        if shape is None:
            count = it.length // dt.itemsize
            shape = (count,)
        else:
            shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
            known = 1
            for s in shape:
                if s != -1:
                    known *= s
            if -1 in shape:
                if shape.count(-1) > 1:
                    raise ValueError(f"shape {shape} has more than one variable dimension")
                var = it.length // (known * dt.itemsize) if known else 0
                shape = tuple(var if s == -1 else s for s in shape)
            count = 1
            for s in shape:
                count *= s
        if count * dt.itemsize > it.length:
            raise ValueError(f"item {item_id:#x}: {it.length} bytes are too few for {shape} of {dt}")
        a = np.frombuffer(self._buf, dtype=dt, count=count, offset=self._base + it.value)
        return a.reshape(shape, order=order)

    def copy(self):
        """A detached copy (payload and items) that stays valid after release and close."""
        self._check_live()
        h = Heap.__new__(Heap)
        buf = bytes(self._mv[self._base:self._base + self.received])
        # items may point past `received` (incomplete heaps): keep whole item ranges inside the copy
        end = max([self.received] + [t[1] + t[2] for t in self._raw_items if not t[3] & L.ITEM_IMMEDIATE])
        if end > self.received:
            buf = bytes(self._mv[self._base:self._base + end])
        h._ring, h._entry, h._buf, h._mv, h._base = None, None, buf, memoryview(buf), 0
        h._raw = list(self._raw_items)
        h._items_off = 0
        for f in ("position", "heap_cnt", "heap_size", "received", "timestamp_ns", "slot", "flags",
                  "item_count", "packets"):
            setattr(h, f, getattr(self, f))
        h._released = False
        h._descmap = self._ring.descriptors() if self._ring is not None else self._descmap
        return h

    def release(self):
        """Give the heap's slot back to the producer (in position order: a heap released before older held
        heaps takes effect when they are released). Idempotent."""
        if not self._released:
            self._released = True
            r = self._ring
            if r is not None and not r._closed:
                if self._entry is None:
                    r._release_through(self.position)  # handed out by the iterator's fast path
                else:
                    r._release_entry(self._entry)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        return (f"Heap(position={self.position}, heap_cnt={self.heap_cnt}, heap_size={self.heap_size}, "
                f"received={self.received}, flags={self.flags:#x}, items={len(self._raw_items)})")

class Batch:
    """Up to ``max_heaps`` consecutive published heaps, as numpy views over the descriptor array.

    Arrays (zero-copy, read-only, valid until release): ``descs`` (structured, layout.DESC_DTYPE) and its
    fields ``seq``, ``heap_cnt``, ``heap_size``, ``received``, ``timestamp_ns``, ``slot``, ``flags``,
    ``item_count``, ``packets``. ``payloads(nbytes)`` gives the payload bytes as an (n, nbytes) uint8 array.
    ``release()`` (or leaving ``with``) gives all n slots back with one tail store.
    """

    def __init__(self, ring, descs, position, entry):
        self._ring = ring
        self._entry = entry
        self.descs = descs
        self.position = position
        self._released = False

    def __len__(self):
        return len(self.descs)

    def __getattr__(self, name):
        if name in L.DESC_FIELDS:
            return self.descs[name]
        raise AttributeError(name)

    @property
    def released(self):
        return self._released

    def _check_live(self):
        if self._released:
            raise RingError(f"batch at position {self.position} was released")
        if self._ring._closed:
            raise RingError("ring is closed")

    @property
    def consecutive(self):
        """True when the heaps' slots are consecutive, so payloads() is a zero-copy strided view."""
        s = self.descs["slot"]
        n = len(s)
        if n == 0:
            return True
        s0 = int(s[0])
        return s0 + n <= self._ring._geo.slot_count and bool((np.diff(s.astype(np.int64)) == 1).all())

    def payloads(self, nbytes=None):
        """The first nbytes (default slot_size) of each heap's slot as an (n, nbytes) uint8 array: a
        zero-copy strided view into the data mapping when the slots are consecutive, else a gathered copy.
        Bytes past a heap's ``received`` are whatever the slot holds (mask with ``received``)."""
        self._check_live()
        r = self._ring
        if nbytes is None:
            nbytes = r._geo.slot_size
        if not 0 <= nbytes <= r._geo.slot_size:
            raise ValueError(f"nbytes {nbytes} not in 0..slot_size {r._geo.slot_size}")
        s = self.descs["slot"]
        if self.consecutive:
            s0 = int(s[0]) if len(s) else 0
            return r._payload2d[s0:s0 + len(s), :nbytes]
        return r._payload2d[s.astype(np.intp), :nbytes]

    def item_table(self):
        """(items, valid): the heaps' item tables gathered as an (n, k) structured array (layout.ITEM_DTYPE,
        a copy; k = max item_count) and the (n, k) mask of valid entries."""
        self._check_live()
        r = self._ring
        counts = self.descs["item_count"]
        k = int(counts.max()) if len(counts) else 0
        items = r._items2d[self.descs["slot"].astype(np.intp), :k]
        valid = np.arange(k, dtype=np.uint32)[None, :] < counts[:, None]
        return items, valid

    def find_item(self, item_id):
        """(found, items): for each heap, whether it has an item with this id, and the first such item
        (structured ITEM_DTYPE array of length n; rows where found is False are meaningless)."""
        items, valid = self.item_table()
        n = len(self.descs)
        if items.shape[1] == 0:
            return np.zeros(n, dtype=bool), np.zeros(n, dtype=L.ITEM_DTYPE)
        match = (items["id"] == np.uint64(item_id)) & valid
        found = match.any(axis=1)
        first = match.argmax(axis=1)
        return found, items[np.arange(n), first]

    def release(self):
        if not self._released:
            self._released = True
            if not self._ring._closed:
                self._ring._release_entry(self._entry)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        return f"Batch(position={self.position}, n={len(self.descs)})"


class Ring:
    """A consumer attached to one ring. Use ``Ring.attach(name)``."""

    def __init__(self):  # use Ring.attach
        self._closed = True
        self._ctl_fd = self._cons_fd = None
        self._ctl_mm = self._data_mm = None
        self._c64 = self._c32 = self._dmv = None
        self._cfutex = self._pfutex = None
        self._desc_arr = self._items2d = self._payload2d = None

    # ------------------------------------------------------------------ attach (spec §7.2)
    @classmethod
    def attach(cls, name_or_path, timeout=10.0, directory=DEFAULT_DIR, max_latency=0.0):
        """Attach to a ring by name (files in ``directory``, default /dev/shm) or by control-file path.

        Waits up to ``timeout`` seconds for the control file to appear (RingNotFound) and to become READY
        (Timeout). Raises VersionMismatch, CorruptRing (checked before the data file is opened), RingBusy.

        ``max_latency`` (seconds), if positive, lets waits nap that long while the stream is moving instead
        of asking the producer for a wake per heap: less CPU per heap, up to that much more latency. An
        idle stream still sleeps on the futex. 0 (the default): spin, then futex.
        """
        self = cls()
        self._max_latency = max(0.0, float(max_latency))
        self._active_head, self._active_at = None, 0.0
        ctl = ctl_path_for(name_or_path, directory)
        self.name = name_or_path
        self.ctl_path = ctl
        deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
        try:
            self._attach(ctl, deadline)
        except BaseException:
            self._teardown()
            raise
        return self

    def _attach(self, ctl, deadline):
        while True:  # 1. open, retrying until it exists
            try:
                self._ctl_fd = os.open(ctl, os.O_RDWR | os.O_CLOEXEC)
                break
            except FileNotFoundError:
                if time.monotonic() >= deadline:
                    raise RingNotFound(f"ring {self.name} not found ({ctl})") from None
                time.sleep(0.01)
        st = os.fstat(self._ctl_fd)  # 2. size, map
        if st.st_size < L.CTL_SIZE:
            raise CorruptRing(f"control file {ctl} is {st.st_size} bytes, want {L.CTL_SIZE}")
        self._ctl_mm = mmap.mmap(self._ctl_fd, L.CTL_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._c64 = memoryview(self._ctl_mm).cast("Q")
        self._c32 = memoryview(self._ctl_mm).cast("I")
        self._closed = False
        while True:  # 3. magic, major, state
            magic = self._c64[_Q_MAGIC]
            if magic != 0:
                if magic != L.MAGIC:
                    raise CorruptRing(f"control file {ctl}: bad magic {magic:#x}, want {L.MAGIC:#x}")
                major = int.from_bytes(self._ctl_mm[L.OFF_MAJOR:L.OFF_MAJOR + 2], "little")
                if major != L.MAJOR_VERSION:
                    raise VersionMismatch(major, L.MAJOR_VERSION)
                if self._c32[_I_STATE] != L.STATE_INIT:
                    break
            if time.monotonic() >= deadline:
                raise Timeout(f"ring {self.name}: producer did not finish creating it (state INIT)")
            time.sleep(0.01)
        hdr = dict(zip(L.HEADER_FIELDS, L.HEADER_STRUCT.unpack_from(self._ctl_mm, 0)))
        if hdr["ctl_size"] != L.CTL_SIZE:
            raise CorruptRing(f"ctl_size {hdr['ctl_size']}, want {L.CTL_SIZE}")
        self._geo = g = validate_geometry(hdr)  # 4. geometry, before the data file is touched
        raw = self._ctl_mm[L.OFF_DATA_PATH:L.OFF_DATA_PATH + L.DATA_PATH_MAX]
        n = raw.find(b"\0")
        if n <= 0 or raw[0:1] != b"/":
            raise CorruptRing("data_path is not a NUL-terminated absolute path")
        self.data_path = os.fsdecode(raw[:n])
        self.header = hdr
        cons = ctl[:-4] + ".cons"  # 5. one consumer
        self._cons_fd = os.open(cons, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(self._cons_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RingBusy(f"ring {self.name} busy: another consumer is attached") from None
        try:  # 6. data file, read-only
            dfd = os.open(self.data_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise CorruptRing(f"data file {self.data_path} missing") from None
        try:
            size = os.fstat(dfd).st_size
            if size != g.data_file_size:
                raise CorruptRing(f"data file {self.data_path} is {size} bytes, header says {g.data_file_size}")
            self._data_mm = mmap.mmap(dfd, g.data_file_size, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(dfd)
        self._dmv = memoryview(self._data_mm)
        # futex word addresses (ctypes objects pin an export of the control mapping until close)
        self._cfutex = ctypes.c_uint32.from_buffer(self._ctl_mm, L.OFF_CONSUMER_FUTEX)
        self._pfutex = ctypes.c_uint32.from_buffer(self._ctl_mm, L.OFF_PRODUCER_FUTEX)
        self._cfutex_addr = ctypes.addressof(self._cfutex)
        self._pfutex_addr = ctypes.addressof(self._pfutex)
        if np is not None:  # persistent zero-copy views for the batch API
            self._desc_arr = np.frombuffer(self._data_mm, L.DESC_DTYPE, g.slot_count, g.desc_offset)
            self._items2d = np.frombuffer(self._data_mm, L.ITEM_DTYPE, g.slot_count * g.max_items,
                                          g.items_offset).reshape(g.slot_count, g.max_items)
            self._payload2d = np.frombuffer(self._data_mm, np.uint8, g.slot_count * g.slot_size,
                                            g.payload_offset).reshape(g.slot_count, g.slot_size)
        # 7. announce, start at tail
        self._c64[_Q_CONSUMER_PID] = os.getpid()
        self._c64[_Q_CONSUMER_ATTACH_NS] = time.time_ns()
        self.session_id = hdr["session_id"]
        self.producer_pid = hdr["producer_pid"]
        self._mask = g.slot_count - 1
        self._desc_base = g.desc_offset
        self._items_base = g.items_offset
        self._item_stride = g.max_items * L.ITEM_SIZE
        self._pay_base = g.payload_offset
        self._read = self._c64[_Q_TAIL]
        self._cached_head = self._read
        self._pending = collections.deque()
        # Releases are stored to tail once per batch (spec 7.3 step 5), and whenever the ring is found
        # empty, before a wait, and at close: a store (and producer wake) per heap makes a block-policy
        # producer sleep and wake once per heap.
        self._stored = self._released_to = self._read
        self._release_batch = min(max(self._geo.slot_count // 8, 1), 64)
        self._eos = False
        self._meta_seq = None
        self._meta = {}

    # ------------------------------------------------------------------ geometry and info
    slot_count = property(lambda self: self._geo.slot_count)
    slot_size = property(lambda self: self._geo.slot_size)
    max_items = property(lambda self: self._geo.max_items)
    page_size = property(lambda self: self._geo.page_size)
    data_file_size = property(lambda self: self._geo.data_file_size)
    geometry = property(lambda self: self._geo)
    policy = property(lambda self: self.header["policy"])
    major = property(lambda self: self.header["major"])
    minor = property(lambda self: self.header["minor"])
    closed = property(lambda self: self._closed)

    @property
    def state(self):
        return self._c32[_I_STATE]

    @property
    def head(self):
        return self._c64[_Q_HEAD]

    @property
    def tail(self):
        return self._c64[_Q_TAIL]

    @property
    def position(self):
        """The next position this consumer will read."""
        return self._read

    @property
    def heartbeat_ns(self):
        return self._c64[_Q_HEARTBEAT_NS]

    def stats(self):
        """The producer's counters by name (spec §2.6). Counters a newer minor adds are 'counter_<i>'."""
        self._check_open()
        n = min(self.header["stats_count"], L.STATS_SLOTS)
        c = self._c64
        out = {name: (c[_Q_STATS + i] if i < n else 0) for i, name in enumerate(L.COUNTER_NAMES)}
        for i in range(len(L.COUNTER_NAMES), n):
            out[f"counter_{i}"] = c[_Q_STATS + i]
        return out

    def producer_alive(self):
        """Liveness (spec §7.6): the producer holds flock(LOCK_EX) on the control file's inode."""
        try:
            fcntl.flock(self._ctl_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(self._ctl_fd, fcntl.LOCK_UN)
        return False

    def descriptors(self):
        """The stream's item descriptors, {id: ItemDescriptor}, from the metadata area (spec §6, seqlock
        read). Cached until the producer rewrites the area."""
        self._check_open()
        g = self._geo
        base = g.meta_offset
        dmv = self._dmv
        deadline = time.monotonic() + 1.0
        while True:
            s1 = int.from_bytes(dmv[base:base + 8], "little")
            if s1 == self._meta_seq:
                return self._meta
            if not s1 & 1:
                length = int.from_bytes(dmv[base + 8:base + 16], "little")
                if length > g.meta_size - L.META_HEADER_SIZE:
                    s2 = int.from_bytes(dmv[base:base + 8], "little")
                    if s1 == s2:
                        raise CorruptRing(f"metadata length {length} > meta_size - 16 ({g.meta_size - 16})")
                else:
                    buf = bytes(dmv[base + 16:base + 16 + length])
                    full_fence()
                    s2 = int.from_bytes(dmv[base:base + 8], "little")
                    if s1 == s2:
                        self._meta = _parse_metadata(buf) if s1 else {}
                        self._meta_seq = s1
                        return self._meta
            if time.monotonic() > deadline:
                raise CorruptRing("metadata seqlock never became stable (producer died mid-write?)")
            time.sleep(0)

    # ------------------------------------------------------------------ reading (spec §7.3)
    def _check_open(self):
        if self._closed:
            raise RingError("ring is closed")

    def _available(self):
        """Published positions not yet read; reloads head when the cached one is used up."""
        avail = (self._cached_head - self._read) & _M64
        if avail == 0:
            self._cached_head = self._c64[_Q_HEAD]
            avail = (self._cached_head - self._read) & _M64
            if avail == 0:
                self._flush_release()  # caught up: hand the released slots back now
            if avail > self._geo.slot_count:
                raise CorruptRing(f"head {self._cached_head} is {avail} positions past read {self._read} "
                                  f"(slot_count {self._geo.slot_count})")
        return avail

    def _take(self, n):
        """Register positions [read, read+n) as handed out; returns the pending entry."""
        self._read = end = (self._read + n) & _M64
        ent = [end, False]
        self._pending.append(ent)
        return ent

    def _release_entry(self, ent):
        ent[1] = True
        pend = self._pending
        if pend[0] is not ent:
            return  # an older position is still held: released when it is
        tail = None
        while pend and pend[0][1]:
            tail = pend.popleft()[0]
        self._released_to = tail
        if ((tail - self._stored) & _M64) >= self._release_batch:
            self._flush_release()

    def _flush_release(self):
        """Store the released position to tail and wake a waiting producer (spec 7.3 step 5)."""
        tail = self._released_to
        if tail == self._stored:
            return
        self._stored = tail
        c32 = self._c32
        self._c64[_Q_TAIL] = tail  # release store (x86-64 TSO)
        full_fence()
        if c32[_I_PRODUCER_WAITING] != 0:
            # The spec's exchange(0) is a load + store here (no atomic RMW from Python). Safe: only the
            # consumer bumps producer_futex, and it bumps after every clear it makes, so the producer's
            # FUTEX_WAIT on its pre-announcement value always fails or is woken; the worst case is one
            # extra wake.
            c32[_I_PRODUCER_WAITING] = 0
            c32[_I_PRODUCER_FUTEX] = (c32[_I_PRODUCER_FUTEX] + 1) & 0xFFFFFFFF
            futex_wake(self._pfutex_addr)

    def _corrupt_desc(self, pos, msg):
        return CorruptRing(f"corrupt descriptor at position {pos}: {msg}")

    def next(self, timeout=None):
        """The next heap (a Heap; use ``with ring.next() as heap:``). Waits up to ``timeout`` seconds (None:
        forever, 0: don't wait). Raises EndOfStream, ProducerGone, Timeout, CorruptRing."""
        self._check_open()
        if self._eos:
            raise EndOfStream("end of stream")
        if self._cached_head == self._read and self._available() == 0:
            self._wait(timeout)
        pos = self._read
        g = self._geo
        (seq, heap_cnt, heap_size, received, ts, slot, flags, icount, packets,
         _) = _unpack_desc(self._data_mm, self._desc_base + (pos & self._mask) * 64)
        if seq != (pos + 1) & _M64:
            raise self._corrupt_desc(pos, f"seq {seq}, want {(pos + 1) & _M64}")
        if slot >= g.slot_count:
            raise self._corrupt_desc(pos, f"slot {slot} >= slot_count {g.slot_count}")
        if received > g.slot_size:
            raise self._corrupt_desc(pos, f"received {received} > slot_size {g.slot_size}")
        if icount > g.max_items:
            raise self._corrupt_desc(pos, f"item_count {icount} > max_items {g.max_items}")
        if icount:
            o = self._items_base + slot * self._item_stride
            raw = [t[:4] for t in _iter_items(self._dmv[o:o + icount * L.ITEM_SIZE])]
            ss = g.slot_size
            for iid, value, length, iflags in raw:
                if not iflags & L.ITEM_IMMEDIATE and (value > ss or length > ss - value):
                    raise self._corrupt_desc(pos, f"item {iid:#x} [{value}, +{length}) past slot_size {ss}")
        else:
            raw = ()
        ent = self._take(1)
        if flags & L.FLAG_END_OF_STREAM:
            self._eos = True
            self._release_entry(ent)
            raise EndOfStream("end of stream")
        h = self._heap(ent, pos, heap_cnt, heap_size, received, ts, slot, flags, icount, packets)
        h._raw = raw
        return h

    def _heap(self, entry, pos, heap_cnt, heap_size, received, ts, slot, flags, icount, packets):
        """A Heap over slot's payload and item table; entry is its release bookkeeping (None: fast path)."""
        h = Heap.__new__(Heap)
        h._ring = self
        h._entry = entry
        h._buf = self._data_mm
        h._mv = self._dmv
        h._base = self._pay_base + slot * self._geo.slot_size
        h._raw = None
        h._items_off = self._items_base + slot * self._item_stride
        h.position = pos
        h.heap_cnt = heap_cnt
        h.heap_size = heap_size
        h.received = received
        h.timestamp_ns = ts
        h.slot = slot
        h.flags = flags
        h.item_count = icount
        h.packets = packets
        h._released = False
        h._descmap = None
        return h

    def heaps(self, timeout=None):
        """Iterate over heaps until end of stream, releasing each when the loop advances or is left.
        ``timeout`` applies to each wait (Timeout is raised).

        While no other heap is held, this takes a fast path: one descriptor unpack and one Heap per
        published position, the item table parsed only if the loop looks at items, and the release a
        cursor update (stored to the shared tail once per batch). Anything else — waiting, end of stream,
        heaps held from next() — goes through next()."""
        self._check_open()
        g = self._geo
        mask, desc_base = self._mask, self._desc_base
        slot_size, slot_count, max_items = g.slot_size, g.slot_count, g.max_items
        mm, unpack, make = self._data_mm, _unpack_desc, self._heap
        eos_flag = L.FLAG_END_OF_STREAM
        heap = None
        try:
            while True:
                pos = self._read
                if self._pending or self._eos or self._cached_head == pos and self._available() == 0:
                    try:
                        heap = self.next(timeout)
                    except EndOfStream:
                        return
                    yield heap
                    heap.release()
                    heap = None
                    continue
                (seq, heap_cnt, heap_size, received, ts, slot, flags, icount, packets,
                 _) = unpack(mm, desc_base + (pos & mask) * 64)
                if (seq != (pos + 1) & _M64 or slot >= slot_count or received > slot_size or icount > max_items
                        or flags & eos_flag):
                    # The slow path again, written out: folding the two into one test costs ~10 % here.
                    try:
                        heap = self.next(timeout)  # next() reports the corruption, or takes the marker
                    except EndOfStream:
                        return
                    yield heap
                    heap.release()
                    heap = None
                    continue
                self._read = (pos + 1) & _M64
                h = make(None, pos, heap_cnt, heap_size, received, ts, slot, flags, icount, packets)
                heap = h
                yield h
                if not h._released:
                    h._released = True
                    self._release_through(pos)
                heap = None
        finally:
            if heap is not None:
                heap.release()

    def _release_through(self, pos):
        """Release a fast-path heap. The iterator hands one out only when every older position is released,
        so releasing it releases through pos, whatever next() handed out after it (those stay held)."""
        end = (pos + 1) & _M64
        if ((end - self._released_to) & _M64) > ((self._read - self._released_to) & _M64) or end == self._released_to:
            return  # released already
        self._released_to = end
        if ((end - self._stored) & _M64) >= self._release_batch:
            self._flush_release()

    __iter__ = heaps

    def next_batch(self, max_heaps, timeout=None):
        """Up to ``max_heaps`` already-published heaps at once (at least one; fewer at the ring's wrap point
        or before an END_OF_STREAM marker) as a Batch of numpy views. Waits like next(). Descriptors (and
        address items) are validated vectorised: CorruptRing if any is bad."""
        _need_numpy()
        self._check_open()
        if max_heaps < 1:
            raise ValueError("max_heaps must be >= 1")
        if self._eos:
            raise EndOfStream("end of stream")
        avail = (self._cached_head - self._read) & _M64
        if avail == 0:
            avail = self._available()
            if avail == 0:
                self._wait(timeout)
                avail = (self._cached_head - self._read) & _M64
        g = self._geo
        pos = self._read
        idx = pos & self._mask
        n = min(avail, max_heaps, g.slot_count - idx)
        d = self._desc_arr[idx:idx + n]
        want = np.arange(1, n + 1, dtype=np.uint64) + np.uint64(pos)  # wraps mod 2^64
        bad = ((d["seq"] != want) | (d["slot"] >= g.slot_count) | (d["received"] > np.uint64(g.slot_size))
               | (d["item_count"] > g.max_items))
        if bad.any():
            k = int(bad.argmax())
            e = d[k]
            raise self._corrupt_desc((pos + k) & _M64, f"seq {e['seq']} slot {e['slot']} received "
                                     f"{e['received']} item_count {e['item_count']}")
        eos = (d["flags"] & L.FLAG_END_OF_STREAM) != 0
        if eos.any():
            k = int(eos.argmax())
            if k == 0:
                self._eos = True
                self._release_entry(self._take(1))
                raise EndOfStream("end of stream")
            n = k
            d = d[:k]
        counts = d["item_count"]
        if counts.any():
            k = int(counts.max())
            items = self._items2d[d["slot"].astype(np.intp), :k]
            valid = np.arange(k, dtype=np.uint32)[None, :] < counts[:, None]
            addr = valid & ((items["flags"] & L.ITEM_IMMEDIATE) == 0)
            ss = np.uint64(g.slot_size)
            v, ln = items["value"], items["length"]
            over = addr & ((v > ss) | (ln > ss - np.minimum(v, ss)))
            if over.any():
                r = int(over.any(axis=1).argmax())
                raise self._corrupt_desc((pos + r) & _M64, "address item past slot_size")
        return Batch(self, d, pos, self._take(n))

    def batches(self, max_heaps, timeout=None):
        """Iterate over batches until end of stream, releasing each when the loop advances or is left."""
        b = None
        try:
            while True:
                try:
                    b = self.next_batch(max_heaps, timeout)
                except EndOfStream:
                    return
                yield b
                b.release()
                b = None
        finally:
            if b is not None:
                b.release()

    # ------------------------------------------------------------------ waiting (spec §7.4)
    def _wait(self, timeout):
        """Return when a heap is published (cached_head updated); raise EndOfStream / ProducerGone / Timeout."""
        now = time.monotonic()
        deadline = float("inf") if timeout is None else now + timeout
        c64, c32 = self._c64, self._c32
        read = self._read
        nap = self._max_latency
        while nap:  # a moving stream: nap instead of spinning and asking for a wake per heap
            h = c64[_Q_HEAD]
            if h != read:
                self._set_head(h)
                return
            now = time.monotonic()
            if h != self._active_head:
                self._active_head, self._active_at = h, now
            if now - self._active_at >= ACTIVE_NAPS * nap or now >= deadline:
                break
            time.sleep(min(nap, deadline - now))
        spin_until = now + min(SPIN_SECONDS, timeout if timeout is not None else SPIN_SECONDS)
        while time.monotonic() < spin_until:
            h = c64[_Q_HEAD]
            if h != read:
                self._set_head(h)
                return
        try:
            while True:
                f = c32[_I_CONSUMER_FUTEX]
                c32[_I_CONSUMER_WAITING] = 1
                full_fence()
                h = c64[_Q_HEAD]
                if h != read:
                    self._set_head(h)
                    return
                if c32[_I_STATE] == L.STATE_CLOSED:
                    h = c64[_Q_HEAD]
                    if h != read:
                        self._set_head(h)
                        return
                    raise EndOfStream("end of stream (ring closed)")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Timeout(f"no heap within {timeout} s")
                futex_wait(self._cfutex_addr, f, min(L.MAX_WAIT_SLICE, left))
                h = c64[_Q_HEAD]
                if h != read:
                    self._set_head(h)
                    return
                if not self.producer_alive():
                    h = c64[_Q_HEAD]  # drain first: everything published before the death is delivered
                    if h != read:
                        self._set_head(h)
                        return
                    if c32[_I_STATE] == L.STATE_CLOSED:
                        raise EndOfStream("end of stream (ring closed)")
                    raise ProducerGone(f"ring {self.name}: producer (pid {self.producer_pid}) is gone")
        finally:
            c32[_I_CONSUMER_WAITING] = 0

    def _set_head(self, h):
        avail = (h - self._read) & _M64
        if avail > self._geo.slot_count:
            raise CorruptRing(f"head {h} is {avail} positions past read {self._read}")
        self._cached_head = h

    # ------------------------------------------------------------------ close
    def close(self):
        """Detach: drop the consumer lock and the mappings. Heaps not released are not released (a consumer
        attaching next gets them again). Never raises because of views the caller still holds: if numpy
        arrays / memoryviews into the data file are alive, the data mapping stays mapped until the last of
        them is gone (their contents are then undefined; reading them does not crash)."""
        if self._closed and self._ctl_fd is None:
            return
        if not self._closed and self._c64 is not None:
            try:
                self._flush_release()
                self._c64[_Q_CONSUMER_PID] = 0
            except (ValueError, TypeError):
                pass
        self._teardown()

    def _teardown(self):
        self._closed = True
        self._desc_arr = self._items2d = self._payload2d = None
        self._cfutex = self._pfutex = None
        for mv in (self._c64, self._c32, self._dmv):
            if mv is not None:
                try:
                    mv.release()
                except BufferError:
                    pass
        self._c64 = self._c32 = self._dmv = None
        for mm in (self._data_mm, self._ctl_mm):
            if mm is not None:
                try:
                    mm.close()
                except BufferError:
                    pass  # live views: unmapped when the last one is garbage-collected
        self._data_mm = self._ctl_mm = None
        for fd in (self._cons_fd, self._ctl_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._cons_fd = self._ctl_fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        if self._closed:
            return f"Ring({self.name!r}, closed)"
        return (f"Ring({self.name!r}, session={self.session_id:#x}, slots={self.slot_count}x{self.slot_size}, "
                f"read={self._read}, head={self.head})")
