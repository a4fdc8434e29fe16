"""What the consumer (ring.py) and the producer (producer.py) of the Python client share, written once: the
word indices through which both read and write the shared words, the counter indices, the ring-name rule,
the default ring directories, the rule that says which directory a client may trust (layout 2.1 §B), and
the symlink-free creation of a producer's directory.

layout.py says where every byte lies (the offsets the golden test compares); this module turns them into
the indices of ``memoryview.cast("Q")`` / ``cast("I")`` views — one aligned load or store per shared word,
which is what spec §11 requires (``struct.unpack_from`` copies bytes and can tear a word) — and says where
a ring lives and whom to believe about it.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import select
import stat as _stat
from typing import Mapping

from . import layout as L

M64 = (1 << 64) - 1  # positions and counters wrap modulo 2^64

# --- word indices: control memory (spec §2), for its cast("Q") / cast("I") views --------------------------
Q_HEAD = L.OFF_HEAD >> 3
Q_HEARTBEAT_NS = L.OFF_HEARTBEAT_NS >> 3
Q_OLDEST = L.OFF_OLDEST >> 3
I_BLOCKED_ON = L.OFF_BLOCKED_ON >> 2
Q_BLOCKED_SINCE_NS = L.OFF_BLOCKED_SINCE_NS >> 3
Q_STATS = L.OFF_STATS >> 3
I_STATE = L.OFF_STATE >> 2
I_PRODUCER_WAITING = L.OFF_PRODUCER_WAITING >> 2
# --- ... and a consumer region (spec §3) ------------------------------------------------------------------
Q_TAIL = L.REG_TAIL >> 3
Q_SPIN_BUDGET_NS = L.REG_SPIN_BUDGET_NS >> 3
I_CONSUMER_WAITING = L.REG_CONSUMER_WAITING >> 2
I_CONSUMER_FUTEX = L.REG_CONSUMER_FUTEX >> 2
Q_WAKE_AT = L.REG_WAKE_AT >> 3
Q_READ = L.REG_READ >> 3
Q_HANDED = L.REG_HANDED >> 3
I_RELEASE_FUTEX = L.REG_RELEASE_FUTEX >> 2


@functools.lru_cache(maxsize=4096)  # (row, field) pairs: 64 rows x 14 fields at most; the producer asks per heap
def row_word(index: int, field: str) -> int:
    """The control memory's word index of consumer-table row ``index``'s ``field`` (spec §2.2): a cast("I")
    index for the 32-bit state and generation (two separate loads, never one 64-bit one), a cast("Q")
    index for the others (group_id and client_minor are 32-bit too)."""
    off = L.OFF_CONSUMER_TABLE + L.ROW_SIZE * index + getattr(L, "ROW_" + field.upper())
    return off >> 2 if field in ROW_U32 else off >> 3


ROW_U32 = ("state", "generation", "group_id", "client_minor")  # the 32-bit fields of a consumer-table row (spec §2.2)


# --- counters (spec §2.3): index by name, and the ones the producer's hot path bumps -----------------------
COUNTER = {name: i for i, name in enumerate(L.COUNTER_NAMES)}
C_PACKETS = COUNTER["packets"]
C_BYTES = COUNTER["bytes"]
C_HEAPS = COUNTER["heaps"]
C_DROPPED = COUNTER["dropped_heaps"]
C_EOS = COUNTER["end_of_stream"]
C_ATTACHED = COUNTER["consumers_attached"]
C_OVERRUNS = COUNTER["consumer_overruns"]
C_ERRORS = COUNTER["consumer_errors"]
C_GROUP_LOST = COUNTER["group_lost"]
C_GROUP_SKIPPED = COUNTER["group_skipped"]

# poll(2) events that mean the other end of a ring socket is gone
POLL_GONE = select.POLLHUP | select.POLLRDHUP | select.POLLERR | select.POLLNVAL

NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,%d}" % (L.NAME_MAX - 1))
XDG_SUBDIR = "ibvbridge"
_PATH_FLAGS = getattr(os, "O_PATH", 0o10000000) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def valid_name(name: str) -> bool:
    """A ring name (spec §1.1): 1-NAME_MAX (64) characters of [A-Za-z0-9_.-] (ASCII), not starting with '.' — the whole
    string (fullmatch: re's $ would also match before a final newline)."""
    return NAME_RE.fullmatch(name) is not None


def check_group_name(name: str) -> bytes:
    """A consumer group's name as the bytes its group_id hashes (spec §14.1, §15: UTF-8, 1 ... 64 bytes, no
    NUL); ValueError naming what is wrong."""
    if not isinstance(name, str):
        raise ValueError(f"consumer group name {name!r} is not text")
    try:
        b = name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"consumer group name {name!r} is not valid Unicode text") from None
    if not 1 <= len(b) <= L.GROUP_NAME_MAX or b"\0" in b:
        raise ValueError(f"consumer group name {name!r}: 1 to {L.GROUP_NAME_MAX} bytes of UTF-8 without NUL")
    return b


