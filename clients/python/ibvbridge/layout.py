"""The ring layout of docs/ring-layout.md, version 2.2, as Python constants.

This module is the one place the Python client knows where anything lies.  Its numbers come from
``_contract.py``, generated from ring/layout.go (``go generate ./ring``), as clients/c/ibvbridge_layout.h is
for C; ``python -m ibvbridge.layout`` prints them as ``NAME VALUE`` lines for the golden test that compares
all three.

The struct formats are derived from the offsets below (``_fields_struct``), never written by hand, so an
offset and the struct that reads it cannot disagree.

numpy is optional here: DESC_DTYPE / ITEM_DTYPE are ``None`` when numpy is not installed.
"""

from __future__ import annotations

import struct
from typing import Any

from . import _contract

_T = _contract.TABLE  # the generated golden table (ring/layout.go): every value below is taken from it

MAGIC = _T["magic_value"]  # b"IBVBRING" little-endian
MAJOR_VERSION = _T["major_value"]
MINOR_VERSION = _T["minor_value"]  # 2.2: group members publish read and handed (§14); any minor of major 2 interoperates

STATS_SLOTS = _T["stats_slots"]
REGION_ALIGN = _T["region_align"]
MAX_SLOT_COUNT = _T["max_slot_count"]
MAX_ITEMS = _T["max_items_limit"]
META_HEADER_SIZE = _T["meta_header_size"]
META_RECORD_HEADER_SIZE = _T["meta_record_header_size"]
NDIM_UNKNOWN = _T["meta_ndim_unknown"]
ROW_SIZE = _T["row_size"]
REGION_SIZE = _T["region_size"]
MAX_CONSUMERS_LIMIT = _T["max_consumers_limit"]
DEFAULT_MAX_CONSUMERS = _T["default_max_consumers"]
HELLO_SIZE = _T["hello_size"]
WELCOME_SIZE = _T["welcome_size"]
ERROR_RECORD_MAX = _T["error_record_max"]
NO_CONSUMER_INDEX = _T["no_consumer_index"]
SOCKET_SUFFIX = _contract.STRINGS["socket_suffix"]
LOCK_SUFFIX = _contract.STRINGS["lock_suffix"]
RUN_DIR = _contract.STRINGS["run_dir"]
ENV_DIR = _contract.STRINGS["env_dir"]
SHM_DIR_PREFIX = _contract.STRINGS["shm_dir_prefix"]
TMP_DIR_PREFIX = _contract.STRINGS["tmp_dir_prefix"]
NAME_MAX = _contract.TABLE["name_max"]  # characters of a ring name (spec §1.1)
GROUP_NAME_MAX = _contract.TABLE["group_name_max"]  # bytes of a consumer group's name (spec §14.1)

