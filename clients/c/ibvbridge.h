/* ibvbridge.h — C consumer for ibvbridge shared-memory SPEAD heap rings.
 *
 * Implements the consumer side of docs/ring-layout.md, layout version 2.x. One header, liburing style:
 * the hot path (ibvb_peek, ibvb_release, item helpers) is static inline; attach/detach/wait live in
 * libibvbridge. Functions return 0 (or a count) on success and -errno on failure; ibvb_last_error()
 * gives a human message for the last failure in the calling thread.
 *
 * How 2.x attaches (spec §1, §9): a ring NAME is a SOCK_SEQPACKET Unix socket NAME.v2.sock in a ring
 * directory. ibvb_attach connects only in a trusted directory (2.1: owned by the caller or root, not
 * writable by others), checks that the server's uid is trusted (SO_PEERCRED), sends a hello
 * and receives a welcome carrying three sealed memfds: the control memory (read-only: header, head, stats,
 * consumer table), the data memory (read-only: descriptors, item tables, metadata, payload) and this
 * consumer's own 4 KiB region (read-write: its cursor `tail` and its wake words). The socket stays open:
 * closing it is the detach, and its hang-up is how the consumer learns that the producer died. Up to
 * max_consumers consumers read one ring, each at its own pace; a consumer the producer detaches (overrun
 * under `drop`, an invalid cursor) learns it from its row of the consumer table.
 *
 * A heap's payload is a view into the ring, valid while this consumer stays attached (2.1): a consumer
 * detached as overrun may find its held slots rewritten. Read the bytes, then check ibvb_heap_valid (or the
 * return of ibvb_release): 1 / 0 proves the bytes read were the heap's. The descriptor and the item entries
 * are copied into private memory and validated before a heap is handed out (h.items points at the copy).
 *
 * C11 (<stdatomic.h>) or C++11 and later (<atomic>): the shared words are IBVB_ATOMIC(T) — _Atomic T in
 * C, std::atomic<T> in C++, same size and alignment — and the inline functions reach them through the
 * ibvb__load/store/fence macros below, so one header serves both languages.
 */
#ifndef IBVBRIDGE_H
#define IBVBRIDGE_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "ibvbridge_layout.h" /* the generated contract: every value below comes from it */

/* IBVB__U(IBVB_L_X) is the generated literal with a u suffix (IBVB__ULL: ull), so a constant keeps the type
 * this header always gave it, in #if too. */
#define IBVB__U_(x) x##u
#define IBVB__U(x) IBVB__U_(x)
#define IBVB__ULL_(x) x##ull
#define IBVB__ULL(x) IBVB__ULL_(x)

