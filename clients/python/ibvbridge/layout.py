"""The ring layout of docs/ring-layout.md, version 1.0, as Python constants.

This module is the one place the Python client knows where anything lies.  ring/layout.go (Go) and
clients/c/ibvbridge.h (C) carry the same numbers; ``python -m ibvbridge.layout`` prints them as
``NAME VALUE`` lines for the golden test that compares all three.

numpy is optional here: DESC_DTYPE / ITEM_DTYPE are ``None`` when numpy is not installed.
"""

import struct

MAGIC = 0x474E495242564249  # b"IBVBRING" little-endian
MAJOR_VERSION = 1
MINOR_VERSION = 0

CTL_SIZE = 4096
DATA_PATH_MAX = 256
STATS_SLOTS = 32
REGION_ALIGN = 4096
MAX_SLOT_COUNT = 1 << 24
MAX_ITEMS = 65536
META_HEADER_SIZE = 16
META_RECORD_HEADER_SIZE = 32
NDIM_UNKNOWN = 0xFFFFFFFF

# --- control file: header (§2.1) ---------------------------------------------------------------------
OFF_MAGIC = 0x00
OFF_MAJOR = 0x08
OFF_MINOR = 0x0A
OFF_CTL_SIZE = 0x0C
OFF_STATE = 0x10
OFF_POLICY = 0x14
OFF_SESSION_ID = 0x18
OFF_PRODUCER_PID = 0x20
OFF_PRODUCER_START_NS = 0x28
OFF_SLOT_COUNT = 0x30
OFF_SLOT_SIZE = 0x38
OFF_MAX_ITEMS = 0x40
OFF_DESC_SIZE = 0x44
OFF_ITEM_SIZE = 0x48
OFF_PAGE_SIZE = 0x4C
OFF_DATA_FILE_SIZE = 0x50
OFF_DESC_OFFSET = 0x58
OFF_ITEMS_OFFSET = 0x60
OFF_META_OFFSET = 0x68
OFF_META_SIZE = 0x70
OFF_PAYLOAD_OFFSET = 0x78
OFF_PACKET_OFFSET = 0x80
OFF_PACKET_SIZE = 0x88
OFF_FEATURES = 0x90
OFF_STATS_COUNT = 0x98
OFF_DATA_PATH = 0x100
# --- control file: cursors, wake words, info, stats (§2.2-2.6) ---------------------------------------
OFF_HEAD = 0x200
OFF_CONSUMER_WAITING = 0x280
OFF_CONSUMER_FUTEX = 0x284
OFF_TAIL = 0x300
OFF_PRODUCER_WAITING = 0x380
OFF_PRODUCER_FUTEX = 0x384
OFF_CONSUMER_PID = 0x400
OFF_CONSUMER_ATTACH_NS = 0x408
OFF_HEARTBEAT_NS = 0x480
OFF_STATS = 0x500
OFF_RESERVED = 0x600

# Header as one struct, magic .. stats_count (0x00 .. 0x9C).
HEADER_FORMAT = "<QHHIIIQQQQQIIIIQQQQQQQQQI"
HEADER_STRUCT = struct.Struct(HEADER_FORMAT)
HEADER_FIELDS = (
    "magic", "major", "minor", "ctl_size", "state", "policy", "session_id", "producer_pid",
    "producer_start_ns", "slot_count", "slot_size", "max_items", "desc_size", "item_size", "page_size",
    "data_file_size", "desc_offset", "items_offset", "meta_offset", "meta_size", "payload_offset",
    "packet_offset", "packet_size", "features", "stats_count",
)
HEADER_SIZE = 0x100  # the header block; HEADER_STRUCT.size == 0x9C, the rest is reserved

# state
STATE_INIT = 0
STATE_READY = 1
STATE_CLOSED = 2
# policy
POLICY_DROP = 0
POLICY_BLOCK = 1