# --- control memory: header (§2.1) -----------------------------------------------------------------
OFF_MAGIC = _T["magic"]
OFF_MAJOR = _T["major"]
OFF_MINOR = _T["minor"]
OFF_CTL_SIZE = _T["header.ctl_size"]
OFF_STATE = _T["state"]
OFF_POLICY = _T["policy"]
OFF_SESSION_ID = _T["session_id"]
OFF_PRODUCER_PID = _T["producer_pid"]
OFF_PRODUCER_START_NS = _T["producer_start_ns"]
OFF_SLOT_COUNT = _T["slot_count"]
OFF_SLOT_SIZE = _T["slot_size"]
OFF_MAX_ITEMS = _T["max_items"]
OFF_DESC_SIZE = _T["header.desc_size"]
OFF_ITEM_SIZE = _T["header.item_size"]
OFF_PAGE_SIZE = _T["page_size"]
OFF_DATA_SIZE = _T["data_size"]
OFF_DESC_OFFSET = _T["desc_offset"]
OFF_ITEMS_OFFSET = _T["items_offset"]
OFF_META_OFFSET = _T["meta_offset"]
OFF_META_SIZE = _T["meta_size"]
OFF_PAYLOAD_OFFSET = _T["payload_offset"]
OFF_PACKET_OFFSET = _T["packet_offset"]
OFF_PACKET_SIZE = _T["packet_size"]
OFF_FEATURES = _T["features"]
OFF_STATS_COUNT = _T["header.stats_count"]
OFF_MAX_CONSUMERS = _T["header.max_consumers"]
# chunk geometry (§13): 0 unless features has FEATURE_CHUNKS
OFF_CHUNK_HEAPS = _T["chunk_heaps"]
OFF_CHUNK_AXIS = _T["chunk_axis"]
OFF_CHUNK_HEAP_SIZE = _T["chunk_heap_size"]
OFF_CHUNK_STEP = _T["chunk_step"]
OFF_CHUNK_TIME_ITEM = _T["chunk_time_item"]
OFF_CHUNK_AXIS_ITEM = _T["chunk_axis_item"]
HEADER_SIZE = _T["producer_version"]  # the header block (producer_version follows it); the rest of it is reserved
# --- control memory: producer blocks, stats, consumer table (§2) -----------------------------------
# 2.2: producer_version, the producing program's name and version, NUL-padded UTF-8 (§2)
OFF_PRODUCER_VERSION = _T["producer_version"]
PRODUCER_VERSION_MAX = _T["producer_version_max"]
OFF_HEAD = _T["head"]
OFF_PRODUCER_WAITING = _T["producer_waiting"]
OFF_HEARTBEAT_NS = _T["heartbeat_ns"]
OFF_OLDEST = _T["oldest"]
OFF_BLOCKED_ON = _T["blocked_on"]  # 2.2 (§14.6): u32, row + 1 of the consumer a block producer waits for, 0 none
OFF_BLOCKED_SINCE_NS = _T["blocked_since_ns"]  # 2.2: CLOCK_REALTIME when that wait began
OFF_STATS = _T["stats"]
OFF_CONSUMER_TABLE = _T["consumer_table"]

# --- consumer table row (§2.2), at OFF_CONSUMER_TABLE + ROW_SIZE * index -----------------------------
ROW_STATE = _T["row.state"]
ROW_GENERATION = _T["row.generation"]
ROW_PID = _T["row.pid"]
ROW_UID = _T["row.uid"]
ROW_ATTACH_NS = _T["row.attach_ns"]
ROW_RELEASED = _T["row.released"]
ROW_WAKES = _T["row.wakes"]
ROW_LOST_HEAPS = _T["row.lost_heaps"]
ROW_ASSIGNED = _T["row.assigned"]  # §14: positions assigned to this group member since it attached
ROW_GROUP_ID = _T["row.group_id"]  # §14: u32, its hello's group_id, 0 for an independent consumer
ROW_CLIENT_MINOR = _T["row.client_minor"]  # 2.2: u32, the minor of the consumer's hello
ROW_READ = _T["row.read"]  # 2.2 (§14.2): a member's read position as the producer last accepted it
ROW_QUEUED = _T["row.queued"]  # 2.2: positions assigned to a member, published, not yet read by it
ROW_SKIPPED = _T["row.skipped"]  # 2.2 (§14.7): assigned positions a 2.2 member released without handing them out

# --- consumer region (§3) ----------------------------------------------------------------------------
REG_TAIL = _T["region.tail"]
REG_CONSUMER_WAITING = _T["region.consumer_waiting"]
REG_CONSUMER_FUTEX = _T["region.consumer_futex"]
REG_WAKE_AT = _T["region.wake_at"]
REG_READ = _T["region.read"]  # 2.2 (§14.2), group members: every position below it has been looked at
REG_HANDED = _T["region.handed"]  # 2.2, group members: own heaps handed to the caller since attach
REG_RELEASE_FUTEX = _T["region.release_futex"]
REG_SPIN_BUDGET_NS = _T["region.spin_budget_ns"]

