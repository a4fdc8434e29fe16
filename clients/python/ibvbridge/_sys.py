"""Linux primitives the ring needs that the standard library lacks: futex and a full fence."""

import ctypes
import platform
import threading

from . import layout

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
    r = _syscall(layout.SYS_FUTEX, addr, layout.FUTEX_WAIT, expected & 0xFFFFFFFF, ctypes.byref(ts), None, 0)
    return 0 if r == 0 else ctypes.get_errno()


def futex_wake(addr, n=0x7FFFFFFF):
    """FUTEX_WAKE (shared) up to n waiters on the u32 at addr."""
    return _syscall(layout.SYS_FUTEX, addr, layout.FUTEX_WAKE, n, None, None, 0)


_fence_lock = threading.Lock()


def full_fence():
    """A full (sequentially consistent) fence on x86-64: an uncontended lock's acquire and release are
    locked read-modify-write instructions (spec §11)."""
    with _fence_lock:
        pass


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


def map_fd(fd, size, writable):
    """mmap(MAP_SHARED) size bytes of fd, PROT_READ (| PROT_WRITE when writable). Python < 3.13 keeps a
    private duplicate of fd inside the mmap object until it is closed; the caller may close fd at once."""
    prot = _mmap.PROT_READ | (_mmap.PROT_WRITE if writable else 0)
    return _mmap.mmap(fd, size, _mmap.MAP_SHARED, prot, **_MMAP_KW)


def require_x86_64():
    """The client's memory ordering rests on x86-64's TSO (plain stores are release stores, spec §11) and
    its futex call on x86-64's syscall number: refuse anywhere else rather than be subtly wrong."""
    machine = platform.machine()
    if machine not in ("x86_64", "AMD64"):
        from .errors import RingError
        raise RingError(f"the ibvbridge Python client supports x86-64 only (this is {machine}): its memory "
                        "ordering relies on x86-64's; use the C client here")
