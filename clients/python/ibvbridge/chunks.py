"""Chunks of a chunk-mode ring (docs/ring-layout.md §13), read zero-copy.

A ring in chunk mode (header feature CHUNKS) holds one chunk per position: ``heaps × axis`` heap positions
of ``heap_size`` bytes each, time-major, followed in the slot by a presence map of one byte per position
(1: that heap arrived complete). This module owns the chunk geometry (read from a private copy of the
header and validated at attach, §13.5) and the Chunk view handed out by ``Ring.next_chunk`` /
``Ring.chunks``::

    for chunk in ring.chunks(timeout=5):
        power = (chunk.data_as(np.int8).astype(np.float32) ** 2)   # [time, axis, samples]
        use(chunk.chunk_id, chunk.present, power)
        if not chunk.valid: ...                                    # read, THEN check (§7.7)

A Chunk's arrays view the ring's memory: they are the chunk's bytes until it is released (the loop's next
step, ``with``, ``chunk.release()``), and only while ``chunk.valid``. ``ring.release(chunk)`` raises
Overrun when the producer overran this consumer while it held the chunk, as for a heap.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Iterator, Optional, Protocol, Sequence, Tuple, Type, TypeVar

from . import layout as L
from .errors import CorruptRing, EndOfStream, RingError

if TYPE_CHECKING:
    import numpy as np
else:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is needed only for the array views
        np = None

from .views import Batch, Heap, RingView

_H = TypeVar("_H", bound=Heap)

FLAG_CHUNK = L.FLAG_CHUNK
FLAG_COMPLETE = L.FLAG_COMPLETE
M64 = (1 << 64) - 1
MAX_CHUNK_BATCH = 4096  # chunks a ChunkBatch holds at most
# A descriptor as uint64 words (spec §4.1): the words next_chunk_batch checks; slot and flags share one, slot
# in its low half, flags in its high half, and item_count is the low half of another.
_DESC_WORDS = L.DESC_SIZE // 8
_W_SEQ, _W_HEAP_SIZE, _W_RECEIVED = L.DESC_SEQ >> 3, L.DESC_HEAP_SIZE >> 3, L.DESC_RECEIVED >> 3
_W_SLOT_FLAGS, _W_ITEM_COUNT = L.DESC_SLOT >> 3, L.DESC_ITEM_COUNT >> 3
assert L.DESC_SLOT % 8 == 0 and L.DESC_FLAGS == L.DESC_SLOT + 4 and L.DESC_ITEM_COUNT % 8 == 0

__all__ = ["ChunkGeometry", "Chunk", "ChunkBatch", "chunk_geometry"]  # and ChunkViews / ChunkSource: Ring's side


class ChunkGeometry(collections.namedtuple("ChunkGeometry", (
        "heaps", "axis", "heap_size", "step", "time_item", "axis_item"))):
    """A chunk-mode ring's geometry (spec §13.1), validated against the slot size at attach."""

    @property
    def positions(self) -> int:
        """Heap positions per chunk: heaps × axis."""
        return self.heaps * self.axis

    @property
    def chunk_bytes(self) -> int:
        """A chunk's payload bytes: positions × heap_size (the presence map starts there)."""
        return self.heaps * self.axis * self.heap_size