# --- handshake records (§1.2) ------------------------------------------------------------------------
MSG_MAGIC = _T["hello.magic"]
MSG_MAJOR = _T["hello.major"]
MSG_MINOR = _T["hello.minor"]
HELLO_ROLE = _T["hello.role"]
HELLO_START = _T["hello.start"]
HELLO_GROUP_ID = _T["hello.group_id"]  # consumer groups (§14): u32, 0 = no group (reserved before 2.1)
WELCOME_STATUS = _T["welcome.status"]
WELCOME_CONSUMER_INDEX = _T["welcome.consumer_index"]
WELCOME_GENERATION = _T["welcome.generation"]
WELCOME_SESSION_ID = _T["welcome.session_id"]
WELCOME_CTL_SIZE = _T["welcome.ctl_size"]
WELCOME_DATA_SIZE = _T["welcome.data_size"]
WELCOME_REGION_SIZE = _T["welcome.region_size"]
WELCOME_MESSAGE = _T["welcome.message"]  # error records: the NUL-terminated UTF-8 message

ROLE_CONSUMER = _T["role.consumer"]
ROLE_OBSERVER = _T["role.observer"]
START_OLDEST = _T["start.oldest"]
START_HEAD = _T["start.head"]
STATUS_OK = _T["status.ok"]
STATUS_VERSION = _T["status.version"]
STATUS_NOT_PERMITTED = _T["status.not_permitted"]
STATUS_BUSY = _T["status.busy"]
STATUS_CLOSING = _T["status.closing"]
STATUS_PROTOCOL = _T["status.protocol"]

# state
STATE_INIT = _T["state.init"]
STATE_READY = _T["state.ready"]
STATE_CLOSED = _T["state.closed"]
# policy
POLICY_DROP = _T["policy.drop"]
POLICY_BLOCK = _T["policy.block"]
# consumer-table row state
CONSUMER_FREE = _T["consumer_state.free"]
CONSUMER_ATTACHED = _T["consumer_state.attached"]
CONSUMER_OVERRUN = _T["consumer_state.overrun"]
CONSUMER_BAD_CURSOR = _T["consumer_state.bad_cursor"]
CONSUMER_GONE = _T["consumer_state.gone"]
# header features
FEATURE_REPLAY_TIMESTAMPS = _T["feature.replay_timestamps"]
FEATURE_CHUNKS = _T["feature.chunks"]

# --- descriptor (§4.1) ---------------------------------------------------------------------------------
DESC_SIZE = _T["desc_size"]
DESC_SEQ = _T["desc.seq"]
DESC_HEAP_CNT = _T["desc.heap_cnt"]
DESC_HEAP_SIZE = _T["desc.heap_size"]
DESC_RECEIVED = _T["desc.received"]
DESC_TIMESTAMP_NS = _T["desc.timestamp_ns"]
DESC_SLOT = _T["desc.slot"]
DESC_FLAGS = _T["desc.flags"]
DESC_ITEM_COUNT = _T["desc.item_count"]
DESC_PACKETS = _T["desc.packets"]
DESC_ASSIGN = _T["desc.assign"]  # §14: bitmask over consumer rows, one group member's bit per group

FLAG_COMPLETE = _T["flag.complete"]
FLAG_INCOMPLETE = _T["flag.incomplete"]
FLAG_TRUNCATED = _T["flag.truncated"]
FLAG_END_OF_STREAM = _T["flag.end_of_stream"]
FLAG_HAS_DESCRIPTORS = _T["flag.has_descriptors"]
FLAG_ITEMS_OVERFLOW = _T["flag.items_overflow"]
FLAG_NO_HEAP_SIZE = _T["flag.no_heap_size"]
FLAG_ITEMS_CUT = _T["flag.items_cut"]
FLAG_CHUNK = _T["flag.chunk"]
FLAG_STREAM_END = _T["flag.stream_end"]  # 2.2: a stream boundary (recv --keep-going), not a heap

