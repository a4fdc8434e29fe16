"""Exceptions of the ibvbridge consumer. All derive from RingError."""


class RingError(Exception):
    """Base class of every ibvbridge error."""


class RingNotFound(RingError):
    """The control file did not appear before the attach timeout."""


class RingBusy(RingError):
    """Another consumer holds the ring's consumer lock (.cons)."""


class VersionMismatch(RingError):
    """The ring's layout major version is not the one this client implements."""

    def __init__(self, found, supported):
        self.found = found
        self.supported = supported
        super().__init__(f"ring layout major version {found}, this client supports {supported}")


class CorruptRing(RingError):
    """A header, descriptor, item or metadata record broke the layout contract."""


class ProducerGone(RingError):
    """The producer died (nobody holds the control file's flock) without closing the ring."""


class EndOfStream(RingError):
    """The stream ended: an END_OF_STREAM marker, or a CLOSED ring with everything read."""


class Timeout(RingError, TimeoutError):
    """A wait (attach or next heap) ran past its deadline."""
