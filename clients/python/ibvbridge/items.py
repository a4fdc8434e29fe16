"""Items by name, in spead2's vocabulary: ItemGroup, Item and HeapGenerator over a ring's heaps.

    import ibvbridge
    ig = ibvbridge.ItemGroup()
    with ibvbridge.attach("cbf") as ring:
        for heap in ring:
            for name, item in ig.update(heap).items():   # the items this heap changed
                print(name, item.value)                 # decoded as spead2 decodes them

This module owns the decoding of item values: descriptors (from the ring's stream-metadata area, spec §6,
which the producer updates before it publishes a heap with HAS_DESCRIPTORS) become Items; ``update(heap)``
gives each Item of the heap its value:

* an item with a numpy ``dtype`` (or a format numpy can hold, such as ``[('u', 32)]``): a read-only numpy
  VIEW of the slot (no copy), valid until the heap is released — ``.copy()`` what must outlive it. A
  shape of ``()`` gives a scalar, as in spead2. With spead2's default ``new_order='='`` a non-native byte
  order is converted (a copy); ``new_order='|'`` keeps the view.
* a format such as ``[('u', 48)]`` (immediates included): Python ints (two's complement for ``'i'``);
  several fields give a tuple; with a shape, a numpy array of that shape (dtype object, or a record of
  the fields for several), as spead2 gives; ``[('c', 8)]`` of shape ``(n,)`` a str.
* a shape with one ``None`` (``-1`` in the ring's metadata) takes its length from the item's bytes.

Differences from spead2, on purpose: values of numpy items are views of shared memory (spead2 copies the
heap into its own memory); descriptors come from the ring's metadata, so a consumer that attaches after the
descriptor heap still names its items. ``HeapGenerator`` fills a producer's slots (the twin of spead2's
``send.HeapGenerator``): the descriptors go to the ring's metadata once, not into every heap.
"""

from __future__ import annotations

import numbers
import struct
from operator import itemgetter
from typing import (Any, Dict, ItemsView, Iterator, KeysView, List, Literal, Optional, Sequence, Tuple,
                    Union, ValuesView)

import numpy as np

from . import layout as L
from ._sys import ORDERED
from .errors import RingError, TruncatedItem
from .metadata import _parse_metadata, meta_record

Shape = Tuple[Optional[int], ...]
Format = List[Tuple[str, int]]
Order = Literal["C", "F"]

STREAM_CTRL_ID = 0x6  # ids up to this one are SPEAD's own (heap cnt ... stream control): not items
_UNRESERVED_ID = 0x1000
_IMMEDIATE_BYTES = 6  # HeapGenerator's immediates: SPEAD-64-48, spead2's default flavour

_ITEM_IMMEDIATE = L.ITEM_IMMEDIATE
_ATTACHED = L.CONSUMER_ATTACHED
_MAX_VIEWS = 1 << 16  # views an Item remembers (ItemGroup.update): one per slot it was seen in

# How an item's value is decoded (spead2's fast paths).
_NUMPY, _IMMEDIATE, _BITS = 0, 1, 2

# ItemGroup.update's plans (see _plan): what a plan does with each item of the heap.
_P_IMMEDIATE, _P_VIEW, _P_SET_IMMEDIATE, _P_SET_RAW = 0, 1, 2, 3
_PLAN_MAX_ITEMS = 64  # a heap with more items is decoded without a plan
_MAX_PLANS = 64  # an ItemGroup stops planning when its heaps took this many shapes (variable-size items)
_NO_PLAN = ()  # a shape that cannot be planned (an undescribed or cut item): decoded the general way
_TABLES: Dict[int, Tuple[Any, Any]] = {}  # item count -> (unpack_from of that many entries, their shape getter)


def _table(n: int) -> Tuple[Any, Any]:
    """For an item table of n entries: an unpack_from giving the entries' fields flat (id, value, length,
    flags, id, value ...) in one call, and an itemgetter of its shape, every field but the values."""
    t = _TABLES.get(n)
    if t is None:
        fmt = L.ITEM_RAW_STRUCT.format
        t = _TABLES[n] = (struct.Struct(fmt[0] + fmt[1:] * n).unpack_from,
                          itemgetter(*[i for i in range(4 * n) if i % 4 != 1]))
    return t


def parse_format(raw: Union[bytes, Sequence[Tuple[str, int]], None],
                 immediate_bytes: Optional[int] = None) -> Optional[Format]:
    """A SPEAD format as a list of (code, bits). ``raw``: the wire form kept in the ring's metadata (one
    code byte and 8 - heap address bytes of bit length per field; that width is tried first when known,
    then SPEAD-64-48's and SPEAD-64-40's, and the first split into known codes is taken, as the Go side
    does), or a list already. None when there is no format or no width fits."""
    if raw is None or len(raw) == 0:
        return None
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        return [(str(c), int(b)) for c, b in raw]
    raw = bytes(raw)
    widths = [3, 4]
    if immediate_bytes:
        w = 1 + 8 - immediate_bytes
        widths = [w] + [x for x in widths if x != w]
    for w in widths:
        if w < 2 or len(raw) % w:
            continue
        fields = [(chr(raw[i]), int.from_bytes(raw[i + 1:i + w], "big")) for i in range(0, len(raw), w)]
        if all(c in "uifcb" and b > 0 for c, b in fields):
            return fields
    return None