def chunk_geometry(features: int, raw: Any, slot_size: int) -> ChunkGeometry | None:
    """The chunk geometry from ``raw``, a private copy of the header bytes at 0xA0 (layout.CHUNK_STRUCT),
    when ``features`` has CHUNKS; None otherwise. CorruptRing (refuse to attach) when a field is 0 or the
    chunk and its presence map do not fit a slot (spec §13.5; Python integers do not overflow, so the
    u64 overflow the spec names is a sum past 2^64, which is past any slot_size too)."""
    if not features & L.FEATURE_CHUNKS:
        return None
    f = dict(zip(L.CHUNK_FIELDS, L.CHUNK_STRUCT.unpack_from(raw, 0)))
    g = ChunkGeometry(f["chunk_heaps"], f["chunk_axis"], f["chunk_heap_size"], f["chunk_step"],
                      f["chunk_time_item"], f["chunk_axis_item"])
    if min(g.heaps, g.axis, g.heap_size, g.step) < 1:
        raise CorruptRing(f"corrupt chunk geometry: {g.heaps} heaps × {g.axis} axis × {g.heap_size} bytes, "
                          f"step {g.step}: each must be at least 1")
    need = g.chunk_bytes + g.positions
    if need > slot_size:  # slot_size is a u64: a sum that overflows u64 is past it too
        raise CorruptRing(f"corrupt chunk geometry: a chunk of {g.heaps} × {g.axis} positions of {g.heap_size} "
                          f"bytes and its presence map ({need} bytes) do not fit a slot of {slot_size} bytes")
    return g