# --- item entry (§5) -----------------------------------------------------------------------------------
ITEM_SIZE = _T["item_size"]
ITEM_ID = _T["item.id"]
ITEM_VALUE = _T["item.value"]
ITEM_LENGTH = _T["item.length"]
ITEM_FLAGS = _T["item.flags"]
ITEM_RESERVED = _T["item.reserved"]
ITEM_IMMEDIATE = _T["item_flag.immediate"]
ITEM_CUT = _T["item_flag.cut"]  # 2.2: an address item of a TRUNCATED heap clipped to the slot

# --- stream metadata (§6) ------------------------------------------------------------------------------
META_SEQ = _T["meta.seq"]
META_LENGTH = _T["meta.length"]
META_RECORDS = _T["meta.records"]
REC_RECORD_SIZE = _T["meta_record.record_size"]
REC_NDIM = _T["meta_record.ndim"]
REC_ID = _T["meta_record.id"]
REC_NAME_LEN = _T["meta_record.name_len"]
REC_DESCRIPTION_LEN = _T["meta_record.description_len"]
REC_FORMAT_LEN = _T["meta_record.format_len"]
REC_DTYPE_LEN = _T["meta_record.dtype_len"]
REC_SHAPE = _T["meta_record.shape"]

# --- stats (§2.3) --------------------------------------------------------------------------------------
COUNTER_NAMES = _contract.COUNTER_NAMES
STATS_COUNT = _T["stats_count"]
assert STATS_COUNT == len(COUNTER_NAMES)

# Futex (linux/futex.h; shared futex: no FUTEX_PRIVATE_FLAG); x86-64 syscall number (_sys has each machine's).
SYS_FUTEX = 202
FUTEX_WAIT = 0
FUTEX_WAKE = 1
MAX_WAIT_SLICE = 0.25  # seconds

# File seals (linux/fcntl.h); F_SEAL_FUTURE_WRITE is missing from older Pythons' fcntl module.
F_SEAL_SEAL = 0x0001
F_SEAL_SHRINK = 0x0002
F_SEAL_GROW = 0x0004
F_SEAL_WRITE = 0x0008
F_SEAL_FUTURE_WRITE = 0x0010
SEALS_SHARED = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE  # ctl and data must have these (§9 step 4)
SEALS_REGION = F_SEAL_SHRINK | F_SEAL_GROW  # the consumer region must have these


def ctl_size_for(max_consumers: int) -> int:
    """The control memory's size for a consumer table of max_consumers rows (spec §2)."""
    n = OFF_CONSUMER_TABLE + ROW_SIZE * max_consumers
    return (n + 4095) // 4096 * 4096


def _fields_struct(fields, size=None):
    """A little-endian struct.Struct from (name, offset, code) triples in offset order, with pad bytes for
    the gaps (and up to ``size`` at the end): the format follows from the offsets."""
    fmt, pos = "<", 0
    for name, off, code in fields:
        if off < pos:
            raise AssertionError(f"field {name} at {off:#x} overlaps the previous one (ends at {pos:#x})")
        if off > pos:
            fmt += f"{off - pos}x"
        fmt += code
        pos = off + struct.calcsize("<" + code)
    if size is not None:
        if size < pos:
            raise AssertionError(f"struct of {pos} bytes does not fit {size}")
        if size > pos:
            fmt += f"{size - pos}x"
    s = struct.Struct(fmt)
    return s, tuple(f[0] for f in fields)


