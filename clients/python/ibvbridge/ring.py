"""Consumer side of the ibvbridge shared-memory heap ring (docs/ring-layout.md, layout 2.1).

``Ring.attach(name)`` connects to the ring's SOCK_SEQPACKET socket (``NAME.v2.sock`` in the ring directory),
checks that the producer's uid is trusted (SO_PEERCRED), sends a hello and receives a welcome with three
sealed memory descriptors: the control memory (mapped read-only: head, state, stats, the consumer table),
the data memory (read-only: descriptors, item tables, stream metadata, payload slots) and this consumer's own
4 KiB region (read-write: its tail cursor and wake words). Several consumers may read one ring; each gets
every heap. The socket stays open for the life of the attachment: closing it detaches, and its hang-up tells
the consumer that the producer is gone.

Heaps are handed out as zero-copy views into the data mapping. A view shows the heap's bytes until its heap
is released, unless the producer detaches this consumer meanwhile (an overrun under the drop policy) and
reuses the slot: read, then check ``heap.valid`` / ``batch.valid`` or call ``ring.release(heap)`` (which
raises Overrun) to prove the bytes were the heap's (layout 2.1 §A).

Supported platform: Linux x86-64. Plain loads and stores through memoryview / ctypes are single aligned
moves there, which have acquire / release semantics under x86-64's TSO memory model; full fences are a
locked instruction (an uncontended threading.Lock).

A Ring is not thread-safe: use it from one thread.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import mmap
from errno import ETIMEDOUT
import os
import select
import socket
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator, Mapping, Sequence, Union

from . import layout as L
from . import shared as _shared
from .shared import (I_CONSUMER_FUTEX, I_CONSUMER_WAITING, I_PRODUCER_WAITING, I_RELEASE_FUTEX, I_STATE, M64,
                     POLL_GONE, Q_HANDED, Q_HEAD, Q_HEARTBEAT_NS, Q_OLDEST, Q_READ, Q_SPIN_BUDGET_NS, Q_STATS, Q_TAIL,
                     Q_WAKE_AT,
                     row_word)
from ._sys import (ORDERED, FutexWaiter, acquire_fence, full_fence, futex_wake, get_seals, map_fd, peer_cred,
                   release_fence, require_supported)
from .errors import (CorruptRing, Detached, EndOfStream, StreamEnd, TruncatedItem, MetadataBusy, Overrun, PermissionDenied, ProducerGone,
                     ProtocolError, RingBusy, RingClosing, RingError, RingNotFound, Timeout, VersionMismatch)

if TYPE_CHECKING:
    import numpy as np
else:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is optional until a view is asked for
        np = None

from . import chunks as _chunks
from .metadata import ItemDescriptor, _parse_metadata
from .views import Batch, Heap, Item, _need_numpy

PathLike = Union[str, "os.PathLike[str]"]

__all__ = ["Ring", "Heap", "Item", "Batch", "ItemDescriptor", "Geometry", "socket_path_for", "lookup_dirs",
           "default_dir", "uid_trusted", "validate_geometry"]

SPIN_BUDGET = 20e-6  # default spin budget before sleeping (spec §7.5)
_STARTS = {"oldest": L.START_OLDEST, "head": L.START_HEAD, L.START_OLDEST: L.START_OLDEST,
           L.START_HEAD: L.START_HEAD}


_unpack_desc = L.DESC_STRUCT.unpack_from
_iter_items = L.ITEM_RAW_STRUCT.iter_unpack  # (id, value, length, flags) per entry
log = logging.getLogger("ibvbridge.ring")
WELCOME_TIMEOUT = 5.0  # seconds for the handshake when the attach has no timeout (spec §B)
_UNMAPPED = memoryview(b"")  # a Ring's word views before attach and after close
LAPPED_WAIT = 0.01  # a group member spins this long for the head store of a lapping descriptor (spec §14.4),
LAPPED_PATIENCE = 1.0  # then waits up to this much longer, a millisecond at a time, before it reports a corrupt ring


def default_dir() -> str:
    """This process's own ring directory (spec §1.1): $IBVBRIDGE_RING_DIR if set and non-empty, else
    /run/ibvbridge for euid 0, else $XDG_RUNTIME_DIR/ibvbridge when XDG_RUNTIME_DIR is absolute, else
    /dev/shm/ibvbridge-UID."""
    return _shared.default_dir()


def lookup_dirs(directory: PathLike | None = None) -> list[str]:
    """Where a consumer looks for a ring name, in order (spec §1.1): ``directory`` if given; else
    $IBVBRIDGE_RING_DIR if set and non-empty; else its own default directory, then /run/ibvbridge."""
    return _shared.lookup_dirs(directory)


def _check_socket_path(s):
    if not s.endswith(L.SOCKET_SUFFIX):
        if s.endswith(".ctl"):
            raise VersionMismatch(1, L.MAJOR_VERSION, f"{s} is a layout 1.0 control file; this client speaks "
                                  f"layout {L.MAJOR_VERSION}.{L.MINOR_VERSION} (sockets named "
                                  f"NAME{L.SOCKET_SUFFIX})")
        raise RingError(f"ring socket {s}: the path must end in {L.SOCKET_SUFFIX}")


def _check_name(s):
    if not _shared.valid_name(s):
        raise RingError(f"ring name {s!r}: use 1-{L.NAME_MAX} characters from [A-Za-z0-9_.-], not starting with '.'")


def socket_path_for(name_or_path: PathLike, directory: PathLike | None = None) -> str:
    """The socket a consumer connects to: a path (anything containing '/', which must end in .v2.sock)
    as given; a name looked up in lookup_dirs(directory), the first trusted directory (spec §B) holding
    NAME.v2.sock winning (the first candidate when none does yet)."""
    s = os.fspath(name_or_path)
    if "/" in s:
        _check_socket_path(s)
        return s
    _check_name(s)
    dirs = lookup_dirs(directory)
    for d in dirs:
        try:
            fd, _ = _shared.open_trusted_dir(d)
        except (OSError, _shared.Untrusted):
            continue
        try:
            os.lstat(s + L.SOCKET_SUFFIX, dir_fd=fd)
            return os.path.join(d, s + L.SOCKET_SUFFIX)
        except OSError:
            pass
        finally:
            os.close(fd)
    return os.path.join(dirs[0], s + L.SOCKET_SUFFIX)


def uid_trusted(uid: int, socket_path: PathLike, euid: int | None = None) -> bool:
    """Whether a producer serving socket_path as uid may be trusted (spec §1.2, §B): uid 0, our own
    effective uid, or the owner of the socket's directory when that directory is trusted (not writable by
    group or others, and owned by us or root, or made by root)."""
    if euid is None:
        euid = os.geteuid()
    if uid == 0 or uid == euid:
        return True
    try:
        fd, owner = _shared.open_trusted_dir(os.path.dirname(os.path.abspath(socket_path)), euid)
    except (OSError, _shared.Untrusted):
        return False
    os.close(fd)
    return owner == uid


class Geometry(collections.namedtuple("Geometry", (
        "slot_count", "slot_size", "max_items", "page_size", "data_size", "desc_offset", "items_offset",
        "meta_offset", "meta_size", "payload_offset", "packet_offset", "packet_size"))):
    """Where everything lies in the data memory (spec §4)."""

    data_file_size = property(lambda self: self.data_size)  # the layout 1.0 name


def validate_geometry(hdr: Mapping[str, int]) -> Geometry:
    """Check a decoded header's data geometry as spec §9 step 5 requires; return a Geometry or raise
    CorruptRing.

    Python integers do not overflow, so every size below is exact; anything beyond data_size (a u64) is
    rejected.
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
    ds = hdr["data_size"]
    if ds == 0 or ds % ps:
        raise bad(f"data_size {ds} is not a non-zero multiple of page_size {ps}")
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
        if size and off % L.REGION_ALIGN:  # size 0: only offset <= data_size (spec §9 step 5)
            raise bad(f"{name} offset {off} is not {L.REGION_ALIGN}-aligned")
        if off + size > ds:
            raise bad(f"{name} [{off}, +{size}) runs past data_size {ds}")
        for oname, ooff, osize in regions[:i]:
            if size and osize and off < ooff + osize and ooff < off + size:
                raise bad(f"{name} overlaps {oname}")
    return Geometry(sc, ss, mi, ps, ds, hdr["desc_offset"], hdr["items_offset"], hdr["meta_offset"],
                    hdr["meta_size"], hdr["payload_offset"], hdr["packet_offset"], hdr["packet_size"])