# --- descriptor (§4) -----------------------------------------------------------------------------------
DESC_SIZE = 64
DESC_SEQ = 0x00
DESC_HEAP_CNT = 0x08
DESC_HEAP_SIZE = 0x10
DESC_RECEIVED = 0x18
DESC_TIMESTAMP_NS = 0x20
DESC_SLOT = 0x28
DESC_FLAGS = 0x2C
DESC_ITEM_COUNT = 0x30
DESC_PACKETS = 0x34
DESC_RESERVED = 0x38
DESC_FORMAT = "<QQQQQIIIIQ"
DESC_STRUCT = struct.Struct(DESC_FORMAT)
DESC_FIELDS = ("seq", "heap_cnt", "heap_size", "received", "timestamp_ns", "slot", "flags",
               "item_count", "packets", "reserved")

FLAG_COMPLETE = 0x01
FLAG_INCOMPLETE = 0x02
FLAG_TRUNCATED = 0x04
FLAG_END_OF_STREAM = 0x08
FLAG_HAS_DESCRIPTORS = 0x10
FLAG_ITEMS_OVERFLOW = 0x20
FLAG_NO_HEAP_SIZE = 0x40

# --- item entry (§5) -----------------------------------------------------------------------------------
ITEM_SIZE = 32
ITEM_ID = 0x00
ITEM_VALUE = 0x08
ITEM_LENGTH = 0x10
ITEM_FLAGS = 0x18
ITEM_RESERVED = 0x1C
ITEM_FORMAT = "<QQQII"
ITEM_STRUCT = struct.Struct(ITEM_FORMAT)
ITEM_FIELDS = ("id", "value", "length", "flags", "reserved")
ITEM_IMMEDIATE = 0x1

# --- stream metadata (§6) ------------------------------------------------------------------------------
META_SEQ = 0x00
META_LENGTH = 0x08
META_RECORDS = 0x10
REC_RECORD_SIZE = 0x00
REC_NDIM = 0x04
REC_ID = 0x08
REC_NAME_LEN = 0x10
REC_DESCRIPTION_LEN = 0x14
REC_FORMAT_LEN = 0x18
REC_DTYPE_LEN = 0x1C
REC_SHAPE = 0x20
META_HEADER_FORMAT = "<QQ"
META_RECORD_FORMAT = "<IIQIIII"
META_RECORD_STRUCT = struct.Struct(META_RECORD_FORMAT)

# --- stats (§2.6) --------------------------------------------------------------------------------------
COUNTER_NAMES = (
    "packets", "bytes", "heaps", "incomplete_heaps", "dropped_heaps", "malformed_packets",
    "duplicate_packets", "truncated_heaps", "discarded_incomplete_heaps", "end_of_stream",
)
STATS_COUNT = len(COUNTER_NAMES)

# Futex (linux/futex.h; shared futex: no FUTEX_PRIVATE_FLAG) and x86-64 syscall number.
SYS_FUTEX = 202
FUTEX_WAIT = 0
FUTEX_WAKE = 1
MAX_WAIT_SLICE = 0.25  # seconds

try:  # numpy structured dtypes for batch views (zero-copy over the data file)
    import numpy as _np
except ImportError:  # pragma: no cover - numpy is optional at import
    _np = None
    DESC_DTYPE = None
    ITEM_DTYPE = None
else:
    DESC_DTYPE = _np.dtype({
        "names": list(DESC_FIELDS),
        "formats": ["<u8", "<u8", "<u8", "<u8", "<u8", "<u4", "<u4", "<u4", "<u4", "<u8"],
        "offsets": [DESC_SEQ, DESC_HEAP_CNT, DESC_HEAP_SIZE, DESC_RECEIVED, DESC_TIMESTAMP_NS, DESC_SLOT,
                    DESC_FLAGS, DESC_ITEM_COUNT, DESC_PACKETS, DESC_RESERVED],
        "itemsize": DESC_SIZE,
    })
    ITEM_DTYPE = _np.dtype({
        "names": list(ITEM_FIELDS),
        "formats": ["<u8", "<u8", "<u8", "<u4", "<u4"],
        "offsets": [ITEM_ID, ITEM_VALUE, ITEM_LENGTH, ITEM_FLAGS, ITEM_RESERVED],
        "itemsize": ITEM_SIZE,
    })

