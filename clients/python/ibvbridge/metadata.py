"""The stream-metadata area's records (spec §6): their one encoder (meta_record), used by the producers and
by ibvbridge.items for a descriptor heap's items, and their one parser (to ItemDescriptors), used by
Ring.descriptors and ibvbridge.items. Imports nothing of the package but layout and errors, so a
consumer's first descriptor costs no import of the producer."""

from __future__ import annotations

import ast
import collections
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

from . import layout as L
from .errors import CorruptRing

if TYPE_CHECKING:
    import numpy as np
else:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is optional until a view is asked for
        np = None


class ItemDescriptor(collections.namedtuple("ItemDescriptor",
                                            ("id", "name", "description", "shape", "dtype", "format",
                                             "order", "dtype_header"))):
    """A SPEAD item descriptor from the stream-metadata area (spec §6).

    shape: tuple (-1 for a variable dimension) or None when unknown; dtype: numpy dtype parsed from the
    numpy header text (None when the stream gave none, or numpy is missing); format: the raw SPEAD format
    field (bytes); order: 'C' or 'F'; dtype_header: the raw numpy header text.
    """


def meta_record(item_id: int, name: str = "", description: str = "", shape: Optional[Sequence[int]] = None,
                fmt: bytes = b"", dtype: Any = "") -> bytes:
    """One stream-metadata record (spec §6), as producers write it and ibvbridge.items re-encodes a descriptor
    heap's item 0x5 to parse it with _parse_metadata. dtype: the numpy header text (or "")."""
    nb, db, tb = name.encode(), description.encode(), dtype.encode()
    fmt = bytes(fmt or b"")
    ndim = L.NDIM_UNKNOWN if shape is None else len(shape)
    shp = b"" if shape is None else b"".join(int(s).to_bytes(8, "little", signed=True) for s in shape)
    body = shp + nb + db + fmt + tb
    size = (L.META_RECORD_HEADER_SIZE + len(body) + 7) // 8 * 8
    hdr = L.META_RECORD_STRUCT.pack(size, ndim, item_id, len(nb), len(db), len(fmt), len(tb))
    return (hdr + body).ljust(size, b"\0")


def _parse_metadata(buf: Any) -> Dict[int, ItemDescriptor]:
    """Parse the records of the stream-metadata area into {id: ItemDescriptor}; CorruptRing if malformed."""
    out: Dict[int, ItemDescriptor] = {}
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