#ifdef __cplusplus
#include <atomic>
#define IBVB_ATOMIC(T) std::atomic<T>
#define ibvb__load(p, mo) ((p)->load(std::memory_order_##mo))
#define ibvb__store(p, v, mo) ((p)->store((v), std::memory_order_##mo))
#define ibvb__fence() std::atomic_thread_fence(std::memory_order_seq_cst)
#define ibvb__fence_acquire() std::atomic_thread_fence(std::memory_order_acquire)
#define IBVB__STATIC_ASSERT(c, m) static_assert(c, m)
extern "C" {
#else
#include <stdatomic.h>
#define IBVB_ATOMIC(T) _Atomic T
#define ibvb__load(p, mo) atomic_load_explicit((p), memory_order_##mo)
#define ibvb__store(p, v, mo) atomic_store_explicit((p), (v), memory_order_##mo)
#define ibvb__fence() atomic_thread_fence(memory_order_seq_cst)
#define ibvb__fence_acquire() atomic_thread_fence(memory_order_acquire)
#define IBVB__STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

/* The library's version: ibvbridge's one version (Go internal/version, pkg-config's Version, the Python
 * package's), checked equal by TestOneVersionEverywhere. The ABI is the soname (libibvbridge.so.N), which
 * moves on its own; the ring layout this library speaks is IBVB_MAJOR.IBVB_MINOR. */
#define IBVB_VERSION_MAJOR_LIB 0
#define IBVB_VERSION_MINOR_LIB 3

/* ---- layout constants (spec §1, §2, §3) ------------------------------------------------------ */

#define IBVB_MAGIC IBVB_L_MAGIC_VALUE /* "IBVBRING" little-endian */
#define IBVB_MAJOR IBVB_L_MAJOR_VALUE
#define IBVB_MINOR IBVB_L_MINOR_VALUE /* 2.2: group members publish read and handed (spec §14) */
#define IBVB_CTL_FIXED_SIZE IBVB_L_CONSUMER_TABLE /* control memory before the consumer table */
#define IBVB_ROW_SIZE IBVB_L_ROW_SIZE /* consumer-table row */
#define IBVB_REGION_SIZE IBVB_L_REGION_SIZE /* consumer region */
#define IBVB_MAX_CONSUMERS_LIMIT IBVB_L_MAX_CONSUMERS_LIMIT
#define IBVB_DEFAULT_MAX_CONSUMERS IBVB_L_DEFAULT_MAX_CONSUMERS
/* ctl_size for a table of n rows: 0x1000 + n * 128, rounded up to 4096 (spec §2). */
#define IBVB_CTL_SIZE_FOR(n) ((((uint64_t)IBVB_CTL_FIXED_SIZE + (uint64_t)(n) * IBVB_ROW_SIZE) + 4095) & ~(uint64_t)4095)
#define IBVB_DESC_SIZE IBVB_L_DESC_SIZE
#define IBVB_ITEM_SIZE IBVB_L_ITEM_SIZE
#define IBVB_STATS_SLOTS IBVB_L_STATS_SLOTS
#define IBVB_STATS_COUNT IBVB_L_STATS_COUNT /* counters defined by 2.2 (13 by 2.0, the chunk counters, group_lost, group_skipped, streams_ended) */
#define IBVB_REGION_ALIGN IBVB_L_REGION_ALIGN
#define IBVB_MAX_SLOT_COUNT IBVB__U(IBVB_L_MAX_SLOT_COUNT)
#define IBVB_MAX_ITEMS IBVB__U(IBVB_L_MAX_ITEMS_LIMIT)
#define IBVB_META_HEADER_SIZE IBVB_L_META_HEADER_SIZE
#define IBVB_PRODUCER_VERSION_MAX IBVB_L_PRODUCER_VERSION_MAX /* 2.2: bytes of the ctl producer_version field (spec §2) */
#define IBVB_META_RECORD_HEADER_SIZE IBVB_L_META_RECORD_HEADER_SIZE
#define IBVB_NAME_MAX IBVB_L_NAME_MAX /* characters of a ring name (spec §1.1) */
#define IBVB_GROUP_NAME_MAX IBVB_L_GROUP_NAME_MAX /* bytes of a consumer group name (spec §14.1) */
#define IBVB_SOCK_SUFFIX IBVB_L_SOCKET_SUFFIX
#define IBVB_LOCK_SUFFIX IBVB_L_LOCK_SUFFIX
#define IBVB_RUN_DIR IBVB_L_RUN_DIR /* ring directory of a root producer */
#define IBVB_SHM_DIR_PREFIX IBVB_L_SHM_DIR_PREFIX /* + decimal euid: everyone else's */
#define IBVB_TMP_DIR_PREFIX IBVB_L_TMP_DIR_PREFIX /* + decimal euid: the next default when the first is a stranger's (2.2) */
#define IBVB_DIR_ENV IBVB_L_ENV_DIR

/* Handshake (spec §1.2). */
#define IBVB_HELLO_SIZE IBVB_L_HELLO_SIZE
#define IBVB_WELCOME_SIZE IBVB_L_WELCOME_SIZE
#define IBVB_ERROR_RECORD_MAX IBVB_L_ERROR_RECORD_MAX
#define IBVB_ROLE_CONSUMER IBVB__U(IBVB_L_ROLE_CONSUMER)
#define IBVB_ROLE_OBSERVER IBVB__U(IBVB_L_ROLE_OBSERVER)
#define IBVB_START_OLDEST IBVB_L_START_OLDEST
#define IBVB_START_HEAD IBVB_L_START_HEAD
#define IBVB_NO_CONSUMER_INDEX IBVB_L_NO_CONSUMER_INDEX
#define IBVB_STATUS_OK IBVB__U(IBVB_L_STATUS_OK)
#define IBVB_STATUS_VERSION IBVB__U(IBVB_L_STATUS_VERSION)
#define IBVB_STATUS_NOT_PERMITTED IBVB__U(IBVB_L_STATUS_NOT_PERMITTED)
#define IBVB_STATUS_BUSY IBVB__U(IBVB_L_STATUS_BUSY)
#define IBVB_STATUS_CLOSING IBVB__U(IBVB_L_STATUS_CLOSING)
#define IBVB_STATUS_PROTOCOL IBVB__U(IBVB_L_STATUS_PROTOCOL)

/* Control memory offsets (spec §2). */
#define IBVB_OFF_MAGIC IBVB_L_MAGIC
#define IBVB_OFF_MAJOR IBVB_L_MAJOR
#define IBVB_OFF_MINOR IBVB_L_MINOR
#define IBVB_OFF_CTL_SIZE IBVB_L_HEADER_CTL_SIZE
#define IBVB_OFF_STATE IBVB_L_STATE
#define IBVB_OFF_POLICY IBVB_L_POLICY
#define IBVB_OFF_SESSION_ID IBVB_L_SESSION_ID
#define IBVB_OFF_PRODUCER_PID IBVB_L_PRODUCER_PID
#define IBVB_OFF_PRODUCER_START_NS IBVB_L_PRODUCER_START_NS
#define IBVB_OFF_SLOT_COUNT IBVB_L_SLOT_COUNT
#define IBVB_OFF_SLOT_SIZE IBVB_L_SLOT_SIZE
#define IBVB_OFF_MAX_ITEMS IBVB_L_MAX_ITEMS
#define IBVB_OFF_DESC_SIZE IBVB_L_HEADER_DESC_SIZE
#define IBVB_OFF_ITEM_SIZE IBVB_L_HEADER_ITEM_SIZE
#define IBVB_OFF_PAGE_SIZE IBVB_L_PAGE_SIZE
#define IBVB_OFF_DATA_SIZE IBVB_L_DATA_SIZE
#define IBVB_OFF_DESC_OFFSET IBVB_L_DESC_OFFSET
#define IBVB_OFF_ITEMS_OFFSET IBVB_L_ITEMS_OFFSET
#define IBVB_OFF_META_OFFSET IBVB_L_META_OFFSET
#define IBVB_OFF_META_SIZE IBVB_L_META_SIZE
#define IBVB_OFF_PAYLOAD_OFFSET IBVB_L_PAYLOAD_OFFSET
#define IBVB_OFF_PACKET_OFFSET IBVB_L_PACKET_OFFSET
#define IBVB_OFF_PACKET_SIZE IBVB_L_PACKET_SIZE
#define IBVB_OFF_FEATURES IBVB_L_FEATURES
#define IBVB_OFF_STATS_COUNT IBVB_L_HEADER_STATS_COUNT
#define IBVB_OFF_MAX_CONSUMERS IBVB_L_HEADER_MAX_CONSUMERS
#define IBVB_OFF_CHUNK_HEAPS IBVB_L_CHUNK_HEAPS /* chunk geometry (spec §13): 0 unless features has CHUNKS */
#define IBVB_OFF_CHUNK_AXIS IBVB_L_CHUNK_AXIS
#define IBVB_OFF_CHUNK_HEAP_SIZE IBVB_L_CHUNK_HEAP_SIZE
#define IBVB_OFF_CHUNK_STEP IBVB_L_CHUNK_STEP
#define IBVB_OFF_CHUNK_TIME_ITEM IBVB_L_CHUNK_TIME_ITEM
#define IBVB_OFF_CHUNK_AXIS_ITEM IBVB_L_CHUNK_AXIS_ITEM
#define IBVB_OFF_HEADER_RESERVED (IBVB_L_CHUNK_AXIS_ITEM + 8)
#define IBVB_OFF_PRODUCER_VERSION IBVB_L_PRODUCER_VERSION /* 2.2 */
#define IBVB_OFF_HEAD IBVB_L_HEAD
#define IBVB_OFF_PRODUCER_WAITING IBVB_L_PRODUCER_WAITING
#define IBVB_OFF_HEARTBEAT_NS IBVB_L_HEARTBEAT_NS
#define IBVB_OFF_OLDEST IBVB_L_OLDEST
#define IBVB_OFF_BLOCKED_ON IBVB_L_BLOCKED_ON
#define IBVB_OFF_BLOCKED_SINCE_NS IBVB_L_BLOCKED_SINCE_NS
#define IBVB_OFF_RESERVED_380 0x380
#define IBVB_OFF_STATS IBVB_L_STATS
#define IBVB_OFF_RESERVED_600 (IBVB_L_STATS + 8 * IBVB_L_STATS_SLOTS)
#define IBVB_OFF_CONSUMER_TABLE IBVB_L_CONSUMER_TABLE

/* Consumer-table row offsets (spec §2.2). */
#define IBVB_ROW_OFF_STATE IBVB_L_ROW_STATE
#define IBVB_ROW_OFF_GENERATION IBVB_L_ROW_GENERATION
#define IBVB_ROW_OFF_PID IBVB_L_ROW_PID
#define IBVB_ROW_OFF_UID IBVB_L_ROW_UID
#define IBVB_ROW_OFF_ATTACH_NS IBVB_L_ROW_ATTACH_NS
#define IBVB_ROW_OFF_RELEASED IBVB_L_ROW_RELEASED
#define IBVB_ROW_OFF_WAKES IBVB_L_ROW_WAKES
#define IBVB_ROW_OFF_LOST_HEAPS IBVB_L_ROW_LOST_HEAPS
#define IBVB_ROW_OFF_ASSIGNED IBVB_L_ROW_ASSIGNED
#define IBVB_ROW_OFF_GROUP_ID IBVB_L_ROW_GROUP_ID
#define IBVB_ROW_OFF_CLIENT_MINOR IBVB_L_ROW_CLIENT_MINOR
#define IBVB_ROW_OFF_READ IBVB_L_ROW_READ
#define IBVB_ROW_OFF_QUEUED IBVB_L_ROW_QUEUED
#define IBVB_ROW_OFF_SKIPPED IBVB_L_ROW_SKIPPED
#define IBVB_ROW_OFF_RESERVED (IBVB_L_ROW_SKIPPED + 8)

/* Consumer region offsets (spec §3). */
#define IBVB_REG_OFF_TAIL IBVB_L_REGION_TAIL
#define IBVB_REG_OFF_CONSUMER_WAITING IBVB_L_REGION_CONSUMER_WAITING
#define IBVB_REG_OFF_CONSUMER_FUTEX IBVB_L_REGION_CONSUMER_FUTEX
#define IBVB_REG_OFF_WAKE_AT IBVB_L_REGION_WAKE_AT
#define IBVB_REG_OFF_READ IBVB_L_REGION_READ
#define IBVB_REG_OFF_HANDED IBVB_L_REGION_HANDED
#define IBVB_REG_OFF_RELEASE_FUTEX IBVB_L_REGION_RELEASE_FUTEX
#define IBVB_REG_OFF_SPIN_BUDGET_NS IBVB_L_REGION_SPIN_BUDGET_NS
#define IBVB_REG_OFF_RESERVED (IBVB_L_REGION_SPIN_BUDGET_NS + 8)

/* ring state */
#define IBVB_STATE_INIT IBVB__U(IBVB_L_STATE_INIT)
#define IBVB_STATE_READY IBVB__U(IBVB_L_STATE_READY)
#define IBVB_STATE_CLOSED IBVB__U(IBVB_L_STATE_CLOSED)
/* policy */
#define IBVB_POLICY_DROP IBVB__U(IBVB_L_POLICY_DROP)
#define IBVB_POLICY_BLOCK IBVB__U(IBVB_L_POLICY_BLOCK)
/* consumer-table row state (spec §2.2) */
#define IBVB_CONSUMER_FREE IBVB__U(IBVB_L_CONSUMER_STATE_FREE)
#define IBVB_CONSUMER_ATTACHED IBVB__U(IBVB_L_CONSUMER_STATE_ATTACHED)
#define IBVB_CONSUMER_OVERRUN IBVB__U(IBVB_L_CONSUMER_STATE_OVERRUN)
#define IBVB_CONSUMER_BAD_CURSOR IBVB__U(IBVB_L_CONSUMER_STATE_BAD_CURSOR)
#define IBVB_CONSUMER_GONE IBVB__U(IBVB_L_CONSUMER_STATE_GONE)
/* header features */
#define IBVB_FEATURE_REPLAY_TIMESTAMPS IBVB__ULL(IBVB_L_FEATURE_REPLAY_TIMESTAMPS)
#define IBVB_FEATURE_CHUNKS IBVB__ULL(IBVB_L_FEATURE_CHUNKS)

/* Descriptor flags (spec §4). */
#define IBVB_FLAG_COMPLETE IBVB__U(IBVB_L_FLAG_COMPLETE)
#define IBVB_FLAG_INCOMPLETE IBVB__U(IBVB_L_FLAG_INCOMPLETE)
#define IBVB_FLAG_TRUNCATED IBVB__U(IBVB_L_FLAG_TRUNCATED)
#define IBVB_FLAG_END_OF_STREAM IBVB__U(IBVB_L_FLAG_END_OF_STREAM)
#define IBVB_FLAG_HAS_DESCRIPTORS IBVB__U(IBVB_L_FLAG_HAS_DESCRIPTORS)
#define IBVB_FLAG_ITEMS_OVERFLOW IBVB__U(IBVB_L_FLAG_ITEMS_OVERFLOW)
#define IBVB_FLAG_NO_HEAP_SIZE IBVB__U(IBVB_L_FLAG_NO_HEAP_SIZE)
#define IBVB_FLAG_ITEMS_CUT IBVB__U(IBVB_L_FLAG_ITEMS_CUT)
#define IBVB_FLAG_CHUNK IBVB__U(IBVB_L_FLAG_CHUNK)
/* 2.2: a stream boundary, not a heap (recv --keep-going): one stream stopped, the ring goes on. ibvb_peek and
 * ibvb_wait return IBVB_STREAM_END for it, with *h's position, heap_cnt (the stop heap's), timestamp_ns, flags. */
#define IBVB_FLAG_STREAM_END IBVB__U(IBVB_L_FLAG_STREAM_END)
/* What ibvb_peek / ibvb_wait return for a STREAM_END marker (a negative errno, like every other non-heap). */
#define IBVB_STREAM_END (-ENOMSG)
/* Item flags (spec §5). */
#define IBVB_ITEM_IMMEDIATE IBVB__U(IBVB_L_ITEM_FLAG_IMMEDIATE)
/* 2.2: an address item of a TRUNCATED heap that runs past the slot: its length was clipped to the slot. */
#define IBVB_ITEM_CUT IBVB__U(IBVB_L_ITEM_FLAG_CUT)

/* Stats indices (spec §2.3). */
enum ibvb_counter {
	IBVB_CTR_PACKETS = IBVB_L_COUNTER_PACKETS,
	IBVB_CTR_BYTES = IBVB_L_COUNTER_BYTES,
	IBVB_CTR_HEAPS = IBVB_L_COUNTER_HEAPS,
	IBVB_CTR_INCOMPLETE_HEAPS = IBVB_L_COUNTER_INCOMPLETE_HEAPS,
	IBVB_CTR_DROPPED_HEAPS = IBVB_L_COUNTER_DROPPED_HEAPS,
	IBVB_CTR_MALFORMED_PACKETS = IBVB_L_COUNTER_MALFORMED_PACKETS,
	IBVB_CTR_DUPLICATE_PACKETS = IBVB_L_COUNTER_DUPLICATE_PACKETS,
	IBVB_CTR_TRUNCATED_HEAPS = IBVB_L_COUNTER_TRUNCATED_HEAPS,
	IBVB_CTR_DISCARDED_INCOMPLETE_HEAPS = IBVB_L_COUNTER_DISCARDED_INCOMPLETE_HEAPS,
	IBVB_CTR_END_OF_STREAM = IBVB_L_COUNTER_END_OF_STREAM,
	IBVB_CTR_CONSUMERS_ATTACHED = IBVB_L_COUNTER_CONSUMERS_ATTACHED,
	IBVB_CTR_CONSUMER_OVERRUNS = IBVB_L_COUNTER_CONSUMER_OVERRUNS,
	IBVB_CTR_CONSUMER_ERRORS = IBVB_L_COUNTER_CONSUMER_ERRORS,
	IBVB_CTR_CHUNKS = IBVB_L_COUNTER_CHUNKS,
	IBVB_CTR_INCOMPLETE_CHUNKS = IBVB_L_COUNTER_INCOMPLETE_CHUNKS,
	IBVB_CTR_TOO_OLD_HEAPS = IBVB_L_COUNTER_TOO_OLD_HEAPS,
	IBVB_CTR_REJECTED_HEAPS = IBVB_L_COUNTER_REJECTED_HEAPS,
	IBVB_CTR_GROUP_LOST = IBVB_L_COUNTER_GROUP_LOST, /* positions lost for a consumer group when a member left holding them (§14) */
	IBVB_CTR_GROUP_SKIPPED = IBVB_L_COUNTER_GROUP_SKIPPED, /* 2.2: positions members released without handing them out (§14.7) */
	IBVB_CTR_STREAMS_ENDED = IBVB_L_COUNTER_STREAMS_ENDED, /* 2.2: STREAM_END markers published */
	IBVB_CTR_COUNT = IBVB_L_STATS_COUNT
};

/* ---- shared structures ----------------------------------------------------------------------- */

/* Control memory (spec §2) up to the consumer table, mapped read-only by the consumer (the memfd is sealed
 * F_SEAL_FUTURE_WRITE: it cannot be made writable). Fields the producer changes while we run are atomic. */
struct ibvb_ctl {
	/* 0x000 header: constant once handed out, except state */
	IBVB_ATOMIC(uint64_t) magic;
	uint16_t major;
	uint16_t minor;
	uint32_t ctl_size;
	IBVB_ATOMIC(uint32_t) state;
	uint32_t policy;
	uint64_t session_id;
	uint64_t producer_pid;
	uint64_t producer_start_ns;
	uint64_t slot_count;
	uint64_t slot_size;
	uint32_t max_items;
	uint32_t desc_size;
	uint32_t item_size;
	uint32_t page_size;
	uint64_t data_size;
	uint64_t desc_offset;
	uint64_t items_offset;
	uint64_t meta_offset;
	uint64_t meta_size;
	uint64_t payload_offset;
	uint64_t packet_offset;
	uint64_t packet_size;
	uint64_t features;
	uint32_t stats_count;
	uint32_t max_consumers;
	uint32_t chunk_heaps; /* chunk geometry (spec §13), 0 unless features has CHUNKS */
	uint32_t chunk_axis;
	uint64_t chunk_heap_size;
	uint64_t chunk_step;
	uint64_t chunk_time_item;
	uint64_t chunk_axis_item;
	uint8_t header_reserved[IBVB_L_PRODUCER_VERSION - IBVB_OFF_HEADER_RESERVED];
	/* 0x100: 2.2 producer_version, the producing program's name and version, NUL-padded UTF-8 (not
	 * necessarily terminated: read at most IBVB_PRODUCER_VERSION_MAX bytes) */
	char producer_version[IBVB_PRODUCER_VERSION_MAX];
	uint8_t reserved_140[IBVB_L_HEAD - IBVB_L_PRODUCER_VERSION - IBVB_PRODUCER_VERSION_MAX];
	/* 0x200 producer cursor */
	IBVB_ATOMIC(uint64_t) head;
	uint8_t pad_head[IBVB_L_PRODUCER_WAITING - IBVB_L_HEAD - 8];
	/* 0x280 producer wait */
	IBVB_ATOMIC(uint32_t) producer_waiting;
	uint8_t pad_pwait[IBVB_L_HEARTBEAT_NS - IBVB_L_PRODUCER_WAITING - 4];
	/* 0x300 producer info */
	IBVB_ATOMIC(uint64_t) heartbeat_ns;
	IBVB_ATOMIC(uint64_t) oldest;
	IBVB_ATOMIC(uint32_t) blocked_on;       /* 2.2 §14.6: row + 1 a block producer waits for, 0 none */
	uint32_t pad_blocked;
	IBVB_ATOMIC(uint64_t) blocked_since_ns; /* 2.2 §14.6: CLOCK_REALTIME when that wait began */
	uint8_t pad_pinfo[IBVB_OFF_RESERVED_380 - IBVB_L_BLOCKED_SINCE_NS - 8];
	/* 0x380 */
	uint8_t reserved_380[IBVB_L_STATS - IBVB_OFF_RESERVED_380];
	/* 0x500 stats */
	IBVB_ATOMIC(uint64_t) stats[IBVB_STATS_SLOTS];
	/* 0x600 */
	uint8_t reserved_600[IBVB_CTL_FIXED_SIZE - IBVB_OFF_RESERVED_600];
	/* 0x1000: max_consumers × struct ibvb_row follow (ibvb_ctl_row) */
};

/* Consumer-table row (spec §2.2), producer-written; state is stored last (release). */
struct ibvb_row {
	IBVB_ATOMIC(uint32_t) state;
	IBVB_ATOMIC(uint32_t) generation;
	IBVB_ATOMIC(uint64_t) pid;
	IBVB_ATOMIC(uint64_t) uid;
	IBVB_ATOMIC(uint64_t) attach_ns;
	IBVB_ATOMIC(uint64_t) released;
	IBVB_ATOMIC(uint64_t) wakes;
	IBVB_ATOMIC(uint64_t) lost_heaps;
	IBVB_ATOMIC(uint64_t) assigned; /* 2.1 §14: positions assigned to this group member since it attached */
	IBVB_ATOMIC(uint32_t) group_id; /* 2.1 §14: its hello's group_id, 0 for an independent consumer */
	IBVB_ATOMIC(uint32_t) client_minor; /* 2.2: the minor of its hello */
	IBVB_ATOMIC(uint64_t) read;     /* 2.2 §14.2: a member's read position as the producer accepted it */
	IBVB_ATOMIC(uint64_t) queued;   /* 2.2 §14.2: assigned to the member, published, not yet read */
	IBVB_ATOMIC(uint64_t) skipped;  /* 2.2 §14.7: assigned positions released without being handed out */
	uint8_t reserved[IBVB_ROW_SIZE - IBVB_ROW_OFF_RESERVED];
};

/* Consumer region (spec §3): one per attachment, mapped read-write; this consumer is its only writer
 * except consumer_waiting (the producer exchanges it with 0) and consumer_futex (the producer bumps it). */
struct ibvb_region {
	IBVB_ATOMIC(uint64_t) tail;
	uint8_t pad_tail[IBVB_L_REGION_CONSUMER_WAITING - 8];
	IBVB_ATOMIC(uint32_t) consumer_waiting;
	IBVB_ATOMIC(uint32_t) consumer_futex;
	IBVB_ATOMIC(uint64_t) wake_at; /* wake me once head reaches this (spec §7.5) */
	IBVB_ATOMIC(uint64_t) read;    /* 2.2 member: every position below it has been looked at (spec §14.2) */
	IBVB_ATOMIC(uint64_t) handed;  /* 2.2 member: own heaps handed to the caller since attach (spec §14.2) */
	uint8_t pad_cwait[IBVB_L_REGION_RELEASE_FUTEX - IBVB_L_REGION_HANDED - 8];
	IBVB_ATOMIC(uint32_t) release_futex;
	uint8_t pad_release[IBVB_L_REGION_SPIN_BUDGET_NS - IBVB_L_REGION_RELEASE_FUTEX - 4];
	IBVB_ATOMIC(uint64_t) spin_budget_ns;
	uint8_t reserved[IBVB_REGION_SIZE - IBVB_REG_OFF_RESERVED];
};

/* Handshake records (spec §1.2), little-endian. */
struct ibvb_hello {
	uint64_t magic;
	uint16_t major;
	uint16_t minor;
	uint32_t role;
	uint32_t start;
	uint32_t group_id; /* 2.1 §14: FNV-1a 32 of the group name, 0 = no group */
	uint32_t reserved[2];
};
struct ibvb_welcome {
	uint64_t magic;
	uint16_t major;
	uint16_t minor;
	uint32_t status;
	uint32_t consumer_index;
	uint32_t generation;
	uint64_t session_id;
	uint64_t ctl_size;
	uint64_t data_size;
	uint64_t region_size;
	uint64_t reserved;
};
/* An error record: status != 0, then a NUL-terminated UTF-8 message at 0x10, no descriptors. */
struct ibvb_error_record {
	uint64_t magic;
	uint16_t major;
	uint16_t minor;
	uint32_t status;
	char message[IBVB_ERROR_RECORD_MAX - IBVB_L_WELCOME_MESSAGE];
};

/* Descriptor (spec §4), in the read-only data mapping. */
struct ibvb_desc {
	uint64_t seq;
	uint64_t heap_cnt;
	uint64_t heap_size;
	uint64_t received;
	uint64_t timestamp_ns;
	uint32_t slot;
	uint32_t flags;
	uint32_t item_count;
	uint32_t packets;
	uint64_t assign; /* 2.1 §14: bitmask over consumer rows, one group member's bit per group */
};

/* Item entry (spec §5). */
struct ibvb_item {
	uint64_t id;
	uint64_t value;
	uint64_t length;
	uint32_t flags;
	uint32_t reserved;
};

/* Stream-metadata area header (spec §6) and record header. */
struct ibvb_meta_header {
	IBVB_ATOMIC(uint64_t) seq;
	uint64_t length;
};
struct ibvb_meta_record_header {
	uint32_t record_size;
	uint32_t ndim;
	uint64_t id;
	uint32_t name_len;
	uint32_t description_len;
	uint32_t format_len;
	uint32_t dtype_len;
};
#define IBVB_META_NDIM_UNKNOWN IBVB_L_META_NDIM_UNKNOWN

#define IBVB__CHECK(T, f, off) IBVB__STATIC_ASSERT(offsetof(T, f) == (off), #T "." #f " offset")
IBVB__STATIC_ASSERT(sizeof(IBVB_ATOMIC(uint64_t)) == 8 && sizeof(IBVB_ATOMIC(uint32_t)) == 4, "atomic sizes");
IBVB__STATIC_ASSERT(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2, "lock-free atomics required");
IBVB__STATIC_ASSERT(sizeof(struct ibvb_ctl) == IBVB_CTL_FIXED_SIZE, "ctl size");
IBVB__STATIC_ASSERT(IBVB_CTL_FIXED_SIZE == IBVB_OFF_CONSUMER_TABLE, "consumer table offset");
IBVB__CHECK(struct ibvb_ctl, magic, IBVB_OFF_MAGIC);
IBVB__CHECK(struct ibvb_ctl, major, IBVB_OFF_MAJOR);
IBVB__CHECK(struct ibvb_ctl, minor, IBVB_OFF_MINOR);
IBVB__CHECK(struct ibvb_ctl, ctl_size, IBVB_OFF_CTL_SIZE);
IBVB__CHECK(struct ibvb_ctl, state, IBVB_OFF_STATE);
IBVB__CHECK(struct ibvb_ctl, policy, IBVB_OFF_POLICY);
IBVB__CHECK(struct ibvb_ctl, session_id, IBVB_OFF_SESSION_ID);
IBVB__CHECK(struct ibvb_ctl, producer_pid, IBVB_OFF_PRODUCER_PID);
IBVB__CHECK(struct ibvb_ctl, producer_start_ns, IBVB_OFF_PRODUCER_START_NS);
IBVB__CHECK(struct ibvb_ctl, slot_count, IBVB_OFF_SLOT_COUNT);
IBVB__CHECK(struct ibvb_ctl, slot_size, IBVB_OFF_SLOT_SIZE);
IBVB__CHECK(struct ibvb_ctl, max_items, IBVB_OFF_MAX_ITEMS);
IBVB__CHECK(struct ibvb_ctl, desc_size, IBVB_OFF_DESC_SIZE);
IBVB__CHECK(struct ibvb_ctl, item_size, IBVB_OFF_ITEM_SIZE);
IBVB__CHECK(struct ibvb_ctl, page_size, IBVB_OFF_PAGE_SIZE);
IBVB__CHECK(struct ibvb_ctl, data_size, IBVB_OFF_DATA_SIZE);
IBVB__CHECK(struct ibvb_ctl, desc_offset, IBVB_OFF_DESC_OFFSET);
IBVB__CHECK(struct ibvb_ctl, items_offset, IBVB_OFF_ITEMS_OFFSET);
IBVB__CHECK(struct ibvb_ctl, meta_offset, IBVB_OFF_META_OFFSET);
IBVB__CHECK(struct ibvb_ctl, meta_size, IBVB_OFF_META_SIZE);
IBVB__CHECK(struct ibvb_ctl, payload_offset, IBVB_OFF_PAYLOAD_OFFSET);
IBVB__CHECK(struct ibvb_ctl, packet_offset, IBVB_OFF_PACKET_OFFSET);
IBVB__CHECK(struct ibvb_ctl, packet_size, IBVB_OFF_PACKET_SIZE);
IBVB__CHECK(struct ibvb_ctl, features, IBVB_OFF_FEATURES);
IBVB__CHECK(struct ibvb_ctl, stats_count, IBVB_OFF_STATS_COUNT);
IBVB__CHECK(struct ibvb_ctl, max_consumers, IBVB_OFF_MAX_CONSUMERS);
IBVB__CHECK(struct ibvb_ctl, chunk_heaps, IBVB_OFF_CHUNK_HEAPS);
IBVB__CHECK(struct ibvb_ctl, chunk_axis, IBVB_OFF_CHUNK_AXIS);
IBVB__CHECK(struct ibvb_ctl, chunk_heap_size, IBVB_OFF_CHUNK_HEAP_SIZE);
IBVB__CHECK(struct ibvb_ctl, chunk_step, IBVB_OFF_CHUNK_STEP);
IBVB__CHECK(struct ibvb_ctl, chunk_time_item, IBVB_OFF_CHUNK_TIME_ITEM);
IBVB__CHECK(struct ibvb_ctl, chunk_axis_item, IBVB_OFF_CHUNK_AXIS_ITEM);
IBVB__CHECK(struct ibvb_ctl, header_reserved, IBVB_OFF_HEADER_RESERVED);
IBVB__CHECK(struct ibvb_ctl, producer_version, IBVB_OFF_PRODUCER_VERSION);
IBVB__CHECK(struct ibvb_ctl, head, IBVB_OFF_HEAD);
IBVB__CHECK(struct ibvb_ctl, producer_waiting, IBVB_OFF_PRODUCER_WAITING);
IBVB__CHECK(struct ibvb_ctl, heartbeat_ns, IBVB_OFF_HEARTBEAT_NS);
IBVB__CHECK(struct ibvb_ctl, oldest, IBVB_OFF_OLDEST);
IBVB__CHECK(struct ibvb_ctl, blocked_on, IBVB_OFF_BLOCKED_ON);
IBVB__CHECK(struct ibvb_ctl, blocked_since_ns, IBVB_OFF_BLOCKED_SINCE_NS);
IBVB__CHECK(struct ibvb_ctl, reserved_380, IBVB_OFF_RESERVED_380);
IBVB__CHECK(struct ibvb_ctl, stats, IBVB_OFF_STATS);
IBVB__CHECK(struct ibvb_ctl, reserved_600, IBVB_OFF_RESERVED_600);

IBVB__STATIC_ASSERT(sizeof(struct ibvb_row) == IBVB_ROW_SIZE, "row size");
IBVB__CHECK(struct ibvb_row, state, IBVB_ROW_OFF_STATE);
IBVB__CHECK(struct ibvb_row, generation, IBVB_ROW_OFF_GENERATION);
IBVB__CHECK(struct ibvb_row, pid, IBVB_ROW_OFF_PID);
IBVB__CHECK(struct ibvb_row, uid, IBVB_ROW_OFF_UID);
IBVB__CHECK(struct ibvb_row, attach_ns, IBVB_ROW_OFF_ATTACH_NS);
IBVB__CHECK(struct ibvb_row, released, IBVB_ROW_OFF_RELEASED);
IBVB__CHECK(struct ibvb_row, wakes, IBVB_ROW_OFF_WAKES);
IBVB__CHECK(struct ibvb_row, assigned, IBVB_ROW_OFF_ASSIGNED);
IBVB__CHECK(struct ibvb_row, group_id, IBVB_ROW_OFF_GROUP_ID);
IBVB__CHECK(struct ibvb_row, client_minor, IBVB_ROW_OFF_CLIENT_MINOR);
IBVB__CHECK(struct ibvb_row, read, IBVB_ROW_OFF_READ);
IBVB__CHECK(struct ibvb_row, queued, IBVB_ROW_OFF_QUEUED);
IBVB__CHECK(struct ibvb_row, skipped, IBVB_ROW_OFF_SKIPPED);
IBVB__CHECK(struct ibvb_row, lost_heaps, IBVB_ROW_OFF_LOST_HEAPS);
IBVB__CHECK(struct ibvb_row, reserved, IBVB_ROW_OFF_RESERVED);

IBVB__STATIC_ASSERT(sizeof(struct ibvb_region) == IBVB_REGION_SIZE, "region size");
IBVB__CHECK(struct ibvb_region, tail, IBVB_REG_OFF_TAIL);
IBVB__CHECK(struct ibvb_region, consumer_waiting, IBVB_REG_OFF_CONSUMER_WAITING);
IBVB__CHECK(struct ibvb_region, consumer_futex, IBVB_REG_OFF_CONSUMER_FUTEX);
IBVB__CHECK(struct ibvb_region, wake_at, IBVB_REG_OFF_WAKE_AT);
IBVB__CHECK(struct ibvb_region, read, IBVB_REG_OFF_READ);
IBVB__CHECK(struct ibvb_region, handed, IBVB_REG_OFF_HANDED);
IBVB__CHECK(struct ibvb_region, release_futex, IBVB_REG_OFF_RELEASE_FUTEX);
IBVB__CHECK(struct ibvb_region, spin_budget_ns, IBVB_REG_OFF_SPIN_BUDGET_NS);
IBVB__CHECK(struct ibvb_region, reserved, IBVB_REG_OFF_RESERVED);

IBVB__STATIC_ASSERT(sizeof(struct ibvb_hello) == IBVB_HELLO_SIZE, "hello size");
IBVB__CHECK(struct ibvb_hello, magic, IBVB_L_HELLO_MAGIC);
IBVB__CHECK(struct ibvb_hello, major, IBVB_L_HELLO_MAJOR);
IBVB__CHECK(struct ibvb_hello, minor, IBVB_L_HELLO_MINOR);
IBVB__CHECK(struct ibvb_hello, role, IBVB_L_HELLO_ROLE);
IBVB__CHECK(struct ibvb_hello, start, IBVB_L_HELLO_START);
IBVB__CHECK(struct ibvb_hello, group_id, IBVB_L_HELLO_GROUP_ID);
IBVB__CHECK(struct ibvb_hello, reserved, IBVB_L_HELLO_GROUP_ID + 4);
IBVB__STATIC_ASSERT(sizeof(struct ibvb_welcome) == IBVB_WELCOME_SIZE, "welcome size");
IBVB__CHECK(struct ibvb_welcome, magic, IBVB_L_WELCOME_MAGIC);
IBVB__CHECK(struct ibvb_welcome, major, IBVB_L_WELCOME_MAJOR);
IBVB__CHECK(struct ibvb_welcome, minor, IBVB_L_WELCOME_MINOR);
IBVB__CHECK(struct ibvb_welcome, status, IBVB_L_WELCOME_STATUS);
IBVB__CHECK(struct ibvb_welcome, consumer_index, IBVB_L_WELCOME_CONSUMER_INDEX);
IBVB__CHECK(struct ibvb_welcome, generation, IBVB_L_WELCOME_GENERATION);
IBVB__CHECK(struct ibvb_welcome, session_id, IBVB_L_WELCOME_SESSION_ID);
IBVB__CHECK(struct ibvb_welcome, ctl_size, IBVB_L_WELCOME_CTL_SIZE);
IBVB__CHECK(struct ibvb_welcome, data_size, IBVB_L_WELCOME_DATA_SIZE);
IBVB__CHECK(struct ibvb_welcome, region_size, IBVB_L_WELCOME_REGION_SIZE);
IBVB__CHECK(struct ibvb_welcome, reserved, IBVB_L_WELCOME_REGION_SIZE + 8);
IBVB__STATIC_ASSERT(sizeof(struct ibvb_error_record) == IBVB_ERROR_RECORD_MAX, "error record size");
IBVB__CHECK(struct ibvb_error_record, magic, IBVB_L_WELCOME_MAGIC);
IBVB__CHECK(struct ibvb_error_record, major, IBVB_L_WELCOME_MAJOR);
IBVB__CHECK(struct ibvb_error_record, minor, IBVB_L_WELCOME_MINOR);
IBVB__CHECK(struct ibvb_error_record, status, IBVB_L_WELCOME_STATUS);
IBVB__CHECK(struct ibvb_error_record, message, IBVB_L_WELCOME_MESSAGE);

IBVB__STATIC_ASSERT(sizeof(struct ibvb_desc) == IBVB_DESC_SIZE, "descriptor size");
IBVB__CHECK(struct ibvb_desc, seq, IBVB_L_DESC_SEQ);
IBVB__CHECK(struct ibvb_desc, heap_cnt, IBVB_L_DESC_HEAP_CNT);
IBVB__CHECK(struct ibvb_desc, heap_size, IBVB_L_DESC_HEAP_SIZE);
IBVB__CHECK(struct ibvb_desc, received, IBVB_L_DESC_RECEIVED);
IBVB__CHECK(struct ibvb_desc, timestamp_ns, IBVB_L_DESC_TIMESTAMP_NS);
IBVB__CHECK(struct ibvb_desc, slot, IBVB_L_DESC_SLOT);
IBVB__CHECK(struct ibvb_desc, flags, IBVB_L_DESC_FLAGS);
IBVB__CHECK(struct ibvb_desc, item_count, IBVB_L_DESC_ITEM_COUNT);
IBVB__CHECK(struct ibvb_desc, packets, IBVB_L_DESC_PACKETS);
IBVB__CHECK(struct ibvb_desc, assign, IBVB_L_DESC_ASSIGN);

IBVB__STATIC_ASSERT(sizeof(struct ibvb_item) == IBVB_ITEM_SIZE, "item size");
IBVB__CHECK(struct ibvb_item, id, IBVB_L_ITEM_ID);
IBVB__CHECK(struct ibvb_item, value, IBVB_L_ITEM_VALUE);
IBVB__CHECK(struct ibvb_item, length, IBVB_L_ITEM_LENGTH);
IBVB__CHECK(struct ibvb_item, flags, IBVB_L_ITEM_FLAGS);
IBVB__CHECK(struct ibvb_item, reserved, IBVB_L_ITEM_RESERVED);

IBVB__STATIC_ASSERT(sizeof(struct ibvb_meta_header) == IBVB_META_HEADER_SIZE, "meta header size");
IBVB__CHECK(struct ibvb_meta_header, seq, IBVB_L_META_SEQ);
IBVB__CHECK(struct ibvb_meta_header, length, IBVB_L_META_LENGTH);
IBVB__STATIC_ASSERT(sizeof(struct ibvb_meta_record_header) == IBVB_META_RECORD_HEADER_SIZE, "meta record header size");
IBVB__CHECK(struct ibvb_meta_record_header, record_size, IBVB_L_META_RECORD_RECORD_SIZE);
IBVB__CHECK(struct ibvb_meta_record_header, ndim, IBVB_L_META_RECORD_NDIM);
IBVB__CHECK(struct ibvb_meta_record_header, id, IBVB_L_META_RECORD_ID);
IBVB__CHECK(struct ibvb_meta_record_header, name_len, IBVB_L_META_RECORD_NAME_LEN);
IBVB__CHECK(struct ibvb_meta_record_header, description_len, IBVB_L_META_RECORD_DESCRIPTION_LEN);
IBVB__CHECK(struct ibvb_meta_record_header, format_len, IBVB_L_META_RECORD_FORMAT_LEN);
IBVB__CHECK(struct ibvb_meta_record_header, dtype_len, IBVB_L_META_RECORD_DTYPE_LEN);

/* ---- chunk geometry (spec §13) ---------------------------------------------------------------- */

/* A chunk-mode ring's geometry: a private copy of the header's fields, validated at attach (each field ≥ 1,
 * positions × heap_size + positions ≤ slot_size without overflow). Heap position (t, a) is the heap_size
 * bytes at (t × axis + a) × heap_size of the chunk; the presence map (positions bytes) follows them. */
struct ibvb_chunk_geometry {
	uint32_t heaps;       /* heap positions along the time axis per chunk */
	uint32_t axis;        /* positions along the second axis (1 when there is none) */
	uint64_t heap_size;   /* bytes per heap position */
	uint64_t step;        /* the time item's value per heap position */
	uint64_t time_item;   /* the immediate item giving the time index (for labels) */
	uint64_t axis_item;   /* the immediate item giving the axis index, 0 when none (for labels) */
	uint64_t positions;   /* heaps × axis: bytes of the presence map */
	uint64_t chunk_bytes; /* positions × heap_size: bytes of a chunk's payload */
};

/* ---- consumer handle ------------------------------------------------------------------------- */

/* Defined here so the hot path can be inline; treat the fields as private. */
struct ibvb_ring {
	const struct ibvb_ctl *ctl;       /* control mapping, read-only, ctl_size bytes */
	const struct ibvb_row *row;       /* this consumer's row of the consumer table (inside ctl) */
	struct ibvb_region *region;       /* this consumer's region, read-write, IBVB_REGION_SIZE bytes */
	const uint8_t *data;              /* data mapping, read-only */
	struct ibvb_item *own_items;      /* private copies of held heaps' item entries, (pos & mask) * max_items */
	uint64_t own_items_size;          /* mapped bytes of own_items */
	const struct ibvb_desc *desc;     /* data + desc_offset */
	const struct ibvb_item *items;    /* data + items_offset */
	const uint8_t *payload;           /* data + payload_offset */
	const uint8_t *meta;              /* data + meta_offset (as validated at attach) */
	uint64_t meta_size;               /* as validated at attach */
	uint64_t mask;                    /* slot_count - 1 */
	uint64_t slot_count;
	uint64_t slot_size;
	uint64_t data_size;               /* mapped bytes of data */
	uint64_t ctl_size;                /* mapped bytes of ctl */
	uint32_t max_items;
	uint32_t eos_pending;             /* an END_OF_STREAM marker at eos_pos awaits release */
	uint64_t eos_pos;
	uint64_t read;                    /* next position to read */
	uint64_t cached_head;             /* last head seen */
	uint64_t released;                /* released position; stored to tail in batches */
	uint64_t stored;                  /* last value stored to tail */
	uint64_t release_batch;           /* releases per tail store (spec §7.4) */
	uint64_t session_id;
	uint32_t row_state_ok;            /* row state while ours: ATTACHED, or GONE after a clean stop */
	uint32_t consumer_index;          /* from the welcome */
	uint32_t generation;              /* from the welcome */
	int64_t max_latency_ns;           /* ibvb_set_max_latency: coalesced sleeps while the stream is active */
	int64_t spin_budget_ns;           /* ibvb_set_spin_budget */
	int64_t wait_avg_ns;              /* moving average of waits that found a heap */
	uint64_t coalesce_heaps;          /* a coalesced sleep asks to be woken when this many heaps wait */
	int active;                       /* the last wait found a heap */
	int sock;                         /* the connection: open for the life of the attachment */
	char name[IBVB_NAME_MAX + 1];     /* ring name, for messages */
	struct ibvb_chunk_geometry chunks; /* validated at attach; all 0 when the ring is not in chunk mode */
	/* consumer groups (spec §14), appended in soname 4: read by the inline ibvb_peek / ibvb_release */
	uint64_t group_bit;               /* this row's bit in a descriptor's assign, 0 when not a member */
	uint8_t *mine;                    /* member: mine[pos & mask] = 1 while pos is its own held heap */
	uint32_t group_id;                /* ibvb_group_id(opts->group), 0 for none */
	/* 2.2 members (spec §14.2), appended in soname 6 */
	uint64_t handed;                  /* own heaps handed to the caller since attach */
	uint64_t read_stored;             /* read as last stored to the region */
};

/* One heap: payload is a view into the ring (valid while ibvb_heap_valid says so), items a private,
 * validated copy of its item entries (valid until released). */
struct ibvb_heap {
	uint64_t position;
	uint64_t heap_cnt;
	uint64_t heap_size;
	uint64_t received;
	uint64_t timestamp_ns;
	uint32_t flags;
	uint32_t item_count;
	uint32_t packets;
	uint32_t slot;
	const uint8_t *payload;          /* slot_size bytes readable; received bytes valid */
	const struct ibvb_item *items;   /* item_count entries, copied out of the ring and validated */
};

/* Named snapshot of the stats block (each counter individually consistent). */
struct ibvb_stats {
	uint64_t packets;
	uint64_t bytes;
	uint64_t heaps;
	uint64_t incomplete_heaps;
	uint64_t dropped_heaps;
	uint64_t malformed_packets;
	uint64_t duplicate_packets;
	uint64_t truncated_heaps;
	uint64_t discarded_incomplete_heaps;
	uint64_t end_of_stream;
	uint64_t consumers_attached;
	uint64_t consumer_overruns;
	uint64_t consumer_errors;
};

/* Header values of an attached ring, and this consumer's place in it. */
struct ibvb_info {
	uint16_t major, minor;
	uint32_t state, policy;
	uint64_t session_id, producer_pid, producer_start_ns;
	uint64_t slot_count, slot_size;
	uint32_t max_items, page_size;
	uint64_t ctl_size, data_size, meta_size, packet_size, features;
	uint32_t stats_count, max_consumers;
	uint64_t head, oldest, heartbeat_ns;
	uint64_t tail;                    /* this consumer's region tail */
	uint32_t consumer_index, generation;
	uint32_t row_state;               /* IBVB_CONSUMER_* of this consumer's row */
	uint64_t lost_heaps;              /* the row's lost_heaps (overrun) */
};

/* ---- library functions (libibvbridge) -------------------------------------------------------- */

/* Attach options (all-zero = the defaults). */
struct ibvb_attach_opts {
	const char *dir; /* ring directory to look in (only that one); NULL: the §1.1 rules: $IBVBRIDGE_RING_DIR
			  * (only that), else the own default (/run/ibvbridge as root, else $XDG_RUNTIME_DIR/ibvbridge,
			  * else /dev/shm/ibvbridge-EUID then /tmp/ibvbridge-EUID), then /run/ibvbridge */
	int start;       /* IBVB_START_OLDEST (0, default): from the oldest heap the ring still holds;
			  * IBVB_START_HEAD (1): only heaps published after the attach */
	unsigned flags;  /* IBVB_ATTACH_WAIT: wait (up to the timeout) for a ring that does not exist yet */
	const char *group; /* consumer group (spec §14) to join as a member, NULL or "": none. A member starts
			    * at head (start is ignored) and ibvb_peek / ibvb_wait hand out only the heaps the
			    * producer assigns to it; the positions it passes over count in ibvb_held and
			    * ibvb_advance (release a member's heaps with ibvb_release / ibvb_release_all). The
			    * Go, C and Python producers assign; one without groups refuses it: -EPROTO. */
};
#define IBVB_ATTACH_WAIT 0x1u

/* Where warnings go (a ring directory skipped because it is not trusted, spec 2.1 §1.1): fn(msg, arg) with
 * one line without a newline; NULL (the default): "ibvbridge: MSG" on stderr. Process-wide. */
typedef void (*ibvb_warn_fn)(const char *msg, void *arg);
void ibvb_set_warn_handler(ibvb_warn_fn fn, void *arg);

/* Attach as a consumer to a ring: NAME (looked up as NAME.v2.sock in trusted directories only, spec 2.1
 * §1.1: an untrusted one is skipped with a warning) or the path of the socket (contains '/', ends in
 * ".v2.sock"; its directory must be trusted). A ring no directory holds fails at once (-ENOENT, "ring NAME
 * not found (looked in DIR, DIR)") unless opts->flags has IBVB_ATTACH_WAIT: then it retries every 10 ms
 * until timeout_ms (<0: forever). A socket that refuses connections (stale) is retried until timeout_ms,
 * then reported (-ECONNREFUSED). The welcome is awaited up to timeout_ms (at least 2 s; 5 s when
 * timeout_ms < 0). On success *out is the handle; the caller owns it (ibvb_detach).
 * Errors (*out = NULL, ibvb_last_error() says more):
 *   -EINVAL bad name, path or option; -ENOENT not found; -ECONNREFUSED stale socket; -EPERM an untrusted
 *   directory was given, or the socket is served by an untrusted uid; -EACCES not permitted (by the producer, or connect was denied); -EBUSY every consumer
 *   row is taken; -ESHUTDOWN the producer is closing; -EPROTONOSUPPORT another layout major (the message
 *   names both versions); -EPROTO malformed welcome or a protocol error record; -EBADMSG corrupt header or
 *   geometry, missing seals or a size mismatch; -ETIMEDOUT no welcome in time; other -errno. */
int ibvb_attach(struct ibvb_ring **out, const char *name_or_path, int timeout_ms);
/* A consumer group's group_id (spec §14): FNV-1a 32 of the name, 0 mapped to 1; 0 for NULL or "". */
uint32_t ibvb_group_id(const char *name);
int ibvb_attach_opts(struct ibvb_ring **out, const char *name_or_path, int timeout_ms,
		     const struct ibvb_attach_opts *opts);
/* Detach: store the released cursor, unmap the three mappings, close the socket (the producer then frees
 * the row; what this consumer held no longer holds anyone back). NULL is ignored. */
void ibvb_detach(struct ibvb_ring *r);
/* Next heap, waiting up to timeout_ms (<0: forever). 0 and *h filled; -ENODATA end of stream;
 * -ETIMEDOUT; -EPIPE producer gone (after everything it published was read); -EOVERFLOW detached as
 * overrun (the message says how many heaps were lost); -ECONNRESET detached for an invalid cursor (or the
 * row was reused); -EINTR a signal interrupted the sleep; -EBADMSG corrupt descriptor. */
int ibvb_wait(struct ibvb_ring *r, struct ibvb_heap *h, int timeout_ms);
/* Cheap waiting (spec §7.5): while the stream is moving, ibvb_wait sleeps coalesced — the producer wakes
 * it only once half the ring waits, and it wakes itself after ns — then takes every heap that arrived
 * meanwhile: a heap may wait up to ns longer, and the consumer's CPU per heap falls with the rate. A sleep
 * that finds nothing new makes the stream idle: the next heap wakes it at once (0 % CPU while idle). 0 (the
 * default, as in the Go and Python clients): a wake per heap, the lowest latency. No spinning with ns > 0. */
#define IBVB_DEFAULT_MAX_LATENCY_NS 0
void ibvb_set_max_latency(struct ibvb_ring *r, int64_t ns);
/* How long ibvb_wait may spin before it sleeps (default 20 µs; ≤ 0: never). It spins only while recent
 * waits averaged at most half of it: spinning for a heap that comes later costs more than the futex
 * round trip it saves. Advertised in the region's spin_budget_ns for `ibvbridge stat`. */
#define IBVB_DEFAULT_SPIN_BUDGET_NS 20000
void ibvb_set_spin_budget(struct ibvb_ring *r, int64_t ns);
/* Message for the last failing call in this thread ("" if none). */
const char *ibvb_last_error(void);
/* Producer liveness (spec §7.6): polls the socket without waiting. 1 alive, 0 gone, -errno. */
int ibvb_producer_alive(const struct ibvb_ring *r);
/* This consumer's row in the consumer table (the welcome's consumer_index). */
uint32_t ibvb_consumer_index(const struct ibvb_ring *r);
/* Fences out of line, for bindings that have no fences of their own (the Python client off x86-64): a
 * plain aligned load followed by ibvb_acquire_fence is an acquire load, ibvb_release_fence followed by a
 * plain aligned store a release store (C11 fence semantics); ibvb_full_fence is seq_cst. */
void ibvb_full_fence(void);
void ibvb_acquire_fence(void);
void ibvb_release_fence(void);
int ibvb_stats(const struct ibvb_ring *r, struct ibvb_stats *s);
/* Counter by index (0 for indices >= stats_count or >= 32); name by index (NULL past the 2.0 set). */
uint64_t ibvb_counter(const struct ibvb_ring *r, unsigned idx);
const char *ibvb_counter_name(unsigned idx);
int ibvb_info(const struct ibvb_ring *r, struct ibvb_info *info);
/* 2.2: what the producer says it runs (header producer_version, e.g. "ibvbridge recv 0.3.0"), copied into buf
 * NUL-terminated (cut to len - 1 bytes). Returns its length, 0 when the producer wrote none. */
size_t ibvb_producer_version(const struct ibvb_ring *r, char *buf, size_t len);

/* Stream metadata (spec §6): copy the record bytes into buf (seqlock read; the length is validated only
 * once the sequence proved the copy stable). Returns the record byte length (0: nothing announced yet),
 * -ENOBUFS if cap is too small (*need set), -EBADMSG corrupt, -EBUSY "metadata area busy" when the
 * producer rewrote it during 1000 tries and 10 ms. */
long ibvb_read_meta(const struct ibvb_ring *r, void *buf, size_t cap, size_t *need);
struct ibvb_meta_record {
	uint64_t id;
	uint32_t ndim;                    /* IBVB_META_NDIM_UNKNOWN: shape unknown */
	const uint8_t *shape;             /* ndim little-endian int64 (may be unaligned: use ibvb_meta_dim) */
	const char *name, *description, *format, *dtype; /* not NUL-terminated */
	uint32_t name_len, description_len, format_len, dtype_len;
};
/* Iterate records in a buffer from ibvb_read_meta: *off starts at 0. 1 = *rec filled, 0 = end,
 * -EBADMSG corrupt record. An id described more than once yields only its last record (spec §6). Strings
 * are the stream's raw bytes, not NUL-terminated and not checked as UTF-8: decode with replacement. */
int ibvb_meta_next(const void *buf, size_t len, size_t *off, struct ibvb_meta_record *rec);
int64_t ibvb_meta_dim(const struct ibvb_meta_record *rec, uint32_t i);

/* Spec §1.2: may a socket served by peer_uid be trusted? 1 yes (0, this process's euid, or the owner of
 * the socket's directory when that directory is not writable by group or others), 0 no. dir_uid/dir_mode:
 * the directory's st_uid/st_mode. Exposed for tests and other bindings. */
int ibvb_peer_uid_trusted(uint32_t peer_uid, uint32_t euid, uint32_t dir_uid, uint32_t dir_mode);

/* internal, out of line */
void ibvb__wake_producer(struct ibvb_ring *r);
int ibvb__corrupt_desc(struct ibvb_ring *r, uint64_t pos, const char *what, uint64_t v1, uint64_t v2);
int ibvb__corrupt_state(struct ibvb_ring *r, const char *what, uint32_t state);
int ibvb__row_changed(struct ibvb_ring *r);
int ibvb__stale(struct ibvb_ring *r);
int ibvb__member_lapped(struct ibvb_ring *r, uint64_t pos);
void ibvb__member_flush(struct ibvb_ring *r);

/* ---- hot path (inline) ----------------------------------------------------------------------- */

/* The producer's session id (new at every producer start; compare to notice a restart). */
static inline uint64_t ibvb_session_id(const struct ibvb_ring *r) { return r->session_id; }
/* The producer's pid, for messages only (liveness is ibvb_producer_alive). */
static inline uint64_t ibvb_producer_pid(const struct ibvb_ring *r) { return r->ctl->producer_pid; }
/* Geometry: payload slots, bytes per slot, item-table entries per slot. */
static inline uint64_t ibvb_slot_count(const struct ibvb_ring *r) { return r->slot_count; }
static inline uint64_t ibvb_slot_size(const struct ibvb_ring *r) { return r->slot_size; }
static inline uint32_t ibvb_max_items(const struct ibvb_ring *r) { return r->max_items; }
/* Positions read (peeked) but not yet released. */
static inline uint64_t ibvb_held(const struct ibvb_ring *r) { return r->read - r->released; }

/* attached() (spec 2.1 §A): this consumer's row still says "ours" — an acquire load of its state, then an
 * acquire load of its generation (two 32-bit loads, in that order; never one 64-bit load over both). The
 * acquire fence first keeps every read of heap bytes before it from moving after the row loads. */
static inline int ibvb__attached(const struct ibvb_ring *r)
{
	ibvb__fence_acquire();
	return ibvb__load(&r->row->state, acquire) == r->row_state_ok &&
	       ibvb__load(&r->row->generation, acquire) == r->generation;
}

/* 1 if the heap h (handed out by this ring and not yet released) is still valid: the producer has not
 * detached this consumer, so it cannot have reused h's slot. Read h's bytes first, then call this: 1 proves
 * the bytes read were h's; 0 means this consumer was overrun (or detached) while holding h and the bytes may
 * be another heap's. No syscall: an acquire fence and two loads. */
static inline int ibvb_heap_valid(const struct ibvb_ring *r, const struct ibvb_heap *h)
{
	if (h->position - r->released >= r->read - r->released)
		return 0; /* not held: released already, or never handed out */
	if (r->mine && !r->mine[h->position & r->mask])
		return 0; /* a member's position that was not its own */
	return ibvb__attached(r);
}

/* A 2.2 member publishes what it has read and handed out (spec §14.2): release stores, before its tail
 * store and before it announces that it sleeps. */
static inline void ibvb__member_publish(struct ibvb_ring *r)
{
	r->read_stored = r->read;
	ibvb__store(&r->region->read, r->read, release);
	ibvb__store(&r->region->handed, r->handed, release);
}

/* Stores the released position to this consumer's tail (spec §7.4): release store, full fence, and if the
 * producer is waiting for a release, bump release_futex and FUTEX_WAKE it (out of line, rare). ibvb_release
 * calls it once per batch of releases (a store per heap would cost the producer a cache miss per heap);
 * peek calls it when it finds nothing to read, wait before it sleeps, detach before it leaves. No syscall
 * unless the producer waits. */
static inline void ibvb_flush_release(struct ibvb_ring *r)
{
	if (r->stored == r->released)
		return;
	if (r->group_bit)
		ibvb__member_publish(r); /* read and handed before tail: the producer loads tail, then read */
	r->stored = r->released;
	ibvb__store(&r->region->tail, r->released, release);
	ibvb__fence();
	if (__builtin_expect(ibvb__load(&r->ctl->producer_waiting, relaxed) != 0, 0))
		ibvb__wake_producer(r);
}

/* A member (spec §14) released through r->released: the positions it passed over after that go back too, up
 * to its next own held heap, and the tail is stored at once (the producer balances its group by it). */
static inline void ibvb__member_released(struct ibvb_ring *r)
{
	while (r->released != r->read && !r->mine[r->released & r->mask])
		r->released++;
	if (r->eos_pending && (int64_t)(r->released - r->eos_pos) > 0)
		r->eos_pending = 0;
	ibvb_flush_release(r);
}

/* Release every held position up to and including h->position (in position order). The views of those
 * heaps must not be touched afterwards. Releasing an already released position does nothing (0). The tail
 * store is batched (at most max(1, slot_count/8), ≤ 64 positions deferred; see ibvb_flush_release).
 * Returns 0, or -ESTALE when this consumer was detached (overrun, invalid cursor) while it held these heaps:
 * their bytes may have been rewritten (the release itself is still done; the next peek/wait reports why). */
static inline int ibvb_release(struct ibvb_ring *r, const struct ibvb_heap *h)
{
	uint64_t t = h->position + 1;
	if ((int64_t)(t - r->released) <= 0 || (int64_t)(t - r->read) > 0)
		return 0; /* already released, or never read */
	if (__builtin_expect(r->eos_pending, 0)) {
		if (t == r->eos_pos)
			t++; /* the END_OF_STREAM marker right after h goes with it */
		if ((int64_t)(t - r->eos_pos) > 0)
			r->eos_pending = 0;
	}
	r->released = t;
	if (__builtin_expect(r->mine != NULL, 0))
		ibvb__member_released(r);
	else if (t - r->stored >= r->release_batch)
		ibvb_flush_release(r);
	if (__builtin_expect(!ibvb__attached(r), 0))
		return ibvb__stale(r);
	return 0;
}

/* A member passes over position pos, another member's (spec §14): released at once when nothing before it
 * is held, else with the held heap before it. */
static inline void ibvb__pass_over(struct ibvb_ring *r, uint64_t pos)
{
	r->read = pos + 1;
	r->mine[pos & r->mask] = 0;
	if (r->released == pos) {
		r->released = pos + 1;
		if (r->released - r->stored >= r->release_batch)
			ibvb_flush_release(r);
	}
	if (r->read - r->read_stored >= r->release_batch)
		ibvb__member_flush(r); /* read may lag by at most a release batch (spec §14.2) */
}

/* Release everything read so far (same contract as ibvb_release on the newest held heap). */
static inline int ibvb_release_all(struct ibvb_ring *r)
{
	struct ibvb_heap h;
	if (r->read == r->released)
		return 0;
	h.position = r->read - 1;
	return ibvb_release(r, &h);
}

/* A member (spec §14) at position pos (descriptor copy d, seq checked): 1 if pos is another member's and was
 * passed over; else 0, and pos is noted as its own (unless END_OF_STREAM, which is everyone's). */
static inline int ibvb__member_passes(struct ibvb_ring *r, uint64_t pos, const struct ibvb_desc *d)
{
	uint32_t marker = d->flags & (IBVB_FLAG_END_OF_STREAM | IBVB_FLAG_STREAM_END); /* markers are everyone's */
	if (!(d->assign & r->group_bit) && !marker) {
		ibvb__pass_over(r, pos);
		return 1;
	}
	r->mine[pos & r->mask] = !marker;
	return 0;
}

/* Next heap without blocking: 0 and *h filled (the read position advances, so several heaps can be
 * held); -EAGAIN nothing published yet; -ENODATA end of stream (an END_OF_STREAM marker, which is
 * consumed, or a CLOSED ring drained); -EBADMSG corrupt descriptor, or an unknown header or row state
 * (spec §8; nothing is consumed); -EOVERFLOW /
 * -ECONNRESET this consumer was detached by the producer (overrun / invalid cursor; sticky: it must stop
 * reading). Spec 2.1 §A: the descriptor and item entries are copied into private memory and validated, then
 * the row is checked (every call): a heap is handed out only while this consumer is attached, so its slot
 * cannot have been reused under it. No syscall unless it flushes a release to a waiting producer. */
static inline int ibvb_peek(struct ibvb_ring *r, struct ibvb_heap *h)
{
again:;
	uint64_t pos = r->read;
	if (pos == r->cached_head) {
		r->cached_head = ibvb__load(&r->ctl->head, acquire);
		if (pos == r->cached_head) {
			/* head first, then the row: a detach the producer made before this head is seen (spec §7.6) */
			if (__builtin_expect(!ibvb__attached(r), 0)) {
				int rc = ibvb__row_changed(r);
				if (rc < 0)
					return rc;
			}
			ibvb_flush_release(r); /* caught up: hand the released slots back now */
			uint32_t st = ibvb__load(&r->ctl->state, acquire);
			if (st != IBVB_STATE_CLOSED)
				return st == IBVB_STATE_READY ? -EAGAIN : ibvb__corrupt_state(r, "header", st);
			/* CLOSED is stored after the last head: re-read it before calling the ring drained. */
			r->cached_head = ibvb__load(&r->ctl->head, acquire);
			if (pos == r->cached_head)
				return -ENODATA;
		}
		if (__builtin_expect(r->group_bit != 0 && r->cached_head - pos > r->slot_count, 0)) {
			int rc = ibvb__member_lapped(r, pos); /* spec §14.4: what it missed was not its own */
			if (rc < 0)
				return rc;
			goto again;
		}
		if (__builtin_expect(r->cached_head - r->released > r->slot_count, 0))
			return ibvb__corrupt_desc(r, pos, "head distance", r->cached_head - r->released, r->slot_count);
	}
	struct ibvb_desc d = r->desc[pos & r->mask]; /* one copy: every field below is the validated one */
	if (__builtin_expect(d.seq != pos + 1, 0)) {
		uint64_t ahead = d.seq - (pos + 1);
		if (r->group_bit == 0 || (ahead & r->mask) != 0 || ahead >= (1ull << 63))
			return ibvb__corrupt_desc(r, pos, "seq", d.seq, pos + 1);
		int rc = ibvb__member_lapped(r, pos); /* overwritten by a later lap: not its own (spec §14.4) */
		if (rc < 0)
			return rc;
		goto again;
	}
	if (__builtin_expect(r->group_bit != 0, 0)) {
		/* seq again after the copy (spec §14.4): another member's descriptor may have been rewritten
		 * meanwhile, and then the copy mixes two positions (the new assign with the old seq) */
#ifdef IBVB_TEST_DESC_COPIED
		IBVB_TEST_DESC_COPIED(r, pos, &d); /* tests only: a producer's rewrite between the copy and here */
#endif
		ibvb__fence_acquire();
		if (*(volatile const uint64_t *)&r->desc[pos & r->mask].seq != d.seq) {
			int rc = ibvb__member_lapped(r, pos);
			if (rc < 0)
				return rc;
			goto again;
		}
		if (ibvb__member_passes(r, pos, &d))
			goto again; /* another member's position: its seq checked, nothing else read (spec §14) */
	}
	if (__builtin_expect(d.slot >= r->slot_count, 0))
		return ibvb__corrupt_desc(r, pos, "slot", d.slot, r->slot_count);
	if (__builtin_expect(d.item_count > r->max_items, 0))
		return ibvb__corrupt_desc(r, pos, "item_count", d.item_count, r->max_items);
	if (__builtin_expect(d.received > r->slot_size, 0))
		return ibvb__corrupt_desc(r, pos, "received", d.received, r->slot_size);
	const struct ibvb_item *shared = r->items + (uint64_t)d.slot * r->max_items;
	struct ibvb_item *items = r->own_items + (pos & r->mask) * r->max_items;
	for (uint32_t i = 0; i < d.item_count; i++)
		items[i] = shared[i];
	for (uint32_t i = 0; i < d.item_count; i++) {
		if (items[i].flags & IBVB_ITEM_IMMEDIATE)
			continue;
		uint64_t v = items[i].value, l = items[i].length;
		if (__builtin_expect(v > r->slot_size || l > r->slot_size - v, 0))
			return ibvb__corrupt_desc(r, pos, "item bytes", v, l);
	}
	/* after the copies: still attached, so the producer had not begun to reuse the slot (spec 2.1 §A) */
	if (__builtin_expect(!ibvb__attached(r), 0)) {
		int rc = ibvb__row_changed(r);
		if (rc < 0)
			return rc;
	}
	r->read = pos + 1;
	if (__builtin_expect(d.flags & (IBVB_FLAG_END_OF_STREAM | IBVB_FLAG_STREAM_END), 0)) {
		/* Release the marker now unless earlier heaps are still held: releasing it would release them.
		 * (A later marker replaces a pending one; the earlier goes back with any release after it.) */
		if (r->released == pos) {
			struct ibvb_heap m;
			m.position = pos;
			ibvb_release(r, &m);
		} else {
			r->eos_pending = 1;
			r->eos_pos = pos;
		}
		if (!(d.flags & IBVB_FLAG_STREAM_END))
			return -ENODATA;
		/* STREAM_END (2.2): one stream ended, the ring goes on; *h says which marker */
		h->position = pos;
		h->heap_cnt = d.heap_cnt;
		h->heap_size = h->received = 0;
		h->timestamp_ns = d.timestamp_ns;
		h->flags = d.flags;
		h->item_count = h->packets = 0;
		h->slot = d.slot;
		h->payload = NULL;
		h->items = NULL;
		return IBVB_STREAM_END;
	}
	h->position = pos;
	h->heap_cnt = d.heap_cnt;
	h->heap_size = d.heap_size;
	h->received = d.received;
	h->timestamp_ns = d.timestamp_ns;
	h->flags = d.flags;
	h->item_count = d.item_count;
	h->packets = d.packets;
	h->slot = d.slot;
	h->payload = r->payload + (uint64_t)d.slot * r->slot_size;
	h->items = items;
	r->handed++;
	if (__builtin_expect(r->group_bit != 0 && r->read - r->read_stored >= r->release_batch, 0))
		ibvb__member_flush(r); /* read may lag by at most a release batch (spec §14.2) */
	return 0;
}

/* ---- batches (liburing's io_uring_for_each_cqe + io_uring_cq_advance) ------------------------- */

/* ibvb_for_each_heap(r, h, rc): run the loop body once for every heap published now, without waiting,
 * *h filled each time (h: struct ibvb_heap *). The heaps stay held: release them together afterwards
 * with ibvb_advance (or one by one with ibvb_release). The loop ends when ibvb_peek stops returning 0;
 * rc (an int lvalue) then holds why: -EAGAIN nothing more yet, -ENODATA end of stream, -EBADMSG a
 * corrupt descriptor, -EOVERFLOW/-ECONNRESET detached (see ibvb_peek).
 * At most slot_count heaps can be held: a body that holds heaps must advance. */
#define ibvb_for_each_heap(r, h, rc) for ((rc) = ibvb_peek((r), (h)); (rc) == 0; (rc) = ibvb_peek((r), (h)))

/* Release the n oldest held heaps, in position order (n larger than ibvb_held releases them all). Their
 * views must not be touched afterwards. One call, one batched tail store. 0 or -ESTALE (see ibvb_release). */
static inline int ibvb_advance(struct ibvb_ring *r, uint64_t n)
{
	struct ibvb_heap h;
	uint64_t held = r->read - r->released;
	if (n == 0 || held == 0)
		return 0;
	h.position = r->released + (n < held ? n : held) - 1;
	return ibvb_release(r, &h);
}

/* ---- chunks (spec §13) ----------------------------------------------------------------------- */

/* One chunk of a chunk-mode ring: heap is the position as ibvb_peek / ibvb_wait handed it out (release it
 * with ibvb_release(r, &c->heap); check ibvb_heap_valid(r, &c->heap) after reading, as for any heap).
 * data and present point into the ring's slot (read-only): data holds chunk_bytes bytes, heap position
 * (t, a) at (t × axis + a) × heap_size; present holds positions bytes, 1 = that heap arrived complete (any
 * other value reads as absent: use ibvb_chunk_present). Bytes of an absent position are undefined. A chunk
 * whose heap.flags has IBVB_FLAG_COMPLETE has every position present (spec §13.3): no need to read the map. */
struct ibvb_chunk {
	struct ibvb_heap heap;
	uint64_t chunk_id;     /* heap.heap_cnt: time index / heaps */
	const uint8_t *data;
	const uint8_t *present;
	uint32_t heaps, axis;  /* the geometry validated at attach */
	uint64_t heap_size;
	uint64_t positions;
	uint64_t chunk_bytes;
};

/* The ring's chunk geometry: 0 and *g filled, or -ENOTSUP (message set) when the ring is not in chunk
 * mode (its header has no CHUNKS feature). */
int ibvb_chunk_geometry(const struct ibvb_ring *r, struct ibvb_chunk_geometry *g);
/* View heap h (from ibvb_peek / ibvb_wait, still held) as a chunk, checked against the geometry validated at
 * attach (spec §13.5: the CHUNK flag, heap_size == chunk_bytes, received ≤ chunk_bytes, all from h, the
 * private descriptor copy): 0 and *c filled; -ENOTSUP not a chunk ring; -EBADMSG not a valid chunk (or
 * the detach error when the row says detached). The heap stays held either way. */
int ibvb_heap_chunk(struct ibvb_ring *r, const struct ibvb_heap *h, struct ibvb_chunk *c);
/* ibvb_wait, then ibvb_heap_chunk: 0 and *c filled (the chunk held), or ibvb_wait's errors (-ENODATA after
 * the last chunk), or ibvb_heap_chunk's (the position then stays held: ibvb_release_all gives it back). */
int ibvb_wait_chunk(struct ibvb_ring *r, struct ibvb_chunk *c, int timeout_ms);

/* Heap position (t, a)'s heap_size bytes, or NULL when (t, a) is outside the chunk. */
static inline const uint8_t *ibvb_chunk_heap(const struct ibvb_chunk *c, uint32_t t, uint32_t a)
{
	if (t >= c->heaps || a >= c->axis)
		return NULL;
	return c->data + ((uint64_t)t * c->axis + a) * c->heap_size;
}

/* 1 when heap position (t, a) arrived complete (its presence byte is exactly 1), else 0. */
static inline int ibvb_chunk_present(const struct ibvb_chunk *c, uint32_t t, uint32_t a)
{
	return t < c->heaps && a < c->axis && c->present[(uint64_t)t * c->axis + a] == 1;
}

/* ---- items ----------------------------------------------------------------------------------- */

/* 1 if the item's value is the value itself (an immediate), 0 if it is an offset into the payload. */
static inline int ibvb_item_is_immediate(const struct ibvb_item *it) { return (it->flags & IBVB_ITEM_IMMEDIATE) != 0; }

/* 1 if every byte of the heap is in its slot: COMPLETE and not TRUNCATED (a 2.2 producer never sets both,
 * spec §4.1; a 2.1 producer set COMPLETE|TRUNCATED on a cut heap whose bytes all arrived). */
static inline int ibvb_heap_complete(const struct ibvb_heap *h)
{
	return (h->flags & IBVB_FLAG_COMPLETE) && !(h->flags & IBVB_FLAG_TRUNCATED);
}

/* 1 if the item runs past the slot of a TRUNCATED heap: only its first it->length bytes are there. */
static inline int ibvb_item_is_cut(const struct ibvb_item *it) { return (it->flags & IBVB_ITEM_CUT) != 0; }

/* First item with this id in h's table, or NULL. */
static inline const struct ibvb_item *ibvb_find_item(const struct ibvb_heap *h, uint64_t id)
{
	for (uint32_t i = 0; i < h->item_count; i++)
		if (h->items[i].id == id)
			return &h->items[i];
	return NULL;
}

/* An address item's bytes (it->length of them) inside the heap payload; NULL for an immediate item. it must
 * be one of h->items (the private copy validated by peek: offset and length are never re-read from the
 * ring). The bytes themselves are the ring's: check ibvb_heap_valid after reading them. */
static inline const void *ibvb_item_ptr(const struct ibvb_heap *h, const struct ibvb_item *it)
{
	return ibvb_item_is_immediate(it) ? NULL : (const void *)(h->payload + it->value);
}

/* IBVB_PARTIAL: ibvb_item_data hands out the first bytes of a cut item too. */
#define IBVB_PARTIAL 0x1
/* An address item's bytes, refusing a cut one: NULL with errno EMSGSIZE when the item ran past the slot of
 * a TRUNCATED heap (unless flags has IBVB_PARTIAL: then its first it->length bytes), EINVAL for an
 * immediate item. *len (if not NULL) gets the byte count handed out. */
static inline const void *ibvb_item_data(const struct ibvb_heap *h, const struct ibvb_item *it, int flags, size_t *len)
{
	if (ibvb_item_is_immediate(it)) {
		errno = EINVAL;
		return NULL;
	}
	if (ibvb_item_is_cut(it) && !(flags & IBVB_PARTIAL)) {
		errno = EMSGSIZE;
		return NULL;
	}
	if (len)
		*len = it->length;
	return h->payload + it->value;
}

#define ibvb_for_each_item(h, it) for ((it) = (h)->items; (it) < (h)->items + (h)->item_count; (it)++)

#ifdef __cplusplus
} /* extern "C" */
#endif

/* The producer API (ibvbridge_producer.c). */
#include "ibvbridge_producer.h"
/* Items by name: descriptors, formats, dtypes (ibvbridge_items.c). */
#include "ibvbridge_items.h"

#endif /* IBVBRIDGE_H */
