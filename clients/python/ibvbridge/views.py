"""Zero-copy views of ring positions: Heap (one position), its Items, and Batch (a run of positions). They
reach their ring only through RingView, the small interface below that Ring provides; this module imports
nothing of the ring, so ring, chunks and items can all import it without a cycle."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Literal, Mapping, Optional, Protocol, Sequence, Tuple

from . import layout as L
from ._sys import ORDERED
from .errors import CorruptRing, RingError, TruncatedItem
from .metadata import ItemDescriptor

if TYPE_CHECKING:
    import numpy as np
else:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is optional until a view is asked for
        np = None

_iter_items = L.ITEM_RAW_STRUCT.iter_unpack  # (id, value, length, flags) per entry
RawItem = Tuple[int, int, int, int]  # an item table entry: (id, value, length, flags)


class SlotGeometry(Protocol):
    """What a view needs of the ring's geometry (ring.Geometry has it)."""

    @property
    def slot_size(self) -> int: ...

    @property
    def slot_count(self) -> int: ...


class RingView(Protocol):
    """What a Heap, an Item and a Batch use of their ring (ring.Ring provides it): the consumer row's check
    (spec §A), the release of positions, the slot geometry and the payload mapping."""

    _closed: bool
    _c32: Any  # the control mapping as u32 words
    _i_row_state: int
    _i_row_gen: int
    _generation: int

    @property
    def _geo(self) -> SlotGeometry: ...

    @property
    def _payload2d(self) -> Optional[np.ndarray]: ...  # None without numpy

    def descriptors(self) -> Mapping[int, ItemDescriptor]: ...

    def _check_row(self) -> None: ...

    def _row_error(self) -> Exception | None: ...

    def _release_through(self, position: int) -> None: ...

    def _release_entry(self, entry: Any) -> None: ...

    def _corrupt_desc(self, position: int, what: str) -> CorruptRing: ...


def _need_numpy() -> None:
    if np is None:
        raise RingError("numpy is required for array views (apt install python3-numpy)")


class Item:
    """One item pointer of a heap (spec §5). For an immediate item ``value`` is the item; for an address
    item ``value`` is the offset of its bytes in the payload, ``length`` their count and ``data`` a
    read-only zero-copy memoryview of them."""

    __slots__ = ("id", "value", "length", "flags", "_heap")
    id: int
    value: int
    length: int
    flags: int

    def __init__(self, heap: Heap, iid: int, value: int, length: int, flags: int) -> None:
        self._heap = heap
        self.id = iid
        self.value = value
        self.length = length
        self.flags = flags

    @property
    def immediate(self) -> bool:
        return bool(self.flags & L.ITEM_IMMEDIATE)

    @property
    def cut(self) -> bool:
        """The item ran past the slot of a TRUNCATED heap: only its first ``length`` bytes are here."""
        return bool(self.flags & L.ITEM_CUT)

    @property
    def data(self) -> memoryview | None:
        """The item's bytes (None for an immediate); TruncatedItem for a cut item (see partial_data)."""
        if self.flags & L.ITEM_CUT:
            raise TruncatedItem(f"item {self.id:#x} of heap {self._heap.heap_cnt} ran past its slot: only "
                                f"{self.length} bytes are kept (raise recv --slot-size; partial_data has them)")
        return self.partial_data

    @property
    def partial_data(self) -> memoryview | None:
        """The item's bytes as kept, also the first bytes of a cut item (None for an immediate)."""
        if self.flags & L.ITEM_IMMEDIATE:
            return None
        h = self._heap
        h._check_live()
        start = h._base + self.value
        return h._mv[start:start + self.length]

    def __repr__(self) -> str:
        if self.immediate:
            return f"Item(id={self.id:#x}, immediate, value={self.value:#x})"
        return f"Item(id={self.id:#x}, offset={self.value}, length={self.length})"