HEADER_STRUCT, HEADER_FIELDS = _fields_struct((
    ("magic", OFF_MAGIC, "Q"), ("major", OFF_MAJOR, "H"), ("minor", OFF_MINOR, "H"),
    ("ctl_size", OFF_CTL_SIZE, "I"), ("state", OFF_STATE, "I"), ("policy", OFF_POLICY, "I"),
    ("session_id", OFF_SESSION_ID, "Q"), ("producer_pid", OFF_PRODUCER_PID, "Q"),
    ("producer_start_ns", OFF_PRODUCER_START_NS, "Q"), ("slot_count", OFF_SLOT_COUNT, "Q"),
    ("slot_size", OFF_SLOT_SIZE, "Q"), ("max_items", OFF_MAX_ITEMS, "I"), ("desc_size", OFF_DESC_SIZE, "I"),
    ("item_size", OFF_ITEM_SIZE, "I"), ("page_size", OFF_PAGE_SIZE, "I"), ("data_size", OFF_DATA_SIZE, "Q"),
    ("desc_offset", OFF_DESC_OFFSET, "Q"), ("items_offset", OFF_ITEMS_OFFSET, "Q"),
    ("meta_offset", OFF_META_OFFSET, "Q"), ("meta_size", OFF_META_SIZE, "Q"),
    ("payload_offset", OFF_PAYLOAD_OFFSET, "Q"), ("packet_offset", OFF_PACKET_OFFSET, "Q"),
    ("packet_size", OFF_PACKET_SIZE, "Q"), ("features", OFF_FEATURES, "Q"),
    ("stats_count", OFF_STATS_COUNT, "I"), ("max_consumers", OFF_MAX_CONSUMERS, "I"),
))

# The chunk geometry (§13), read apart from the 2.0 header: it lies in the header's reserved space.
CHUNK_STRUCT, CHUNK_FIELDS = _fields_struct((
    ("chunk_heaps", 0, "I"), ("chunk_axis", OFF_CHUNK_AXIS - OFF_CHUNK_HEAPS, "I"),
    ("chunk_heap_size", OFF_CHUNK_HEAP_SIZE - OFF_CHUNK_HEAPS, "Q"),
    ("chunk_step", OFF_CHUNK_STEP - OFF_CHUNK_HEAPS, "Q"),
    ("chunk_time_item", OFF_CHUNK_TIME_ITEM - OFF_CHUNK_HEAPS, "Q"),
    ("chunk_axis_item", OFF_CHUNK_AXIS_ITEM - OFF_CHUNK_HEAPS, "Q"),
))

ROW_STRUCT, ROW_FIELDS = _fields_struct((
    ("state", ROW_STATE, "I"), ("generation", ROW_GENERATION, "I"), ("pid", ROW_PID, "Q"),
    ("uid", ROW_UID, "Q"), ("attach_ns", ROW_ATTACH_NS, "Q"), ("released", ROW_RELEASED, "Q"),
    ("wakes", ROW_WAKES, "Q"), ("lost_heaps", ROW_LOST_HEAPS, "Q"), ("assigned", ROW_ASSIGNED, "Q"),
    ("group_id", ROW_GROUP_ID, "I"), ("client_minor", ROW_CLIENT_MINOR, "I"), ("read", ROW_READ, "Q"),
    ("queued", ROW_QUEUED, "Q"), ("skipped", ROW_SKIPPED, "Q"),
), ROW_SIZE)

REGION_FIELDS = ("tail", "consumer_waiting", "consumer_futex", "wake_at", "read", "handed", "release_futex",
                 "spin_budget_ns")

HELLO_STRUCT, HELLO_FIELDS = _fields_struct((
    ("magic", MSG_MAGIC, "Q"), ("major", MSG_MAJOR, "H"), ("minor", MSG_MINOR, "H"), ("role", HELLO_ROLE, "I"),
    ("start", HELLO_START, "I"), ("group_id", HELLO_GROUP_ID, "I"),
), HELLO_SIZE)

WELCOME_STRUCT, WELCOME_FIELDS = _fields_struct((
    ("magic", MSG_MAGIC, "Q"), ("major", MSG_MAJOR, "H"), ("minor", MSG_MINOR, "H"),
    ("status", WELCOME_STATUS, "I"), ("consumer_index", WELCOME_CONSUMER_INDEX, "I"),
    ("generation", WELCOME_GENERATION, "I"), ("session_id", WELCOME_SESSION_ID, "Q"),
    ("ctl_size", WELCOME_CTL_SIZE, "Q"), ("data_size", WELCOME_DATA_SIZE, "Q"),
    ("region_size", WELCOME_REGION_SIZE, "Q"),
), WELCOME_SIZE)

