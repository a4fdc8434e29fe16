"""Exceptions of the ibvbridge consumer (layout 2.1). All derive from RingError."""

from __future__ import annotations


class RingError(Exception):
    """Base class of every ibvbridge error."""


class RingNotFound(RingError):
    """No socket of that name in any trusted ring directory (at once, or after the timeout with wait=True), or
    only a stale one (no producer answered) until the timeout."""


class PermissionDenied(RingError):
    """The socket is served by an untrusted uid (spec §1.2), the socket cannot be connected to, or the
    producer refused this consumer (error status 2, not permitted)."""


class RingBusy(RingError):
    """Every consumer row of the ring is attached (error status 3)."""


class RingClosing(RingError):
    """The producer refused the attach because its stream has ended (error status 4)."""


class VersionMismatch(RingError):
    """The ring's layout major version is not the one this client implements (error status 1, or a major
    mismatch in the welcome or header). ``found`` and ``supported`` are the majors; the message names both
    versions."""

    def __init__(self, found: int, supported: int, message: str | None = None) -> None:
        self.found = found
        self.supported = supported
        super().__init__(message or f"ring layout major version {found}, this client supports {supported}")


class ProtocolError(RingError):
    """The producer's answer is malformed (too short, wrong magic, wrong descriptors), or it answered
    status 5 (our hello was malformed)."""


class CorruptRing(RingError):
    """The ring's memory broke the layout contract: bad geometry, missing seals, a size mismatch, a bad
    descriptor, item or metadata record."""


class Detached(RingError):
    """The producer detached this consumer (spec §7.6); the ring must not be read any more. ``reason`` is
    the consumer-table row state (layout.CONSUMER_*) or None when the row was reused."""

    def __init__(self, message: str, reason: int | None = None) -> None:
        self.reason = reason
        super().__init__(message)


class Overrun(Detached):
    """Detached as overrun: the consumer fell a whole ring behind under the drop policy. ``lost_heaps``:
    the published heaps it had not released."""

    def __init__(self, message: str, lost_heaps: int) -> None:
        self.lost_heaps = lost_heaps
        super().__init__(message, 2)


class ProducerGone(RingError):
    """The producer died (its socket hung up) without closing the ring; raised once everything it
    published has been read."""


class EndOfStream(RingError):
    """The stream ended: an END_OF_STREAM marker, or a CLOSED ring with everything read."""


class StreamEnd(EndOfStream):
    """One stream ended and the ring goes on (2.2: a STREAM_END marker, recv --keep-going): the next read
    gets the next stream's first heap. A subclass of EndOfStream, so a loop written for one stream ends at
    the end of its stream; catch StreamEnd first to read on. ``heap_cnt`` is the stop heap's cnt,
    ``position`` the marker's, ``timestamp_ns`` when the stream ended."""

    def __init__(self, msg: str = "stream ended", heap_cnt: int = 0, position: int = 0, timestamp_ns: int = 0):
        super().__init__(msg)
        self.heap_cnt = heap_cnt
        self.position = position
        self.timestamp_ns = timestamp_ns


class TruncatedItem(ValueError):
    """An item of a TRUNCATED heap ran past its slot: only its first bytes are in the ring. Ask for them
    with ``partial=True`` (``heap.array``) or ``item.partial_data``; raise ``--slot-size`` to get it whole."""


class MetadataBusy(RingError):
    """The producer rewrote the stream-metadata area during every read for 1000 tries and 10 ms (spec §6)."""


class Timeout(RingError, TimeoutError):
    """A wait (attach or next heap) ran past its deadline."""


# ---------------------------------------------------------------- producer side (ibvbridge.Producer)
class RingInUse(RingError):
    """Another live producer holds the ring name's lock (spec §1.1)."""


class UnsafeDirectory(RingError):
    """The ring directory (or a file in it) is not safe to use: not a real directory, owned by another uid,
    writable by group or others, or a symbolic link planted where the lock file goes (spec §1.1)."""


class NoSpace(RingError):
    """The ring's memory cannot be reserved: not enough shared memory (or hugepages); the message names the
    size needed and what is available."""


class NoHugePages(NoSpace):
    """hugepages="require" and the ring's data memory cannot be backed by hugepages."""


class RingFull(RingError):
    """drop policy: no payload slot is free (the heap is dropped; count it with
    ``producer.add("dropped_heaps", 1)``)."""


class StreamEnded(RingError):
    """The producer already published END_OF_STREAM, which is final (spec §4.1): nothing may follow it."""


class Interrupted(RingError):
    """A producer wait (block-policy acquire, wait_drained, end_of_stream) was interrupted by
    ``Producer.interrupt()`` or ``close()``."""


class NoConsumer(RingError):
    """wait_drained: no consumer is attached, so nobody would ever drain the ring."""


class HugePageWarning(RuntimeWarning):
    """hugepages="auto" fell back to ordinary shared memory."""