class ChunkViews:
    """A chunk ring's per-slot views, made once at attach (make_views): ``data[slot]`` is [time, axis,
    heap_size] uint8, ``present[slot]`` [time, axis] uint8, both inside [0, slot_size) by the attach check;
    ``all_present`` the read-only all-True map of a COMPLETE chunk (§13.3); ``presence_base`` slot 0's
    presence map in the data mapping ``data_mm``; ``desc_check`` next_chunk_batch's (mask, lo, span)."""

    __slots__ = ("geo", "slot_size", "data_mm", "presence_base", "data", "present", "all_present", "desc_check")

    def __init__(self, geo: ChunkGeometry, slot_size: int, data_mm: Any, presence_base: int,
                 data: Optional[np.ndarray], present: np.ndarray, all_present: np.ndarray,
                 desc_check: Tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        self.geo = geo
        self.slot_size = slot_size
        self.data_mm = data_mm
        self.presence_base = presence_base
        self.data = data
        self.present = present
        self.all_present = all_present
        self.desc_check = desc_check

    def slot_data(self) -> np.ndarray:
        """The per-slot payload views (None only for a chunk of 0 bytes, which the attach check refuses)."""
        d = self.data
        if d is None:
            raise RingError("chunk ring with no chunk bytes")
        return d


class ChunkSource(RingView, Protocol):
    """What this module uses of a ring (ring.Ring provides it): its chunk geometry and views, the
    descriptor array, and the heap and batch paths that hand positions out."""

    name: str

    @property
    def _chunk_geo(self) -> Optional[ChunkGeometry]: ...

    @property
    def _chunk_views(self) -> Optional[ChunkViews]: ...

    @property
    def _desc_raw(self) -> Optional[np.ndarray]: ...

    def _batch_span(self, max_heaps: int, timeout: Optional[float], what: str) -> Tuple[int, int, int]: ...

    def _take(self, n: int) -> Any: ...

    def _checked_batch(self, pos: int, n: int, raw: np.ndarray) -> Batch: ...

    def _next(self, timeout: Optional[float], cls: Type[_H]) -> _H: ...

    def _heaps(self, timeout: Optional[float], cls: Type[_H]) -> Iterator[_H]: ...

    def release(self, heap: Heap | Batch) -> None: ...


class Chunk(Heap):
    """One chunk (spec §13.2–13.3), handed out by ``Ring.next_chunk`` / ``Ring.chunks``: the Heap of its ring
    position, with the chunk's views.

    ``chunk_id`` (the descriptor's heap_cnt: time index / heaps), ``position``, ``timestamp_ns``,
    ``received``, ``packets``, ``flags``, ``slot`` come from the checked private descriptor copy.
    ``data`` is a read-only uint8 view [time, axis, heap bytes] of the slot; ``data_as(dtype)`` the same
    bytes as [time, axis, elements] of dtype; ``present`` a bool array [time, axis] (True: that heap
    arrived complete; bytes of a position not present are undefined). Read, then check ``valid``.
    """

    # A subclass, not a wrapper: the descriptor's fields are plain slots (no property call per field read),
    # and the ring builds the chunk in one step on its heap path (Ring._next / Ring._heaps).
    __slots__ = ("_present", "_views")
    _present: Optional[bytes]
    _views: ChunkViews  # set by next_chunk / iter_chunks as the chunk is handed out

    chunk_id = Heap.heap_cnt  # type: ignore[misc]  # mypy reads the slot descriptor as a class variable; the same slot under the chunk's name: the chunk id, time index / heaps

    # ----- geometry
    @property
    def geometry(self) -> ChunkGeometry:
        return self._views.geo

    @property
    def shape(self) -> tuple[int, int]:
        """(time, axis): heap positions of the chunk."""
        g = self._views.geo
        return (g.heaps, g.axis)

    @property
    def data(self) -> np.ndarray:
        """The chunk's payload as a read-only uint8 view [time, axis, heap_size] (no copy)."""
        self._check_live()
        return self._views.slot_data()[self.slot]

    def data_as(self, dtype: Any, shape: int | Sequence[int] | None = None) -> np.ndarray:
        """The payload as a read-only view [time, axis, *shape] of ``dtype``: each heap position's bytes
        reinterpreted (shape defaults to heap_size / itemsize elements). ValueError when a heap position
        does not hold a whole number of dtype elements or the shape does not match it."""
        dt = np.dtype(dtype)
        hs = self._views.geo.heap_size
        if dt.itemsize == 0 or hs % dt.itemsize:
            raise ValueError(f"a heap position of {hs} bytes is not a whole number of {dt} elements")
        a = self.data.view(dt)
        if shape is None:
            return a
        shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        return a.reshape(self.shape + shape)

    def _presence(self) -> bytes:
        """The presence map's bytes, copied once out of the slot (a private copy, like the descriptor)."""
        p = self._present
        if p is None:
            self._check_live()
            v = self._views
            off = v.presence_base + self.slot * v.slot_size
            p = self._present = v.data_mm[off:off + v.geo.positions]  # mmap slicing copies
        return p

    @property
    def present(self) -> np.ndarray:
        """The presence map as a read-only bool array [time, axis]: True where the presence byte is 1 (any
        other value is a corrupt chunk and reads as not present, spec §13.2). A COMPLETE chunk's map is all
        1 (§13.3): it is read from the private descriptor copy, not the slot. Otherwise it is made from a
        private copy of the map, taken on first use: check ``valid`` after reading it, as for the bytes."""
        if self.flags & FLAG_COMPLETE:
            return self._views.all_present
        p = self._presence()
        g = self._views.geo
        if p.count(0) + p.count(1) == len(p):  # the usual map: its bytes are the bools
            return np.frombuffer(p, np.bool_).reshape(g.heaps, g.axis)
        a = np.frombuffer(p, np.uint8).reshape(g.heaps, g.axis) == 1
        a.flags.writeable = False
        return a

    @property
    def heaps_present(self) -> int:
        """How many heap positions are present (presence byte 1): all of them in a COMPLETE chunk (§13.3,
        from the private descriptor copy: a slot's map page is not touched), else counted in the map."""
        if self.flags & FLAG_COMPLETE:
            return self._views.geo.positions
        p = self._present
        return (self._presence() if p is None else p).count(1)

    def heap(self, t: int, a: int = 0) -> np.ndarray:
        """Heap position (t, a)'s bytes (a read-only uint8 view of heap_size bytes)."""
        g = self._views.geo
        if not (0 <= t < g.heaps and 0 <= a < g.axis):
            raise IndexError(f"heap position ({t}, {a}) outside {g.heaps} × {g.axis}")
        return self.data[t, a]

    # ----- validity and release: the Heap's (spec §7.7). valid: whether every byte read from this chunk so far
    # was the chunk's (read, THEN check); release(): give the slot back, in position order; ring.release(chunk)
    # also proves the chunk was read whole (Overrun when it was not).

    def copy(self) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[override]  # a chunk copies to (data, present) arrays, not a Heap (public API)
        """(data, present) copied out of the ring, then checked: Overrun / Detached when the producer
        overran this consumer while it held the chunk, so a copy is never torn."""
        d = np.array(self.data)
        p = np.array(self.present)
        r = self._ring
        assert r is not None  # a Chunk is handed out by its ring, never a copy
        r._check_row()
        return d, p

    def __enter__(self) -> Chunk:
        return self

    def __repr__(self) -> str:
        g = self._views.geo
        return (f"Chunk(chunk_id={self.chunk_id}, position={self.position}, {g.heaps}x{g.axis}x{g.heap_size}, "
                f"flags={self.flags:#x})")


def make_views(g: ChunkGeometry | None, payload_offset: int, slot_count: int, slot_size: int, max_items: int,
               data_mm: Any, payload2d: np.ndarray | None) -> ChunkViews | None:
    """The chunk views of a chunk ring (None without chunk geometry, numpy or a payload mapping): per-slot
    views of the payload payload2d (slot_count, slot_size), read-only, and next_chunk_batch's check."""
    if g is None or np is None or payload2d is None:
        return None
    # next_chunk_batch's one-pass check of a run of descriptors as uint64 words: masked, seq less the run's
    # first position, then every word w in [lo, lo + span] (one unsigned compare: w - lo <= span, wrapping).
    # Row i: seq = pos + 1 + i; heap_size = chunk_bytes; received <= chunk_bytes; CHUNK set, END_OF_STREAM
    # clear and slot < slot_count (the flags word masked to those two bits); item_count <= max_items.
    mask = np.zeros(_DESC_WORDS, np.uint64)
    span = np.full(_DESC_WORDS, M64, np.uint64)
    rows = min(slot_count, MAX_CHUNK_BATCH)  # a batch's rows: bounded memory whatever slot_count is
    lo = np.zeros((rows, _DESC_WORDS), np.uint64)
    mask[_W_SEQ] = mask[_W_HEAP_SIZE] = mask[_W_RECEIVED] = M64
    lo[:, _W_SEQ] = np.arange(1, rows + 1, dtype=np.uint64)
    span[_W_SEQ] = 0
    lo[:, _W_HEAP_SIZE], span[_W_HEAP_SIZE] = g.chunk_bytes, 0
    span[_W_RECEIVED] = g.chunk_bytes
    mask[_W_SLOT_FLAGS] = ((L.FLAG_CHUNK | L.FLAG_END_OF_STREAM) << 32) | 0xFFFFFFFF
    lo[:, _W_SLOT_FLAGS], span[_W_SLOT_FLAGS] = L.FLAG_CHUNK << 32, slot_count - 1
    mask[_W_ITEM_COUNT], span[_W_ITEM_COUNT] = 0xFFFFFFFF, max_items
    p2 = payload2d
    cb = g.chunk_bytes
    data = p2[:, :cb].reshape(p2.shape[0], g.heaps, g.axis, g.heap_size) if cb else None
    present = p2[:, cb:cb + g.positions].reshape(p2.shape[0], g.heaps, g.axis)
    # A COMPLETE chunk's presence map, every position present (§13.3): one read-only array for all of them.
    everywhere = np.ones((g.heaps, g.axis), np.bool_)
    everywhere.flags.writeable = False
    return ChunkViews(g, slot_size, data_mm, payload_offset + cb, data, present, everywhere, (mask, lo, span))


class ChunkBatch:
    """Up to ``max_chunks`` consecutive chunks taken at once (``Ring.next_chunk_batch`` / ``chunk_batches``):
    their descriptors copied once and checked vectorised, every one as a chunk (``next_chunk_batch``), released
    together with one tail store. ``chunk_id`` (uint64 [n]) and ``flags`` come from the private copy;
    ``present`` is a bool array [n, time, axis] copied out of the slots; ``data`` a read-only uint8 array
    [n, time, axis, heap bytes] — a zero-copy view when the chunks' slots are consecutive (``consecutive``),
    else a gathered copy; ``chunk(i)`` views one chunk's bytes. Read, then check ``valid``."""

    __slots__ = ("_views", "_batch", "_geo", "_present")

    def __init__(self, views: ChunkViews, batch: Batch) -> None:
        self._views = views
        self._batch = batch
        self._geo = views.geo
        self._present: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return len(self._batch)

    geometry = property(lambda self: self._geo)
    chunk_id = property(lambda self: self._batch.descs["heap_cnt"], doc="uint64 [n]: the chunk ids")
    flags = property(lambda self: self._batch.descs["flags"], doc="uint32 [n]: CHUNK, COMPLETE / INCOMPLETE")
    received = property(lambda self: self._batch.descs["received"], doc="uint64 [n]: payload bytes that arrived")
    slots = property(lambda self: self._batch.descs["slot"], doc="uint32 [n]: the slots holding the chunks")
    consecutive = property(lambda self: self._batch.consecutive, doc="True: data is a zero-copy view")
    valid = property(lambda self: self._batch.valid, doc="as Chunk.valid, for every chunk of the batch")
    released = property(lambda self: self._batch.released)

    @property
    def present(self) -> np.ndarray:
        """bool [n, time, axis]: True where the presence byte is 1 (copied once out of the slots)."""
        p = self._present
        if p is None:
            self._batch._check_live()
            d = self._batch.descs
            v = self._views
            # A COMPLETE chunk's map is all 1 (§13.3): read from its descriptor copy; only the others' maps
            # are gathered (a copy) out of their slots.
            partial = (d["flags"] & FLAG_COMPLETE) == 0
            if not partial.any():
                p = np.broadcast_to(v.all_present, (len(d),) + v.all_present.shape)
            else:
                p = np.ones((len(d),) + v.all_present.shape, np.bool_)
                p[partial] = v.present[d["slot"][partial]] == 1
                p.flags.writeable = False
            self._present = p
        return p

    @property
    def data(self) -> np.ndarray:
        """uint8 [n, time, axis, heap bytes]: a view when ``consecutive``, else a gathered copy."""
        self._batch._check_live()
        s = self._batch.descs["slot"]
        if self._batch.consecutive:
            s0 = int(s[0]) if len(s) else 0
            return self._views.slot_data()[s0:s0 + len(s)]
        return self._views.slot_data()[s.astype(np.intp)]

    def chunk(self, i: int) -> np.ndarray:
        """Chunk i's bytes, uint8 [time, axis, heap bytes], a zero-copy view."""
        self._batch._check_live()
        return self._views.slot_data()[int(self._batch.descs["slot"][i])]

    def release(self) -> None:
        """Give every chunk's slot back (one tail store). Idempotent."""
        self._batch.release()

    def __enter__(self) -> ChunkBatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"ChunkBatch(position={self._batch.position}, n={len(self)})"


def next_chunk_batch(ring: ChunkSource, max_chunks: int, timeout: float | None) -> ChunkBatch:
    """Ring.next_chunk_batch: a run of published positions, their descriptors copied once (spec §A) and checked
    in one vectorised pass as chunks (§9.1 and §13.5: seq, slot, CHUNK, heap_size, received, item_count).
    A run that fails it (an END_OF_STREAM marker in it, or a corrupt descriptor) goes through Ring.next_batch's
    checks, which cut it before the marker or report the first bad position, then each as a chunk; CorruptRing
    (after releasing the batch) for the first that is not one."""
    v = _views(ring)
    g = v.geo
    pos, idx, n = ring._batch_span(min(max_chunks, MAX_CHUNK_BATCH), timeout, "next_chunk_batch")
    descs = ring._desc_raw
    assert descs is not None  # mapped while the ring is open, which _batch_span checked
    raw = descs[idx * L.DESC_SIZE:(idx + n) * L.DESC_SIZE].copy()
    mask, lo, span = v.desc_check
    m = raw.view(np.uint64).reshape(n, _DESC_WORDS) & mask
    m[:, _W_SEQ] -= np.uint64(pos)  # wraps mod 2^64, as seq does
    m -= lo[:n]
    cb = g.chunk_bytes
    if (m <= span).all():
        ring._check_row()  # copied and checked: now prove they were these chunks' (spec §A)
        d = raw.view(L.DESC_DTYPE)
        d.flags.writeable = False
        return ChunkBatch(v, Batch(ring, d, pos, ring._take(n), None))
    b = ring._checked_batch(pos, n, raw)  # EndOfStream at the marker; CorruptRing for a bad descriptor
    d = b.descs
    bad = ((d["flags"] & L.FLAG_CHUNK) == 0) | (d["heap_size"] != np.uint64(cb)) | (d["received"] > np.uint64(cb))
    if bad.any():
        k = int(bad.argmax())
        b.release()
        raise ring._corrupt_desc((b.position + k) & M64,
                                 f"not a chunk of {cb} bytes: flags {int(d['flags'][k]):#x}, "
                                 f"heap_size {int(d['heap_size'][k])}, received {int(d['received'][k])}")
    return ChunkBatch(v, b)


def iter_chunk_batches(ring: ChunkSource, max_chunks: int, timeout: float | None) -> Iterator[ChunkBatch]:
    """Ring.chunk_batches: batches until end of stream, each released when the loop advances or is left."""
    cb: Optional[ChunkBatch] = None
    try:
        while True:
            try:
                cb = next_chunk_batch(ring, max_chunks, timeout)
            except EndOfStream:
                return
            yield cb
            done, cb = cb, None
            ring.release(done._batch)  # Overrun when the producer lapped us while the loop held it
    finally:
        if cb is not None:
            cb.release()


def _not_a_chunk(ring: ChunkSource, c: Chunk, cb: int) -> CorruptRing:
    """The CorruptRing for c, handed out but not a chunk of cb bytes (§13.5: CHUNK flag, heap_size ==
    chunk_bytes, received ≤ chunk_bytes, from its private descriptor copy); c is released first."""
    c.release()
    return ring._corrupt_desc(c.position, f"not a chunk of {cb} bytes: flags {c.flags:#x}, heap_size "
                              f"{c.heap_size}, received {c.received}")


def _views(ring: ChunkSource) -> ChunkViews:
    if ring._chunk_geo is None:
        raise RingError(f"ring {ring.name} is not in chunk mode (no CHUNKS feature)")
    v = ring._chunk_views
    if np is None or v is None:
        raise RingError("numpy is required for chunks (apt install python3-numpy)")
    return v


def next_chunk(ring: ChunkSource, timeout: float | None) -> Chunk:
    """Ring.next_chunk: the next position (descriptor checked as every heap's, §9.1), checked as a chunk."""
    v = _views(ring)
    cb = v.geo.chunk_bytes
    c = ring._next(timeout, Chunk)  # EndOfStream at the marker
    c._present = None
    c._views = v
    if not c.flags & FLAG_CHUNK or c.heap_size != cb or c.received > cb:
        raise _not_a_chunk(ring, c, cb)
    return c


def iter_chunks(ring: ChunkSource, timeout: float | None) -> Iterator[Chunk]:
    """Ring.chunks: every chunk until end of stream, each released when the loop advances or is left. It
    rides on the heap iterator's fast path (one descriptor copy checked per position, releases stored to
    the tail in batches); that path checks this consumer's row before it hands out the next position, so a
    chunk overrun while the loop held it raises Overrun at the next step."""
    v = _views(ring)
    cb = v.geo.chunk_bytes
    for c in ring._heaps(timeout, Chunk):
        c._present = None
        c._views = v
        if not c.flags & FLAG_CHUNK or c.heap_size != cb or c.received > cb:
            raise _not_a_chunk(ring, c, cb)
        yield c