class RingStats(dict):
    """A snapshot of a ring's counters (spec §2.3): a dict by our counter names, also readable as
    attributes, and under spead2's names (``spead2.recv.StreamStats``) where a counter means the same:
    ``SPEAD2_NAMES`` maps each spead2 name to ours. spead2 names with no counter here (``batches``,
    ``worker_blocked``, ``max_batch``, ``search_dist``: the receive loop's own, which ``recv`` logs and exports
    as metrics) raise AttributeError rather than read as 0."""

    SPEAD2_NAMES = {
        "heaps": "heaps",
        "packets": "packets",
        "incomplete_heaps_evicted": "incomplete_heaps",
        "too_old_heaps": "too_old_heaps",
        "rejected_heaps": "rejected_heaps",
    }

    def __getattr__(self, name: str) -> int:
        key = self.SPEAD2_NAMES.get(name, name)
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"no counter {name!r} (counters: {', '.join(sorted(self))})") from None

    def __call__(self) -> RingStats:
        return self  # ring.stats(), as the method it once was


class Stream:
    """One stream of a ring (``Ring.streams()``): iterate it for its heaps; ``end`` is then the StreamEnd
    that closed it, or None when the ring's end of stream did."""

    def __init__(self, ring: Ring, timeout: float | None) -> None:
        self._ring = ring
        self._timeout = timeout
        self._it: Iterator[Heap] | None = None
        self.end: StreamEnd | None = None

    def __iter__(self) -> Iterator[Heap]:
        return self

    def __next__(self) -> Heap:
        if self._it is None:
            self._ring._last_stream_end = None
            self._it = self._ring.heaps(self._timeout)
        try:
            return next(self._it)
        except StopIteration:
            self.end = self._ring._last_stream_end
            raise