def format_bytes(fmt: Format, immediate_bytes: int = _IMMEDIATE_BYTES) -> bytes:
    """The wire form of a format for a stream whose heap addresses take immediate_bytes bytes."""
    w = 8 - immediate_bytes
    return b"".join(c.encode("ascii") + int(b).to_bytes(w, "big") for c, b in fmt)


def _format_dtype(fmt: Format) -> np.dtype:
    """The numpy dtype spead2 decodes a format into: object ('O') where numpy has no such type."""
    fields = []
    for code, bits in fmt:
        if (code in "ui" and bits in (8, 16, 32, 64)) or (code == "f" and bits in (32, 64)):
            fields.append(f">{code}{bits // 8}")
        elif code == "b" and bits == 8:
            fields.append("?")
        elif code == "c" and bits == 8:
            fields.append("S1")
        elif code in "uib":
            fields.append("O")
        else:
            raise ValueError(f"illegal format ({code!r}, {bits})")
    return np.dtype(",".join(fields))


DESCRIPTOR_ITEM = 0x5  # an item descriptor: its bytes are a SPEAD packet describing one item
_D_NAME, _D_DESCRIPTION, _D_SHAPE, _D_FORMAT, _D_ID, _D_DTYPE = 0x10, 0x11, 0x12, 0x13, 0x14, 0x15


def parse_descriptor_item(data: Any) -> Any:
    """An item descriptor as it travels in a heap (item 0x5: an embedded SPEAD packet), as the ring's
    ItemDescriptor (what Ring.descriptors() gives). Item lengths as spead2 and the Go side take them: the
    addressed items sorted by address, each ending where the next begins. ValueError when malformed."""
    b = bytes(data)
    if len(b) < 8 or b[0] != 0x53 or b[1] != 4 or b[2] + b[3] != 8 or not 1 <= b[3] <= 7:
        raise ValueError("item descriptor: not a SPEAD-64 packet")
    imm_bytes = b[3]
    addr_bits = 8 * imm_bytes
    n = int.from_bytes(b[6:8], "big")
    payload = b[8 + 8 * n:]
    if len(b) < 8 + 8 * n:
        raise ValueError(f"item descriptor: {n} item pointers past its {len(b)} bytes")
    iid, addressed = None, []
    for k in range(n):
        ptr = int.from_bytes(b[8 + 8 * k:16 + 8 * k], "big")
        item, value = (ptr >> addr_bits) & ((1 << (63 - addr_bits)) - 1), ptr & ((1 << addr_bits) - 1)
        if ptr >> 63:
            if item == _D_ID:
                iid = value
        elif item:
            addressed.append((value, item))
    addressed.sort(key=lambda t: t[0])  # stable: ties keep wire order
    fields: Dict[int, bytes] = {}
    for k, (off, item) in enumerate(addressed):
        end = addressed[k + 1][0] if k + 1 < len(addressed) else len(payload)
        if off > end or end > len(payload):
            raise ValueError(f"item descriptor: item {item:#x} at {off}..{end} past its {len(payload)} bytes")
        fields[item] = payload[off:end]
    if not iid:
        raise ValueError("item descriptor without an id")
    shape: Optional[Tuple[int, ...]] = None
    if _D_SHAPE in fields:
        raw, w = fields[_D_SHAPE], 1 + imm_bytes
        if len(raw) % w:
            raise ValueError(f"item descriptor {iid:#x}: shape of {len(raw)} bytes, fields of {w}")
        shape = tuple(-1 if raw[i] & 0x01 else int.from_bytes(raw[i + 1:i + w], "big")
                      for i in range(0, len(raw), w))
    try:
        name = fields.get(_D_NAME, b"").decode()
        desc = fields.get(_D_DESCRIPTION, b"").decode()
        dtype = fields.get(_D_DTYPE, b"").decode("ascii")
    except UnicodeDecodeError as e:
        raise ValueError(f"item descriptor {iid:#x}: {e}") from None
    rec = meta_record(iid, name, desc, shape, fields.get(_D_FORMAT, b""), dtype)
    return next(iter(_parse_metadata(rec).values()))