# Where a user's default ring directory may lie when XDG_RUNTIME_DIR is not set (spec §1.1): the first of
# PREFIX + UID for each prefix (the contract's) that does not exist or passes the producer's check. A module
# variable so tests can point it at temporary directories they own.
SHARED_PREFIXES = (L.SHM_DIR_PREFIX, L.TMP_DIR_PREFIX)


def own_default_dirs(euid: int | None = None, env: Mapping[str, str] | None = None) -> list[str]:
    """This process's own default ring directories, in order (spec §1.1): /run/ibvbridge for euid 0, else
    $XDG_RUNTIME_DIR/ibvbridge when XDG_RUNTIME_DIR is set and absolute, else /dev/shm/ibvbridge-UID and,
    should a stranger have made that one first, /tmp/ibvbridge-UID."""
    euid = os.geteuid() if euid is None else euid
    env = os.environ if env is None else env
    if euid == 0:
        return [L.RUN_DIR]
    xdg = env.get("XDG_RUNTIME_DIR", "")
    if xdg.startswith("/"):
        return [os.path.join(xdg, XDG_SUBDIR)]
    return [f"{prefix}{euid}" for prefix in SHARED_PREFIXES]


def own_default_dir(euid: int | None = None, env: Mapping[str, str] | None = None) -> str:
    """The first of own_default_dirs(): where a producer makes its ring unless a stranger made it first."""
    return own_default_dirs(euid, env)[0]


def producer_dirs(directory: str | os.PathLike[str] | None = None) -> list[str]:
    """The ring directories a producer tries, in order (spec §1.1): ``directory`` if given, else
    $IBVBRIDGE_RING_DIR if set and non-empty (each alone), else own_default_dirs()."""
    if directory:
        return [os.fspath(directory)]
    env = os.environ.get(L.ENV_DIR)
    return [env] if env else own_default_dirs()


def default_dir(directory: str | os.PathLike[str] | None = None) -> str:
    """The ring directory a producer creates its ring in when nothing is in the way: the first of
    producer_dirs()."""
    return producer_dirs(directory)[0]


def lookup_dirs(directory: str | os.PathLike[str] | None = None) -> list[str]:
    """Where a consumer looks a ring name up, in order (spec §1.1): ``directory`` if given, else
    $IBVBRIDGE_RING_DIR if set and non-empty (only that one); else its own default directories, then
    /run/ibvbridge."""
    if directory:
        return [os.fspath(directory)]
    env = os.environ.get(L.ENV_DIR)
    if env:
        return [env]
    own = own_default_dirs()
    return own if own == [L.RUN_DIR] else own + [L.RUN_DIR]


class Untrusted(Exception):
    """A directory a client must not connect in; the message says why in a few words ("owned by uid
    65534, not 1001 or root")."""