# The common prefix of a welcome and an error record: magic, major, minor, status.
RECORD_PREFIX_STRUCT, RECORD_PREFIX_FIELDS = _fields_struct((
    ("magic", MSG_MAGIC, "Q"), ("major", MSG_MAJOR, "H"), ("minor", MSG_MINOR, "H"),
    ("status", WELCOME_STATUS, "I"),
), WELCOME_MESSAGE)

_DESC_SPEC = (
    ("seq", DESC_SEQ, "Q"), ("heap_cnt", DESC_HEAP_CNT, "Q"), ("heap_size", DESC_HEAP_SIZE, "Q"),
    ("received", DESC_RECEIVED, "Q"), ("timestamp_ns", DESC_TIMESTAMP_NS, "Q"), ("slot", DESC_SLOT, "I"),
    ("flags", DESC_FLAGS, "I"), ("item_count", DESC_ITEM_COUNT, "I"), ("packets", DESC_PACKETS, "I"),
    ("assign", DESC_ASSIGN, "Q"),
)
DESC_STRUCT, DESC_FIELDS = _fields_struct(_DESC_SPEC, DESC_SIZE)
DESC_FORMAT = DESC_STRUCT.format

_ITEM_SPEC = (
    ("id", ITEM_ID, "Q"), ("value", ITEM_VALUE, "Q"), ("length", ITEM_LENGTH, "Q"), ("flags", ITEM_FLAGS, "I"),
    ("reserved", ITEM_RESERVED, "I"),
)
ITEM_STRUCT, ITEM_FIELDS = _fields_struct(_ITEM_SPEC, ITEM_SIZE)
ITEM_FORMAT = ITEM_STRUCT.format
# The four fields a reader uses (reserved skipped as padding): iter_unpack yields (id, value, length, flags).
ITEM_RAW_STRUCT, _ = _fields_struct(_ITEM_SPEC[:4], ITEM_SIZE)

META_HEADER_STRUCT, _ = _fields_struct((("seq", META_SEQ, "Q"), ("length", META_LENGTH, "Q")), META_RECORDS)
META_RECORD_STRUCT, META_RECORD_FIELDS = _fields_struct((
    ("record_size", REC_RECORD_SIZE, "I"), ("ndim", REC_NDIM, "I"), ("id", REC_ID, "Q"),
    ("name_len", REC_NAME_LEN, "I"), ("description_len", REC_DESCRIPTION_LEN, "I"),
    ("format_len", REC_FORMAT_LEN, "I"), ("dtype_len", REC_DTYPE_LEN, "I"),
), REC_SHAPE)


# --- handshake helpers (§1.2) --------------------------------------------------------------------------
def pack_hello(role: int = ROLE_CONSUMER, start: int = START_OLDEST, major: int = MAJOR_VERSION,
               minor: int = MINOR_VERSION, magic: int = MAGIC, group_id: int = 0) -> bytes:
    """A 32-byte hello record; group_id (§14) goes at HELLO_GROUP_ID."""
    return HELLO_STRUCT.pack(magic, major, minor, role, start, group_id)


def group_id(name: str) -> int:
    """The group_id of a consumer group's name (§14): FNV-1a 32 over its UTF-8 bytes, 0 mapped to 1; 0 for
    no group ("")."""
    if not name:
        return 0
    h = 0x811C9DC5
    for c in name.encode():
        h = ((h ^ c) * 0x01000193) & 0xFFFFFFFF
    return h or 1


def unpack_hello(buf: bytes) -> dict[str, int]:
    """A hello as a dict; ValueError unless it is exactly HELLO_SIZE bytes."""
    if len(buf) != HELLO_SIZE:
        raise ValueError(f"hello of {len(buf)} bytes, want {HELLO_SIZE}")
    return dict(zip(HELLO_FIELDS, HELLO_STRUCT.unpack(buf)))


def pack_welcome(consumer_index: int, generation: int, session_id: int, ctl_size: int, data_size: int,
                 region_size: int = REGION_SIZE, major: int = MAJOR_VERSION, minor: int = MINOR_VERSION,
                 magic: int = MAGIC, status: int = STATUS_OK) -> bytes:
    """A 64-byte welcome record (its descriptors travel beside it as SCM_RIGHTS)."""
    return WELCOME_STRUCT.pack(magic, major, minor, status, consumer_index, generation, session_id, ctl_size,
                               data_size, region_size)