class Heap:
    """A heap read from the ring. Its payload and item views are valid until ``release()`` (or the end of a
    ``with`` block, or the next step of ``for heap in ring``); ``copy()`` what must outlive it."""

    __slots__ = ("_ring", "_entry", "_buf", "_mv", "_base", "_raw", "_items_off", "position", "heap_cnt",
                 "heap_size", "received", "timestamp_ns", "slot", "flags", "item_count", "packets", "_released",
                 "_descmap")
    _ring: Optional[RingView]  # None: a copy
    _entry: Any  # the release queue's entry; None: handed out by the iterator's fast path
    _buf: Any  # the buffer the item views come from (the data mapping, or a copy's bytes)
    _mv: memoryview
    _base: int
    _raw: Optional[List[RawItem]]
    _items_off: int
    _released: bool
    _descmap: Optional[Mapping[int, ItemDescriptor]]
    position: int  # the heap's position in the ring (0, 1, 2 ... modulo 2^64)
    heap_cnt: int
    heap_size: int
    received: int  # payload bytes in the slot
    timestamp_ns: int
    slot: int
    flags: int  # layout.FLAG_*
    item_count: int
    packets: int

    @property
    def _raw_items(self) -> List[RawItem]:
        """The item table as (id, value, length, flags) tuples, parsed and checked on first use (spec §7.3:
        an address item past the slot is a corrupt ring), so a loop that never looks at items pays
        nothing for them."""
        raw = self._raw
        if raw is None:
            self._check_live()
            n = self.item_count
            ring = self._ring
            assert ring is not None  # a copy's table is parsed when it is made
            if n:
                o = self._items_off
                raw = list(_iter_items(self._mv[o:o + n * L.ITEM_SIZE]))
                ss = ring._geo.slot_size
                for iid, value, length, iflags in raw:
                    if not iflags & 1 and (value > ss or length > ss - value):  # 1: L.ITEM_IMMEDIATE
                        raise ring._corrupt_desc(self.position, f"item {iid:#x} [{value}, +{length}) past "
                                                 f"slot_size {ss}")
            else:
                raw = []
            ring._check_row()  # copied, then checked: the table was this heap's (spec §A)
            self._raw = raw
        return raw

    @property
    def cnt(self) -> int:
        """The SPEAD heap counter, under spead2's name (``spead2.recv.Heap.cnt``); the same as ``heap_cnt``."""
        return self.heap_cnt

    # ----- flags
    @property
    def complete(self) -> bool:
        """Every byte of the heap is here: COMPLETE and not TRUNCATED (a 2.2 producer never sets both)."""
        return bool(self.flags & L.FLAG_COMPLETE) and not self.flags & L.FLAG_TRUNCATED

    @property
    def incomplete(self) -> bool:
        return bool(self.flags & L.FLAG_INCOMPLETE)

    @property
    def truncated(self) -> bool:
        return bool(self.flags & L.FLAG_TRUNCATED)

    @property
    def end_of_stream(self) -> bool:
        return bool(self.flags & L.FLAG_END_OF_STREAM)

    @property
    def has_descriptors(self) -> bool:
        return bool(self.flags & L.FLAG_HAS_DESCRIPTORS)

    @property
    def items_overflow(self) -> bool:
        return bool(self.flags & L.FLAG_ITEMS_OVERFLOW)

    @property
    def no_heap_size(self) -> bool:
        return bool(self.flags & L.FLAG_NO_HEAP_SIZE)

    @property
    def items_cut(self) -> bool:
        return bool(self.flags & L.FLAG_ITEMS_CUT)


    def _check_live(self) -> None:
        if self._released:
            raise RingError(f"heap at position {self.position} was released: its memory belongs to the producer")
        if self._ring is not None and self._ring._closed:
            raise RingError("ring is closed")

    @property
    def released(self) -> bool:
        return self._released

    @property
    def valid(self) -> bool:
        """Whether every byte read from this heap so far was the heap's (spec §A): True while the ring still
        counts this consumer, so the producer has not reused the heap's slot. Read the payload or items,
        THEN check ``valid`` (or call ``ring.release(heap)``, which raises Overrun): False means the bytes
        may belong to a later heap. False after release and after the ring is closed; a copy is always
        valid."""
        r = self._ring
        if r is None:
            return True
        if self._released or r._closed:
            return False
        c32 = r._c32  # the common answer inline (as _check_row): a chunk consumer asks once per chunk
        if c32[r._i_row_state] == L.CONSUMER_ATTACHED and c32[r._i_row_gen] == r._generation and not ORDERED:
            return True
        return r._row_error() is None

    @property
    def payload(self) -> memoryview:
        """payload[0:received] as a read-only memoryview into the data mapping (no copy)."""
        self._check_live()
        return self._mv[self._base:self._base + self.received]

    @property
    def items(self) -> list[Item]:
        return [Item(self, *t) for t in self._raw_items]

    def find(self, item_id: int) -> Item | None:
        """The first item with this id, or None."""
        for t in self._raw_items:
            if t[0] == item_id:
                return Item(self, *t)
        return None

    def item(self, item_id: int) -> Item:
        """The first item with this id; KeyError if the heap has none."""
        it = self.find(item_id)
        if it is None:
            raise KeyError(f"heap {self.heap_cnt} has no item {item_id:#x}")
        return it

    def array(self, item_id: int, dtype: Any = None, shape: int | Sequence[int] | None = None,
              partial: bool = False) -> np.ndarray:
        """An address item as a read-only numpy array VIEW into the data mapping (no copy).

        dtype / shape default to the stream's item descriptor (spec §6) when known, else uint8 / 1-D.
        A -1 in the shape is the variable dimension. ValueError when the item is too short for the shape.
        TruncatedItem (a ValueError) when the item ran past the slot of a TRUNCATED heap, unless
        ``partial=True``: then a 1-D array of the whole elements kept (the shape is not applied).
        """
        _need_numpy()
        self._check_live()
        it = self.find(item_id)
        if it is None:
            if self.flags & L.FLAG_ITEMS_CUT:
                raise TruncatedItem(f"heap {self.heap_cnt} has no item {item_id:#x} in its slot: the heap "
                                    f"({self.heap_size} bytes) was cut to the slot; raise recv --slot-size")
            raise KeyError(f"heap {self.heap_cnt} has no item {item_id:#x}")
        if it.flags & L.ITEM_IMMEDIATE:
            raise TypeError(f"item {item_id:#x} is immediate: use heap.item({item_id:#x}).value")
        if it.cut:
            if not partial:
                it.data  # raises TruncatedItem, naming the item
            shape = None
        order: Literal["C", "F"] = "C"
        if dtype is None or shape is None:
            d = (self._ring.descriptors() if self._ring is not None else self._descmap or {}).get(item_id)
            if d is not None:
                if dtype is None:
                    dtype = d.dtype
                if shape is None:
                    shape = d.shape
                order = "F" if d.order == "F" else "C"
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

    def copy(self) -> Heap:
        """A detached copy (payload and items) that stays valid after release and close. The bytes are
        copied, then checked (layout 2.1 §A): Overrun / Detached when the producer overran this consumer
        while it held the heap, so a copy is never a torn heap."""
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
        if self._ring is not None:
            self._ring._check_row()  # copied, then checked
        return h

    def release(self) -> None:
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

    def __getitem__(self, key: str | int) -> Any:
        """``heap['name']`` / ``heap[id]``: the item decoded by the ring's descriptor (ibvbridge.items)."""
        from .items import heap_item
        return heap_item(self, key)

    def __enter__(self) -> Heap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return (f"Heap(position={self.position}, heap_cnt={self.heap_cnt}, heap_size={self.heap_size}, "
                f"received={self.received}, flags={self.flags:#x}, items={len(self._raw_items)})")