class Descriptor:
    """What a SPEAD item descriptor says: id, name, description, shape (None for the variable dimension),
    dtype (numpy) or format (list of (code, bits)), order ('C' or 'F')."""

    __slots__ = ("id", "name", "description", "shape", "dtype", "order", "format", "_kind", "_dt", "_var",
                 "_known", "_nbytes", "_top", "_string", "_imm_width", "_view", "_views", "_views_buf", "_fmt", "_fixed")

    def __init__(self, id: int, name: str, description: str, shape: Sequence[Optional[int]],
                 dtype: Any = None, order: str = "C", format: Optional[Format] = None) -> None:
        shape = tuple(None if (s is None or s < 0) else int(s) for s in shape)
        if sum(s is None for s in shape) > 1:
            raise ValueError(f"item {name!r}: shape {shape} has more than one variable dimension")
        if order not in ("C", "F"):
            raise ValueError(f"item {name!r}: order must be 'C' or 'F', not {order!r}")
        if dtype is not None:
            dtype = np.dtype(dtype)
            if dtype.hasobject or dtype.itemsize == 0:
                raise ValueError(f"item {name!r}: dtype {dtype} has objects or no size")
            if format is not None:
                raise ValueError(f"item {name!r}: give a dtype or a format, not both")
            internal = dtype
        else:
            if not format:
                raise ValueError(f"item {name!r}: give a dtype or a format")
            format = [(str(c), int(b)) for c, b in format]
            internal = _format_dtype(format)
        self.id, self.name, self.description = int(id), name, description
        self.shape: Shape = shape
        self.dtype: Optional[np.dtype] = dtype
        self.order: Order = "F" if order == "F" else "C"
        self.format = format
        self._fmt: Format = format or []  # the format, [] for a dtype item (a _NUMPY kind)
        # the shape of a fixed-shape item (no variable dimension); () for one with a variable dimension
        self._fixed: Tuple[int, ...] = () if None in shape else tuple(s for s in shape if s is not None)
        self._dt = internal
        self._var = None in shape
        known = 1
        for s in shape:
            if s is not None:
                known *= s
        self._known = known
        if not internal.hasobject:
            self._kind = _NUMPY
            self._nbytes = known * internal.itemsize
        elif not shape and len(self._fmt) == 1 and self._fmt[0][0] in "ui" and self._fmt[0][1] < 64:
            self._kind = _IMMEDIATE
            self._nbytes = (self._fmt[0][1] + 7) // 8
        else:
            self._kind = _BITS
            self._nbytes = (known * self.itemsize_bits + 7) // 8
        self._top = 1 << (self._fmt[0][1] - 1) if self._fmt and self._fmt[0][0] == "i" else 0
        self._string = len(shape) == 1 and format == [("c", 8)]
        # ItemGroup.update's inlined fast paths, decided once: an immediate of exactly its format's width
        # (bytes), -1 for none; a fixed-shape native numpy array (one frombuffer, a view).
        self._imm_width = self._fmt[0][1] // 8 if self._kind == _IMMEDIATE and self._fmt[0][1] % 8 == 0 else -1
        self._view = self._kind == _NUMPY and not self._var and internal.isnative and bool(shape) \
            and not self._string
        # Those views by offset in the buffer they view (a ring's slots repeat, so do the views): a heap
        # then costs a dict look-up, not a new array. Bounded by _MAX_VIEWS; forgotten for another buffer.
        self._views: Dict[int, np.ndarray] = {}
        self._views_buf: Any = None

    @property
    def itemsize_bits(self) -> int:
        """Bits per element."""
        return self._dt.itemsize * 8 if self.format is None else sum(b for _, b in self.format)

    def is_variable_size(self) -> bool:
        return self._var

    def dynamic_shape(self, max_elements: int) -> Tuple[int, ...]:
        """The shape with its variable dimension as large as max_elements elements allow."""
        if not self._var:
            return self._fixed
        var = max_elements // self._known if self._known else 0
        return tuple(var if s is None else s for s in self.shape)

    @classmethod
    def from_ring(cls, d: Any, immediate_bytes: Optional[int] = None) -> "Descriptor":
        """From a ring's ItemDescriptor (Ring.descriptors()): the numpy header wins over the format."""
        shape = () if d.shape is None else d.shape
        if d.dtype is not None:
            return cls(d.id, d.name, d.description, shape, dtype=d.dtype, order=d.order)
        fmt = parse_format(d.format, immediate_bytes)
        if fmt is None:
            raise ValueError(f"item {d.id:#x} ({d.name!r}): no dtype and no readable format {d.format!r}")
        return cls(d.id, d.name, d.description, shape, format=fmt)

    def __repr__(self) -> str:
        t = f"dtype={self.dtype}" if self.dtype is not None else f"format={self.format}"
        return f"{type(self).__name__}(id={self.id:#x}, name={self.name!r}, shape={self.shape}, {t})"