def pack_error(status: int, message: str, major: int = MAJOR_VERSION, minor: int = MINOR_VERSION,
               magic: int = MAGIC) -> bytes:
    """An error record: the common prefix, then the NUL-terminated UTF-8 message (cut to fit 256 bytes)."""
    msg = message.encode("utf-8")[:ERROR_RECORD_MAX - WELCOME_MESSAGE - 1]
    return RECORD_PREFIX_STRUCT.pack(magic, major, minor, status) + msg + b"\0"


def unpack_record(buf: bytes) -> dict[str, Any]:
    """The producer's answer as a dict: magic, major, minor, status, and either the welcome's fields
    (status 0, at least WELCOME_SIZE bytes) or ``message`` (an error record). ValueError when it is too short
    to be either; the caller checks magic, major and the size of a welcome."""
    if len(buf) < WELCOME_MESSAGE:
        raise ValueError(f"record of {len(buf)} bytes is shorter than {WELCOME_MESSAGE}")
    d = dict(zip(RECORD_PREFIX_FIELDS, RECORD_PREFIX_STRUCT.unpack_from(buf, 0)))
    if d["status"] != STATUS_OK:
        raw = bytes(buf[WELCOME_MESSAGE:])
        d["message"] = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
    elif len(buf) >= WELCOME_SIZE:
        d.update(zip(WELCOME_FIELDS, WELCOME_STRUCT.unpack_from(buf, 0)))
    return d


try:  # numpy structured dtypes for batch views (zero-copy over the data memory)
    import numpy as _np
except ImportError:  # pragma: no cover - numpy is optional at import
    DESC_DTYPE: Any = None
    ITEM_DTYPE: Any = None
else:
    def _dtype(spec: Any, size: int) -> Any:
        """A numpy structured dtype from the same (name, offset, code) triples as the struct."""
        codes = {"Q": "<u8", "I": "<u4", "H": "<u2"}
        return _np.dtype({"names": [f[0] for f in spec], "formats": [codes[f[2]] for f in spec],
                          "offsets": [f[1] for f in spec], "itemsize": size})

    DESC_DTYPE = _dtype(_DESC_SPEC, DESC_SIZE)
    ITEM_DTYPE = _dtype(_ITEM_SPEC, ITEM_SIZE)

assert HEADER_STRUCT.size == OFF_MAX_CONSUMERS + 4
assert DESC_STRUCT.size == DESC_SIZE and ITEM_STRUCT.size == ITEM_SIZE
assert META_RECORD_STRUCT.size == META_RECORD_HEADER_SIZE and META_HEADER_STRUCT.size == META_HEADER_SIZE
assert HELLO_STRUCT.size == HELLO_SIZE and WELCOME_STRUCT.size == WELCOME_SIZE and ROW_STRUCT.size == ROW_SIZE