class Batch:
    """Up to ``max_heaps`` consecutive published heaps, as numpy views over the descriptor array.

    ``descs`` (structured, layout.DESC_DTYPE, read-only) and its fields ``seq``, ``heap_cnt``, ``heap_size``,
    ``received``, ``timestamp_ns``, ``slot``, ``flags``, ``item_count``, ``packets`` are a private copy of the
    descriptors, checked before the batch was handed out (spec §A: never re-read from shared memory).
    ``payloads(nbytes)`` gives the payload bytes as an (n, nbytes) uint8 array (zero-copy when it can): read
    them, THEN check ``valid`` (False: the producer overran this consumer and the bytes may be a later
    heap's). ``release()`` (or leaving ``with``) gives all n slots back with one tail store.
    """

    _ring: RingView

    def __init__(self, ring: RingView, descs: Any, position: int, entry: Any,
                 items: Optional[np.ndarray] = None) -> None:
        self._ring = ring
        self._entry = entry
        self._items = items  # the item tables as copied and checked by next_batch (None: no items)
        self.descs = descs
        self.position = position
        self._released = False

    def __len__(self) -> int:
        return len(self.descs)

    def __getattr__(self, name: str) -> Any:
        if name in L.DESC_FIELDS:
            return self.descs[name]
        raise AttributeError(name)

    @property
    def released(self) -> bool:
        return self._released

    @property
    def valid(self) -> bool:
        """As Heap.valid, for every heap of the batch: read, then check."""
        r = self._ring
        if self._released or r._closed:
            return False
        return r._row_error() is None

    def _check_live(self) -> None:
        if self._released:
            raise RingError(f"batch at position {self.position} was released")
        if self._ring._closed:
            raise RingError("ring is closed")

    @property
    def consecutive(self) -> bool:
        """True when the heaps' slots are consecutive, so payloads() is a zero-copy strided view."""
        s = self.descs["slot"]
        n = len(s)
        if n == 0:
            return True
        s0 = int(s[0])
        return s0 + n <= self._ring._geo.slot_count and bool((s == np.arange(s0, s0 + n, dtype=s.dtype)).all())

    def payloads(self, nbytes: int | None = None) -> np.ndarray:
        """The first nbytes (default slot_size) of each heap's slot as an (n, nbytes) uint8 array: a
        zero-copy strided view into the data mapping when the slots are consecutive, else a gathered copy.
        Bytes past a heap's ``received`` are whatever the slot holds (mask with ``received``)."""
        self._check_live()
        r = self._ring
        if nbytes is None:
            nbytes = r._geo.slot_size
        if not 0 <= nbytes <= r._geo.slot_size:
            raise ValueError(f"nbytes {nbytes} not in 0..slot_size {r._geo.slot_size}")
        p2 = r._payload2d
        assert p2 is not None  # a Batch exists only where numpy mapped the payload
        s = self.descs["slot"]
        if self.consecutive:
            s0 = int(s[0]) if len(s) else 0
            return p2[s0:s0 + len(s), :nbytes]
        return p2[s.astype(np.intp), :nbytes]

    def item_table(self) -> tuple[np.ndarray, np.ndarray]:
        """(items, valid): the heaps' item tables gathered as an (n, k) structured array (layout.ITEM_DTYPE,
        a copy; k = max item_count) and the (n, k) mask of valid entries."""
        self._check_live()
        counts = self.descs["item_count"]
        items = self._items
        if items is None:
            items = np.zeros((len(counts), 0), dtype=L.ITEM_DTYPE)
        k = items.shape[1]
        valid = np.arange(k, dtype=np.uint32)[None, :] < counts[:, None]
        return items, valid

    def find_item(self, item_id: int) -> tuple[np.ndarray, np.ndarray]:
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

    def release(self) -> None:
        """Give all the batch's slots back (one tail store). Idempotent."""
        if not self._released:
            self._released = True
            if not self._ring._closed:
                self._ring._release_entry(self._entry)

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Batch(position={self.position}, n={len(self.descs)})"