class Ring:
    """A consumer attached to one ring. Use ``Ring.attach(name)``."""

    # What attach sets (declared for the type checker). The mappings' word views are _UNMAPPED until
    # attach and after close (close drops them so the mappings can be unmapped).
    name: str
    socket_path: str | None
    header: dict[str, int]
    session_id: int
    producer_pid: int
    producer_uid: int
    consumer_index: int
    _generation: int
    _geo: Geometry
    _max_latency: float
    _spin_budget: float
    _wait_avg: float
    _active: bool
    _directory: PathLike | None
    _wait_for_ring: bool
    _sock: socket.socket | None
    _fds: list[int]
    _ctl_mm: mmap.mmap | None
    _data_mm: mmap.mmap | None
    _region_mm: mmap.mmap | None
    _c64: memoryview  # the control mapping as u64 / u32 words
    _c32: memoryview
    _r64: memoryview  # this consumer's region as u64 / u32 words
    _r32: memoryview
    _dmv: memoryview  # the data mapping, and as u64 words
    _d64: memoryview
    _desc_arr: np.ndarray | None  # numpy views of the data mapping (None without numpy)
    _desc_raw: np.ndarray | None
    _items2d: np.ndarray | None
    _payload2d: np.ndarray | None
    _cfutex: ctypes.c_uint32 | None
    _rfutex: ctypes.c_uint32 | None
    _detached: RingError | None
    _pending: collections.deque[list[Any]]
    _last_stream_end: StreamEnd | None
    _meta_seq: int | None
    _meta: dict[int, ItemDescriptor]

    def __init__(self) -> None:  # use Ring.attach
        self._closed = True
        self._sock = None
        self._fds = []
        self._ctl_mm = self._data_mm = self._region_mm = None
        self._c64 = self._c32 = self._r64 = self._r32 = self._d64 = self._dmv = _UNMAPPED
        self._cfutex = self._rfutex = None
        self._desc_arr = self._desc_raw = self._items2d = self._payload2d = None
        self._chunk_geo: _chunks.ChunkGeometry | None = None
        self._chunk_views: _chunks.ChunkViews | None = None
        self._detached = None
        self._gone = False
        self.group_id = 0  # consumer group (§14), 0 for an independent consumer
        self._group_bit = 0  # this row's bit in a descriptor's assign mask when a member, else 0

    # ------------------------------------------------------------------ attach (spec §9)
    @classmethod
    def attach(cls, name_or_path: PathLike, timeout: float | None = 10.0, directory: PathLike | None = None,
               start: str | int = "oldest", max_latency: float = 0.0, spin_budget: float = SPIN_BUDGET,
               wait: bool = False, group: str | None = None) -> Ring:
        """Attach to a ring as a consumer, by name or by socket path (anything with a '/', ending in
        .v2.sock).

        A name is looked up in ``directory`` if given, else in $IBVBRIDGE_RING_DIR, else in this user's
        default ring directory ($XDG_RUNTIME_DIR/ibvbridge, or /dev/shm/ibvbridge-UID) and then
        /run/ibvbridge (spec §1.1). Only trusted directories are used (layout 2.1 §B: not writable by group
        or others, owned by this euid or root, or made by root): an untrusted default directory is skipped
        with one warning line (logger "ibvbridge.ring"), a given one (``directory``, the environment, a
        socket path) refused with PermissionDenied; the producer must run as root, this euid or the
        trusted directory's owner. A name with no socket is RingNotFound at once ("ring NAME not found
        (looked in ...)") unless ``wait`` is true: then it is retried every 10 ms for up to ``timeout``
        seconds (None: forever). A socket nobody serves (stale) is retried until the timeout. The
        handshake waits up to ``timeout`` (5 s when timeout is None) for the producer's answer (Timeout).
        ``start``: "oldest" begins at the oldest heap the ring still holds, "head" at the next heap
        published.

        Raises RingNotFound, PermissionDenied (untrusted producer uid, or refused), RingBusy (every consumer
        row taken), RingClosing, VersionMismatch, ProtocolError, CorruptRing (seals, sizes and the header
        are checked before the data memory is mapped), Timeout.

        ``max_latency`` (seconds), if positive, coalesces the wakes of a moving stream (spec §7.5): the
        producer wakes this consumer only once half the ring waits, and it wakes itself after
        ``max_latency``: less CPU per heap, up to that much more latency, no spinning. An idle stream still
        sleeps until its next heap. 0 (the default): a wake per heap.

        ``spin_budget`` (seconds, default 20 µs) bounds the spin before a sleep; the consumer spins only
        while recent waits averaged at most half of it (0: never spin).

        ``group`` (a name) attaches as a member of that consumer group (spec §14): the members share the
        stream, each heap goes to exactly one of them (the producer chooses), and a member starts at head
        (``start`` is ignored). next(), iteration and the chunk reads hand out only this member's heaps;
        next_batch()/batches()/next_chunk_batch() refuse (RingError) for a member. The Go, C and Python
        producers know groups; one that does not refuses with ProtocolError.
        """
        require_supported()
        if start not in _STARTS:
            raise ValueError(f"start must be 'oldest' or 'head', not {start!r}")
        if group:
            _shared.check_group_name(group)  # UTF-8, 1 ... 64 bytes (spec §14.1): ValueError otherwise
        self = cls()
        self.group_id = L.group_id(group or "")
        if self.group_id:
            start = "head"  # a member always starts at head (spec §14)
        self._max_latency = max(0.0, float(max_latency))
        self._spin_budget = max(0.0, float(spin_budget))
        self._wait_avg, self._active = 0.0, False
        self.name = os.fspath(name_or_path)
        self._directory = directory
        self._wait_for_ring = bool(wait)
        if "/" in self.name:
            _check_socket_path(self.name)
        else:
            _check_name(self.name)
        self.socket_path = None
        deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
        try:
            self._attach(_STARTS[start], deadline, timeout)
        except BaseException:
            self._teardown()
            raise
        return self

    def _lookup_list(self):
        """[(directory, socket file name)] to try in order, and whether they were given (an untrusted given
        directory is refused; an untrusted default one skipped)."""
        if "/" in self.name:
            path = os.path.abspath(self.name)
            return [(os.path.dirname(path), os.path.basename(path))], True
        given = bool(self._directory) or bool(os.environ.get(L.ENV_DIR))
        return [(d, self.name + L.SOCKET_SUFFIX) for d in lookup_dirs(self._directory)], given

    def _connect(self, deadline):
        """Step 1 (spec §B): connect to the socket in the first trusted directory holding it, through that
        directory's descriptor (so the directory checked is the one connected in). Returns the socket and
        the directory's owner. A missing socket is RingNotFound at once unless attach(wait=True); a refused
        (stale) one is retried every 10 ms until the deadline."""
        name = self.name
        cands, given = self._lookup_list()
        warned = set()
        while True:
            stale = None
            for d, fname in cands:
                path = os.path.join(d, fname)
                try:
                    fd, owner = _shared.open_trusted_dir(d)
                except FileNotFoundError:
                    continue
                except _shared.Untrusted as e:
                    if given:
                        raise PermissionDenied(f"ring {name}: ring directory {d} is not trusted: {e}") from None
                    if d not in warned:
                        warned.add(d)
                        log.warning("ibvbridge: skipping %s: %s", d, e)
                    continue
                except OSError as e:
                    raise RingError(f"ring {name}: ring directory {d}: {e.strerror or e}") from None
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
                try:
                    os.lstat(fname, dir_fd=fd)
                    s.settimeout(max(0.001, min(deadline - time.monotonic(), 3600.0)))
                    s.connect(f"/proc/self/fd/{fd}/{fname}")
                    self.socket_path = path
                    return s, owner
                except FileNotFoundError:
                    s.close()
                except (ConnectionRefusedError, socket.timeout):
                    s.close()
                    stale = stale or path
                except PermissionError as e:
                    s.close()
                    raise PermissionDenied(f"ring {name}: cannot connect to {path}: {e.strerror}") from None
                except OSError as e:
                    s.close()
                    raise RingError(f"ring {name}: connect {path}: {e}") from None
                finally:
                    os.close(fd)
            looked = ", ".join(d for d, _ in cands)
            if stale is None and not self._wait_for_ring:
                raise RingNotFound(f"ring {name} not found (looked in {looked})")
            if time.monotonic() >= deadline:
                if stale is not None:
                    raise RingNotFound(f"ring {name}: stale socket {stale} (no producer; `ibvbridge rm --stale` "
                                       "removes it)")
                raise RingNotFound(f"ring {name} not found (looked in {looked})")
            time.sleep(0.01)

    def _attach(self, start, deadline, timeout):
        name = self.name
        sock, owner = self._connect(deadline)
        self._sock = sock
        path = self.socket_path
        pid, uid, _ = peer_cred(sock)  # 2. who serves this socket?
        if not _shared.peer_trusted(uid, owner):
            raise PermissionDenied(f"ring {name}: socket {path} served by uid {uid}, which is not trusted (not "
                                   f"root, uid {os.geteuid()} or the directory's owner {owner})")
        self.producer_uid = uid
        if timeout is None:
            timeout = WELCOME_TIMEOUT
            deadline = time.monotonic() + timeout
        try:  # 3. hello, welcome
            sock.settimeout(max(0.001, min(deadline - time.monotonic(), 3600.0)))
            sock.sendall(L.pack_hello(L.ROLE_CONSUMER, start, group_id=self.group_id))
            msg, fds, mflags, _ = socket.recv_fds(sock, L.ERROR_RECORD_MAX, 8, socket.MSG_CMSG_CLOEXEC)
        except socket.timeout:
            raise Timeout(f"ring {name}: the producer did not answer within {timeout} s") from None
        except (ConnectionResetError, BrokenPipeError):
            try:  # a producer that refused before reading the hello (busy) left its error record queued
                msg, fds, mflags, _ = socket.recv_fds(sock, L.ERROR_RECORD_MAX, 8,
                                                      socket.MSG_CMSG_CLOEXEC | socket.MSG_DONTWAIT)
            except OSError:
                msg, fds, mflags = b"", [], 0
        self._fds = list(fds)
        w = self._check_welcome(msg, fds, mflags)
        ctl_fd, data_fd, region_fd = fds
        self.consumer_index, self._generation = w["consumer_index"], w["generation"]
        if self.group_id:
            if self.consumer_index >= 64:  # assign is a u64 over rows: max_consumers <= 64 with groups (§14)
                raise ProtocolError(f"ring {name}: group member given row {self.consumer_index} (assign has 64 bits)")
            self._group_bit = 1 << self.consumer_index
        # 4. seals and sizes, before anything is mapped
        for what, fd, need, size in (("control", ctl_fd, L.SEALS_SHARED, w["ctl_size"]),
                                     ("data", data_fd, L.SEALS_SHARED, w["data_size"]),
                                     ("consumer region", region_fd, L.SEALS_REGION, w["region_size"])):
            seals = get_seals(fd)
            if seals & need != need:
                raise CorruptRing(f"ring {name}: {what} memory is not sealed (seals {seals:#x}, need {need:#x})")
            st = os.fstat(fd).st_size
            if st != size:
                raise CorruptRing(f"ring {name}: {what} memory is {st} bytes, the welcome says {size}")
        # 5. control memory, read-only; validate before the data memory is mapped
        self._ctl_mm = ctl_mm = _map(ctl_fd, w["ctl_size"], False)
        self._c64 = memoryview(ctl_mm).cast("Q")
        self._c32 = memoryview(ctl_mm).cast("I")
        self._closed = False
        hdr = self._check_header(w)
        self._geo = g = validate_geometry(hdr)
        # chunk geometry (§13.5), from a private copy of the header's bytes, before the data is mapped
        self._chunk_geo = _chunks.chunk_geometry(hdr["features"], bytes(ctl_mm[L.OFF_CHUNK_HEAPS:0x100]),
                                                 g.slot_size)
        # 6. data read-only, region read-write; the descriptors are closed, the socket kept
        self._data_mm = data_mm = _map(data_fd, g.data_size, False)
        self._region_mm = region_mm = _map(region_fd, L.REGION_SIZE, True)
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        self._dmv = memoryview(data_mm)
        self._d64 = self._dmv.cast("Q")  # shared u64 words of the data memory (the metadata sequence)
        self._r64 = memoryview(region_mm).cast("Q")
        self._r32 = memoryview(region_mm).cast("I")
        sock.setblocking(False)
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN | select.POLLRDHUP)
        # futex word addresses (ctypes objects pin an export of the region mapping until close)
        self._cfutex = ctypes.c_uint32.from_buffer(region_mm, L.REG_CONSUMER_FUTEX)
        self._rfutex = ctypes.c_uint32.from_buffer(region_mm, L.REG_RELEASE_FUTEX)
        self._cfutex_addr = ctypes.addressof(self._cfutex)
        self._rfutex_addr = ctypes.addressof(self._rfutex)
        self._futex_wait = FutexWaiter(self._cfutex_addr)
        self._poll_due = 0.0  # a wait polls liveness before its first sleep from this monotonic time on (_wait)
        if np is not None:  # persistent zero-copy views for the batch API
            self._desc_arr = np.frombuffer(data_mm, L.DESC_DTYPE, g.slot_count, g.desc_offset)
            self._desc_raw = np.frombuffer(data_mm, np.uint8, g.slot_count * L.DESC_SIZE, g.desc_offset)
            self._items2d = np.frombuffer(data_mm, L.ITEM_DTYPE, g.slot_count * g.max_items,
                                          g.items_offset).reshape(g.slot_count, g.max_items)
            self._payload2d = np.frombuffer(data_mm, np.uint8, g.slot_count * g.slot_size,
                                            g.payload_offset).reshape(g.slot_count, g.slot_size)
            self._chunk_views = _chunks.make_views(self._chunk_geo, g.payload_offset, g.slot_count, g.slot_size,
                                                   g.max_items, data_mm, self._payload2d)
        self._i_row_state = row_word(self.consumer_index, "state")
        self._i_row_gen = row_word(self.consumer_index, "generation")
        self._q_row_lost = row_word(self.consumer_index, "lost_heaps")
        self._r64[Q_SPIN_BUDGET_NS] = int(self._spin_budget * 1e9)
        self._coalesce_heaps = max(1, self._geo.slot_count // 2)
        # 7. start at the region's tail (the producer stored the start position before the welcome)
        self.session_id = hdr["session_id"]
        self.producer_pid = hdr["producer_pid"]
        self._mask = g.slot_count - 1
        self._desc_base = g.desc_offset
        self._items_base = g.items_offset
        self._item_stride = g.max_items * L.ITEM_SIZE
        self._pay_base = g.payload_offset
        self._read = self._r64[Q_TAIL]
        self._cached_head = self._read
        self._pending = collections.deque()
        # Releases are stored to tail once per batch (spec §7.4: at most max(1, slot_count / 8) deferred),
        # and whenever the ring is found empty, before a wait, and at close: a store (and producer wake) per
        # heap makes a block-policy producer sleep and wake once per heap.
        self._stored = self._released_to = self._read
        self._release_batch = min(max(self._geo.slot_count // 8, 1), 64)
        # A 2.2 group member publishes read and handed (spec §14.2): handed counts its own heaps handed out,
        # _pub_read / _pub_handed what the region says now.
        self._handed = 0
        self._pub_read, self._pub_handed = self._read, 0
        if self._group_bit:
            self._publish_progress()
        self._eos = False
        self._last_stream_end = None
        self._meta_seq = None
        self._meta = {}
        self._check_row()

    def _check_welcome(self, msg, fds, mflags):
        """Step 3: the producer's answer; raises the error its status names, or ProtocolError."""
        name = self.name
        if not msg:
            raise ProtocolError(f"ring {name}: the producer closed the connection without answering")
        if mflags & socket.MSG_TRUNC:
            raise ProtocolError(f"ring {name}: the producer's answer is longer than {L.ERROR_RECORD_MAX} bytes")
        try:
            w = L.unpack_record(msg)
        except ValueError:
            w = None
        if w is None or w["magic"] != L.MAGIC:
            raise ProtocolError(f"ring {name}: the producer's answer ({len(msg)} bytes) is not an ibvbridge "
                                "welcome")
        st = w["status"]
        if st != L.STATUS_OK:
            text = w["message"] or "(no message)"
            if st == L.STATUS_VERSION:
                raise VersionMismatch(w["major"], L.MAJOR_VERSION, f"ring {name}: {text} (the producer speaks "
                                      f"{w['major']}.{w['minor']}; this client {L.MAJOR_VERSION}."
                                      f"{L.MINOR_VERSION})")
            exc = {L.STATUS_NOT_PERMITTED: PermissionDenied, L.STATUS_BUSY: RingBusy,
                   L.STATUS_CLOSING: RingClosing, L.STATUS_PROTOCOL: ProtocolError}.get(st)
            if exc is None:
                raise ProtocolError(f"ring {name}: the producer answered unknown status {st}: {text}")
            raise exc(f"ring {name}: {text}")
        if w["major"] != L.MAJOR_VERSION:  # another major refuses with status 1: this welcome is malformed
            raise ProtocolError(f"ring {name}: a welcome (status 0) of layout major {w['major']}; this client "
                                f"speaks {L.MAJOR_VERSION}.{L.MINOR_VERSION}")
        if len(msg) < L.WELCOME_SIZE:  # a later minor may append fields: 64 … 256 bytes (spec §1.2)
            raise ProtocolError(f"ring {name}: welcome of {len(msg)} bytes, want at least {L.WELCOME_SIZE}")
        if len(fds) != 3 or mflags & socket.MSG_CTRUNC:
            raise ProtocolError(f"ring {name}: the welcome carried {len(fds)} descriptors, want 3")
        if w["consumer_index"] == L.NO_CONSUMER_INDEX:
            raise ProtocolError(f"ring {name}: welcomed as an observer, not a consumer")
        if w["region_size"] != L.REGION_SIZE:
            raise ProtocolError(f"ring {name}: region_size {w['region_size']}, want {L.REGION_SIZE}")
        return w

    def _check_header(self, w):
        """Step 5: the control memory's header against the spec and the welcome."""
        hdr = dict(zip(L.HEADER_FIELDS, L.HEADER_STRUCT.unpack_from(self._ctl_mm, 0)))
        name = self.name
        if hdr["magic"] != L.MAGIC:
            raise CorruptRing(f"ring {name}: bad magic {hdr['magic']:#x} in the control memory, want {L.MAGIC:#x}")
        if hdr["major"] != L.MAJOR_VERSION:
            raise VersionMismatch(hdr["major"], L.MAJOR_VERSION, f"ring {name} is layout {hdr['major']}."
                                  f"{hdr['minor']}; this client speaks {L.MAJOR_VERSION}.{L.MINOR_VERSION}")
        if hdr["state"] not in (L.STATE_READY, L.STATE_CLOSED):  # INIT is never handed out; spec §8
            raise CorruptRing(f"ring {name}: the control memory is in state {hdr['state']}, not READY or CLOSED")
        mc = hdr["max_consumers"]
        if not 1 <= mc <= L.MAX_CONSUMERS_LIMIT:
            raise CorruptRing(f"ring {name}: max_consumers {mc} not in 1..{L.MAX_CONSUMERS_LIMIT}")
        if hdr["ctl_size"] != L.ctl_size_for(mc) or hdr["ctl_size"] != w["ctl_size"]:
            raise CorruptRing(f"ring {name}: ctl_size {hdr['ctl_size']}, want {L.ctl_size_for(mc)} for "
                              f"{mc} consumers (welcome: {w['ctl_size']})")
        if w["consumer_index"] >= mc:
            raise CorruptRing(f"ring {name}: consumer_index {w['consumer_index']} >= max_consumers {mc}")
        if hdr["data_size"] != w["data_size"]:
            raise CorruptRing(f"ring {name}: data_size {hdr['data_size']}, the welcome says {w['data_size']}")
        if hdr["session_id"] != w["session_id"]:
            raise CorruptRing(f"ring {name}: session_id {hdr['session_id']:#x}, the welcome says "
                              f"{w['session_id']:#x}")
        self.header = hdr
        return hdr

    # ------------------------------------------------------------------ geometry and info
    @property
    def slot_count(self) -> int:
        return self._geo.slot_count

    @property
    def slot_size(self) -> int:
        return self._geo.slot_size

    @property
    def max_items(self) -> int:
        return self._geo.max_items

    @property
    def page_size(self) -> int:
        return self._geo.page_size

    @property
    def data_size(self) -> int:
        return self._geo.data_size

    data_file_size = data_size  # the layout 1.0 name

    @property
    def geometry(self) -> Geometry:
        return self._geo

    @property
    def policy(self) -> int:
        return self.header["policy"]

    @property
    def major(self) -> int:
        return self.header["major"]

    @property
    def minor(self) -> int:
        return self.header["minor"]

    @property
    def max_consumers(self) -> int:
        return self.header["max_consumers"]

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def closed(self) -> bool:
        return self._closed


    @property
    def state(self) -> int:
        return self._c32[I_STATE]

    @property
    def head(self) -> int:
        return self._c64[Q_HEAD]

    @property
    def oldest(self) -> int:
        """The lowest position whose slot the producer still holds (spec §7.1)."""
        return self._c64[Q_OLDEST]

    @property
    def tail(self) -> int:
        """This consumer's tail as stored in its region (released positions are < tail)."""
        return self._r64[Q_TAIL]

    @property
    def position(self) -> int:
        """The next position this consumer will read."""
        return self._read

    @property
    def producer_version(self) -> str:
        """What the producer says it runs (2.2 header producer_version, e.g. "ibvbridge recv 0.3.0"; "" if
        it wrote none)."""
        mm = self._ctl_mm
        if mm is None:
            raise RingError("ring is closed")
        raw = bytes(mm[L.OFF_PRODUCER_VERSION:L.OFF_PRODUCER_VERSION + L.PRODUCER_VERSION_MAX])
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")

    @property
    def heartbeat_ns(self) -> int:
        return self._c64[Q_HEARTBEAT_NS]

    def row(self) -> dict[str, int]:
        """This consumer's row of the consumer table (spec §2.2) as a dict."""
        self._check_mapped()
        off = L.OFF_CONSUMER_TABLE + L.ROW_SIZE * self.consumer_index
        return dict(zip(L.ROW_FIELDS, L.ROW_STRUCT.unpack_from(self._ctl_mm, off)))

    @property
    def stats(self) -> RingStats:
        """The producer's counters (spec §2.3), read now: a mapping by our names (``ring.stats["heaps"]``),
        with attribute access (``ring.stats.heaps``) and spead2's names where a counter means the same
        (``ring.stats.incomplete_heaps_evicted``; see ``RingStats.SPEAD2_NAMES``), as spead2's
        ``stream.stats`` reads. Counters a newer minor adds are 'counter_<i>'. ``ring.stats()`` (the
        older call form) returns the same."""
        self._check_mapped()
        n = min(self.header["stats_count"], L.STATS_SLOTS)
        c = self._c64
        out = {name: (c[Q_STATS + i] if i < n else 0) for i, name in enumerate(L.COUNTER_NAMES)}
        for i in range(len(L.COUNTER_NAMES), n):
            out[f"counter_{i}"] = c[Q_STATS + i]
        return RingStats(out)

    def producer_alive(self) -> bool:
        """Liveness (spec §7.6): False once the producer's end of the socket hung up (one poll, no wait)."""
        if self._gone or self._sock is None:
            return not self._gone
        try:
            events = self._poller.poll(0)
        except InterruptedError:
            return True
        for _, rev in events:
            if rev & POLL_GONE:
                self._gone = True
            elif rev & select.POLLIN:
                try:  # the producer sends nothing after the welcome: 0 bytes is its EOF, anything else is dropped
                    if self._sock.recv(L.ERROR_RECORD_MAX, socket.MSG_DONTWAIT) == b"":
                        self._gone = True
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    self._gone = True
        return not self._gone

    def _row_error(self):
        """None while this consumer is attached (spec §2.2: row state 1, then the row's generation equal to
        the welcome's, two 32-bit loads in that order), else the Detached / Overrun the row says. A row gone
        (4) because the producer closed every connection as it stopped is not an error: what it published
        stays readable (drain, then EOS / ProducerGone)."""
        c32 = self._c32
        if ORDERED:
            acquire_fence()  # the heap bytes read before this check are read before the row (spec §A)
        st = c32[self._i_row_state]
        if st == L.CONSUMER_ATTACHED and c32[self._i_row_gen] == self._generation:
            return None
        if ORDERED:
            acquire_fence()  # the row's state is stored last: its other fields are read after it
        gen = c32[self._i_row_gen]
        name, idx = self.name, self.consumer_index
        if gen != self._generation:
            return Detached(f"ring {name}: detached: consumer row {idx} was given to another consumer", None)
        if st == L.CONSUMER_OVERRUN:
            lost = self._c64[self._q_row_lost]
            return Overrun(f"ring {name}: overrun: detached after falling a whole ring behind, {lost} heaps lost",
                           lost)
        if st == L.CONSUMER_BAD_CURSOR:
            return Detached(f"ring {name}: detached: invalid cursor", st)
        if st > L.CONSUMER_GONE:  # a minor never adds a row state (spec §8)
            return CorruptRing(f"ring {name} corrupt: consumer row {idx} has unknown state {st}")
        if st == L.CONSUMER_GONE:
            if not self.producer_alive():
                return None
            return Detached(f"ring {name}: detached: the producer dropped this consumer's connection", st)
        return Detached(f"ring {name}: detached: consumer row {idx} is in state {st}", st)

    def _check_row(self):
        """Raise Detached / Overrun if the producer detached this consumer (spec §2.2, §7.6). Two loads in the
        common case; called on every heap handed out (after its descriptor and items were copied and
        checked), whenever head is reloaded, after futex waits and before reporting corruption."""
        c32 = self._c32
        if c32[self._i_row_state] == L.CONSUMER_ATTACHED and c32[self._i_row_gen] == self._generation \
                and not ORDERED:
            return
        err = self._row_error()
        if err is not None:
            self._detached = err
            raise err

    @property
    def attached(self) -> bool:
        """True while the producer counts this consumer (spec §2.2): every heap it handed out is then still
        the heap's bytes. False once it was detached (overrun, bad cursor, replaced) or closed."""
        if self._closed:
            return False
        return self._row_error() is None

    def release(self, heap: Heap | Batch) -> None:
        """Release a Heap or Batch (as ``heap.release()``), then prove it was read whole: raises Overrun
        (``lost_heaps``) when the producer overran this consumer while it held the heap, Detached for any
        other detach, so bytes read from it before this call may belong to a later heap (spec §A). A copy
        (``heap.copy()``) never raises."""
        owner = getattr(heap, "_ring", None)
        if owner is not None and owner is not self:
            raise ValueError("the heap belongs to another ring")
        was_released = heap.released
        ok = was_released or owner is None or self._closed or heap.valid
        heap.release()
        if not ok:
            err = self._detached or self._row_error()
            if err is not None:
                self._detached = err
                raise err

    def descriptors(self) -> dict[int, ItemDescriptor]:
        """The stream's item descriptors, {id: ItemDescriptor}, from the metadata area (spec §6, seqlock
        read; an id described twice keeps its last record). Cached until the producer rewrites the area.
        MetadataBusy when the producer rewrote it during 1000 tries and 10 ms."""
        self._check_open()
        g = self._geo
        base = g.meta_offset
        dmv, d64, q = self._dmv, self._d64, g.meta_offset >> 3
        start, tries = time.monotonic(), 0
        while True:
            s1 = d64[q]  # one aligned 8-byte load (spec §11: a byte copy could tear it)
            if ORDERED:
                acquire_fence()  # the sequence before the records (a seqlock read)
            if s1 == self._meta_seq:
                return self._meta
            if not s1 & 1:
                length = int.from_bytes(dmv[base + 8:base + 16], "little")
                if length > g.meta_size - L.META_HEADER_SIZE:
                    s2 = d64[q]
                    if s1 == s2:
                        raise CorruptRing(f"metadata length {length} > meta_size - 16 ({g.meta_size - 16})")
                else:
                    buf = bytes(dmv[base + 16:base + 16 + length])
                    full_fence()
                    s2 = d64[q]
                    if s1 == s2:
                        self._meta = _parse_metadata(buf) if s1 else {}
                        self._meta_seq = s1
                        return self._meta
            tries += 1  # spec §6: give up after 1000 tries or 10 ms, whichever is longer
            if tries >= 1000 and time.monotonic() - start >= 0.010:
                raise MetadataBusy(f"ring {self.name}: metadata area busy (rewritten during {tries} reads)")
            time.sleep(0)

    # ------------------------------------------------------------------ reading (spec §9.1)
    def _check_mapped(self):
        if self._closed:
            raise RingError("ring is closed")

    def _check_open(self):
        if self._closed:
            raise RingError("ring is closed")
        if self._detached is not None:
            raise self._detached  # a detached consumer must not read on (spec §7.6)

    def _available(self):
        """Published positions not yet read; reloads head (and checks the table row) when the cached one is
        used up."""
        avail = (self._cached_head - self._read) & M64
        if avail == 0:
            h = self._c64[Q_HEAD]
            if ORDERED:
                acquire_fence()  # head is an acquire load (spec §9.1)
            self._check_row()
            avail = (h - self._read) & M64
            if avail == 0:
                self._flush_release()  # caught up: hand the released slots back now
            elif avail > self._geo.slot_count:
                if self._group_bit and self._lapped(self._read):  # a 2.2 member skips it (spec §14.4)
                    return (self._cached_head - self._read) & M64
                raise CorruptRing(f"head {h} is {avail} positions past read {self._read} "
                                  f"(slot_count {self._geo.slot_count})")
            self._cached_head = h
        return avail

    def _take(self, n):
        """Register positions [read, read+n) as handed out; returns the pending entry. A heap the iterator's
        fast path handed out and still held (nothing pending, yet released_to short of read) is queued
        first, so positions released after it wait for it (_release_through releases that entry)."""
        pend = self._pending
        if not pend and self._released_to != self._read:
            pend.append([self._read, False])
        self._read = end = (self._read + n) & M64
        ent = [end, False]
        self._pending.append(ent)
        return ent

    def _release_entry(self, ent):
        ent[1] = True
        pend = self._pending
        if pend[0] is not ent:
            return  # an older position is still held: released when it is
        tail: int = pend.popleft()[0]  # ent, released just now
        while pend and pend[0][1]:
            tail = pend.popleft()[0]
        self._released_to = tail
        if self._group_bit or ((tail - self._stored) & M64) >= self._release_batch:
            self._flush_release()  # a member at once: the producer balances its group by it (spec §14)

    def _pass_over(self, pos):
        """A member moves past position pos, assigned to another member (spec §14): released at once when
        nothing before it is held, else with the held heap before it."""
        end = self._read = (pos + 1) & M64
        if self._pending:
            self._pending.append([end, True])
            if ((end - self._pub_read) & M64) >= self._release_batch:
                self._publish_progress()  # read lags by at most the deferral of spec §7.4 (§14.2)
        else:
            self._released_to = end
            if ((end - self._stored) & M64) >= self._release_batch:
                self._flush_release()

    def _lapped(self, pos, seq=None):
        """A 2.2 member met a lapped descriptor (spec §14.4): read more than slot_count behind head, or seq a
        non-zero multiple of slot_count ahead of position pos. Its row first (detached wins); still attached,
        the positions it missed were not its own (the producer never overwrites the descriptor of a position
        assigned to a member before it read it): it moves read to head - slot_count (head loaded afresh),
        passing over them, and goes on. Not to head - slot_count + 1: the window (§14.5, q - u <
        slot_count) lets the member's oldest queued position u be head - slot_count itself, whose descriptor
        is intact (the producer cannot publish head while u is queued); were it another member's, the
        producer may overwrite it as we read it, which its seq then shows. A seq lapped by a position whose
        head store has not come yet (the producer writes descriptors, then head) is waited for, at most
        LAPPED_WAIT seconds. False when this is not a lapped descriptor."""
        sc = self._geo.slot_count
        if seq is not None:
            d = (seq - ((pos + 1) & M64)) & M64
            if not d or d % sc or d >= 1 << 63:
                return False
        self._check_row()
        c64 = self._c64
        until = None
        while True:
            h = c64[Q_HEAD]
            if ORDERED:
                acquire_fence()
            new = (h - sc) & M64
            if 0 < ((new - self._read) & M64) <= ((h - self._read) & M64):
                break
            if seq is None:
                return False
            now = time.monotonic()  # seq says position seq - 1 is being published: its head store follows
            if until is None:
                until = now + LAPPED_WAIT
            elif now >= until:
                # A producer descheduled between the descriptor and the head store (a busy machine, a
                # Python producer): wait on, a millisecond at a time, up to LAPPED_PATIENCE while it lives.
                if now >= until + LAPPED_PATIENCE or not self.producer_alive():
                    return False
                time.sleep(0.001)
        self._pass_over((new - 1) & M64)
        self._cached_head = h
        return True

    def _publish_progress(self):
        """A member's read and handed (spec §14.2), release-stored — handed, then read, both before the tail
        the caller may store next, so a producer that loads tail, then read, then handed sees them at least
        as new as that tail."""
        if ORDERED:
            release_fence()
        r64 = self._r64
        r64[Q_HANDED] = self._pub_handed = self._handed
        r64[Q_READ] = self._pub_read = self._read

    def _flush_release(self):
        """Store the released position to the region's tail (a member's read and handed first) and wake a
        waiting producer (spec §7.4, §14.2)."""
        tail = self._released_to
        if self._group_bit and (self._pub_read != self._read or self._pub_handed != self._handed):
            self._publish_progress()
        if tail == self._stored:
            return
        self._stored = tail
        if ORDERED:
            release_fence()
        self._r64[Q_TAIL] = tail  # a release store (spec §7.4)
        full_fence()
        if self._c32[I_PRODUCER_WAITING] != 0:
            r32 = self._r32  # we are release_futex's only writer: a plain load and store
            r32[I_RELEASE_FUTEX] = (r32[I_RELEASE_FUTEX] + 1) & 0xFFFFFFFF
            futex_wake(self._rfutex_addr)

    def _corrupt_desc(self, pos, msg):
        """The CorruptRing to raise for position pos, unless the table row says detached (a slot reused
        under a detached consumer looks corrupt): then that Detached is raised here."""
        self._check_row()
        return CorruptRing(f"corrupt descriptor at position {pos}: {msg}")

    def next(self, timeout: float | None = None) -> Heap:
        """The next heap (a Heap; use ``with ring.next() as heap:``). Waits up to ``timeout`` seconds (None:
        forever, 0: don't wait). Raises EndOfStream, ProducerGone, Timeout, CorruptRing, Overrun, Detached."""
        return self._next(timeout, Heap)

    def _next(self, timeout, cls):
        """next(), handing the position out as a cls (Heap, or chunks.Chunk: a Heap with a chunk's views)."""
        self._check_open()
        if self._eos:
            raise EndOfStream("end of stream")
        while True:
            if self._cached_head == self._read and self._available() == 0:
                self._wait(timeout)
            pos = self._read
            off = self._desc_base + (pos & self._mask) * 64
            (seq, heap_cnt, heap_size, received, ts, slot, flags, icount, packets,
             assign) = _unpack_desc(self._data_mm, off)
            if not self._group_bit:
                break
            if ORDERED:
                acquire_fence()
            again = self._d64[off >> 3]
            if again != seq:
                # seq again after the copy (spec §14.4): another member's descriptor rewritten meanwhile, and
                # the copy may mix two positions (the new assign with the old seq): a lapped one
                seq = again
            if seq != (pos + 1) & M64:
                if self._lapped(pos, seq):  # lapped under positions that were not its own (spec §14.4)
                    continue
                raise self._corrupt_desc(pos, f"seq {seq}, want {(pos + 1) & M64}")
            if assign & self._group_bit or flags & (L.FLAG_END_OF_STREAM | L.FLAG_STREAM_END):
                break
            self._pass_over(pos)  # another member's position: only its seq is checked (spec §14.4)
        g = self._geo
        if seq != (pos + 1) & M64:
            raise self._corrupt_desc(pos, f"seq {seq}, want {(pos + 1) & M64}")
        if slot >= g.slot_count:
            raise self._corrupt_desc(pos, f"slot {slot} >= slot_count {g.slot_count}")
        if received > g.slot_size:
            raise self._corrupt_desc(pos, f"received {received} > slot_size {g.slot_size}")
        if icount > g.max_items:
            raise self._corrupt_desc(pos, f"item_count {icount} > max_items {g.max_items}")
        if icount:
            o = self._items_base + slot * self._item_stride
            raw = list(_iter_items(self._dmv[o:o + icount * L.ITEM_SIZE]))
            ss = g.slot_size
            for iid, value, length, iflags in raw:
                if not iflags & L.ITEM_IMMEDIATE and (value > ss or length > ss - value):
                    raise self._corrupt_desc(pos, f"item {iid:#x} [{value}, +{length}) past slot_size {ss}")
        else:
            raw = []
        c32 = self._c32  # descriptor and items copied and checked: now prove they were this heap's (spec §A)
        if c32[self._i_row_state] != L.CONSUMER_ATTACHED or c32[self._i_row_gen] != self._generation or ORDERED:
            self._check_row()
        ent = self._take(1)
        if flags & L.FLAG_STREAM_END:
            self._release_entry(ent)  # goes back with any heap before it still held
            raise StreamEnd(f"stream ended (stop heap {heap_cnt})", heap_cnt, pos, ts)
        if flags & L.FLAG_END_OF_STREAM:
            self._eos = True
            self._release_entry(ent)
            self._flush_release()  # nothing more will be read: hand the marker's slot back now
            raise EndOfStream("end of stream")
        h = self._heap(cls, ent, pos, heap_cnt, heap_size, received, ts, slot, flags, icount, packets)
        h._raw = raw
        if self._group_bit:
            self._handed += 1  # one of its own heaps handed to the caller (spec §14.2)
        return h

    def _heap(self, cls, entry, pos, heap_cnt, heap_size, received, ts, slot, flags, icount, packets):
        """A Heap (or subclass cls) over slot's payload and item table; entry is its release bookkeeping (None:
        fast path)."""
        h = cls.__new__(cls)
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

    def streams(self, timeout: float | None = None) -> Iterator[Stream]:
        """Iterate over the streams of a ring that goes on across them (recv --keep-going): each a
        ``Stream``, itself an iterator over that stream's heaps; after its loop ends, ``stream.end`` is the
        StreamEnd that closed it (None when the ring itself ended). Ends at the ring's end of stream.

            for stream in ring.streams():
                for heap in stream: ...
                print("stream ended at heap", stream.end and stream.end.heap_cnt)
        """
        while not self._eos:
            s = Stream(self, timeout)
            yield s
            for h in s:  # the caller left its loop early: the rest of that stream is skipped
                pass
            if s.end is None:
                return

    def heaps(self, timeout: float | None = None) -> Iterator[Heap]:
        """Iterate over heaps until the end of the stream (a STREAM_END or END_OF_STREAM marker: call again
        to read the next stream, or use ``streams()``), releasing each when the loop advances or is left.
        ``timeout`` applies to each wait (Timeout is raised).

        While no other heap is held, this takes a fast path: one descriptor unpack and one Heap per
        published position, the item table parsed only if the loop looks at items, and the release a
        cursor update (stored to the shared tail once per batch). Anything else — waiting, end of stream,
        heaps held from next() — goes through next()."""
        return self._heaps(timeout, Heap)

    def _heaps(self, timeout, cls):
        """heaps(), handing each position out as a cls (Heap, or chunks.Chunk)."""
        self._check_open()
        g = self._geo
        mask, desc_base = self._mask, self._desc_base
        slot_size, slot_count, max_items = g.slot_size, g.slot_count, g.max_items
        mm, dmv, unpack, new = self._data_mm, self._dmv, _unpack_desc, cls.__new__
        pay_base, items_base, item_stride = self._pay_base, self._items_base, self._item_stride
        eos_flag = L.FLAG_END_OF_STREAM | L.FLAG_STREAM_END
        c32, i_state, i_gen, gen = self._c32, self._i_row_state, self._i_row_gen, self._generation
        attached = L.CONSUMER_ATTACHED
        member, release_batch = self._group_bit, self._release_batch
        heap = None
        try:
            while True:
                pos = self._read
                if member or self._pending or self._eos or self._cached_head == pos and self._available() == 0:
                    try:
                        heap = self._next(timeout, cls)
                    except StreamEnd as e:
                        self._last_stream_end = e
                        return
                    except EndOfStream:
                        return
                    yield heap
                    heap.release()
                    heap = None
                    continue
                (seq, heap_cnt, heap_size, received, ts, slot, flags, icount, packets,
                 _) = unpack(mm, desc_base + (pos & mask) * 64)
                if (seq != (pos + 1) & M64 or slot >= slot_count or received > slot_size or icount > max_items
                        or flags & eos_flag):
                    # The slow path again, written out: folding the two into one test costs ~10 % here.
                    try:
                        heap = self._next(timeout, cls)  # next() reports the corruption, or takes the marker
                    except StreamEnd as e:
                        self._last_stream_end = e
                        return
                    except EndOfStream:
                        return
                    yield heap
                    heap.release()
                    heap = None
                    continue
                if c32[i_state] != attached or c32[i_gen] != gen or ORDERED:
                    self._check_row()  # the copy was checked: now prove it was this heap's (spec §A)
                self._read = end = (pos + 1) & M64
                # The Heap built here, not by _heap(): a call fewer per heap (keep the two alike).
                h = new(cls)
                h._ring = self
                h._entry = None
                h._buf = mm
                h._mv = dmv
                h._base = pay_base + slot * slot_size
                h._raw = None
                h._items_off = items_base + slot * item_stride
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
                heap = h
                yield h
                if not h._released:
                    h._released = True
                    if self._released_to == pos and not self._pending:  # _release_through, inlined
                        self._released_to = end
                        if ((end - self._stored) & M64) >= release_batch:
                            self._flush_release()
                    else:
                        self._release_through(pos)
                heap = None
        finally:
            if heap is not None:
                heap.release()

    def _release_through(self, pos):
        """Release a fast-path heap. The iterator hands one out only when every older position is released,
        so releasing it releases through pos, whatever next() handed out after it (those stay held); when
        next() handed out more while it was held, _take queued it: that entry is released instead."""
        end = (pos + 1) & M64
        pend = self._pending
        if pend and pend[0][0] == end:
            self._release_entry(pend[0])  # queued by _take while it was held
            return
        if ((end - self._released_to) & M64) > ((self._read - self._released_to) & M64) or end == self._released_to:
            return  # released already
        self._released_to = end
        if ((end - self._stored) & M64) >= self._release_batch:
            self._flush_release()

    __iter__ = heaps

    async def next_async(self, timeout: float | None = None) -> Heap:
        """``await ring.next_async()``: next() for asyncio, the same waiting rules (ibvbridge.aio)."""
        from .aio import next_async
        return await next_async(self, timeout)

    def __aiter__(self) -> AsyncIterator[Heap]:
        """``async for heap in ring``: each heap released when the loop advances (ibvbridge.aio)."""
        from .aio import heaps_async
        return heaps_async(self)

    def next_batch(self, max_heaps: int, timeout: float | None = None) -> Batch:
        """Up to ``max_heaps`` already-published heaps at once (at least one; fewer at the ring's wrap point
        or before an END_OF_STREAM marker) as a Batch of numpy views. Waits like next(). Descriptors (and
        address items) are validated vectorised: CorruptRing if any is bad."""
        pos, idx, n = self._batch_span(max_heaps, timeout, "next_batch")
        # checked and used from a private copy only (spec §A); copied as bytes: a structured-array copy
        # costs ~40x more (0.4 ms vs 10 us for 4096 descriptors)
        descs = self._desc_raw
        assert descs is not None  # mapped with numpy, which _batch_span checked
        return self._checked_batch(pos, n, descs[idx * L.DESC_SIZE:(idx + n) * L.DESC_SIZE].copy())

    def _batch_span(self, max_heaps, timeout, what):
        """(pos, idx, n) of the next batch: n ≥ 1 published positions from pos (slot index idx), at most
        max_heaps and none past the ring's wrap point; waits like next()."""
        _need_numpy()
        self._check_open()
        if self._group_bit:
            raise RingError(f"{what}: this consumer is a group member (spec §14); a batch would hold other "
                            "members' positions: read with next() or iteration")
        if max_heaps < 1:
            raise ValueError("max_heaps must be >= 1")
        if self._eos:
            raise EndOfStream("end of stream")
        avail = (self._cached_head - self._read) & M64
        if avail == 0:
            avail = self._available()
            if avail == 0:
                self._wait(timeout)
                avail = (self._cached_head - self._read) & M64
        pos = self._read
        idx = pos & self._mask
        return pos, idx, min(avail, max_heaps, self._geo.slot_count - idx)

    def _checked_batch(self, pos, n, raw):
        """The Batch of positions [pos, pos + n) from raw, a private copy of their descriptors' bytes: each
        checked (vectorised, as next() checks one), cut before an END_OF_STREAM marker (EndOfStream when it
        comes first), address items copied and checked, then this consumer's row checked (spec §A)."""
        g = self._geo
        d = raw.view(L.DESC_DTYPE)
        d.flags.writeable = False
        want = np.arange(1, n + 1, dtype=np.uint64) + np.uint64(pos)  # wraps mod 2^64
        bad = ((d["seq"] != want) | (d["slot"] >= g.slot_count) | (d["received"] > np.uint64(g.slot_size))
               | (d["item_count"] > g.max_items))
        if bad.any():
            k = int(bad.argmax())
            e = d[k]
            raise self._corrupt_desc((pos + k) & M64, f"seq {e['seq']} slot {e['slot']} received "
                                     f"{e['received']} item_count {e['item_count']}")
        eos = (d["flags"] & (L.FLAG_END_OF_STREAM | L.FLAG_STREAM_END)) != 0
        if eos.any():
            n = int(eos.argmax())
            d = d[:n]
        counts = d["item_count"]
        items = None
        if n and counts.any():
            k = int(counts.max())
            items2d = self._items2d
            assert items2d is not None  # mapped with numpy, which _batch_span checked
            items = items2d[d["slot"].astype(np.intp), :k]  # fancy indexing: a private copy
            items.flags.writeable = False
            valid = np.arange(k, dtype=np.uint32)[None, :] < counts[:, None]
            addr = valid & ((items["flags"] & L.ITEM_IMMEDIATE) == 0)
            ss = np.uint64(g.slot_size)
            v, ln = items["value"], items["length"]
            over = addr & ((v > ss) | (ln > ss - np.minimum(v, ss)))
            if over.any():
                r = int(over.any(axis=1).argmax())
                raise self._corrupt_desc((pos + r) & M64, "address item past slot_size")
        self._check_row()  # descriptors and items copied and checked: they were these heaps' (spec §A)
        if n == 0 and raw.view(L.DESC_DTYPE)[0]["flags"] & L.FLAG_STREAM_END:
            m = raw.view(L.DESC_DTYPE)[0]
            self._release_entry(self._take(1))
            raise StreamEnd(f"stream ended (stop heap {int(m['heap_cnt'])})", int(m["heap_cnt"]), pos,
                            int(m["timestamp_ns"]))
        if n == 0:
            self._eos = True
            self._release_entry(self._take(1))
            self._flush_release()  # nothing more will be read: hand the marker's slot back now
            raise EndOfStream("end of stream")
        return Batch(self, d, pos, self._take(n), items)

    def batches(self, max_heaps: int, timeout: float | None = None) -> Iterator[Batch]:
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

    # ------------------------------------------------------------------ chunks (spec §13: ibvbridge.chunks)
    @property
    def chunk_geometry(self) -> _chunks.ChunkGeometry | None:
        """The ring's chunk geometry (validated at attach), or None when it is not in chunk mode."""
        return self._chunk_geo

    def next_chunk(self, timeout: float | None = None) -> _chunks.Chunk:
        """The next chunk of a chunk-mode ring (use ``with ring.next_chunk() as chunk:``); waits and raises
        as next() (EndOfStream after the last chunk), CorruptRing for a position that is not a valid chunk,
        RingError when the ring is not in chunk mode."""
        return _chunks.next_chunk(self, timeout)

    def chunks(self, timeout: float | None = None) -> Iterator[_chunks.Chunk]:
        """Iterate over chunks until end of stream, releasing each when the loop advances or is left
        (Overrun at the next step when the producer overran this consumer while the loop held one)."""
        return _chunks.iter_chunks(self, timeout)

    def next_chunk_batch(self, max_chunks: int, timeout: float | None = None) -> _chunks.ChunkBatch:
        """Up to ``max_chunks`` already-published chunks at once (at least one; fewer at the ring's wrap point,
        before END_OF_STREAM, or past chunks.MAX_CHUNK_BATCH = 4096) as a ChunkBatch of numpy arrays; waits and
        raises as next_batch()."""
        return _chunks.next_chunk_batch(self, max_chunks, timeout)

    def chunk_batches(self, max_chunks: int, timeout: float | None = None) -> Iterator[_chunks.ChunkBatch]:
        """Iterate over chunk batches until end of stream, releasing each when the loop advances or is left."""
        return _chunks.iter_chunk_batches(self, max_chunks, timeout)

    # ------------------------------------------------------------------ waiting (spec §7.5)
    def _wait(self, timeout):
        """Return when a heap is published (cached_head updated); raise EndOfStream / ProducerGone / Timeout /
        Detached. Spins only without max_latency and while recent waits were short (see attach).

        Its cost is paid per wake, so the loop does only what the protocol needs (spec §7.5). Producer
        liveness (§7.6) is a poll() syscall, made as the Go client makes it: after a sleep that timed out (a
        dead producer wakes nobody, so a death during a sleep is noticed when it ends, within a slice), before
        the first sleep of a wait when the last poll is a slice old, and before a Timeout is reported — not
        before every sleep of a moving stream, and no sleep is cut short for it (an extra wake costs more
        than the poll). A death while the consumer was busy is noticed within two slices. Whether a sleep
        timed out is the futex's own answer (ETIMEDOUT), not a clock."""
        self._flush_release()
        c64 = self._c64
        read = self._read
        start = now = time.monotonic()
        lat = self._max_latency
        budget = self._spin_budget
        if not lat and budget > 0 and self._wait_avg <= budget / 2:
            spin_until = now + min(budget, timeout if timeout is not None else budget)
            while time.monotonic() < spin_until:
                h = c64[Q_HEAD]
                if h != read:
                    self._set_head(h)
                    self._note_wait(start, time.monotonic())
                    return
            now = time.monotonic()
        deadline = None if timeout is None else start + timeout
        c32, r32, r64 = self._c32, self._r32, self._r64
        fence, sleep = full_fence, self._futex_wait
        wake_next = (read + 1) & M64
        look = False  # poll liveness before the next sleep (a sleep timed out)
        try:
            while True:
                coalesce = lat and self._active
                if self._group_bit and self._pub_read != self._read:
                    self._publish_progress()  # before consumer_waiting = 1 (spec §14.2)
                f = r32[I_CONSUMER_FUTEX]
                r64[Q_WAKE_AT] = (read + self._coalesce_heaps) & M64 if coalesce else wake_next
                r32[I_CONSUMER_WAITING] = 1
                fence()
                h = c64[Q_HEAD]
                if h != read:
                    self._set_head(h)
                    self._note_wait(start, now)
                    return
                self._check_row()
                st = c32[I_STATE]
                if st != L.STATE_READY:
                    if st != L.STATE_CLOSED:  # a minor never adds a state (spec §8)
                        raise CorruptRing(f"ring {self.name} corrupt: unknown header state {st}")
                    if ORDERED:
                        acquire_fence()  # state is an acquire load: everything published before is seen
                    h = c64[Q_HEAD]
                    if h != read:
                        self._set_head(h)
                        return
                    raise EndOfStream("end of stream (ring closed)")
                left = L.MAX_WAIT_SLICE if deadline is None else deadline - now
                if look or now >= self._poll_due or left <= 0:
                    look = False
                    self._poll_due = now + L.MAX_WAIT_SLICE
                    if not self.producer_alive():
                        h = c64[Q_HEAD]  # drain first: everything published before the death is delivered
                        if h != read:
                            self._set_head(h)
                            return
                        if c32[I_STATE] == L.STATE_CLOSED:
                            raise EndOfStream("end of stream (ring closed)")
                        raise ProducerGone(f"ring {self.name}: producer (pid {self.producer_pid}) is gone")
                if left <= 0:
                    raise Timeout(f"no heap within {timeout} s")
                slice_ = min(lat if coalesce else L.MAX_WAIT_SLICE, left)
                timed_out = sleep(f, slice_) == ETIMEDOUT
                now = time.monotonic()
                look = timed_out  # (a coalesced sleep that timed out first takes what came, if anything)
                if coalesce and timed_out:
                    # The latency bound passed: take what came; nothing at all means the stream went idle.
                    h = c64[Q_HEAD]
                    if h != read:
                        self._set_head(h)
                        self._note_wait(start, now)
                        return
                    self._active = False
        finally:
            if r32 is not None and not self._closed:
                r32[I_CONSUMER_WAITING] = 0

    def _note_wait(self, start, now):
        """A wait that found a heap: a moving average of the last ~8 wait lengths; the stream is active."""
        self._wait_avg += (now - start - self._wait_avg) / 8
        self._active = True

    def _set_head(self, h):
        if ORDERED:
            acquire_fence()  # h was loaded from head: an acquire load (spec §9.1)
        self._check_row()
        avail = (h - self._read) & M64
        if avail > self._geo.slot_count:
            if self._group_bit and self._lapped(self._read):  # a 2.2 member skips it (spec §14.4)
                return
            raise CorruptRing(f"head {h} is {avail} positions past read {self._read}")
        self._cached_head = h

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """Detach (spec §7.6): store the released tail, close the socket (the producer then stops counting
        this consumer: heaps still held are given back) and drop the mappings. Never raises because of views
        the caller still holds: if numpy arrays / memoryviews into the data memory are alive, the data
        mapping stays mapped until the last of them is gone (their contents are then undefined; reading them
        does not crash)."""
        if self._closed and self._sock is None and not self._fds:
            return
        if not self._closed and self._r64 is not _UNMAPPED:
            try:
                self._flush_release()
            except (ValueError, TypeError):
                pass
        self._teardown()

    def _teardown(self):
        self._closed = True
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = []
        self._desc_arr = self._desc_raw = self._items2d = self._payload2d = None
        self._chunk_views = None
        self._cfutex = self._rfutex = None
        for mv in (self._c64, self._c32, self._r64, self._r32, self._d64, self._dmv):
            if mv is not None:
                try:
                    mv.release()
                except BufferError:
                    pass
        self._c64 = self._c32 = self._r64 = self._r32 = self._d64 = self._dmv = _UNMAPPED
        for mm in (self._data_mm, self._ctl_mm, self._region_mm):
            if mm is not None:
                try:
                    mm.close()
                except BufferError:
                    pass  # live views: unmapped when the last one is garbage-collected
        self._data_mm = self._ctl_mm = self._region_mm = None

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        if self._closed:
            return f"Ring({self.name!r}, closed)"
        return (f"Ring({self.name!r}, session={self.session_id:#x}, consumer={self.consumer_index}, "
                f"slots={self.slot_count}x{self.slot_size}, read={self._read}, head={self.head})")


def _map(fd: int, size: int, writable: bool) -> mmap.mmap:
    """Map a received descriptor (a module function so tests can watch what is mapped, and when)."""
    return map_fd(fd, size, writable)

