"""Producer side of the ibvbridge shared-memory heap ring (docs/ring-layout.md, layout 2.2).

    import numpy as np, ibvbridge
    with ibvbridge.Producer.create("myring", slot_count=1024, slot_size=4096, policy="block") as p:
        slot = p.acquire()                       # a free payload slot (waits under block)
        slot.payload[:16] = np.arange(16)        # writable numpy view of the slot: no copy
        slot.add_item(0x1000, value=0, length=16)
        slot.add_item(0x1001, value=7, length=5, immediate=True)
        p.publish(slot, heap_cnt=1)              # descriptor, head store, conditional wakes
        p.end_of_stream()
        p.wait_drained()                         # block: until every consumer has read everything

What it does, as the Go producer (ring/producer.go) does:

* The ring directory, lock and socket follow spec §1.1: the directory is created 0755 and checked through
  an ``O_DIRECTORY | O_NOFOLLOW`` descriptor (owned by our euid, not group/other writable, not a link);
  every later file operation goes through that descriptor; one producer per name (``flock`` on
  ``NAME.v2.lock``); the socket ``NAME.v2.sock`` is bound afresh (0600, or 0660 and ``group``).
* Memory (spec §1): sealed memfds. The data memory is hugetlb when asked and available (its pages are
  reserved at ``mmap`` with ``MAP_POPULATE``), else shmem, refused up front when larger than the memory
  available (MemAvailable, or the cgroup v2 limit) and then ``posix_fallocate``d. Both memories are
  sealed ``SHRINK | GROW | FUTURE_WRITE | SEAL`` before any consumer sees them.
* A daemon thread serves the socket: ``SO_PEERCRED`` gate (our uid, root, or members of ``group``), error
  records with statuses 1-5, a fresh sealed 4 KiB region memfd per consumer, the consumer's row (state
  stored last), the welcome with ``SCM_RIGHTS``; it notices a consumer's hang-up (row state 4), and every
  100 ms refreshes the heartbeat and the rows' ``released`` (validating the cursors).
* The hot path (one thread: acquire / publish / publish_batch / end_of_stream / wait_drained) makes no
  syscall per heap except the conditional wakes of §7.5. Slots return to a FIFO pool when every attached
  consumer has released them (the reclaim point is the slowest consumer, spec §7.1); every cursor read
  from a region is validated (spec §7.2: outside [released, head] detaches it, state 3, counted in
  ``consumer_errors``); under ``drop`` a full ring detaches the slowest consumers as overrun when another
  is ahead, else the new heap is dropped (``RingFull``); under ``block`` the producer waits on the
  slowest consumer's ``release_futex`` (spec §7.4). No slot any attached consumer holds is ever reused.
* Consumer groups (spec §14, 2.2): each published position is assigned to one member of every group from
  what the members publish (``read``, ``handed``): nothing queued first, round robin, else fewest queued —
  a whole ``publish_batch`` at once, with numpy (``_round_robin``). A 2.2 member bounds the window by its
  oldest queued position, is woken only for its own positions, and when the ring is full the consumers
  holding it back are detached (drop) or waited for and named (block: ctl ``blocked_on``). A member that
  leaves is settled at the detach; every loop over positions covers at most ``slot_count`` of them.
  ``groups=`` grants who may join which group.

Memory ordering (spec §11): stores through memoryview / numpy / struct into the mappings are plain aligned
moves. On x86-64 its TSO makes them release stores, in program order, and a full fence is an uncontended
``threading.Lock`` (a locked instruction); elsewhere (aarch64) libibvbridge's C11 fences order them
(``_sys.ORDERED``: a release fence before the head, state and row-state stores, an acquire fence after
reading the consumers' tails).

The wake (spec §7.5) wants an atomic exchange on the consumer's ``consumer_waiting``; Python has none, so
the producer does: load ``consumer_waiting``; if non-zero, store 0, full fence, add 1 to
``consumer_futex``, ``FUTEX_WAKE``. Why that is enough: the consumer reads ``consumer_futex`` *before* it
stores ``consumer_waiting = 1``, then fences and re-reads ``head``. Our ``head`` store is followed by a
full fence before we load ``consumer_waiting``, so either the consumer's re-read sees the new head (it
does not sleep), or our load sees its announcement and our increment of ``consumer_futex`` comes after
its read of it, so its ``FUTEX_WAIT`` either returns at once (value changed) or is woken. The only thing
the plain store can do that an exchange cannot is overwrite a fresh announcement the consumer made
between our load and store; that consumer still gets our futex increment and wake, returns, and announces
itself again — a spurious wake, which the protocol allows. There is one waker per consumer per publish.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import mmap
import os
import secrets
import select
import socket
import resource
import stat as _stat
import struct
import threading
import time
import warnings
from typing import Any, Dict, Iterable, List, Literal, Mapping, Optional, Sequence, Tuple, Union

from . import layout as L
from . import shared as _shared
from .metadata import meta_record
from .shared import (C_ATTACHED, C_BYTES, C_EOS, C_ERRORS, C_GROUP_LOST, C_GROUP_SKIPPED, C_HEAPS, C_OVERRUNS,
                     C_PACKETS, COUNTER, I_BLOCKED_ON, I_CONSUMER_FUTEX, I_CONSUMER_WAITING, I_PRODUCER_WAITING,
                     I_RELEASE_FUTEX, I_STATE, M64, POLL_GONE, Q_BLOCKED_SINCE_NS, Q_HANDED, Q_HEAD, Q_HEARTBEAT_NS,
                     Q_OLDEST, Q_READ, Q_STATS, Q_TAIL, Q_WAKE_AT, ROW_U32, row_word)
from ._sys import (ORDERED, acquire_fence, add_seals, full_fence, futex_wait, futex_wake, peer_cred, release_fence,
                   require_supported)
from .errors import (HugePageWarning, Interrupted, NoConsumer, NoHugePages, NoSpace, RingError, RingFull,
                     RingInUse, StreamEnded, Timeout, UnsafeDirectory)

import numpy as np

__all__ = ["Producer", "Slot", "producer_dir", "layout_for", "COMPLETE", "INCOMPLETE", "TRUNCATED",
           "END_OF_STREAM", "HAS_DESCRIPTORS", "IMMEDIATE"]

log = logging.getLogger("ibvbridge.producer")

MAX_DATA_SIZE = (1 << 63) - 1  # off_t: the largest memfd and mapping
SMALL_SHM = 1 << 20  # new_shm: up to this size a memfd is fallocated without asking what memory is available
F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x10)
SEALS_SHARED = L.F_SEAL_SHRINK | L.F_SEAL_GROW | F_SEAL_FUTURE_WRITE | L.F_SEAL_SEAL
SEALS_REGION = L.F_SEAL_SHRINK | L.F_SEAL_GROW | L.F_SEAL_SEAL

COMPLETE = L.FLAG_COMPLETE
INCOMPLETE = L.FLAG_INCOMPLETE
TRUNCATED = L.FLAG_TRUNCATED
END_OF_STREAM = L.FLAG_END_OF_STREAM
HAS_DESCRIPTORS = L.FLAG_HAS_DESCRIPTORS
IMMEDIATE = L.ITEM_IMMEDIATE

POLICIES = {"drop": L.POLICY_DROP, "block": L.POLICY_BLOCK, L.POLICY_DROP: L.POLICY_DROP,
            L.POLICY_BLOCK: L.POLICY_BLOCK}

BEAT_SECONDS = 0.1  # heartbeat and row refresh (spec: every <= 250 ms)
# Test hooks (the conformance suite, interop/conformance): IBVBRIDGE_TEST_MUTANT lists guards to break, to prove
# the suite catches each: row-late (a detached consumer's row is not written before its slots are reused),
# no-wake (interrupt does not wake a producer asleep on a release futex), no-unmap (a detached consumer's
# region is not unmapped at the detach); IBVBRIDGE_TEST_WAIT_SLICE_MS
# replaces the 250 ms slice of a blocked producer. Unset, as outside the suite: no effect.
_TEST_MUTANTS = frozenset(os.environ.get("IBVBRIDGE_TEST_MUTANT", "").split(","))
_TEST_LEFT_MAPPED = []  # no-unmap: the regions left mapped
_TEST_WAIT_SLICE = int(os.environ.get("IBVBRIDGE_TEST_WAIT_SLICE_MS", "0") or 0) / 1000 or L.MAX_WAIT_SLICE
HELLO_RESERVED = L.HELLO_GROUP_ID + 4  # the hello's reserved bytes run from here to its end (spec §1.2, §14)
NO_SLOT = 0xFFFFFFFF  # _pos_slot of a position whose slot is back in the pool (group reclaim, spec §14)
HELLO_TIMEOUT = 2.0  # a connection that sends no hello within this is closed and counted (layout 2.1 §C)
MAX_PENDING = 64  # connections waiting for their hello at once; more are refused busy
FD_RESERVE = 32  # descriptors kept free under RLIMIT_NOFILE: below, new connections are refused busy
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # linux/socket.h; missing from Python's socket module
_GID = struct.Struct("I")


def peer_groups(sock: socket.socket) -> tuple[int, ...]:
    """The supplementary groups of a connected Unix socket's peer (SO_PEERGROUPS: the kernel's word, as it
    was at connect), as a tuple of gids; () if the kernel cannot say."""
    for n in (256, 65536):
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, n * _GID.size)
        except OSError as e:
            if e.errno == errno.ERANGE:
                continue
            return ()
        return tuple(g for (g,) in _GID.iter_unpack(raw[:len(raw) - len(raw) % _GID.size]))
    return ()


def _fds_left():
    """Descriptors this process may still open (RLIMIT_NOFILE's soft limit minus those open)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return 1 << 30
    return soft - len(os.listdir("/proc/self/fd"))
SPIN_SECONDS = 50e-6
BLOCKED_LOG_SECONDS = 0.5  # a block producer logs whom it waits for after this (spec §14.6: within 1 s)


def _signed(d):
    """A difference of positions as a signed number (positions wrap modulo 2^64): -2^63 ... 2^63 - 1."""
    return ((d + (1 << 63)) & M64) - (1 << 63)


def _index_array(idx):
    """An index array for idx, a slice or an index array (Producer._ring_idx's answer)."""
    if isinstance(idx, slice):
        return np.arange(idx.start, idx.stop, dtype=np.int64)
    return idx


def _round_robin(queued, last, k):
    """Assign k positions in turn among members with queued positions queued[i] and last picks last[i]
    (spec §14.3: each position to the member with the fewest queued, ties to the one picked least recently;
    each pick adds one to its queued and makes it the most recent). Returns (choice: member index per
    position, counts per member, index in choice of each member's last pick or -1).

    The picks go level by level: every member at q positions queued is picked before any at q + 1, and the
    members picked at level L are, in order, those that start at L (least recent first) and then those
    that reached L by being picked, in the order they were picked at L - 1. So level L is the suffix of one
    fixed order O (queued descending, then least recent first) holding the members whose queued is <= L,
    and from the highest queued on every level is all of O: the sequence is built with numpy, without a
    Python step per position."""
    n = len(queued)
    order = sorted(range(n), key=lambda i: (-queued[i], last[i]))
    o = np.array(order, np.int64)
    qasc = np.array(sorted(queued), np.int64)
    qmin, qmax = int(qasc[0]), int(qasc[-1])
    parts = []
    done = 0
    if qmax > qmin:
        levels = np.arange(qmin, min(qmax, qmin + k), dtype=np.int64)
        c = np.searchsorted(qasc, levels, side="right").astype(np.int64)  # members at each level
        cum = np.cumsum(c)
        nlev = int(np.searchsorted(cum, k, side="left")) + 1  # levels needed (the last may be cut)
        c, cum = c[:nlev], cum[:nlev]
        total = int(cum[-1])
        pos = np.arange(total, dtype=np.int64) - np.repeat(cum - c, c) + np.repeat(n - c, c)
        parts.append(o[pos][:k])
        done = min(total, k)
    if done < k:
        rest = k - done
        parts.append(np.tile(o, rest // n + 1)[:rest])
    choice = np.concatenate(parts) if len(parts) > 1 else parts[0]
    counts = np.bincount(choice, minlength=n).tolist()
    rev = choice[::-1]
    lastidx = [-1] * n
    for i in range(n):
        if counts[i]:
            lastidx[i] = k - 1 - int(np.argmax(rev == i))
    return choice, counts, lastidx


# ---------------------------------------------------------------- directory, lock, socket (spec §1.1)
_valid_name = _shared.valid_name


def producer_dir(directory: str | os.PathLike[str] | None = None) -> str:
    """The producer's ring directory (spec §1.1): ``directory`` if given, else $IBVBRIDGE_RING_DIR if set
    and non-empty, else /run/ibvbridge for euid 0, else $XDG_RUNTIME_DIR/ibvbridge when XDG_RUNTIME_DIR is
    set and absolute, else /dev/shm/ibvbridge-UID (the first default: a producer skips it for
    /tmp/ibvbridge-UID when a stranger made it first)."""
    return _shared.default_dir(directory)


def open_ring_dir(path: str) -> int:
    """Create path (0755) if missing, component by component from '/' without following any symlink
    (layout 2.1 §B: each component is opened O_DIRECTORY | O_NOFOLLOW relative to its parent and must be
    owned by our euid or root), and check the final directory: owned by our euid, not writable by group or
    others. Returns its descriptor; UnsafeDirectory with one line naming the path and the problem
    otherwise."""
    try:
        fd = _shared.make_dir_nofollow(path, 0o755)
    except _shared.Untrusted as e:
        raise UnsafeDirectory(f"ring directory {path}: {e}") from None
    except OSError as e:
        raise RingError(f"ring directory {path}: {e.strerror or e}") from None
    st = os.fstat(fd)
    uid = os.geteuid()
    why = None
    if st.st_uid != uid:
        why = f"ring directory {path} is owned by uid {st.st_uid}, not {uid} (remove it, or give directory=)"
    elif st.st_mode & 0o022:
        why = (f"ring directory {path} is writable by group or others (mode {st.st_mode & 0o7777:#o}): "
               "chmod go-w it, or give directory=")
    if why:
        os.close(fd)
        raise UnsafeDirectory(why)
    return fd


def _lock_ring(dirfd, path, name):
    """flock(LOCK_EX | LOCK_NB) the lock file NAME.v2.lock, opened through dirfd without following links;
    retried if the locked inode is no longer the one at the name. Returns the locked descriptor."""
    ln = name + L.LOCK_SUFFIX
    full = os.path.join(path, ln)
    for _ in range(10):
        try:
            fd = os.open(ln, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dirfd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UnsafeDirectory(f"lock file {full} is a symbolic link: refusing to follow it "
                                      "(remove it)") from None
            raise RingError(f"lock file {full}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RingInUse(f"ring {name} ({path}) is in use by a live producer") from None
        except OSError as e:
            os.close(fd)
            raise RingError(f"lock file {full}: {e.strerror or e}") from None
        a = os.fstat(fd)
        try:
            b = os.stat(ln, dir_fd=dirfd, follow_symlinks=False)
        except OSError:
            b = None
        if b is not None and (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
            if not _stat.S_ISREG(a.st_mode):
                os.close(fd)
                raise UnsafeDirectory(f"lock file {full} is not a regular file")
            return fd
        os.close(fd)  # unlinked or replaced by its previous owner meanwhile: lock what is there now
    raise RingError(f"lock file {full}: the lock file keeps changing")


def _resolve_gid(group):
    if group is None:
        return None
    if isinstance(group, int):
        return group
    if str(group).isdigit():
        return int(group)
    import grp
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise RingError(f"group {group!r} does not exist") from None


class Grant:
    """Who may join one consumer group (spec §14.1): its name and the uids and gids granted."""

    __slots__ = ("name", "uids", "gids")

    def __init__(self, name, uids, gids):
        self.name, self.uids, self.gids = name, frozenset(uids), frozenset(gids)

    def permits(self, uid: int, gid: int, groups: Iterable[int]) -> bool:
        """Whether a peer (SO_PEERCRED uid and primary gid, SO_PEERGROUPS) may join: root always."""
        return uid == 0 or uid in self.uids or gid in self.gids or not self.gids.isdisjoint(groups)


check_group_name = _shared.check_group_name


def parse_grants(groups: Mapping[str, Iterable[int | str]] | None) -> dict[int, Grant] | None:
    """Producer(groups=...) as {group_id: Grant}; None for no grants (every group open). Each entry: a uid
    (an int, its decimal text or a user name) or "@" and a gid (decimal, or a group name). ValueError for a
    bad name, an unknown user or group, or two names with the same group_id."""
    if groups is None:
        return None
    out: dict[int, Grant] = {}
    for name, who in groups.items():
        check_group_name(name)
        gid_ = L.group_id(name)
        if gid_ in out and out[gid_].name != name:
            raise ValueError(f"consumer groups {out[gid_].name!r} and {name!r} have the same group_id "
                             f"{gid_:#010x}: rename one")
        uids, gids = set(), set()
        for w in ([who] if isinstance(who, (int, str)) else who):
            if isinstance(w, int) and not isinstance(w, bool) and w >= 0:
                uids.add(w)
            elif isinstance(w, str) and w.startswith("@") and len(w) > 1:
                g = _resolve_gid(w[1:])
                gids.add(g)
            elif isinstance(w, str) and w.isdigit():
                uids.add(int(w))
            elif isinstance(w, str) and w:
                import pwd
                try:
                    uids.add(pwd.getpwnam(w).pw_uid)
                except KeyError:
                    raise ValueError(f"consumer group {name!r}: user {w!r} does not exist") from None
            else:
                raise ValueError(f"consumer group {name!r}: {w!r} is not a uid, a user name or @gid")
        prev = out.get(gid_)
        if prev is not None:
            uids |= prev.uids
            gids |= prev.gids
        out[gid_] = Grant(name, uids, gids)
    return out


# ---------------------------------------------------------------- memory (spec §1, §4)
def _meminfo(key):
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k == key:
                    parts = v.split()
                    n = int(parts[0]) if parts else 0
                    return n << 10 if len(parts) > 1 and parts[1] == "kB" else n
    except (OSError, ValueError):
        pass
    return 0


def shm_available() -> int:
    """The memory a new shared mapping may take: MemAvailable, or less under this process's cgroup v2
    memory limit; 0 if unknown."""
    avail = _meminfo("MemAvailable")
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return avail
    for line in lines:
        if not line.startswith("0::"):
            continue
        d = "/sys/fs/cgroup" + line[3:]
        try:
            with open(d + "/memory.max") as f:
                lim = int(f.read().strip())
            with open(d + "/memory.current") as f:
                used = int(f.read().strip())
        except (OSError, ValueError):  # "max": no limit
            continue
        if used < lim and (avail == 0 or lim - used < avail):
            avail = lim - used
    return avail


def new_shm(name: str, size: int) -> tuple[int, mmap.mmap]:
    """A sealable shmem memfd of size bytes, refused up front when larger than the available memory (an
    unlimited shmem fallocate would meet the OOM killer rather than fail) — for rings: a memfd of at most
    SMALL_SHM (a consumer's region, a page) is no more than any allocation, and the three files read to
    know cost more than the rest of an admission (as the Go producer) — reserved with posix_fallocate and
    mapped read-write. Returns (fd, mmap); not sealed yet."""
    avail = shm_available() if size > SMALL_SHM else 0
    if avail and size > avail:
        raise NoSpace(f"the ring needs {size >> 20} MiB of shared memory and {avail >> 20} MiB are "
                      "available: use fewer or smaller slots")
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.ENOMEM):
                raise NoSpace(f"the ring needs {size >> 20} MiB of shared memory and the system has "
                              f"{shm_available() >> 20} MiB available: use fewer or smaller slots") from None
            raise
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise
    return fd, mm


def _align(v, a=4096):
    return (v + a - 1) // a * a


def layout_for(slot_count: int, slot_size: int, max_items: int, meta_size: int, packet_size: int = 0,
               page_size: int = 4096) -> dict[str, int]:
    """The data memory's geometry (spec §4): a dict of desc_offset, items_offset, meta_offset,
    payload_offset, packet_offset, data_size. Every region starts on a 4096-byte boundary; data_size is
    a multiple of page_size."""
    g = {"desc_offset": 0}
    off = _align(slot_count * L.DESC_SIZE)
    g["items_offset"] = off
    off = _align(off + slot_count * max_items * L.ITEM_SIZE)
    g["meta_offset"] = off
    off = _align(off + meta_size)
    g["payload_offset"] = off
    off = _align(off + slot_count * slot_size)
    g["packet_offset"] = off if packet_size else 0
    off = _align(off + packet_size)
    g["data_size"] = _align(off, page_size)
    return g


def _check_params(name, slot_count, slot_size, max_items, meta_size, max_consumers):
    if not isinstance(name, str) or not _valid_name(name):
        raise RingError(f"ring name {name!r}: use 1-{L.NAME_MAX} characters from [A-Za-z0-9_.-], not starting with '.'")
    if slot_count < 1 or slot_count > L.MAX_SLOT_COUNT or slot_count & (slot_count - 1):
        raise ValueError(f"slot_count {slot_count} is not a power of two in 1..{L.MAX_SLOT_COUNT}")
    if slot_size < 64 or slot_size % 64:
        raise ValueError(f"slot_size {slot_size} is not a multiple of 64 (>= 64)")
    if not 1 <= max_items <= L.MAX_ITEMS:
        raise ValueError(f"max_items {max_items} not in 1..{L.MAX_ITEMS}")
    if meta_size < L.META_HEADER_SIZE:
        raise ValueError(f"meta_size {meta_size} < {L.META_HEADER_SIZE}")
    if not 1 <= max_consumers <= L.MAX_CONSUMERS_LIMIT:
        raise ValueError(f"max_consumers {max_consumers} not in 1..{L.MAX_CONSUMERS_LIMIT}")
    # Python's integers cannot wrap, but the sizes must fit the header's u64 fields and mmap's off_t.
    size = layout_for(slot_count, slot_size, max_items, meta_size)["data_size"]
    if size > MAX_DATA_SIZE:
        raise ValueError(f"a ring of {slot_count} slots x {slot_size} bytes with {max_items} items each needs "
                         f"{size} bytes of data memory, more than the {MAX_DATA_SIZE} a ring can have")


# ---------------------------------------------------------------- stream metadata records (spec §6)
def _dtype_text(d, shape):
    dt = getattr(d, "dtype", None)
    hdr = getattr(d, "dtype_header", None)
    if hdr:
        return hdr
    if dt is None:
        return ""
    if isinstance(dt, (str, bytes)):
        s = dt.decode() if isinstance(dt, bytes) else dt
        if s.lstrip().startswith("{"):
            return s  # already the numpy header text
        dt = np.dtype(s)
    dt = np.dtype(dt)
    order = getattr(d, "order", "C") or "C"
    shp = "None" if shape is None else repr(tuple(int(x) for x in shape))
    return (f"{{'descr': {np.lib.format.dtype_to_descr(dt)!r}, 'fortran_order': {order == 'F'}, "
            f"'shape': {shp}}}")


def _record_of(d):
    if isinstance(d, (bytes, bytearray, memoryview)):
        return bytes(d)
    shape = getattr(d, "shape", None)
    shape = None if shape is None else tuple(int(x) for x in shape)
    fmt = getattr(d, "format", b"") or b""
    if isinstance(fmt, str):
        fmt = fmt.encode()
    return meta_record(int(d.id), getattr(d, "name", "") or "", getattr(d, "description", "") or "", shape,
                       fmt, _dtype_text(d, shape))


# ---------------------------------------------------------------- consumers
class Member:
    """The producer's record of one attached consumer: its socket, table row and mapped region."""

    oq: Optional[int]
    commit_end: Optional[int]

    def __init__(self, sock: socket.socket, index: int, generation: int, region_mm: mmap.mmap, released: int,
                 pid: int, uid: int) -> None:
        self.sock, self.index, self.generation = sock, index, generation
        self.region_mm: Optional[mmap.mmap] = region_mm  # None once unmapped at the detach
        self.r64 = memoryview(region_mm).cast("Q")
        self.r32 = memoryview(region_mm).cast("I")
        self._cf: Optional[ctypes.c_uint32] = ctypes.c_uint32.from_buffer(region_mm, L.REG_CONSUMER_FUTEX)
        self._rf: Optional[ctypes.c_uint32] = ctypes.c_uint32.from_buffer(region_mm, L.REG_RELEASE_FUTEX)
        self.cf_addr, self.rf_addr = ctypes.addressof(self._cf), ctypes.addressof(self._rf)
        self.released = released
        self.pid, self.uid = pid, uid
        self.detached = False
        # consumer groups (spec §14): group is the hello's group_id (0: independent), v22 whether it is a
        # member that publishes read and handed (its hello's minor >= 2, §14.1); read is its read as last
        # accepted (a 2.1 member's is its tail), queued the positions assigned to it at or after read, oq
        # the oldest of them (None: not known yet), last_pick orders ties (round robin), assigned is its
        # row's, swept its released as of the last sweep (positions before it no longer need it),
        # rel_assigned the assigned positions it released, handed its region's, skipped its row's;
        # commit_end is one past the last position assigned to it in the commit under way (its wake).
        self.group = 0
        self.v22 = False
        self.read = released
        self.queued = self.last_pick = self.assigned = 0
        self.oq = None
        self.swept = released
        self.rel_assigned = self.handed = self.skipped = 0
        self.commit_end = None

    @property
    def tail(self):
        return self.r64[Q_TAIL]

    def unmap(self):
        """Unmap the region at the detach (spec §7.6, 2.1 §C: nothing a connection created outlives it),
        not whenever the last reference to this record goes. A hot path still holding this record from an
        older snapshot then finds its views released (ValueError) and skips it; cf_addr and rf_addr stay
        plain numbers (a futex call on them fails or wakes spuriously, harmlessly). lock held."""
        if self.region_mm is None:
            return
        if "no-unmap" in _TEST_MUTANTS:
            _TEST_LEFT_MAPPED.append(self.region_mm)  # left mapped for the producer's life
            return
        self._cf = self._rf = None  # their exports pin the mapping
        self.r64.release()
        self.r32.release()
        try:
            self.region_mm.close()
        except BufferError:
            return  # a view someone still holds: unmapped when it goes
        self.region_mm = None


class Slot:
    """A payload slot taken by ``Producer.acquire()``: fill ``payload`` (a writable numpy uint8 view of
    the whole slot, no copy) and the item table (``add_item``), then ``Producer.publish(slot, ...)``, or
    give it back unpublished with ``discard()``.

    As a context manager it cannot leak: leaving the ``with`` block without publishing (an exception, or
    no publish call) discards it, so the pool never loses a slot (under ``block`` a lost slot would
    stall the ring for good)::

        with p.acquire() as slot:
            slot.payload[:n] = fill()           # an exception here gives the slot back
            p.publish(slot, heap_cnt=k)
    """

    __slots__ = ("_p", "index", "payload", "item_count", "overflow", "end", "_live")

    def __init__(self, producer, index):
        self._p = producer
        self.index = index
        self.payload = producer._payload2d[index]
        self.item_count = 0
        self.overflow = False
        self.end = 0  # the end of the furthest address item
        self._live = True

    def add_item(self, item_id: int, value: int = 0, length: int = 0, immediate: bool = False,
                 cut: bool = False) -> bool:
        """Append an item pointer (spec §5). An address item's bytes are payload[value:value+length]
        (ValueError past the slot); an immediate item carries ``value`` and its width ``length`` in bytes.
        ``cut``: the item ran past the slot of a TRUNCATED heap and ``length`` is what the slot kept (2.2
        ITEM_CUT). Returns False (and the heap gets ITEMS_OVERFLOW) when the table already holds max_items."""
        p = self._p
        if not immediate:
            ss = p.slot_size
            if value < 0 or length < 0 or value > ss or length > ss - value:
                raise ValueError(f"address item {item_id:#x} [{value}, +{length}) runs past slot_size {ss}")
            if value + length > self.end:
                self.end = value + length
        if self.item_count >= p.max_items:
            self.overflow = True
            return False
        L.ITEM_STRUCT.pack_into(p.data, p._items_off + (self.index * p.max_items + self.item_count) * 32,
                                item_id & M64, value & M64, length & M64,
                                (L.ITEM_IMMEDIATE if immediate else 0) | (L.ITEM_CUT if cut and not immediate else 0), 0)
        self.item_count += 1
        return True

    def reset_items(self) -> None:
        self.item_count, self.overflow, self.end = 0, False, 0

    def discard(self) -> None:
        """Return the slot to the pool unpublished."""
        self._p.discard(self)

    @property
    def live(self) -> bool:
        """True until the slot is published or discarded."""
        return self._live

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> Literal[False]:
        if self._live and not self._p._closed:
            self._p.discard(self)
        return False

    def __repr__(self):
        return f"Slot({self.index}, items={self.item_count})"


# ---------------------------------------------------------------- the producer
class Producer:
    """The producer of one ring. Make it with ``Producer.create(name, ...)``; use it as a context manager
    or call ``close()``. acquire / publish / publish_batch / end_of_stream / wait_drained / discard and
    set_descriptors belong to one thread (the hot path); interrupt, consumers, stats and close may be
    called from any thread."""

    _unmap_on_close = True

    @classmethod
    def create(cls, name: str, slot_count: int = 256, slot_size: int = 1 << 20, max_items: int = 64,
               meta_size: int = 64 << 10, policy: str | int = "drop", hugepages: str = "auto",
               directory: str | os.PathLike[str] | None = None, max_consumers: int = L.DEFAULT_MAX_CONSUMERS,
               group: str | int | None = None,
               groups: Mapping[str, Iterable[int | str]] | None = None) -> Producer:
        """Create ring ``name``: check/create the ring directory, take the name's lock, reserve and seal the
        memory, bind the socket and start serving consumers.

        slot_count: payload slots (a power of two); slot_size: bytes per slot (a multiple of 64);
        max_items: item-table entries per heap; meta_size: the stream-metadata area; policy: "drop"
        (a full ring drops the new heap: RingFull) or "block" (wait for the slowest consumer);
        hugepages: "auto" (hugetlb data memory if available, else shmem with a HugePageWarning),
        "require" (NoHugePages otherwise) or "off"; directory: the ring directory (default spec §1.1);
        max_consumers: rows of the consumer table (1..64); group: a group name or gid whose members may
        attach too (the socket becomes 0660 with that group); groups: grants for consumer groups (spec
        §14.1), {GROUP NAME: [uid, "@gid", ...]} (a uid as an int, its decimal text or a user name; a gid
        as "@" and its number or a group name): with grants, only those peers (and root) may join a group,
        a hello for a group not listed or by anyone else is refused with status 2 ("not permitted to join
        group NAME"); consumers without a group are admitted as before. None (the default): every group is
        open to every consumer the ring admits.

        Raises UnsafeDirectory, RingInUse ("in use by a live producer"), NoSpace / NoHugePages, RingError.
        """
        require_supported()
        return cls(name, slot_count=slot_count, slot_size=slot_size, max_items=max_items, meta_size=meta_size,
                   policy=policy, hugepages=hugepages, directory=directory, max_consumers=max_consumers,
                   group=group, groups=groups)

    # Made by __init__ (None until then: close() cleans up whatever a failed __init__ left).
    _dirfd: Optional[int]
    _lockfd: Optional[int]
    ctl_fd: Optional[int]
    data_fd: Optional[int]
    ctl: Optional[mmap.mmap]
    data: Optional[mmap.mmap]
    _listener: Optional[socket.socket]
    _thread: Optional[threading.Thread]
    _stop_r: Optional[int]
    _stop_w: Optional[int]
    _spare_fd: Optional[int]
    conns: Dict[int, Member]  # consumers by row, under lock
    _snap: Tuple[Member, ...]
    # The descriptor array (structured, layout.DESC_DTYPE): read and written by field name, which the
    # numpy stubs of Debian's numpy do not type (ndarray.__getitem__ of a str), hence Any.
    desc: Any

    def __init__(self, name, *, slot_count=256, slot_size=1 << 20, max_items=64, meta_size=64 << 10,
                 policy="drop", hugepages="auto", directory=None, max_consumers=L.DEFAULT_MAX_CONSUMERS,
                 group=None, groups=None, packet_size=0, start_position=0, serve=True):
        _check_params(name, slot_count, slot_size, max_items, meta_size, max_consumers)
        self.grants = parse_grants(groups)
        if policy not in POLICIES:
            raise ValueError(f"policy {policy!r}: use 'drop' or 'block'")
        if hugepages not in ("auto", "require", "off"):
            raise ValueError(f"hugepages {hugepages!r}: use 'auto', 'require' or 'off'")
        self.name = name
        self.slot_count, self.slot_size, self.max_items = slot_count, slot_size, max_items
        self.meta_size, self.packet_size, self.max_consumers = meta_size, packet_size, max_consumers
        self.policy = POLICIES[policy]
        self.gid = _resolve_gid(group)
        self._closed = False
        self._ended = False  # END_OF_STREAM is published: it is final (spec §4.1), nothing may follow it
        self._dirfd = self._lockfd = None
        self.ctl_fd = self.data_fd = None
        self.ctl = self.data = None
        self._listener = None
        self._thread = None
        self._stop_r = self._stop_w = None
        self._candidates = _shared.producer_dirs(directory)
        self.directory = self._candidates[0]
        try:
            self._setup(hugepages, start_position, serve)
        except BaseException:
            self._release(unlink=True)
            raise

    # ..................................................................... setup
    def _open_dir(self):
        """Open the ring directory (spec §1.1): the given one, or the first default one that is missing
        (then made) or passes the check; a default one that exists and fails it — a stranger made it
        first — is skipped with one warning naming it and why, and the next default is used."""
        last = len(self._candidates) - 1
        for i, d in enumerate(self._candidates):
            self.directory = d
            try:
                return open_ring_dir(d)
            except UnsafeDirectory as e:
                if i == last:
                    raise
                log.warning("ibvbridge: skipping %s: %s; using %s", d, e, self._candidates[i + 1])

    def _setup(self, hugepages, start_position, serve):
        self._dirfd = self._open_dir()
        self._lockfd = _lock_ring(self._dirfd, self.directory, self.name)
        self.socket_path = os.path.join(self.directory, self.name + L.SOCKET_SUFFIX)
        self._create_memory(hugepages)
        data, ctl = self.data, self.ctl
        assert data is not None and ctl is not None  # _create_memory mapped both, or raised
        sc = self.slot_count
        g = self.g
        self.mask = sc - 1
        self._items_off = g["items_offset"]
        self.desc = np.frombuffer(data, L.DESC_DTYPE, sc, g["desc_offset"])
        self.items = np.frombuffer(data, L.ITEM_DTYPE, sc * self.max_items,
                                   g["items_offset"]).reshape(sc, self.max_items)
        self._payload2d = np.frombuffer(data, np.uint8, sc * self.slot_size,
                                        g["payload_offset"]).reshape(sc, self.slot_size)
        self.meta_off = g["meta_offset"]
        self.c64 = memoryview(ctl).cast("Q")
        self.c32 = memoryview(ctl).cast("I")
        self._stats = self.c64[Q_STATS:Q_STATS + L.STATS_SLOTS]
        self._desc_off = g["desc_offset"]
        # private state of the hot path
        self._pos = start_position & M64  # next position to publish (= head after each publish)
        self._reclaim = self._pos  # positions < _reclaim have their slots back in the pool
        self._free = np.arange(sc, dtype=np.uint32)  # FIFO of free slots: [_free_r, _free_w) mod sc
        self._free_r, self._free_w = 0, sc
        self._pos_slot = np.zeros(sc, dtype=np.uint32)
        # Consumer groups (spec §14), under the lock. _pos_need, per position (& mask): the rows of group
        # members that must still release it before its slot is free. _scan: positions below it were looked
        # at by reclaim and freed unless a member needs them; from it to head every position holds its slot.
        # _window_end: no slot is taken for a position at or past it (every consumer within slot_count of
        # head, and of the oldest held position). _rescan: a member left, positions below _scan may be free.
        self._pos_need = np.zeros(sc, dtype=np.uint64)
        self._scan = self._pos
        self._window_end = (self._pos + sc) & M64
        self._rescan = False
        self._group_members = 0
        # Below it, a departed member's settled positions need no attached independent consumer either: with
        # nobody attached, reclaim frees them under block too (spec §7.1, §14.7). None: nothing to free.
        self._settle_front: Optional[int] = None
        self._picks = 0
        self._skipped_departed = 0  # what departed 2.2 members released unread (group_skipped, §14.7)
        self._blocked = None  # (row, since_ns, logged) of the consumer a block producer waits for (§14.6)
        self._taken = set()  # slots acquired and not yet published (single-heap API)
        self.c64[Q_HEAD] = self._pos
        self.c64[Q_OLDEST] = self._reclaim
        self.c64[Q_HEARTBEAT_NS] = time.time_ns()
        # consumers: index -> Member, under _lock; _snap is the hot path's lock-free copy
        self.lock = threading.RLock()
        self.conns = {}
        self._graveyard = []
        self._snap = ()
        self._attached = threading.Event()
        self._interrupted = False
        self._wait_addr = 0
        self.refused = []
        self._refused_logged = 0.0
        self.hello_timeouts = 0  # connections closed for sending no hello within HELLO_TIMEOUT
        self._spare_fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)  # given up to refuse at EMFILE
        # the socket (spec §1.1): a leftover one is stale (we hold the lock): remove it, bind afresh
        sname = self.name + L.SOCKET_SUFFIX
        try:
            os.unlink(sname, dir_fd=self._dirfd)
        except FileNotFoundError:
            pass
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            self._listener.bind(f"/proc/self/fd/{self._dirfd}/{sname}")
        finally:
            os.umask(old)
        if self.gid is not None:
            os.chown(sname, -1, self.gid, dir_fd=self._dirfd, follow_symlinks=False)
            os.chmod(sname, 0o660, dir_fd=self._dirfd)
        self._listener.listen(64)
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        if serve:
            self._thread = threading.Thread(target=self._serve, name=f"ibvbridge-producer-{self.name}",
                                             daemon=True)
            self._thread.start()

    def _create_memory(self, hugepages):
        """Data and control memfds, sized and reserved before anything is written, then the header (state
        READY) and the seals (spec §1)."""
        page, huge, hfd = 4096, False, None
        if hugepages != "off":
            try:
                hfd = os.memfd_create("ibvbridge-data", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING | os.MFD_HUGETLB)
                page = os.fstat(hfd).st_blksize
                huge = True
            except OSError as e:
                self._no_huge(hugepages, f"hugetlb memfd: {e.strerror or e}")
        g = layout_for(self.slot_count, self.slot_size, self.max_items, self.meta_size, self.packet_size, page)
        if huge:
            assert hfd is not None  # huge: the hugetlb memfd was made
            size = g["data_size"]
            try:
                os.ftruncate(hfd, size)
                self.data = mmap.mmap(hfd, size, mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0x8000),
                                      mmap.PROT_READ | mmap.PROT_WRITE)
                self.data_fd = hfd
            except OSError as e:
                os.close(hfd)
                free = _meminfo("HugePages_Free") * _meminfo("Hugepagesize")
                if e.errno == errno.ENOMEM:
                    why = (f"the ring needs {size >> 20} MiB of hugepages and {free >> 20} MiB are free "
                           "(echo N > /proc/sys/vm/nr_hugepages)")
                else:
                    why = f"hugetlb mmap of {size >> 20} MiB: {e.strerror or e}"
                self._no_huge(hugepages, why)
                huge, page = False, 4096
                g = layout_for(self.slot_count, self.slot_size, self.max_items, self.meta_size, self.packet_size)
        if not huge:
            self.data_fd, self.data = new_shm("ibvbridge-data", g["data_size"])
        self.g, self.page_size, self.huge = g, page, huge
        self.data_size = g["data_size"]
        self.ctl_size = L.ctl_size_for(self.max_consumers)
        self.ctl_fd, self.ctl = new_shm("ibvbridge-ctl", self.ctl_size)
        self.session_id = secrets.randbits(63) | 1
        self.hdr = dict(magic=L.MAGIC, major=L.MAJOR_VERSION, minor=L.MINOR_VERSION, ctl_size=self.ctl_size,
                        state=L.STATE_READY, policy=self.policy, session_id=self.session_id,
                        producer_pid=os.getpid(), producer_start_ns=time.time_ns(), slot_count=self.slot_count,
                        slot_size=self.slot_size, max_items=self.max_items, desc_size=L.DESC_SIZE,
                        item_size=L.ITEM_SIZE, page_size=page, data_size=g["data_size"],
                        desc_offset=g["desc_offset"], items_offset=g["items_offset"],
                        meta_offset=g["meta_offset"], meta_size=self.meta_size,
                        payload_offset=g["payload_offset"], packet_offset=g["packet_offset"],
                        packet_size=self.packet_size, features=0, stats_count=L.STATS_COUNT,
                        max_consumers=self.max_consumers)
        L.HEADER_STRUCT.pack_into(self.ctl, 0, *(self.hdr[f] for f in L.HEADER_FIELDS))
        from . import __version__  # 2.2 producer_version: what stat and consumers say this ring runs
        ver = f"ibvbridge.Producer {__version__}".encode()[:L.PRODUCER_VERSION_MAX]
        self.ctl[L.OFF_PRODUCER_VERSION:L.OFF_PRODUCER_VERSION + len(ver)] = ver
        add_seals(self.ctl_fd, SEALS_SHARED)
        add_seals(self.data_fd, SEALS_SHARED)

    @staticmethod
    def _no_huge(mode, why):
        if mode == "require":
            raise NoHugePages(why)
        warnings.warn(f"{why}; using ordinary shared memory", HugePageWarning, stacklevel=5)

    # ..................................................................... properties
    @property
    def consumers(self) -> int:
        """Consumers attached now."""
        return len(self._snap)

    @property
    def head(self) -> int:
        """The published head (positions below it are visible to consumers)."""
        return self._pos

    @property
    def oldest(self) -> int:
        return self._scan

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> dict[str, int]:
        """The ring's counters as {name: value} (spec §2.3)."""
        st = self._stats
        return {n: st[i] for i, n in enumerate(L.COUNTER_NAMES)}

    def _counter(self, c):
        i = COUNTER[c] if isinstance(c, str) else int(c)
        if not 0 <= i < L.STATS_SLOTS:
            raise IndexError(f"counter {c!r}")
        return i

    def add(self, counter: str | int, n: int = 1) -> None:
        """Add n to a counter (a name of layout.COUNTER_NAMES, or its index)."""
        i = self._counter(counter)
        self._stats[i] = (self._stats[i] + n) & M64

    def set(self, counter: str | int, value: int) -> None:
        """Set a counter."""
        self._stats[self._counter(counter)] = value & M64

    # ..................................................................... the socket (spec §1.2)
    def _serve(self):
        """The serving thread: accepts connections, answers hellos (each within HELLO_TIMEOUT, without ever
        blocking on one), notices consumers' hang-ups, beats. Everything a connection creates ends with it
        (layout 2.1 §C): a pending hello holds one descriptor, a consumer its socket and region."""
        listener, stop_r = self._listener, self._stop_r
        assert listener is not None and stop_r is not None  # made before the thread starts
        poller = select.poll()
        poller.register(listener, select.POLLIN)
        poller.register(stop_r, select.POLLIN)
        watched: Dict[int, Member] = {}
        pending: Dict[int, Tuple[socket.socket, float]] = {}  # fd -> (connection, hello deadline)
        next_beat = 0.0
        while True:
            with self.lock:
                live = {m.sock.fileno(): m for m in self.conns.values()}
                gone, self._graveyard = self._graveyard, []
            for m in gone:  # detached by the hot path: their sockets are ours to close
                fd = m.sock.fileno()
                if fd in watched:
                    poller.unregister(fd)
                    del watched[fd]
                m.sock.close()
            for fd in set(watched) - set(live):
                try:
                    poller.unregister(fd)
                except (KeyError, ValueError):
                    pass
                del watched[fd]
            for fd, m in live.items():
                if watched.get(fd) is not m:
                    if fd in watched:
                        poller.unregister(fd)
                    poller.register(fd, select.POLLIN | select.POLLRDHUP)
                    watched[fd] = m
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + BEAT_SECONDS
                self._beat()
            for fd, (conn, dl) in list(pending.items()):
                if now >= dl:  # no hello in time: closed and counted
                    poller.unregister(fd)
                    del pending[fd]
                    conn.close()
                    self.hello_timeouts += 1
                    self._log_refusal(f"ring {self.name}: closed a connection that sent no hello within "
                                      f"{HELLO_TIMEOUT} s")
            wake = min([next_beat] + [dl for _, dl in pending.values()])
            try:
                events = poller.poll(max(1, int((wake - time.monotonic()) * 1000) + 1))
            except InterruptedError:
                continue
            for fd, ev in events:
                if fd == self._stop_r:
                    for conn, _ in pending.values():
                        conn.close()
                    return
                if fd == listener.fileno():
                    conn = self._accept()
                    if conn is not None:
                        pending[conn.fileno()] = (conn, time.monotonic() + HELLO_TIMEOUT)
                        poller.register(conn, select.POLLIN | select.POLLRDHUP)
                    continue
                if fd in pending:
                    conn, _ = pending.pop(fd)
                    poller.unregister(fd)
                    try:
                        msg = conn.recv(256, socket.MSG_DONTWAIT)
                    except OSError:
                        conn.close()
                        continue
                    if not msg:  # EOF, or a 0-byte record it cannot be told from: closed unanswered (§1.2)
                        conn.close()
                        continue
                    try:
                        self._answer(conn, msg)
                    except OSError:
                        conn.close()
                    continue
                m = watched.get(fd)
                if m is None:
                    continue
                hung = bool(ev & POLL_GONE)
                if not hung:
                    try:
                        m.sock.recv(256, socket.MSG_DONTWAIT)
                        hung = True  # EOF, or a record: nothing is sent after the welcome, so it ends it (§1.2)
                    except BlockingIOError:
                        pass
                    except OSError:
                        hung = True
                if hung:
                    poller.unregister(fd)
                    del watched[fd]
                    self._consumer_left(m)

    def _accept(self):
        """Accept one connection, or None. Keeps FD_RESERVE descriptors free (layout 2.1 §C): when fewer
        are left, or MAX_PENDING hellos are outstanding, the connection is refused as busy with the reason;
        when accept itself finds no descriptor, the spare one is given up to refuse it likewise (else the
        listener would stay readable and the loop spin)."""
        listener = self._listener
        assert listener is not None  # made before the thread that accepts starts
        try:
            conn, _ = listener.accept()
        except OSError as e:
            if e.errno not in (errno.EMFILE, errno.ENFILE) or self._spare_fd is None:
                return None
            os.close(self._spare_fd)
            self._spare_fd = None
            try:
                conn, _ = listener.accept()
                self._refuse(conn, L.STATUS_BUSY, f"ring {self.name} busy: the producer is out of file "
                                                  "descriptors")
            except OSError:
                pass
            finally:
                try:
                    self._spare_fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    pass
            return None
        left = _fds_left()
        if left < FD_RESERVE:
            self._refuse(conn, L.STATUS_BUSY, f"ring {self.name} busy: the producer has {left} file descriptors "
                                              f"left (keeps {FD_RESERVE} in reserve)")
            return None
        conn.setblocking(False)
        return conn

    def _beat(self):
        """Heartbeat (for humans) and the table rows' released positions, kept current while idle."""
        if self._closed:
            return
        self.c64[Q_HEARTBEAT_NS] = time.time_ns()
        with self.lock:
            self._read_cursors_locked(self.c64[Q_HEAD])

    def _permitted(self, uid, gid, conn=None):
        """The SO_PEERCRED gate (spec §1.2): our euid, root, or a member of the producer's group — by the
        peer's real groups (SO_PEERGROUPS, layout 2.1 §C), not /etc/group."""
        if uid in (0, os.geteuid()):
            return True
        if self.gid is None:
            return False
        if gid == self.gid:
            return True
        return conn is not None and self.gid in peer_groups(conn)

    def _log_refusal(self, message):
        now = time.monotonic()
        if now - self._refused_logged > 1.0:  # a stranger connecting in a loop gets a line a second
            self._refused_logged = now
            log.warning("%s", message)

    def _refuse(self, conn, status, message):
        self.refused.append((status, message))
        del self.refused[:-100]
        self._log_refusal(f"ring {self.name}: refused a client: {message}")
        try:
            conn.send(L.pack_error(status, message))
        except OSError:
            pass
        conn.close()

    def _refuse_hook(self, conn):
        """Tests may answer every hello with an error record here; True when it did."""
        return False

    def _welcome_hook(self, rec, fds):
        return rec, fds

    _region_seals = SEALS_REGION

    def _handshake(self, conn):
        """Answer one connection on the caller's thread (blocking up to HELLO_TIMEOUT for its hello)."""
        conn.settimeout(HELLO_TIMEOUT)
        try:
            msg = conn.recv(256)
        except (socket.timeout, OSError):
            conn.close()
            return
        if not msg:  # EOF, or a 0-byte record it cannot be told from: closed unanswered (spec §1.2)
            conn.close()
            return
        self._answer(conn, msg)

    def _answer(self, conn, msg):
        """Answer the hello msg of conn: an error record, or a welcome with the ring's descriptors."""
        if self._refuse_hook(conn):
            return
        pid, uid, gid = peer_cred(conn)
        try:
            h = L.unpack_hello(msg)
        except ValueError:
            h = None
        if h is None or h["magic"] != L.MAGIC:
            return self._refuse(conn, L.STATUS_PROTOCOL, f"ring {self.name}: hello of {len(msg)} bytes is not "
                                "an ibvbridge hello")
        if not self._permitted(uid, gid, conn):
            return self._refuse(conn, L.STATUS_NOT_PERMITTED, f"ring {self.name}: uid {uid} may not attach "
                                f"(the producer runs as uid {os.geteuid()})")
        if h["major"] != L.MAJOR_VERSION:
            return self._refuse(conn, L.STATUS_VERSION, f"ring {self.name} is layout {L.MAJOR_VERSION}."
                                f"{L.MINOR_VERSION}; this client speaks {h['major']}.{h['minor']}")
        if h["role"] not in (L.ROLE_CONSUMER, L.ROLE_OBSERVER) or h["start"] not in (L.START_OLDEST,
                                                                                     L.START_HEAD):
            return self._refuse(conn, L.STATUS_PROTOCOL, f"ring {self.name}: role {h['role']}, start "
                                f"{h['start']}")
        if any(msg[HELLO_RESERVED:L.HELLO_SIZE]):  # 2.1 (spec §1.2): what follows group_id stays reserved
            return self._refuse(conn, L.STATUS_PROTOCOL, f"ring {self.name}: the hello's reserved bytes are not "
                                "zero")
        group = int.from_bytes(msg[L.HELLO_GROUP_ID:L.HELLO_GROUP_ID + 4], "little")
        if group and h["role"] == L.ROLE_OBSERVER:
            return self._refuse(conn, L.STATUS_PROTOCOL, f"ring {self.name}: an observer in group {group:#x}")
        if group and self.grants is not None:  # spec §14.1: with grants, only the granted may join a group
            g = self.grants.get(group)
            if g is None or not g.permits(uid, gid, peer_groups(conn) if uid and gid not in g.gids else ()):
                what = g.name if g is not None else f"{group:#010x} (not granted)"
                return self._refuse(conn, L.STATUS_NOT_PERMITTED, f"ring {self.name}: uid {uid} is not permitted "
                                    f"to join group {what}")
        if self._closed or self.c32[I_STATE] == L.STATE_CLOSED:
            return self._refuse(conn, L.STATUS_CLOSING, f"ring {self.name} is closing: the stream has ended")
        if h["role"] == L.ROLE_OBSERVER:
            rec = L.pack_welcome(L.NO_CONSUMER_INDEX, 0, self.session_id, self.ctl_size, 0, 0)
            assert self.ctl_fd is not None  # made with the ring, before the server starts
            socket.send_fds(conn, [rec], [self.ctl_fd])
            conn.close()
            return
        rfd, rmm = new_shm("ibvbridge-region", L.REGION_SIZE)
        try:
            if self._region_seals:
                add_seals(rfd, self._region_seals)
            with self.lock:
                free = [i for i in range(self.max_consumers) if i not in self.conns]
                if not free:
                    rmm.close()
                    return self._refuse(conn, L.STATUS_BUSY, f"ring {self.name} busy: all {self.max_consumers} "
                                        "consumer rows are attached")
                idx = free[0]
                # the start position goes into the region under the reclaim lock (spec §7.1); a group member
                # starts at head (§14), an independent consumer with start = 0 where every position holds
                # its slot (oldest)
                start = self._scan if h["start"] == L.START_OLDEST and not group else self.c64[Q_HEAD]
                rmm[0:8] = start.to_bytes(8, "little")
                gen = (self.row_get(idx, "generation") + 1) & 0xFFFFFFFF
                self.row_set(idx, generation=gen, pid=pid, uid=uid, attach_ns=time.time_ns(), released=start,
                             wakes=0, lost_heaps=0, assigned=0, group_id=group, client_minor=h["minor"],
                             read=start if group else 0, queued=0, skipped=0)  # read, queued: members' (§2.2)
                full_fence()
                self.row_set(idx, state=L.CONSUMER_ATTACHED)  # last: the row is complete
                m = Member(conn, idx, gen, rmm, start, pid, uid)
                m.group = group
                m.v22 = bool(group) and h["minor"] >= 2  # a 2.2 member publishes read and handed (§14.1)
                if m.v22:
                    rmm[L.REG_READ:L.REG_READ + 8] = start.to_bytes(8, "little")
                self._group_members += bool(group)
                self._settle_front = None  # reclaim finds the frontier from the attached consumers now
                self.conns[idx] = m
                self._snap = tuple(self.conns.values())
                self._stats[C_ATTACHED] = len(self.conns)
            rec = L.pack_welcome(idx, gen, self.session_id, self.ctl_size, self.data_size, L.REGION_SIZE)
            rec, fds = self._welcome_hook(rec, [self.ctl_fd, self.data_fd, rfd])
            try:
                if fds:
                    socket.send_fds(conn, [rec], fds)
                else:
                    conn.send(rec)
            except OSError:
                self._consumer_left(m)
                return
            conn.setblocking(False)
            self._attached.set()
        finally:
            os.close(rfd)

    def _consumer_left(self, m):
        """A consumer's socket hung up: its final tail is read (layout 2.1 §D: released and lost_heaps are
        then right), its row becomes gone (4) and it stops counting (spec §7.6)."""
        with self.lock:
            if self.conns.get(m.index) is m:
                t = m.r64[Q_TAIL]
                if (t - m.released) & M64 <= (self.c64[Q_HEAD] - m.released) & M64:
                    m.released = t  # a valid final cursor; an invalid one is ignored (it is leaving anyway)
                del self.conns[m.index]
                self._settle_departed_locked(m)
                self._snap = tuple(self.conns.values())
                if self.row_get(m.index, "generation") == m.generation:
                    self.row_set(m.index, released=m.released)
                    full_fence()
                    self.row_set(m.index, state=L.CONSUMER_GONE)
                self._stats[C_ATTACHED] = len(self.conns)
                m.detached = True
                m.unmap()
            m.detached = True
        m.sock.close()

    def _detach_locked(self, m, state, lost_heaps=0):
        """Detach m for ``state`` (2 overrun, 3 bad cursor): the row says why (state stored last), the
        counter counts it, and its socket is shut down (the serving thread closes it). lock held."""
        if self.conns.get(m.index) is not m:
            return
        del self.conns[m.index]
        self._snap = tuple(self.conns.values())
        m.detached = True
        self._settle_departed_locked(m)
        self.row_set(m.index, released=m.released)
        if "row-late" not in _TEST_MUTANTS:
            self.row_set(m.index, lost_heaps=lost_heaps)
            full_fence()
            self.row_set(m.index, state=state)
        # Layout 2.1 §A: the consumer checks its row after copying a heap; a slot it held may be reused only
        # once the detached state is visible to it, i.e. after this fence.
        full_fence()
        if state == L.CONSUMER_OVERRUN:
            self._stats[C_OVERRUNS] += 1
        elif state == L.CONSUMER_BAD_CURSOR:
            self._stats[C_ERRORS] += 1
        self._stats[C_ATTACHED] = len(self.conns)
        m.unmap()
        try:
            m.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self._thread is None:
            m.sock.close()
        else:
            self._graveyard.append(m)  # the serving thread unregisters and closes it

    # ..................................................................... consumer table (spec §2.2)
    def row_get(self, index: int, field: str) -> int:
        """One field of consumer-table row index: one aligned load."""
        w = row_word(index, field)
        return self.c32[w] if field in ROW_U32 else self.c64[w]

    def row_set(self, index: int, **fields: int) -> None:
        """Store fields of row index in the order given (state last, by the callers), one store each."""
        for field, v in fields.items():
            w = row_word(index, field)
            if field == "state" and ORDERED:
                release_fence()  # the row's state is stored last, with release (spec §2.2)
            if field in ROW_U32:
                self.c32[w] = v & 0xFFFFFFFF
            else:
                self.c64[w] = v & M64

    def row(self, index: int) -> dict[str, int]:
        """Consumer-table row ``index`` as a dict (spec §2.2)."""
        o = L.OFF_CONSUMER_TABLE + L.ROW_SIZE * index
        return dict(zip(L.ROW_FIELDS, L.ROW_STRUCT.unpack_from(self.ctl, o)))

    # ..................................................................... reclaiming (spec §7.1-7.3)
    def _read_cursors_locked(self, head):
        """Read every attached consumer's tail (spec §7.2), then a group member's read and handed (§14.2, in
        that order: acquire loads): a valid tail (in [released, head]) becomes its released position and
        its row's; an invalid one detaches it (state 3, consumer_errors). A 2.2 member's read outside
        [tail, head] is taken as its tail (it harms only its own share); a 2.1 member's read is its tail.
        The read a member moves past is what is no longer queued for it (§14.3)."""
        for m in list(self.conns.values()):
            t = m.r64[Q_TAIL]
            r = m.released
            if (t - r) & M64 > (head - r) & M64:
                self._detach_locked(m, L.CONSUMER_BAD_CURSOR, (head - r) & M64)  # §2.2: from the final valid tail
                continue
            if t != r:
                m.released = t
                self.row_set(m.index, released=t)
            if m.group:
                if m.v22:
                    rd = m.r64[Q_READ]
                    m.handed = m.r64[Q_HANDED]
                    if (rd - t) & M64 > (head - t) & M64:
                        rd = t
                else:
                    rd = t
                self._advance_read_locked(m, rd, head)
        if ORDERED:
            acquire_fence()  # the tails are acquire loads: no slot they free is written before them

    def _advance_read_locked(self, m, rd, head):
        """Member m's read becomes rd, which the caller has checked lies in [tail, head] (spec §14.2): the
        positions assigned to it between the read accepted before and rd are no longer queued when rd is
        ahead (§14.3), and queued again when it is behind (a member that stores a lower read keeps its own
        share queued longer). Bounded: at most slot_count positions are counted."""
        old = m.read
        if rd == old:
            return
        if (rd - old) & M64 <= (head - old) & M64:  # ahead
            if m.queued:
                m.queued -= self._count_bit_locked(m.index, old, rd, head)
        else:
            m.queued += self._count_bit_locked(m.index, rd, old, head)
        m.oq = None  # found again from the new read when needed
        m.read = rd
        self.row_set(m.index, read=rd, queued=m.queued)

    def _ring_idx(self, start, end, head):
        """Descriptor indices of positions [start, end), clipped to the last slot_count positions before
        head (checked by subtraction, spec §14.7): positions older than that hold nothing any member needs
        (a position a member must still release holds its slot; one queued for it bounds the window)."""
        sc = self.slot_count
        if (head - start) & M64 > sc:
            start = (head - sc) & M64
        n = (end - start) & M64
        if n == 0 or n > sc:
            return None, start
        i0 = start & self.mask
        if i0 + n <= sc:
            return slice(i0, i0 + n), start
        return (np.arange(n, dtype=np.int64) + i0) & self.mask, start

    def _count_bit_locked(self, index, start, end, head):
        """How many positions in [start, end) still carry row index's bit (bounded, vectorised)."""
        idx, _ = self._ring_idx(start, end, head)
        if idx is None:
            return 0
        return int(np.count_nonzero(self._pos_need[idx] & np.uint64(1 << index)))

    def _oldest_queued_locked(self, m, head):
        """The oldest position queued for 2.2 member m (assigned to it, at or after its read), or None."""
        if not m.queued:
            return None
        if m.oq is None:
            idx, start = self._ring_idx(m.read, head, head)
            if idx is None:
                return None
            hit = (self._pos_need[idx] & np.uint64(1 << m.index)) != 0
            k = int(hit.argmax())
            m.oq = (start + k) & M64 if hit[k] else None
        return m.oq

    def _nfree(self):
        return self._free_w - self._free_r

    def _room(self):
        """Slots that may be taken now: free ones, within the window (spec §14.5; without groups the window
        holds exactly the free slots)."""
        w = (self._window_end - self._pos - len(self._taken)) & M64
        return min(self._free_w - self._free_r, 0 if w >= 1 << 63 else w)

    def _push_slots(self, slots):
        """Return slots (an array) to the pool's tail."""
        n = len(slots)
        if not n:
            return
        sc = self.slot_count
        w = self._free_w % sc
        k = min(n, sc - w)
        self._free[w:w + k] = slots[:k]
        if k < n:
            self._free[:n - k] = slots[k:]
        self._free_w += n

    def _free_positions(self, to):
        """Return the slots of positions [_reclaim, to) to the pool (they all hold one)."""
        n = (to - self._reclaim) & M64
        if n == 0:
            return
        idx = (np.arange(n, dtype=np.int64) + (self._reclaim & self.mask)) & self.mask
        self._push_slots(self._pos_slot[idx])
        self._reclaim = to & M64
        if (self._reclaim - self._scan) & M64 <= (self._pos - self._scan) & M64:  # passed _scan
            self._scan = self._reclaim
        self.c64[Q_OLDEST] = self._scan

    def _free_idx(self, idx):
        """Give the slots of the positions at descriptor indices idx (an index array) that still
        hold one back to the pool (group reclaim: out of order)."""
        s = self._pos_slot[idx]
        held = s != NO_SLOT
        if held.any():
            self._push_slots(s[held])
            self._pos_slot[idx[held]] = NO_SLOT

    def _advance_reclaim(self):
        """Move _reclaim over the positions below _scan whose slots are back (vectorised, bounded)."""
        n = (self._scan - self._reclaim) & M64
        if not n:
            return
        idx, start = self._ring_idx(self._reclaim, self._scan, self._scan)
        if idx is None:
            return
        held = self._pos_slot[idx] != NO_SLOT
        k = int(held.argmax())
        self._reclaim = (start + k) & M64 if held[k] else self._scan

    def _set_window_locked(self):
        """No slot for a position slot_count past the oldest position holding a slot, the tail of any
        independent consumer or 2.1 member, or the oldest position queued for a 2.2 member (spec §14.5)."""
        ref = self._pos
        low = self._reclaim
        for m in self.conns.values():
            x = self._oldest_queued_locked(m, self.c64[Q_HEAD]) if m.v22 else m.released
            if x is not None and (ref - x) & M64 > (ref - low) & M64:
                low = x
        self._window_end = (low + self.slot_count) & M64

    def _reclaim_locked(self, want=1):
        """Give back the slots every attached consumer has released (up to the slowest one's cursor) — for
        a group member, only the positions assigned to it (spec §14.5). With nobody attached, drop frees the
        oldest positions as it needs slots (the ring keeps the newest heaps for a consumer that attaches
        later); block keeps everything."""
        if self._rescan:  # a member left: what only it held below _scan is free
            self._rescan = False
            self._free_unneeded(self._reclaim, self._scan, self._scan)
            self._advance_reclaim()
        if not self.conns:
            if self._settle_front is not None:  # the departed members' settled positions are free
                front, self._settle_front = self._settle_front, None
                if (front - self._scan) & M64 <= (self._pos - self._scan) & M64 and front != self._scan:
                    self._free_unneeded(self._scan, front, self.c64[Q_HEAD])
                    self._scan = front
                    self._advance_reclaim()
                    self.c64[Q_OLDEST] = self._scan
            if self.policy == L.POLICY_DROP:
                self._set_window_locked()
                need = want - self._room()
                if need > 0:
                    held = (self._pos - self._reclaim) & M64
                    self._free_positions((self._reclaim + min(need, held)) & M64)
            self._set_window_locked()
            self._skipped_stat()
            return
        head = self.c64[Q_HEAD]
        self._read_cursors_locked(head)
        if not self.conns:  # every one was detached just now: nothing more is free
            self._set_window_locked()
            return
        if not self._group_members and self._reclaim == self._scan:  # no groups: in order, as ever
            slow = self._slowest_locked()
            if slow is not None:
                self._free_positions(slow.released)
            self._set_window_locked()
            return
        rec = self._reclaim
        to = head  # the independent consumers' frontier
        for m in self.conns.values():
            if m.group:
                self._sweep_locked(m, head)
            elif (m.released - rec) & M64 < (to - rec) & M64:
                to = m.released
        in_order = self._reclaim == self._scan
        if (to - rec) & M64 >= (self._scan - rec) & M64 and to != self._scan:
            if not self._free_unneeded(self._scan, to, head):
                in_order = False
            self._scan = to
        if in_order:
            self._reclaim = self._scan
        else:
            self._advance_reclaim()
        self.c64[Q_OLDEST] = self._scan
        self._set_window_locked()
        self._skipped_stat()

    def _free_unneeded(self, start, end, head):
        """Free the slots of the positions in [start, end) (clipped to the last slot_count before head) that no
        group member needs any more; False when some member still needs one of them."""
        idx, _ = self._ring_idx(start, end, head)
        if idx is None:
            return True
        sel = _index_array(idx)
        free = self._pos_need[sel] == 0
        self._free_idx(sel[free])
        return bool(free.all())

    def _sweep_locked(self, m, head):
        """Group member m's releases since its last sweep (spec §14.5): each position it passed that was
        assigned to it no longer needs it (counted as released assigned, for skipped: §14.7), and is free
        if reclaim has looked at it and nobody else needs it. Vectorised over at most slot_count positions."""
        if m.swept == m.released:
            return
        idx, start = self._ring_idx(m.swept, m.released, head)
        m.swept = m.released
        if idx is None:
            return
        bit = np.uint64(1 << m.index)
        need = self._pos_need[idx]
        hit = (need & bit) != 0
        n = int(np.count_nonzero(hit))
        if not n:
            return
        need = np.where(hit, need & ~bit, need)
        self._pos_need[idx] = need
        m.rel_assigned += n
        if m.v22:
            sk = max(0, m.rel_assigned - m.handed)
            if sk != m.skipped:
                m.skipped = sk
                self.row_set(m.index, skipped=sk)
        # free what nobody needs now and reclaim has already looked at: in [_reclaim, _scan)
        off = np.arange(len(need), dtype=np.int64) + _signed(start - self._reclaim)
        free = hit & (need == 0) & (off >= 0) & (off < ((self._scan - self._reclaim) & M64))
        if free.any():
            self._free_idx(_index_array(idx)[free])

    def _skipped_stat(self):
        """group_skipped (stats 18): what departed members and attached 2.2 members released unread."""
        if self._group_members or self._skipped_departed:
            self._stats[C_GROUP_SKIPPED] = (self._skipped_departed +
                                            sum(m.skipped for m in self.conns.values())) & M64

    def _settle_departed_locked(self, m):
        """A group member left (spec §14.7), settled here, at the detach, under the lock: its bit leaves
        every published position that carries it (at most slot_count, vectorised) — what it had released is
        released, what was assigned to it at or after its final tail is lost for its group (group_lost) — so
        the next consumer of its row inherits nothing; the slots nobody needs now return at the hot path's
        next reclaim (the pool is the hot path's). lock held."""
        if not m.group:
            return
        self._group_members -= 1
        end = self.c64[Q_HEAD]  # positions are assigned and head stored under the lock: every bit is below it
        idx, start = self._ring_idx(m.swept, end, end)
        m.swept = end
        if idx is not None:
            bit = np.uint64(1 << m.index)
            need = self._pos_need[idx]
            hit = (need & bit) != 0
            if hit.any():
                self._pos_need[idx] = np.where(hit, need & ~bit, need)
                # at or after its final tail: lost; before it: released
                after = np.arange(len(need), dtype=np.int64) >= _signed(m.released - start)
                lost = int(np.count_nonzero(hit & after))
                m.rel_assigned += int(np.count_nonzero(hit)) - lost
                if lost:
                    self._stats[C_GROUP_LOST] += lost
        if m.v22:
            m.handed = m.r64[Q_HANDED]
            self._skipped_departed += max(0, m.rel_assigned - m.handed)
            m.skipped = 0
        self._rescan = True
        front = end  # what an attached independent consumer has not released stays held
        for o in self.conns.values():
            if not o.group and (o.released - front) & M64 >= 1 << 63:
                front = o.released
        if self._settle_front is None or (self._settle_front - front) & M64 >= 1 << 63:
            self._settle_front = front
        self._skipped_stat()

    def _assign_locked(self):
        """Give each position staged since head to one member of every group (spec §14.3), from what the
        members published: a member with nothing queued first, the one picked least recently among several,
        else the one with the fewest queued, ties to the one picked least recently. The mask goes into the
        descriptor's assign (0x38) before head is stored, and into _pos_need; the END_OF_STREAM marker is for
        everyone and assigned to nobody. Vectorised: the whole run is assigned at once (_round_robin)."""
        q0, end = self.c64[Q_HEAD], self._pos
        k = (end - q0) & M64
        if not k:
            return
        groups: Dict[int, List[Member]] = {}
        for m in sorted(self.conns.values(), key=lambda m: m.index):
            if m.group:
                groups.setdefault(m.group, []).append(m)
        if k == 1:  # the single-heap publish: the same picks, without numpy's cost per call
            self._assign_one_locked(q0, groups)
        else:
            self._assign_run_locked(q0, k, groups)

    def _assign_run_locked(self, q0, k, groups):
        """_assign_locked for the k positions from q0, vectorised (_round_robin)."""
        idx = (np.arange(k, dtype=np.int64) + (q0 & self.mask)) & self.mask
        flags = self.desc["flags"][idx]
        live = np.flatnonzero((flags & L.FLAG_END_OF_STREAM) == 0)
        masks = np.zeros(k, np.uint64)
        n_live = len(live)
        if n_live:
            for g in groups.values():
                choice, counts, lastidx = _round_robin([m.queued for m in g], [m.last_pick for m in g], n_live)
                picks = self._picks
                for i, m in enumerate(g):
                    c = counts[i]
                    if not c:
                        continue
                    if not m.queued:
                        m.oq = (q0 + int(live[int(np.argmax(choice == i))])) & M64
                    m.queued += c
                    m.assigned += c
                    m.last_pick = picks + lastidx[i] + 1
                    m.commit_end = (q0 + int(live[lastidx[i]]) + 1) & M64
                    self.row_set(m.index, assigned=m.assigned, queued=m.queued)
                self._picks = picks + n_live
                masks[live] |= np.array([1 << m.index for m in g], np.uint64)[choice]
        self.desc["assign"][idx] = masks
        self._pos_need[idx] = masks

    def _assign_one_locked(self, q, groups):
        """_assign_locked for one position q: in every group the member _round_robin picks first, the one
        with the fewest queued, ties to the one picked least recently, then to the lowest row."""
        i = q & self.mask
        mask = 0
        if not self.desc["flags"][i] & L.FLAG_END_OF_STREAM:
            for g in groups.values():
                m = min(g, key=lambda m: (m.queued, m.last_pick, m.index))
                if not m.queued:
                    m.oq = q
                m.queued += 1
                m.assigned += 1
                self._picks += 1
                m.last_pick = self._picks
                m.commit_end = (q + 1) & M64
                self.row_set(m.index, assigned=m.assigned, queued=m.queued)
                mask |= 1 << m.index
        self.desc["assign"][i] = mask
        self._pos_need[i] = mask

    def _publish_staged(self):
        """Make the positions staged since head visible: with group members attached, fresh cursors, the
        assignment and the head store under the lock (a member that leaves meanwhile has its bits cleared
        before its row can go to a new consumer, who starts at this head: spec §14.7); else just _commit."""
        if self._group_members:
            with self.lock:
                self._reclaim_locked()
                self._assign_locked()
                self._commit()
        else:
            self._commit()

    def _slowest_locked(self):
        """The attached consumer furthest behind head by its released position."""
        head = self.c64[Q_HEAD]
        slow = None
        for m in self.conns.values():
            if slow is None or (head - m.released) & M64 > (head - slow.released) & M64:
                slow = m
        return slow

    def _holders_locked(self):
        """The attached consumers holding the ring back at the next position q (spec §14.6), lowest row first:
        each for which a bound of §14.5 fails at q (an independent or 2.1 member with q - tail >= slot_count,
        a 2.2 member with q - oldest queued >= slot_count), and each that still needs the oldest position
        holding a slot (an independent with tail <= it, the member whose bit it carries with tail <= it)."""
        sc, head, ref = self.slot_count, self.c64[Q_HEAD], self._pos
        q = (self._pos + len(self._taken)) & M64
        o = self._reclaim
        held = o != self._pos
        need = int(self._pos_need[o & self.mask]) if held else 0
        out = []
        for m in sorted(self.conns.values(), key=lambda m: m.index):
            x = self._oldest_queued_locked(m, head) if m.v22 else m.released
            if x is not None and (q - x) & M64 >= sc:
                out.append(m)
                continue
            if held and not (0 < (m.released - o) & M64 <= (ref - o) & M64):  # tail <= o
                if not m.group or need >> m.index & 1:
                    out.append(m)
        return out

    def _blocker_locked(self):
        """The consumer a waiting producer waits for (spec §14.6): the first (lowest row) of those holding the
        ring back, else (waiting to drain) the slowest."""
        h = self._holders_locked()
        return h[0] if h else self._slowest_locked()

    def _overrun_locked(self):
        """drop, no slot to take (spec §14.6): when some attached consumer does not hold the ring back,
        detach every one that does as overrun, reclaim and try again; True if a slot may be taken now,
        False when every attached consumer holds it back (the new heap is dropped)."""
        while True:
            holders = self._holders_locked()
            if not holders or len(holders) == len(self.conns):
                return False
            head = self.c64[Q_HEAD]
            for m in holders:
                self._detach_locked(m, L.CONSUMER_OVERRUN, (head - m.released) & M64)
            self._reclaim_locked()
            if self._room() > 0:
                return True

    def _refill(self, want, timeout):
        """Make at least one slot free (up to want): reclaim; then drop: overrun or RingFull; block: wait."""
        with self.lock:
            self._reclaim_locked(want)
            if self._room() > 0:
                return
            if self.policy == L.POLICY_DROP:
                if self._overrun_locked():
                    return
                raise RingFull(f"ring {self.name}: no free slot")

        def done():
            self._reclaim_locked(want)
            return self._room() > 0
        self._wait_for(done, timeout)

    def _wait_for(self, done, timeout):
        """Sleep until done() (called with the lock held) is true: on the release_futex of the first consumer
        holding the ring back (spec §7.4, §14.6; ctl blocked_on and blocked_since_ns name it meanwhile, and
        the log within a second), or for an attach when none is attached, in <= 250 ms slices. Timeout when
        timeout (seconds) passes; Interrupted after interrupt()."""
        try:
            self._wait_loop(done, timeout)
        finally:
            if self._blocked is not None:
                self._blocked = None
                self.c32[I_BLOCKED_ON] = 0
                self.c64[Q_BLOCKED_SINCE_NS] = 0

    def _note_blocked(self, m):
        """A block producer is about to wait for consumer m (spec §14.6): ctl blocked_on (row + 1) and
        blocked_since_ns name it; once the wait has lasted BLOCKED_LOG_SECONDS, one log line says whom."""
        b = self._blocked
        now = time.monotonic()
        if b is None or b[0] is not m:
            self._blocked = b = [m, now, False]
            self.c64[Q_BLOCKED_SINCE_NS] = time.time_ns()
            self.c32[I_BLOCKED_ON] = m.index + 1
        if not b[2] and now - b[1] >= BLOCKED_LOG_SECONDS:
            b[2] = True
            g = ""
            if m.group:
                gr = self.grants.get(m.group) if self.grants else None
                g = f", group {gr.name if gr else f'{m.group:#010x}'}"
            log.warning("ring %s: waiting for consumer row %d (pid %d%s) to release position %d (head %d) for "
                        "%.1f s", self.name, m.index, m.pid, g, m.released, self.c64[Q_HEAD], now - b[1])

    def _wait_loop(self, done, timeout):
        deadline = None if timeout is None else time.monotonic() + timeout
        spin_until = time.monotonic() + SPIN_SECONDS
        c32 = self.c32
        while True:
            if self._interrupted:
                if not self._closed:
                    self._interrupted = False
                raise Interrupted(f"ring {self.name}: interrupted")
            with self.lock:
                ok = done()
                slow = self._blocker_locked()
                f = None if slow is None else slow.r32[I_RELEASE_FUTEX]  # attached: mapped
            if ok:
                return
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise Timeout(f"ring {self.name}: nothing released within {timeout} s")
            if now < spin_until:
                continue
            slice_ = _TEST_WAIT_SLICE if deadline is None else max(0.001, min(_TEST_WAIT_SLICE, deadline - now))
            if slow is None:
                if self._blocked is not None:  # waiting for nobody: blocked_on 0 (spec §2), not a departed row
                    self._blocked = None
                    self.c32[I_BLOCKED_ON] = 0
                    self.c64[Q_BLOCKED_SINCE_NS] = 0
                self._attached.clear()
                with self.lock:
                    none = not self.conns
                if none and not self._interrupted:
                    self._attached.wait(slice_)
                continue
            self._note_blocked(slow)
            c32[I_PRODUCER_WAITING] = 1
            full_fence()
            with self.lock:
                ok = done()
            if not ok and not slow.detached:
                self._wait_addr = slow.rf_addr
                if not self._interrupted:
                    futex_wait(slow.rf_addr, f, slice_)
                self._wait_addr = 0
            c32[I_PRODUCER_WAITING] = 0
            if ok:
                return

    def interrupt(self) -> None:
        """Make a blocked acquire / publish_batch / wait_drained / end_of_stream raise Interrupted (the
        next one, if none is waiting). Safe from any thread."""
        self._interrupted = True
        self._attached.set()
        a = self._wait_addr
        if a and "no-wake" not in _TEST_MUTANTS:
            futex_wake(a)

    # ..................................................................... the hot path
    def acquire(self, timeout: float | None = None) -> Slot:
        """A free payload slot (a Slot). drop: RingFull when none is free (count the heap with
        ``add("dropped_heaps", 1)``); block: waits for the slowest consumer (timeout seconds, None:
        forever; Timeout after it), Interrupted after interrupt()."""
        self._check_open()
        self._check_not_ended("acquire a slot")
        if self._free_w == self._free_r or self._room() <= 0:
            self._refill(1, timeout)
        s = int(self._free[self._free_r % self.slot_count])
        self._free_r += 1
        self._taken.add(s)
        return Slot(self, s)

    def discard(self, slot: Slot) -> None:
        """Give an acquired slot back unpublished."""
        if not slot._live:
            raise RingError(f"slot {slot.index} was already published or discarded")
        slot._live = False
        self._taken.discard(slot.index)
        self._free[self._free_w % self.slot_count] = slot.index
        self._free_w += 1

    def publish(self, slot: Slot, heap_cnt: int, heap_size: int | None = None, received: int | None = None,
                timestamp_ns: int | None = None, flags: int = COMPLETE, packets: int = 1) -> int:
        """Publish the heap in ``slot`` (spec §7.3): its item table is already written by add_item; the
        descriptor, then a release store of head, then a wake for each consumer that announced it sleeps.

        received: payload bytes stored in the slot (<= slot_size); heap_size: the heap's length. Either
        defaults to the other; with neither, the end of the furthest address item (0 if none). Returns the
        heap's position. After end_of_stream: StreamEnded, and the slot goes back to the pool."""
        if not slot._live or slot._p is not self:
            raise RingError(f"slot {slot.index} was already published or discarded")
        if self._ended:
            self.discard(slot)
            self._check_not_ended(f"publish heap {heap_cnt}")
        if received is None:
            received = slot.end if heap_size is None else min(heap_size, self.slot_size)
        if heap_size is None:
            heap_size = received
        if not 0 <= received <= self.slot_size:
            raise ValueError(f"received {received} not in 0..slot_size {self.slot_size}")
        if slot.overflow:
            flags |= L.FLAG_ITEMS_OVERFLOW
        slot._live = False
        self._taken.discard(slot.index)
        pos = self._pos
        L.DESC_STRUCT.pack_into(self.data, self._desc_off + (pos & self.mask) * 64, (pos + 1) & M64,
                                heap_cnt & M64, heap_size & M64, received,
                                time.time_ns() if timestamp_ns is None else timestamp_ns, slot.index, flags,
                                slot.item_count, packets, 0)
        self._pos_slot[pos & self.mask] = slot.index
        self._pos = (pos + 1) & M64
        st = self._stats
        if not flags & L.FLAG_END_OF_STREAM:
            st[C_HEAPS] += 1
            st[C_BYTES] += received
            st[C_PACKETS] += packets
        self._publish_staged()
        return pos

    def _commit(self, force=False):
        """Release-store head, full fence, then wake every consumer that announced it sleeps and whose
        wake_at head has reached — a 2.2 group member only when a position assigned to it in this commit
        has (spec §14.4) — or every sleeping one with force (spec §7.5; see the module docstring for the
        plain-store exchange)."""
        pos = self._pos
        if ORDERED:
            release_fence()  # descriptors and item tables before head: a release store (spec §7.3)
        self.c64[Q_HEAD] = pos
        full_fence()
        for m in self._snap:
            try:
                r32 = m.r32
                if m.v22:  # a 2.2 member only for a position assigned to it at or after its wake_at (§14.4)
                    end, m.commit_end = m.commit_end, None
                    if not r32[I_CONSUMER_WAITING] or not (force or end is not None and
                                                           (end - m.r64[Q_WAKE_AT]) & M64 < 1 << 63):
                        continue
                elif not (r32[I_CONSUMER_WAITING] and (force or (pos - m.r64[Q_WAKE_AT]) & M64 < 1 << 63)):
                    continue
                r32[I_CONSUMER_WAITING] = 0
                full_fence()
                r32[I_CONSUMER_FUTEX] = (r32[I_CONSUMER_FUTEX] + 1) & 0xFFFFFFFF
            except ValueError:  # detached since this snapshot was taken: its region is unmapped (Member.unmap)
                continue
            futex_wake(m.cf_addr)
            if not m.detached:  # (a detached member's row may belong to someone else by now)
                o = row_word(m.index, "wakes")
                self.c64[o] = (self.c64[o] + 1) & M64

    def _items_block(self, items, n):
        """Normalise publish_batch's items: (template (k,) ITEM_DTYPE, per-heap (n, k) array or None,
        [(column, field, array)] overrides, overflow)."""
        if items is None:
            return None, None, [], False
        if isinstance(items, np.ndarray) and items.dtype.names:
            arr = np.asarray(items)
            k = arr.shape[-1]
            over = k > self.max_items
            if arr.ndim == 1:
                t = np.zeros(min(k, self.max_items), L.ITEM_DTYPE)
                for f in ("id", "value", "length", "flags"):
                    t[f] = arr[f][:self.max_items]
                return t, None, [], over
            if arr.shape[0] != n:
                raise ValueError(f"items has {arr.shape[0]} rows for {n} heaps")
            full = np.zeros((n, min(k, self.max_items)), L.ITEM_DTYPE)
            for f in ("id", "value", "length", "flags"):
                full[f] = arr[f][:, :self.max_items]
            return None, full, [], over
        items = list(items)
        over = len(items) > self.max_items
        items = items[:self.max_items]
        t = np.zeros(len(items), L.ITEM_DTYPE)
        cols = []
        for c, it in enumerate(items):
            it = tuple(it) + (0,) * (4 - len(it))
            for f, v in zip(("id", "value", "length", "flags"), it[:4]):
                if np.ndim(v) == 0:
                    t[f][c] = int(v) & M64
                else:
                    a = np.asarray(v, dtype=np.uint64 if f != "flags" else np.uint32).ravel()
                    if len(a) != n:
                        raise ValueError(f"item {c} field {f}: {len(a)} values for {n} heaps")
                    cols.append((c, f, a))
        return t, None, cols, over

    def publish_batch(self, payloads: Any, heap_cnts: Any, heap_sizes: Any = None, items: Any = None,
                      flags: Any = COMPLETE, timestamp_ns: Any = None, packets: Any = 1,
                      timeout: float | None = None) -> int:
        """Publish many (small) heaps at once: takes free slots, copies the payloads with numpy, writes all
        descriptors and item tables vectorised and stores head once per run of free slots (one wake check
        per consumer per head store).

        payloads: an (n, w) uint8 array (w <= slot_size; received = w for every heap, unless heap_sizes
        says less), a list of n bytes-like objects, or None (the slots' payload is left as it is; give
        heap_sizes). heap_cnts: n counters. heap_sizes: n sizes or one (default: the payload lengths).
        items: None; a list of (id, value, length, flags) whose fields are scalars or arrays of n values
        (e.g. ``[(0x1000, 0, 64, 0), (0x1001, cnts, 5, ibvbridge.producer.IMMEDIATE)]``); or an ITEM_DTYPE
        structured array of shape (k,) (the same items for every heap) or (n, k).

        Returns how many heaps were published: all n under block (waits like acquire; Timeout /
        Interrupted); under drop as many as there were free slots, in order — the rest are dropped (count
        them with ``add("dropped_heaps", n - published)``). After end_of_stream: StreamEnded."""
        self._check_open()
        self._check_not_ended("publish heaps")
        cnts = np.asarray(heap_cnts, dtype=np.uint64).ravel()
        n = len(cnts)
        if n == 0:
            return 0
        ss = self.slot_size
        lst = None
        recv: Optional[np.ndarray]
        hs: Optional[np.ndarray]
        if payloads is None:
            arr, width = None, 0
            if heap_sizes is None:
                raise ValueError("payloads=None needs heap_sizes")
        elif isinstance(payloads, np.ndarray):
            arr = payloads
            if arr.ndim == 1:
                arr = arr.reshape(1, -1) if n == 1 else arr.reshape(n, -1)
            if arr.dtype != np.uint8:
                arr = arr.view(np.uint8).reshape(n, -1)
            if arr.shape[0] != n:
                raise ValueError(f"{arr.shape[0]} payloads for {n} heap_cnts")
            width = arr.shape[1]
            if width > ss:
                raise ValueError(f"payloads of {width} bytes > slot_size {ss}")
        else:
            lst = [memoryview(b).cast("B") for b in payloads]
            if len(lst) != n:
                raise ValueError(f"{len(lst)} payloads for {n} heap_cnts")
            arr, width = None, 0
        if lst is not None:
            recv = np.fromiter((len(b) for b in lst), dtype=np.uint64, count=n)
            if n and int(recv.max()) > ss:
                raise ValueError(f"a payload is larger than slot_size {ss}")
        else:
            recv = None
        if heap_sizes is not None:
            hs = np.broadcast_to(np.asarray(heap_sizes, dtype=np.uint64), (n,))
            if recv is None:
                recv = np.minimum(hs, np.uint64(width if arr is not None else ss))
        else:
            hs = recv if recv is not None else None
        if recv is None:
            recv_scalar = width
        template, full, cols, over = self._items_block(items, n)
        # address items must lie inside the slot (a consumer would report the ring corrupt)
        self._check_items(template, full, cols)
        if over:
            flags |= L.FLAG_ITEMS_OVERFLOW
        k_items = 0 if template is None and full is None else (template if full is None else full).shape[-1]
        ts = time.time_ns() if timestamp_ns is None else timestamp_ns
        done_n = 0
        while done_n < n:
            want = n - done_n
            if self._room() < want:
                try:
                    self._refill(want, timeout)
                except RingFull:
                    if self._room() <= 0:
                        break
            k = min(self._room(), want)
            slots = self._take_slots(k)
            sl = slice(done_n, done_n + k)
            si = slots.astype(np.intp)
            consecutive = k == 1 or (int(slots[-1]) - int(slots[0]) == k - 1 and
                                     bool((np.diff(slots.astype(np.int64)) == 1).all()))
            s0 = int(slots[0])
            if arr is not None and width:
                if consecutive:
                    self._payload2d[s0:s0 + k, :width] = arr[sl]
                else:
                    self._payload2d[si, :width] = arr[sl]
            elif lst is not None:
                p2 = self._payload2d
                for j in range(k):
                    b = lst[done_n + j]
                    p2[int(slots[j]), :len(b)] = np.frombuffer(b, np.uint8)
            if k_items:
                if full is not None:
                    blk = full[sl]
                else:
                    blk = np.empty((k, k_items), L.ITEM_DTYPE)
                    blk[:] = template
                    for c, f, a in cols:
                        blk[f][:, c] = a[sl]
                if consecutive:
                    self.items[s0:s0 + k, :k_items] = blk
                else:
                    self.items[si, :k_items] = blk
            pos = self._pos
            d = np.zeros(k, L.DESC_DTYPE)
            d["seq"] = np.arange(1, k + 1, dtype=np.uint64) + np.uint64(pos)
            d["heap_cnt"] = cnts[sl]
            r: Union[np.ndarray, int] = recv[sl] if recv is not None else recv_scalar
            d["received"] = r
            d["heap_size"] = hs[sl] if hs is not None else r
            d["timestamp_ns"] = ts if np.ndim(ts) == 0 else np.asarray(ts, np.uint64)[sl]
            d["slot"] = slots
            d["flags"] = flags
            d["item_count"] = k_items
            d["packets"] = packets
            i0 = pos & self.mask
            if i0 + k <= self.slot_count:
                self.desc[i0:i0 + k] = d
                self._pos_slot[i0:i0 + k] = slots
            else:
                idx = (np.arange(k, dtype=np.int64) + i0) & self.mask
                self.desc[idx] = d
                self._pos_slot[idx] = slots
            self._pos = (pos + k) & M64
            st = self._stats
            st[C_HEAPS] += k
            st[C_BYTES] += int(np.sum(r)) if recv is not None else k * recv_scalar
            st[C_PACKETS] += k * packets
            self._publish_staged()
            done_n += k
        return done_n

    def _check_items(self, template, full, cols):
        ss = np.uint64(self.slot_size)
        for blk in (template, full):
            if blk is None or blk.size == 0:
                continue
            addr = (blk["flags"] & L.ITEM_IMMEDIATE) == 0
            v, ln = blk["value"], blk["length"]
            if (addr & ((v > ss) | (ln > ss - np.minimum(v, ss)))).any():
                raise ValueError(f"an address item runs past slot_size {self.slot_size}")
        if cols and template is not None:
            for c in sorted({c for c, _, _ in cols}):
                got = {f: a for cc, f, a in cols if cc == c}
                v = got.get("value", template["value"][c])
                ln = got.get("length", template["length"][c])
                fl = got.get("flags", template["flags"][c])
                v, ln, fl = np.broadcast_arrays(np.asarray(v, np.uint64), np.asarray(ln, np.uint64),
                                                np.asarray(fl, np.uint32))
                addr = (fl & L.ITEM_IMMEDIATE) == 0
                if (addr & ((v > ss) | (ln > ss - np.minimum(v, ss)))).any():
                    raise ValueError(f"address item {c} runs past slot_size {self.slot_size}")

    def _take_slots(self, k):
        sc = self.slot_count
        r = self._free_r % sc
        if r + k <= sc:
            s = self._free[r:r + k].copy()
        else:
            s = np.concatenate((self._free[r:], self._free[:k - (sc - r)]))
        self._free_r += k
        return s

    def end_of_stream(self, stop_heap_cnt: int = 0, timeout: float | None = None) -> int:
        """Publish the END_OF_STREAM marker (spec §4.1). It takes a slot like a heap: with none free it
        waits up to timeout seconds (None: drop does not wait, block waits forever) for the consumers, then
        raises RingFull (close() still marks the ring CLOSED, which consumers also read as the end). A
        second call raises StreamEnded: the marker is final."""
        self._check_open()
        self._check_not_ended("publish a second end-of-stream marker")
        if self._room() <= 0:
            try:
                self._refill(1, timeout if self.policy == L.POLICY_BLOCK else 0)
            except Timeout:
                raise RingFull(f"ring {self.name}: no free slot for the end-of-stream marker") from None
            except RingFull:
                if not timeout:
                    raise

                def done():
                    self._reclaim_locked()
                    return self._room() > 0
                try:
                    self._wait_for(done, timeout)
                except Timeout:
                    raise RingFull(f"ring {self.name}: no free slot for the end-of-stream marker") from None
        s = int(self._free[self._free_r % self.slot_count])
        self._free_r += 1
        slot = Slot(self, s)
        self._stats[C_EOS] = 1  # before the marker: a consumer that sees it reads the counter set
        pos = self.publish(slot, stop_heap_cnt, 0, 0, time.time_ns(), L.FLAG_END_OF_STREAM, 0)
        self._ended = True
        self._commit(force=True)  # the end of the stream wakes consumers whose wakes are coalesced too
        return pos

    def wait_drained(self, timeout: float | None = None) -> None:
        """Wait until every attached consumer has released everything published (so closing loses
        nothing). NoConsumer when no consumer is attached when it is called (nobody would ever drain the
        ring); consumers that detach meanwhile stop counting, and it returns when the last one has gone.
        Timeout; Interrupted."""
        with self.lock:
            self._reclaim_locked()
            if not self.conns:
                raise NoConsumer(f"ring {self.name}: no consumer attached")

        def done():
            self._reclaim_locked()
            return not self.conns or self._reclaim == self._pos
        self._wait_for(done, timeout)

    def wait_consumers(self, n: int, timeout: float | None = None) -> None:
        """Wait until at least n consumers are attached; Timeout otherwise."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self._snap) < n:
            if self._interrupted:
                self._interrupted = self._closed
                raise Interrupted(f"ring {self.name}: interrupted")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise Timeout(f"ring {self.name}: {len(self._snap)} consumers attached, want {n}")
            self._attached.clear()
            if len(self._snap) < n:
                self._attached.wait(0.05 if left is None else min(0.05, left))

    def set_descriptors(self, records: Iterable[Any]) -> None:
        """Rewrite the stream-metadata area (spec §6, a seqlock) with item descriptors: ItemDescriptor-like
        objects (id, name, description, format bytes, dtype: a numpy dtype, a dtype string or the numpy
        header text, shape: a tuple with -1 for a variable dimension, or None) or ready-made records
        (bytes). Call it before publishing the heap that carries them."""
        body = b"".join(_record_of(d) for d in records)
        if len(body) > self.meta_size - L.META_HEADER_SIZE:
            raise ValueError(f"descriptors take {len(body)} bytes; meta_size - 16 is "
                             f"{self.meta_size - L.META_HEADER_SIZE}")
        data = self.data
        assert data is not None  # mapped in __init__, never dropped
        mv = memoryview(data)
        words = mv.cast("Q")  # the sequence as one aligned 8-byte store (spec §11: a byte copy can tear)
        o = self.meta_off
        try:
            seq = words[o >> 3]
            if seq & 1:
                seq += 1
            words[o >> 3] = seq + 1
            full_fence()
            mv[o + 16:o + 16 + len(body)] = body
            mv[o + 8:o + 16] = len(body).to_bytes(8, "little")
            full_fence()
            words[o >> 3] = seq + 2
        finally:
            words.release()
            mv.release()

    def _check_open(self):
        if self._closed:
            raise RingError(f"ring {self.name} is closed")

    def _check_not_ended(self, what: str) -> None:
        if self._ended:
            raise StreamEnded(f"ring {self.name}: cannot {what}: the stream has ended (END_OF_STREAM is final)")

    # ..................................................................... stopping (spec §7.6)
    def close(self) -> None:
        """Clean stop: interrupt a waiting hot path, state CLOSED, wake every consumer, close every
        connection, remove the socket and the lock file, unmap. Consumers keep their mappings, drain what
        was published, then see the end of stream. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._interrupted = True
        self.interrupt()
        self._stop_serving()
        if self.ctl is not None:
            with self.lock:
                if ORDERED:
                    release_fence()  # state is a release store: everything published comes before it
                self.c32[I_STATE] = L.STATE_CLOSED
                full_fence()
                for m in self.conns.values():
                    r32 = m.r32
                    r32[I_CONSUMER_WAITING] = 0
                    r32[I_CONSUMER_FUTEX] = (r32[I_CONSUMER_FUTEX] + 1) & 0xFFFFFFFF
                    futex_wake(m.cf_addr)
        self._release(unlink=True)

    def _stop_serving(self):
        if self._stop_w is not None:
            try:
                os.write(self._stop_w, b"x")
            except OSError:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    def _release(self, unlink):
        self._closed = True
        lock = getattr(self, "lock", None)
        if lock is not None:
            with lock:
                for m in list(self.conns.values()) + list(getattr(self, "_graveyard", [])):
                    try:
                        m.sock.close()
                    except OSError:
                        pass
                self._graveyard = []
        if self._listener is not None:
            self._listener.close()
        if self._dirfd is not None and unlink:
            for f in ((self.name + L.SOCKET_SUFFIX) if self._listener is not None else None,
                      (self.name + L.LOCK_SUFFIX) if self._lockfd is not None else None):
                if f:
                    try:
                        os.unlink(f, dir_fd=self._dirfd)
                    except OSError:
                        pass
        for attr in ("_lockfd", "_dirfd", "_stop_r", "_stop_w", "ctl_fd", "data_fd", "_spare_fd"):
            fd = getattr(self, attr, None)
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
                setattr(self, attr, None)
        if self._unmap_on_close:
            self._unmap()

    def _unmap(self):
        for a in ("desc", "items", "_payload2d"):
            if hasattr(self, a):
                setattr(self, a, None)
        for a in ("_stats", "c64", "c32"):
            mv = getattr(self, a, None)
            if mv is not None:
                try:
                    mv.release()
                except (BufferError, ValueError):
                    pass
        for a in ("data", "ctl"):
            mm = getattr(self, a, None)
            if mm is not None:
                try:
                    mm.close()
                except BufferError:
                    pass  # views the caller still holds: unmapped when the last one goes

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._closed:
            return f"Producer({self.name!r}, closed)"
        return (f"Producer({self.name!r}, socket={self.socket_path!r}, slots={self.slot_count}x"
                f"{self.slot_size}, head={self._pos}, consumers={self.consumers})")