class Item(Descriptor):
    """A descriptor with a value. ``version`` counts the updates (as in spead2: a HeapGenerator sends an
    item whose version changed since the last heap)."""

    __slots__ = ("_value", "version")

    def __init__(self, *args: Any, value: Any = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._value = value
        self.version = 1

    @classmethod
    def from_descriptor(cls, d: Descriptor) -> "Item":
        return cls(d.id, d.name, d.description, d.shape, dtype=d.dtype, order=d.order, format=d.format)

    @property
    def value(self) -> Any:
        """The decoded value; a numpy value is a view of the heap's slot, valid until the heap's release."""
        return self._value

    @value.setter
    def value(self, v: Any) -> None:
        if v is None:
            raise ValueError(f"item {self.name!r}: a value cannot be None (SPEAD cannot encode it)")
        self._value = v
        self.version += 1

    def set_from_raw(self, buf: Any, offset: int, length: int, new_order: str = "=") -> None:
        """Decode an address item: ``length`` bytes at ``offset`` of ``buf`` (no copy for numpy items)."""
        if self._kind == _NUMPY:
            dt = self._dt
            if self._var:
                shape = self.dynamic_shape(length // dt.itemsize)
                count = 1
                for s in shape:
                    count *= s
            else:
                shape, count = self._fixed, self._known
            if count * dt.itemsize > length:
                raise ValueError(f"item {self.name!r}: {length} bytes are too few for {shape} of {dt}")
            a = np.frombuffer(buf, dt, count, offset)
            if new_order != "|" and not dt.isnative and new_order in "=<>":
                a = a.astype(dt.newbyteorder(new_order), casting="equiv", copy=False)
            self._finish(a.reshape(shape, order=self.order))
        else:
            self._from_bytes(bytes(memoryview(buf)[offset:offset + length]), False)

    def _view_of(self, buf: Any, off: int) -> np.ndarray:
        """The value of a fixed-shape native numpy item (_view) at offset off of buf: a read-only view,
        remembered for the next heap in the same place."""
        a = np.frombuffer(buf, self._dt, self._known, off)
        if len(self._fixed) != 1:
            a = a.reshape(self._fixed, order=self.order)
        if self._views_buf is not buf:
            self._views, self._views_buf = {}, buf
        if len(self._views) < _MAX_VIEWS:
            self._views[off] = a
        return a

    def set_from_immediate(self, value: int, width: int) -> None:
        """Decode an immediate item: its value and its width in bytes (the ring's item table)."""
        if self._kind == _IMMEDIATE and width * 8 == self._fmt[0][1]:
            top = self._top
            self._value = value - 2 * top if top and value >= top else value
            self.version += 1
        else:
            self._from_bytes((value & ((1 << (8 * width)) - 1)).to_bytes(width, "big"), True)

    def _from_bytes(self, raw: bytes, immediate: bool) -> None:
        if self._kind == _NUMPY:
            dt = self._dt
            shape = self.dynamic_shape(len(raw) // dt.itemsize)
            count = 1
            for s in shape:
                count *= s
            n = count * dt.itemsize
            if n > len(raw):
                raise ValueError(f"item {self.name!r}: {len(raw)} bytes are too few for {shape} of {dt}")
            raw = raw[len(raw) - n:] if immediate else raw[:n]  # immediates are padded at the head
            a = np.frombuffer(raw, dt, count)
            if not dt.isnative:
                a = a.astype(dt.newbyteorder("="), casting="equiv")
            self._finish(a.reshape(shape, order=self.order))
            return
        bits = self.itemsize_bits
        shape = self.dynamic_shape(len(raw) * 8 // bits)
        count = 1
        for s in shape:
            count *= s
        if count * bits > len(raw) * 8:
            raise ValueError(f"item {self.name!r}: {len(raw)} bytes are too few for {shape} of {self.format}")
        if immediate:
            raw = raw[len(raw) - (count * bits + 7) // 8:]
        acc = int.from_bytes(raw, "big")
        left = len(raw) * 8
        fmt = self._fmt

        def field() -> Any:
            nonlocal left
            out = []
            for code, nb in fmt:
                left -= nb
                v: Any = (acc >> left) & ((1 << nb) - 1)  # the field's bits, then its value (int, bool, bytes, float)
                if code == "i" and v >= 1 << (nb - 1):
                    v -= 1 << nb
                elif code == "b":
                    v = bool(v)
                elif code == "c":
                    v = bytes((v,))
                elif code == "f":
                    v = (np.uint32(v).view(np.float32) if nb == 32 else np.uint64(v).view(np.float64))
                out.append(v)
            return out[0] if len(out) == 1 else tuple(out)

        def load(dims: Tuple[int, ...]) -> Any:
            return [load(dims[1:]) for _ in range(dims[0])] if dims else field()

        value = load(tuple(shape))
        if self._string:
            value = b"".join(value).decode("ascii")
        elif shape:
            # As spead2: a shaped item numpy has no type for is an array of the format's dtype (object
            # elements, or a record of them for several fields), not nested lists.
            value = np.array(value, self._dt)
        self._value = value
        self.version += 1

    def _finish(self, a: np.ndarray) -> None:
        self._value = a[()] if not self.shape else (b"".join(a).decode("ascii") if self._string else a)
        self.version += 1

    def to_bytes(self, immediate_bytes: int = _IMMEDIATE_BYTES) -> Tuple[Union[bytes, np.ndarray], Optional[int]]:
        """The value encoded for a heap: (bytes or a numpy array to copy into the payload, None), or
        (b"", int) when it travels as an immediate (a fixed-size value of at most immediate_bytes bytes)."""
        v = self._value
        if v is None:
            raise ValueError(f"item {self.name!r} has no value")
        if self._kind == _IMMEDIATE and self._fmt[0][1] <= 8 * immediate_bytes:
            nb = self._fmt[0][1]
            iv = int(v)
            lo, hi = (-(1 << (nb - 1)), 1 << (nb - 1)) if self._top else (0, 1 << nb)
            if not lo <= iv < hi:
                raise ValueError(f"item {self.name!r}: {iv} does not fit {self.format}")
            # The value's bits as spead2 packs them: from the top of its last (nb + 7) // 8 bytes.
            return b"", (iv & ((1 << nb) - 1)) << (-nb % 8)
        if self._kind == _NUMPY:
            if self._string and isinstance(v, (str, bytes)):
                v = [v[i:i + 1] for i in range(len(v))]
                v = [x.encode("ascii") if isinstance(x, str) else x for x in v]
            a = np.asarray(v, dtype=self._dt, order=self.order)
            if len(a.shape) != len(self.shape) or any(s is not None and s != x for s, x in zip(self.shape, a.shape)):
                raise ValueError(f"item {self.name!r}: value of shape {a.shape}, want {self.shape}")
            return (a.T if self.order == "F" else a), None
        # generic bit packing, as spead2 does
        fmt = self._fmt
        acc, nbits = 0, 0

        def store(x: Any, dims: int) -> None:
            nonlocal acc, nbits
            if dims:
                for y in x:
                    store(y, dims - 1)
                return
            fields: Sequence[Any] = x if len(fmt) > 1 else (x,)
            for (code, nb), f in zip(fmt, fields):
                if code == "f":
                    f = int(np.float32(f).view(np.uint32)) if nb == 32 else int(np.float64(f).view(np.uint64))
                elif code == "c":
                    f = f[0] if isinstance(f, (bytes, bytearray)) else ord(f)
                f = int(f)
                if code == "i" and f < 0:
                    f += 1 << nb
                if not 0 <= f < (1 << nb):
                    raise ValueError(f"item {self.name!r}: {f} does not fit {nb} bits")
                acc = (acc << nb) | f
                nbits += nb

        store(v, len(self.shape))
        pad = -nbits % 8
        return (acc << pad).to_bytes((nbits + pad) // 8, "big"), None


class ItemGroup:
    """Items by name and by id, as ``spead2.ItemGroup``: ``update(heap)`` learns descriptors and decodes
    the heap's items; ``ig['name']`` / ``ig[id]`` give an Item, ``keys()`` the names, ``ids()`` the ids,
    ``values()`` the Items, ``items()`` (name, Item) pairs."""

    def __init__(self) -> None:
        self._by_name: Dict[str, Item] = {}
        self._by_id: Dict[int, Item] = {}
        self._lookup: Dict[Union[str, int], Item] = {}
        self._meta: Any = None  # the ring metadata mapping last read (Ring.descriptors() caches it)
        self._imm_bytes: Optional[int] = None
        # update's plans by heap shape (see _plan), for heaps of the buffer _plans_buf; None: not planning.
        # Emptied whenever an item changes (_add) or update meets another buffer.
        self._plans: Optional[Dict[Tuple[int, ...], Tuple[Any, ...]]] = {}
        self._plans_buf: Any = None

    # ----- spead2's mapping interface
    def __getitem__(self, key: Union[str, int]) -> Item:
        return self._lookup[key]

    def __contains__(self, key: object) -> bool:
        return key in self._lookup

    def keys(self) -> KeysView[str]:
        return self._by_name.keys()

    def ids(self) -> KeysView[int]:
        return self._by_id.keys()

    def values(self) -> ValuesView[Item]:
        return self._by_name.values()

    def items(self) -> ItemsView[str, Item]:
        return self._by_name.items()

    def __len__(self) -> int:
        return len(self._by_name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def add_item(self, id: Optional[int], name: str, description: str, shape: Sequence[Optional[int]],
                 dtype: Any = None, order: str = "C", format: Optional[Format] = None,
                 value: Any = None) -> Item:
        """Describe an item (id None: the next free id from 0x1000). A new descriptor for an id or a name
        replaces the old item, as in spead2."""
        if id is None:
            id = _UNRESERVED_ID
            while id in self._by_id:
                id += 1
        item = Item(id, name, description, shape, dtype=dtype, order=order, format=format, value=value)
        self._add(item)
        return item

    def _add(self, item: Item) -> None:
        old = self._by_id.get(item.id)
        if old is not None and (old.name, old.shape, old.dtype, old.order, old.format) == (
                item.name, item.shape, item.dtype, item.order, item.format):
            old.description = item.description  # the same item described again: keep its value
            return
        self._plans = {}  # every plan decided with the old items
        for o in (old, self._by_name.get(item.name)):
            if o is not None:
                self._by_id.pop(o.id, None)
                self._by_name.pop(o.name, None)
                self._lookup.pop(o.id, None)
                self._lookup.pop(o.name, None)
        self._by_id[item.id] = item
        self._by_name[item.name] = item
        self._lookup[item.id] = item
        self._lookup[item.name] = item

    def add_descriptors(self, descriptors: Any) -> None:
        """Learn descriptors: a Ring's ``descriptors()`` mapping ({id: ItemDescriptor}) or Descriptors.
        A descriptor this module cannot decode is left out (spead2 logs and drops it too)."""
        for d in (descriptors.values() if isinstance(descriptors, dict) else descriptors):
            if isinstance(d, Descriptor):
                self._add(Item.from_descriptor(d))
                continue
            try:
                self._add(Item.from_descriptor(Descriptor.from_ring(d, self._imm_bytes)))
            except ValueError:
                continue

    def _learn(self, heap: Any) -> None:
        """Read the ring's metadata (cached by the ring until the producer rewrites it)."""
        if self._imm_bytes is None:
            for _iid, _v, length, fl in heap._raw_items:
                if fl & L.ITEM_IMMEDIATE and 1 <= length <= 7:
                    self._imm_bytes = length
                    break
        ring = heap._ring
        meta = ring.descriptors() if ring is not None else (heap._descmap or {})
        if meta is not self._meta:
            self._meta = meta
            self.add_descriptors(meta)
        if heap.flags & L.FLAG_HAS_DESCRIPTORS:
            # The heap's own descriptors too: the ring's metadata may lack them (an area too small for the
            # stream's descriptors: the producer then logs and leaves it as it was).
            found = []
            for iid, value, length, fl in heap._raw_items:
                if iid == DESCRIPTOR_ITEM and not fl & L.ITEM_IMMEDIATE:
                    try:
                        found.append(parse_descriptor_item(heap._mv[heap._base + value:heap._base + value + length]))
                    except (ValueError, RingError):
                        continue  # spead2 drops a descriptor it cannot read, too
            self.add_descriptors(found)

    def update(self, heap: Any, new_order: str = "=", partial: bool = False) -> Dict[str, Item]:
        """Learn the descriptors the heap brought (HAS_DESCRIPTORS) or the ring knows, and decode the heap's
        items. Returns {name: Item} of the items this heap changed. Numpy values are views of the heap's
        slot: valid until it is released. An item cut to the slot of a TRUNCATED heap raises TruncatedItem
        (nothing of the heap is decoded); with ``partial=True`` it is left out and the rest decoded."""
        if heap._released:
            raise RingError(f"heap at position {heap.position} was released: its memory belongs to the producer")
        plans = self._plans
        raw = heap._raw
        if raw is None and plans is not None and heap._buf is self._plans_buf \
                and not heap.flags & L.FLAG_HAS_DESCRIPTORS:
            # A heap of a shape met before (the same item ids, lengths and flags; values aside) is decoded
            # by that shape's plan: its item table copied in one unpack, the row checked (spec §A), each
            # address item's bounds checked (§9.1), then each value set as update decided for that shape.
            n = heap.item_count
            tab = _TABLES.get(n)
            if tab is None and 0 < n <= _PLAN_MAX_ITEMS:
                tab = _table(n)
            if tab is not None:
                ring = heap._ring
                if ring._closed:
                    raise RingError("ring is closed")
                buf = heap._buf
                t = tab[0](buf, heap._items_off)
                plan = plans.get(tab[1](t))
                if plan:
                    c32 = ring._c32
                    if c32[ring._i_row_state] != _ATTACHED or c32[ring._i_row_gen] != ring._generation or ORDERED:
                        ring._check_row()  # copied, then checked: the table was this heap's
                    for k, limit in plan[1]:
                        if t[k] > limit:
                            break  # past the slot: the general way reads it again and says so
                    else:
                        base = heap._base
                        for k, it, kind, arg in plan[0]:
                            v = t[k]
                            if kind == _P_IMMEDIATE:
                                it._value = v - 2 * arg if arg and v >= arg else v
                                it.version += 1
                            elif kind == _P_VIEW:
                                off = base + v
                                a = it._views.get(off)
                                if a is None:
                                    a = it._view_of(buf, off)
                                it._value = a
                                it.version += 1
                            elif kind == _P_SET_IMMEDIATE:
                                it.set_from_immediate(v, arg)
                            else:
                                it.set_from_raw(buf, base + v, arg, new_order)
                        return plan[2].copy()
                elif plan is None:
                    raw = heap._raw_items
                    updated = self._update(heap, raw, new_order, partial)
                    self._plan(heap, raw, tab[1](t))
                    return updated
        if raw is None:
            raw = heap._raw_items
        return self._update(heap, raw, new_order, partial)

    def _plan(self, heap: Any, raw: List[Tuple[int, int, int, int]], shape: Tuple[int, ...]) -> None:
        """Decide, for later heaps of this heap's shape, what update did with each of its items: a plan
        (actions: value index in the flat table, Item, kind, argument; address items' bounds: value index,
        highest value; the dict update returns), kept by shape. Made only for a table read
        straight from the ring (raw), at most _MAX_PLANS of them."""
        plans = self._plans
        if plans is None or heap._buf is not self._plans_buf:
            return
        if len(plans) >= _MAX_PLANS:
            self._plans = None  # a shape per heap: planning costs more than it saves, until items change
            return
        if [x for iid, _v, length, flags in raw for x in (iid, length, flags)] != list(shape):
            return  # the table read twice differs: the ring was detached or is corrupt (the row says which)
        ss = heap._ring._geo.slot_size
        get = self._by_id.get
        acts, bounds, updated = [], [], {}
        for k, (iid, _v, length, flags) in enumerate(raw):
            it = get(iid)
            if flags & L.ITEM_CUT or (it is None and iid > STREAM_CTRL_ID):
                plans[shape] = _NO_PLAN  # update decides these heap by heap (truncation, learning)
                return
            if it is None:
                continue
            if flags & _ITEM_IMMEDIATE:
                acts.append((4 * k + 1, it, _P_IMMEDIATE, it._top) if length == it._imm_width
                            else (4 * k + 1, it, _P_SET_IMMEDIATE, length))
            else:
                if it._view and it._nbytes > length:
                    plans[shape] = _NO_PLAN  # too short: update raises ValueError, heap by heap
                    return
                bounds.append((4 * k + 1, ss - length))
                acts.append((4 * k + 1, it, _P_VIEW if it._view else _P_SET_RAW, length))
            updated[it.name] = it
        plans[shape] = (tuple(acts), tuple(bounds), updated)

    def _update(self, heap: Any, raw: List[Tuple[int, int, int, int]], new_order: str,
                partial: bool) -> Dict[str, Item]:
        """update() the general way, from the heap's checked item table raw."""
        buf = heap._buf
        if buf is not self._plans_buf:
            self._plans_buf = buf  # the items' views are of this buffer from here: plans of another go
            if self._plans is not None:
                self._plans = {}
        if heap.flags & L.FLAG_HAS_DESCRIPTORS or self._meta is None:
            self._learn(heap)
        get = self._by_id.get
        base = heap._base
        updated = {}
        learnt = False
        if heap.flags & L.FLAG_TRUNCATED and not partial:
            for iid, _v, length, flags in raw:
                if flags & L.ITEM_CUT:
                    raise TruncatedItem(f"heap {heap.heap_cnt}: item {iid:#x} ran past its slot ({length} of its "
                                        f"bytes kept; the heap is {heap.heap_size} bytes): raise recv --slot-size, "
                                        "or update(heap, partial=True) to leave it out")
        for iid, value, length, flags in raw:
            if flags & L.ITEM_CUT:
                continue
            it = get(iid)
            if it is None:
                if iid <= STREAM_CTRL_ID or learnt:
                    continue
                self._learn(heap)  # a descriptor written since we last looked (attached late, or no flag)
                learnt = True
                it = self._by_id.get(iid)
                if it is None:
                    continue
            # The common cases inlined (set_from_immediate / set_from_raw do the rest): an integer immediate
            # of its format's width, and a fixed-shape native numpy array, one frombuffer (a view).
            if flags & _ITEM_IMMEDIATE:
                if length == it._imm_width:
                    top = it._top
                    it._value = value - 2 * top if top and value >= top else value
                    it.version += 1
                else:
                    it.set_from_immediate(value, length)
            elif it._view:
                if it._nbytes > length:
                    raise ValueError(f"item {it.name!r}: {length} bytes are too few for {it.shape} of {it._dt}")
                off = base + value
                a = it._views.get(off) if it._views_buf is buf else None
                if a is None:
                    a = it._view_of(buf, off)
                it._value = a
                it.version += 1
            else:
                it.set_from_raw(buf, base + value, length, new_order)
            updated[it.name] = it
        return updated


def heap_item(heap: Any, key: Union[str, int]) -> Item:
    """``heap['name']`` / ``heap[id]``: one item of a single heap, decoded by the ring's descriptor (a
    fresh Item; numpy values are views valid until the heap's release). KeyError when the ring has no
    descriptor of that name or the heap has no such item."""
    ring = heap._ring
    meta = ring.descriptors() if ring is not None else (heap._descmap or {})
    if isinstance(key, numbers.Integral):
        d = meta.get(int(key))
    else:
        d = next((x for x in meta.values() if x.name == key), None)
    if d is None:
        raise KeyError(f"no item descriptor for {key!r}")
    imm = next((t[2] for t in heap._raw_items if t[3] & L.ITEM_IMMEDIATE and 1 <= t[2] <= 7), None)
    item = Item.from_descriptor(Descriptor.from_ring(d, imm))
    heap._check_live()
    for iid, value, length, flags in heap._raw_items:
        if iid == d.id:
            if flags & L.ITEM_CUT:
                raise TruncatedItem(f"heap {heap.heap_cnt}: item {key!r} ran past its slot: only {length} bytes kept")
            if flags & L.ITEM_IMMEDIATE:
                item.set_from_immediate(value, length)
            else:
                item.set_from_raw(heap._buf, heap._base + value, length)
            return item
    raise KeyError(f"heap {heap.heap_cnt} has no item {key!r} ({d.id:#x})")


class HeapGenerator:
    """The twin of ``spead2.send.HeapGenerator`` for a ring producer: ``publish(heap_cnt)`` takes a slot,
    writes the changed items' values (``data='stale'``) or all of them (``data='all'``), and publishes it.
    The descriptors go to the ring's stream-metadata area (spec §6) when they change, before the first
    heap that carries their items — not into every heap. Fixed-size integer formats of up to 48 bits
    travel as immediates (SPEAD-64-48), everything else as address items in the payload."""

    def __init__(self, item_group: ItemGroup, producer: Any) -> None:
        self._ig = item_group
        self._p = producer
        self._sent_versions: Dict[int, int] = {}
        self._described: Optional[List[Tuple[Any, ...]]] = None

    def _write_descriptors(self) -> None:
        now: List[Tuple[Any, ...]] = [(it.id, it.name, it.description, it.shape, it.dtype, it.order, it.format)
               for it in self._ig._by_id.values()]
        if now == self._described:
            return
        recs = []
        for it in self._ig._by_id.values():
            shape = tuple(-1 if s is None else s for s in it.shape)
            fmt = b"" if it.format is None else format_bytes(it.format)
            recs.append(_MetaDescriptor(it.id, it.name, it.description, shape, it.dtype, fmt, it.order))
        self._p.set_descriptors(recs)
        self._described = now
        self._sent_versions.clear()  # the descriptors changed: send every item again

    def publish(self, heap_cnt: int, data: str = "stale", timeout: Optional[float] = None, **kw: Any) -> int:
        """Fill a slot with the items and publish it as heap heap_cnt; returns its position. kw goes to
        Producer.publish (timestamp_ns, flags, ...). ValueError when the values do not fit the slot."""
        if data not in ("stale", "all"):
            raise ValueError(f"data must be 'stale' or 'all', not {data!r}")
        self._write_descriptors()
        slot = self._p.acquire(timeout)
        try:
            off = 0
            payload = slot.payload
            sent = self._sent_versions
            for it in self._ig._by_id.values():
                if it._value is None or (data == "stale" and sent.get(it.id) == it.version):
                    continue
                body, imm = it.to_bytes()
                if imm is not None:
                    slot.add_item(it.id, value=imm, length=_IMMEDIATE_BYTES, immediate=True)
                    continue
                raw = np.ascontiguousarray(body).data.cast("B") if isinstance(body, np.ndarray) \
                    else memoryview(body)
                n = raw.nbytes
                if off + n > len(payload):
                    raise ValueError(f"items take more than the slot's {len(payload)} bytes (at {it.name!r})")
                payload[off:off + n] = np.frombuffer(raw, np.uint8)
                slot.add_item(it.id, value=off, length=n)
                off += n
        except BaseException:
            slot.discard()
            raise
        pos = self._p.publish(slot, heap_cnt=heap_cnt, **kw)
        for it in self._ig._by_id.values():
            sent[it.id] = it.version
        return pos


class _MetaDescriptor:
    """What Producer.set_descriptors reads from a descriptor (its ItemDescriptor-like interface)."""

    __slots__ = ("id", "name", "description", "shape", "dtype", "format", "order")

    def __init__(self, id: int, name: str, description: str, shape: Tuple[int, ...], dtype: Any,
                 format: bytes, order: str) -> None:
        self.id, self.name, self.description, self.shape = id, name, description, shape
        self.dtype, self.format, self.order = dtype, format, order

