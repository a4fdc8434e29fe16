"""Linux primitives the ring needs that the standard library lacks: futex and a full fence."""

import ctypes
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
    locked read-modify-write instructions (spec §10)."""
    with _fence_lock:
        pass