def dump() -> dict[str, int]:
    """Every constant and offset of the spec by name, exactly as ring.LayoutTable() in Go names them (the
    golden cross-language test requires identical tables).

    Control-memory header fields bare ("magic", "slot_count", "head", "stats" ... are offsets), except the
    header's ctl_size, desc_size, item_size, stats_count and max_consumers fields, which are "header.NAME"
    (the bare desc_size, item_size and stats_count are values); consumer-table rows "row.NAME", the consumer
    region "region.NAME", handshake records "hello.NAME" / "welcome.NAME"; descriptor fields "desc.NAME",
    item fields "item.NAME", metadata "meta.NAME" and "meta_record.NAME"; "magic_value", "major_value",
    "minor_value" are the version constants; enumerations "state.*", "policy.*", "consumer_state.*",
    "role.*", "start.*", "status.*", "flag.*", "item_flag.*", "feature.*", "counter.*".
    """
    g = globals()
    d = {
        "magic_value": MAGIC, "major_value": MAJOR_VERSION, "minor_value": MINOR_VERSION,
        "desc_size": DESC_SIZE, "item_size": ITEM_SIZE, "stats_slots": STATS_SLOTS, "stats_count": STATS_COUNT,
        "region_align": REGION_ALIGN, "max_slot_count": MAX_SLOT_COUNT, "max_items_limit": MAX_ITEMS,
        "meta_header_size": META_HEADER_SIZE, "meta_record_header_size": META_RECORD_HEADER_SIZE,
        "meta_ndim_unknown": NDIM_UNKNOWN, "row_size": ROW_SIZE, "region_size": REGION_SIZE,
        "max_consumers_limit": MAX_CONSUMERS_LIMIT, "default_max_consumers": DEFAULT_MAX_CONSUMERS,
        "hello_size": HELLO_SIZE, "welcome_size": WELCOME_SIZE, "error_record_max": ERROR_RECORD_MAX,
        "no_consumer_index": NO_CONSUMER_INDEX,
    }
    for name in HEADER_FIELDS:
        key = ("header." + name if name in ("ctl_size", "desc_size", "item_size", "stats_count", "max_consumers")
               else name)
        d[key] = g["OFF_" + name.upper()]
    for name in CHUNK_FIELDS:
        d[name] = g["OFF_" + name.upper()]
    d["producer_version_max"] = PRODUCER_VERSION_MAX
    d["name_max"], d["group_name_max"] = NAME_MAX, GROUP_NAME_MAX
    for name in ("producer_version", "head", "producer_waiting", "heartbeat_ns", "oldest", "blocked_on",
                 "blocked_since_ns", "stats"):
        d[name] = g["OFF_" + name.upper()]
    d["consumer_table"] = OFF_CONSUMER_TABLE
    for name in ROW_FIELDS:
        d["row." + name] = g["ROW_" + name.upper()]
    for name in REGION_FIELDS:
        d["region." + name] = g["REG_" + name.upper()]
    for name in HELLO_FIELDS:
        d["hello." + name] = g[("MSG_" if name in ("magic", "major", "minor") else "HELLO_") + name.upper()]
    for name in WELCOME_FIELDS:
        d["welcome." + name] = g[("MSG_" if name in ("magic", "major", "minor") else "WELCOME_") + name.upper()]
    d["welcome.message"] = WELCOME_MESSAGE
    for name in DESC_FIELDS:
        d["desc." + name] = g["DESC_" + name.upper()]
    for name in ITEM_FIELDS:
        d["item." + name] = g["ITEM_" + name.upper()]
    d["meta.seq"] = META_SEQ
    d["meta.length"] = META_LENGTH
    d["meta.records"] = META_RECORDS
    for name in META_RECORD_FIELDS + ("shape",):
        d["meta_record." + name] = g["REC_" + name.upper()]
    enums = (("state", "STATE_", ("init", "ready", "closed")), ("policy", "POLICY_", ("drop", "block")),
             ("consumer_state", "CONSUMER_", ("free", "attached", "overrun", "bad_cursor", "gone")),
             ("role", "ROLE_", ("consumer", "observer")), ("start", "START_", ("oldest", "head")),
             ("status", "STATUS_", ("ok", "version", "not_permitted", "busy", "closing", "protocol")),
             ("flag", "FLAG_", ("complete", "incomplete", "truncated", "end_of_stream", "has_descriptors",
                                "items_overflow", "no_heap_size", "items_cut", "chunk", "stream_end")),
             ("item_flag", "ITEM_", ("immediate", "cut")), ("feature", "FEATURE_", ("replay_timestamps", "chunks")))
    for prefix, const, names in enums:
        for name in names:
            d[f"{prefix}.{name}"] = g[const + name.upper()]
    for i, name in enumerate(COUNTER_NAMES):
        d["counter." + name] = i
    return d


def main() -> None:
    for name, value in dump().items():
        print(name, value)


if __name__ == "__main__":
    main()
