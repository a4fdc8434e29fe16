"""Linux primitives the ring needs that the standard library lacks: futex and memory fences.

Memory ordering (spec §11). On x86-64 (TSO) a plain aligned load is an acquire load and a plain aligned
store a release store, so ORDERED is False and the ring code issues no fence but the full ones, which take
an uncontended lock (a locked instruction). Elsewhere (aarch64) plain loads and stores are unordered:
ORDERED is True and the ring code calls acquire_fence() after each load that publishes something (head,
tail, state, a row's state, the metadata sequence) and release_fence() before each store that does, and
full_fence() where the spec asks for one. Those are C11 fences from libibvbridge (clients/c, loaded with
ctypes): Python has none of its own. IBVBRIDGE_PY_FENCES=lib uses them on x86-64 too (the tests do).
"""

import ctypes
import ctypes.util
import os
import platform
import threading
from typing import Any, Callable

from . import layout

MACHINE = platform.machine()
# futex(2)'s syscall number: x86-64's, and the generic table's (aarch64, riscv64).
_SYS_FUTEX = {"x86_64": 202, "AMD64": 202, "aarch64": 98, "arm64": 98, "riscv64": 98}.get(MACHINE)
ORDERED = MACHINE not in ("x86_64", "AMD64") or os.environ.get("IBVBRIDGE_PY_FENCES") == "lib"
FENCES = "x86-64 TSO"  # what orders the ring's loads and stores here (for messages and tests)
_fence_lib = None
_fence_error = None
if ORDERED:
    _path = os.environ.get("IBVBRIDGE_LIB") or ctypes.util.find_library("ibvbridge")
    try:
        if not _path:
            raise OSError("libibvbridge not found")
        _fence_lib = ctypes.CDLL(_path)
        for _f in ("ibvb_acquire_fence", "ibvb_release_fence", "ibvb_full_fence"):
            getattr(_fence_lib, _f).argtypes, getattr(_fence_lib, _f).restype = (), None
        FENCES = f"libibvbridge fences ({_path})"
    except (OSError, AttributeError) as e:
        _fence_error = f"{e}"

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = (ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p,
                     ctypes.c_void_p, ctypes.c_uint)


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


def futex_wait(addr, expected, timeout):
    """FUTEX_WAIT (shared) on the u32 at addr while it equals expected, at most timeout seconds.

    Returns 0 on a wake, else the errno (EAGAIN, EINTR, ETIMEDOUT): callers treat every return alike and
    re-check. ctypes drops the GIL for the call and returns to the interpreter afterwards, so a pending
    KeyboardInterrupt is raised right after an EINTR.
    """
    ns = max(0, int(timeout * 1e9))
    ts = _Timespec(ns // 1_000_000_000, ns % 1_000_000_000)
    r = _syscall(_SYS_FUTEX, addr, layout.FUTEX_WAIT, expected & 0xFFFFFFFF, ctypes.byref(ts), None, 0)
    return 0 if r == 0 else ctypes.get_errno()


class FutexWaiter:
    """FUTEX_WAIT on one u32 (a consumer's own futex word) with its timespec made once: a Ring's wait
    loop calls it once per wake, and a fresh ctypes structure per call costs a quarter of the call. Not
    thread-safe (its timespec is shared by its calls): one per Ring, used from the Ring's thread."""

    __slots__ = ("_addr", "_ts", "_pts")

    def __init__(self, addr):
        self._addr = addr
        self._ts = _Timespec(0, 0)
        self._pts = ctypes.byref(self._ts)

    def __call__(self, expected, timeout):
        """As futex_wait(addr, expected, timeout): 0 on a wake, else the errno (ETIMEDOUT: the time ran
        out)."""
        ns = max(0, int(timeout * 1e9))
        ts = self._ts
        ts.tv_sec, ts.tv_nsec = divmod(ns, 1_000_000_000)
        if _syscall(_SYS_FUTEX, self._addr, layout.FUTEX_WAIT, expected & 0xFFFFFFFF, self._pts, None, 0) == 0:
            return 0
        return ctypes.get_errno()


def futex_wake(addr, n=0x7FFFFFFF):
    """FUTEX_WAKE (shared) up to n waiters on the u32 at addr."""
    return _syscall(_SYS_FUTEX, addr, layout.FUTEX_WAKE, n, None, None, 0)


_fence_lock = threading.Lock()


def _lock_fence():
    """A full (sequentially consistent) fence on x86-64: an uncontended lock's acquire and release are
    locked read-modify-write instructions (spec §11)."""
    with _fence_lock:
        pass


def _no_fence():
    pass


full_fence: Callable[[], Any]
acquire_fence: Callable[[], Any]
release_fence: Callable[[], Any]
if _fence_lib is not None:
    full_fence = _fence_lib.ibvb_full_fence
    acquire_fence = _fence_lib.ibvb_acquire_fence
    release_fence = _fence_lib.ibvb_release_fence
else:  # x86-64: loads are acquire loads and stores release stores already; callers test ORDERED first
    full_fence, acquire_fence, release_fence = _lock_fence, _no_fence, _no_fence


# ---------------------------------------------------------------- sockets, seals, mappings (spec §1)
import fcntl as _fcntl  # noqa: E402
import mmap as _mmap  # noqa: E402
import socket as _socket  # noqa: E402
import struct as _struct  # noqa: E402
import sys as _sys  # noqa: E402

F_ADD_SEALS = getattr(_fcntl, "F_ADD_SEALS", 1033)
F_GET_SEALS = getattr(_fcntl, "F_GET_SEALS", 1034)
_UCRED = _struct.Struct("iII")  # struct ucred: pid_t pid; uid_t uid; gid_t gid


def peer_cred(sock):
    """(pid, uid, gid) of a connected Unix socket's peer, from SO_PEERCRED (the kernel's word, not the
    peer's)."""
    return _UCRED.unpack(sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _UCRED.size))


def get_seals(fd):
    """The seals of a memfd (F_GET_SEALS); 0 for a file that cannot be sealed."""
    try:
        return _fcntl.fcntl(fd, F_GET_SEALS)
    except OSError:
        return 0


def add_seals(fd, seals):
    _fcntl.fcntl(fd, F_ADD_SEALS, seals)


_MMAP_KW = {"trackfd": False} if _sys.version_info >= (3, 13) else {}


def map_fd(fd: int, size: int, writable: bool) -> _mmap.mmap:
    """mmap(MAP_SHARED) size bytes of fd, PROT_READ (| PROT_WRITE when writable). Python < 3.13 keeps a
    private duplicate of fd inside the mmap object until it is closed; the caller may close fd at once."""
    prot = _mmap.PROT_READ | (_mmap.PROT_WRITE if writable else 0)
    return _mmap.mmap(fd, size, _mmap.MAP_SHARED, prot, **_MMAP_KW)


def require_supported():
    """Refuse, in one line, a machine whose memory ordering the client cannot provide (spec §11): one with
    no known futex syscall number, or off x86-64 without libibvbridge's fences."""
    from .errors import RingError
    if _SYS_FUTEX is None:
        raise RingError(f"the ibvbridge Python client does not know this machine ({MACHINE}): it supports "
                        "x86-64 and aarch64; use the C client here")
    if ORDERED and _fence_lib is None:
        raise RingError(f"the ibvbridge Python client on {MACHINE} needs libibvbridge for its memory fences "
                        f"({_fence_error}): make -C clients/c install, or set IBVBRIDGE_LIB to its path")