def open_trusted_dir(path: str, euid: int | None = None) -> tuple[int, int]:
    """Open a ring directory for connecting (spec §B) and return (fd, owner uid): an O_PATH descriptor,
    opened without following a symlink as its last component, of a directory that no one but its owner can
    write (not writable by group or others) and that is owned by the caller's euid or root — or whose
    parent is owned by root and not writable by group or others (only root could have made it: systemd's
    /run/ibvbridge owned by the ibvbridge user). FileNotFoundError when it does not exist; Untrusted
    otherwise. The caller closes fd."""
    euid = os.geteuid() if euid is None else euid
    try:
        fd = os.open(path, _PATH_FLAGS)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise
        if e.errno in (errno.ENOTDIR, errno.ELOOP):
            try:
                if _stat.S_ISLNK(os.lstat(path).st_mode):
                    raise Untrusted("a symbolic link") from None
            except OSError:
                pass
            raise Untrusted("not a directory") from None
        raise Untrusted(e.strerror or str(e)) from None
    try:
        st = os.fstat(fd)
        if not _stat.S_ISDIR(st.st_mode):
            raise Untrusted("not a directory")
        if st.st_mode & 0o022:
            raise Untrusted(f"writable by group or others (mode 0{st.st_mode & 0o7777:o})")  # as Go prints it
        if st.st_uid not in (euid, 0) and not _root_made(fd):
            raise Untrusted(f"owned by uid {st.st_uid}, not {euid} or root")
        return fd, st.st_uid
    except BaseException:
        os.close(fd)
        raise


def _root_made(fd: int) -> bool:
    """Whether the directory fd's parent is owned by root and not writable by group or others."""
    try:
        pfd = os.open("..", _PATH_FLAGS, dir_fd=fd)
    except OSError:
        return False
    try:
        st = os.fstat(pfd)
    finally:
        os.close(pfd)
    return st.st_uid == 0 and not st.st_mode & 0o022


def peer_trusted(uid: int, dir_owner: int | None, euid: int | None = None) -> bool:
    """Whether a producer serving a socket as uid may be believed (spec §1.2, §B): root, the caller's euid,
    or the owner of the trusted directory the socket lies in."""
    euid = os.geteuid() if euid is None else euid
    return uid in (0, euid) or (dir_owner is not None and uid == dir_owner)


def make_dir_nofollow(path: str | os.PathLike[str], mode: int = 0o755, euid: int | None = None) -> int:
    """Create (or open) the directory path from '/' one component at a time without following any
    symlink (spec §B): each existing component is opened O_PATH | O_DIRECTORY | O_NOFOLLOW relative to its
    parent and must be owned by euid or root; a missing one is made (mode) and opened likewise. Returns an
    O_RDONLY descriptor of the final directory. Raises Untrusted naming the component and what is wrong,
    OSError for anything else."""
    euid = os.geteuid() if euid is None else euid
    comps = [c for c in os.path.abspath(os.fspath(path)).split("/") if c]
    cur = os.open("/", _PATH_FLAGS)
    done = ""
    try:
        for i, comp in enumerate(comps):
            here = done + "/" + comp
            last = i == len(comps) - 1
            flags = (os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC) if last else _PATH_FLAGS
            try:
                nxt = os.open(comp, flags, dir_fd=cur)
            except FileNotFoundError:
                try:
                    os.mkdir(comp, mode, dir_fd=cur)
                except FileExistsError:
                    pass
                nxt = _open_component(comp, flags, cur, here)
            except OSError as e:
                nxt = _refuse_component(comp, cur, here, e)
            try:
                st = os.fstat(nxt)
                if st.st_uid not in (euid, 0):
                    raise Untrusted(f"{here} is owned by uid {st.st_uid}, not {euid} or root")
            except BaseException:
                os.close(nxt)
                raise
            os.close(cur)
            cur, done = nxt, here
        if not comps:
            fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            os.close(cur)
            return fd
        return cur
    except BaseException:
        try:
            os.close(cur)
        except OSError:
            pass
        raise


def _open_component(comp: str, flags: int, parent: int, here: str) -> int:
    try:
        return os.open(comp, flags, dir_fd=parent)
    except OSError as e:
        return _refuse_component(comp, parent, here, e)


def _refuse_component(comp: str, parent: int, here: str, err: OSError) -> int:
    if err.errno in (errno.ENOTDIR, errno.ELOOP):
        try:
            if _stat.S_ISLNK(os.lstat(comp, dir_fd=parent).st_mode):
                raise Untrusted(f"{here} is a symbolic link") from None
        except OSError:
            pass
        raise Untrusted(f"{here} is not a directory") from None
    raise err
