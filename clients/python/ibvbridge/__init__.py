"""Python consumer of ibvbridge shared-memory heap rings (docs/ring-layout.md, layout 1.x).

    import ibvbridge
    with ibvbridge.Ring.attach("myring") as ring:
        for heap in ring:
            print(heap.heap_cnt, len(heap.payload))
"""

from .errors import (CorruptRing, EndOfStream, ProducerGone, RingBusy, RingError, RingNotFound, Timeout,
                     VersionMismatch)

__version__ = "0.1.0"

_LAZY = {"Ring", "Heap", "Item", "Batch", "ItemDescriptor", "Geometry", "ctl_path_for", "validate_geometry"}

__all__ = sorted(_LAZY) + ["attach", "layout", "RingError", "RingNotFound", "RingBusy", "VersionMismatch",
                           "CorruptRing", "ProducerGone", "EndOfStream", "Timeout", "__version__"]


def __getattr__(name):
    # Imported lazily so that `python -m ibvbridge.layout` runs the layout module exactly once.
    if name in _LAZY or name == "attach":
        from . import ring
        return ring.Ring.attach if name == "attach" else getattr(ring, name)
    if name == "layout":
        import importlib
        return importlib.import_module(".layout", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
