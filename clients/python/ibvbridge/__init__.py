"""Python consumer of ibvbridge shared-memory heap rings (docs/ring-layout.md, layout 2.x).

    import ibvbridge
    with ibvbridge.Ring.attach("myring") as ring:      # the socket myring.v2.sock in the ring directory
        for heap in ring:
            print(heap.heap_cnt, len(heap.payload))

Several consumers may attach to one ring; each receives every heap.

A ring is made (and written) with ``ibvbridge.Producer.create(name, ...)``: see ibvbridge.producer.
"""

from typing import Any

from .errors import (CorruptRing, Detached, EndOfStream, HugePageWarning, Interrupted, MetadataBusy, NoConsumer,
                     NoHugePages,
                     NoSpace, Overrun, PermissionDenied, ProducerGone, ProtocolError, RingBusy, RingClosing,
                     RingError, RingFull, RingInUse, RingNotFound, StreamEnd, StreamEnded, Timeout, TruncatedItem,
                     UnsafeDirectory, VersionMismatch)

__version__ = "0.3.0"  # ibvbridge's one version (internal/version in Go, the C library's pkg-config)

_LAZY = {"Ring", "Stream", "RingStats", "Heap", "Item", "Batch", "ItemDescriptor", "Geometry", "socket_path_for", "lookup_dirs",
         "default_dir", "uid_trusted", "validate_geometry"}
_ERRORS = ["RingError", "RingNotFound", "PermissionDenied", "RingBusy", "RingClosing", "VersionMismatch",
           "ProtocolError", "CorruptRing", "Detached", "Overrun", "ProducerGone", "EndOfStream", "StreamEnd",
           "TruncatedItem", "MetadataBusy",
           "Timeout",
           "RingInUse", "UnsafeDirectory", "NoSpace", "NoHugePages", "RingFull", "StreamEnded", "Interrupted", "NoConsumer",
           "HugePageWarning"]
_PRODUCER = {"Producer", "Slot"}
_ITEMS = {"ItemGroup", "HeapGenerator", "Descriptor"}  # spead2's vocabulary (ibvbridge.items)

__all__ = sorted(_LAZY | _PRODUCER | _ITEMS) + ["attach", "layout", "shared"] + _ERRORS + ["__version__"]


def __getattr__(name: str) -> Any:
    # Imported lazily so that `python -m ibvbridge.layout` runs the layout module exactly once.
    if name in _LAZY or name == "attach":
        from . import ring
        return ring.Ring.attach if name == "attach" else getattr(ring, name)
    if name in _PRODUCER:
        from . import producer
        return getattr(producer, name)
    if name in _ITEMS:
        from . import items
        return getattr(items, name)
    if name in ("layout", "shared"):
        import importlib
        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