assert HEADER_STRUCT.size == OFF_STATS_COUNT + 4
assert DESC_STRUCT.size == DESC_SIZE
assert ITEM_STRUCT.size == ITEM_SIZE
assert META_RECORD_STRUCT.size == META_RECORD_HEADER_SIZE


def dump():
    """Every constant and offset of the spec by name, exactly as ring.LayoutTable() in Go names them (the
    golden cross-language test requires identical tables).

    Header fields are bare ("magic", "slot_count", "head", "stats" ... are offsets), except the header's
    ctl_size, desc_size, item_size and stats_count fields, which are "header.NAME" (the bare names are the
    values: "ctl_size" 4096, "desc_size" 64 ...); "magic_value", "major_value", "minor_value" are the
    version constants. Descriptor fields "desc.NAME", item fields "item.NAME", metadata "meta.NAME" and
    "meta_record.NAME"; enumerations "state.*", "policy.*", "flag.*", "item_flag.*", "counter.*".
    """
    d = {
        "magic_value": MAGIC, "major_value": MAJOR_VERSION, "minor_value": MINOR_VERSION,
        "ctl_size": CTL_SIZE, "desc_size": DESC_SIZE, "item_size": ITEM_SIZE, "data_path_max": DATA_PATH_MAX,
        "stats_slots": STATS_SLOTS, "stats_count": STATS_COUNT, "region_align": REGION_ALIGN,
        "max_slot_count": MAX_SLOT_COUNT, "max_items_limit": MAX_ITEMS, "meta_header_size": META_HEADER_SIZE,
        "meta_record_header_size": META_RECORD_HEADER_SIZE, "meta_ndim_unknown": NDIM_UNKNOWN,
    }
    for name in HEADER_FIELDS:
        key = "header." + name if name in ("ctl_size", "desc_size", "item_size", "stats_count") else name
        d[key] = globals()["OFF_" + name.upper()]
    for name in ("data_path", "head", "consumer_waiting", "consumer_futex", "tail", "producer_waiting",
                 "producer_futex", "consumer_pid", "consumer_attach_ns", "heartbeat_ns", "stats"):
        d[name] = globals()["OFF_" + name.upper()]
    d["ctl_reserved"] = OFF_RESERVED
    for name in DESC_FIELDS:
        d["desc." + name] = globals()["DESC_" + name.upper()]
    for name in ITEM_FIELDS:
        d["item." + name] = globals()["ITEM_" + name.upper()]
    d["meta.seq"] = META_SEQ
    d["meta.length"] = META_LENGTH
    d["meta.records"] = META_RECORDS
    for name in ("record_size", "ndim", "id", "name_len", "description_len", "format_len", "dtype_len",
                 "shape"):
        d["meta_record." + name] = globals()["REC_" + name.upper()]
    d.update({
        "state.init": STATE_INIT, "state.ready": STATE_READY, "state.closed": STATE_CLOSED,
        "policy.drop": POLICY_DROP, "policy.block": POLICY_BLOCK,
        "flag.complete": FLAG_COMPLETE, "flag.incomplete": FLAG_INCOMPLETE, "flag.truncated": FLAG_TRUNCATED,
        "flag.end_of_stream": FLAG_END_OF_STREAM, "flag.has_descriptors": FLAG_HAS_DESCRIPTORS,
        "flag.items_overflow": FLAG_ITEMS_OVERFLOW, "flag.no_heap_size": FLAG_NO_HEAP_SIZE,
        "item_flag.immediate": ITEM_IMMEDIATE,
    })
    for i, name in enumerate(COUNTER_NAMES):
        d["counter." + name] = i
    return d


def main():
    for name, value in dump().items():
        print(name, value)


if __name__ == "__main__":
    main()
