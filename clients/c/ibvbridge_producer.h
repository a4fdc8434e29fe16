/* ibvbridge_producer.h — C producer for ibvbridge shared-memory SPEAD heap rings (layout 2.x).
 *
 * Included by ibvbridge.h; implemented in ibvbridge_producer.c (libibvbridge). Implements the producer side
 * of docs/ring-layout.md 2.2: the ring directory, lock and socket (§1.1), the handshake with its SO_PEERCRED
 * gate (§1.2), sealed control and data memfds (§1, §2, §4), one sealed region per consumer (§3), the slot
 * pool and reclaim from the slowest attached consumer (§7.1-§7.3), cursor validation (§7.2), waiting for a
 * release (§7.4), wakes (§7.5), the clean stop (§7.6) and consumer groups (layout 2.2 §14: a member's
 * hello brings its group; commit assigns each position to one member of every group from what members
 * publish — read and handed — idle members first; a slot is free once every independent consumer and its
 * assigned member released it; drop detaches exactly the consumers holding the ring back, block waits for
 * the first of them by name (ctl blocked_on); a leaving member is settled at its detach (group_lost);
 * grants limit who may join a group; no extra work per heap while no member is attached).
 *
 * Shape (liburing style): functions return 0 (or a count) and -errno on failure, ibvb_last_error() gives a
 * message for the last failure in the calling thread. The hot path (acquire, add_item, stage, commit,
 * publish, discard, counters) is static inline and makes no allocation and no system call per heap, except a
 * FUTEX_WAKE for a consumer that announced it sleeps (at most one per consumer per commit).
 *
 *   struct ibvb_producer *p;
 *   ibvb_producer_create(&p, "demo", NULL);           // the defaults: 256 × 1 MiB slots, drop, 8 consumers
 *   struct ibvb_slot s;
 *   if (ibvb_producer_acquire(p, &s) == 0) {          // -EAGAIN: drop policy and the ring is full
 *           memcpy(s.payload, data, n);
 *           ibvb_producer_add_item(&s, 0x1000, 0, n, 0);
 *           struct ibvb_publish_info h = {.heap_cnt = cnt, .heap_size = n, .received = n,
 *                                         .timestamp_ns = ibvb_producer_now_ns(), .flags = IBVB_FLAG_COMPLETE,
 *                                         .packets = 1};
 *           ibvb_producer_publish(p, &s, &h);
 *   } else {
 *           ibvb_producer_add(p, IBVB_CTR_DROPPED_HEAPS, 1);
 *   }
 *   ibvb_producer_end_of_stream(p, 0, 1000);
 *   ibvb_producer_close(p);
 *
 * Threads. A producer runs one service thread of its own: it accepts and answers consumers, notices a
 * consumer's death (its socket's EOF: row state 4), and every 100 ms stores heartbeat_ns and refreshes the
 * table's `released` columns. Everything else belongs to ONE hot-path thread (the caller's): acquire,
 * add_item, stage, commit, publish, discard, add, set, set_descriptors, end_of_stream, wait_drained.
 * From any thread: ibvb_producer_interrupt, ibvb_producer_consumers, ibvb_producer_counter and the
 * accessors. ibvb_producer_close: once the hot path has returned (interrupt a blocked one first).
 *
 * Guarantees (the Go producer's, spec §0): a consumer can write only its own 4 KiB region; the control and
 * data memory are sealed F_SEAL_SHRINK|GROW|FUTURE_WRITE|SEAL before any descriptor leaves the process;
 * every cursor read from a region is validated (outside [released, head]: the consumer is detached, row
 * state 3, consumer_errors); no slot is reused while an attached consumer has not released its position;
 * under drop a consumer that would hold the others back is detached as overrun, else the new heap is
 * dropped (never a held one overwritten); under block the producer waits on the slowest consumer's
 * release_futex in ≤ 250 ms slices; a stranger (not this euid, root or --group) gets an error record.
 */
#ifndef IBVBRIDGE_PRODUCER_H
#define IBVBRIDGE_PRODUCER_H

#include "ibvbridge.h"

#ifdef __cplusplus
extern "C" {
#endif

#define IBVB_HUGEPAGES_AUTO 0    /* hugetlb when the pool has the pages, else 4 KiB pages with a warning on stderr */
#define IBVB_HUGEPAGES_REQUIRE 1 /* fail (-ENOMEM) without hugepages */
#define IBVB_HUGEPAGES_OFF 2     /* 4 KiB pages */

#define IBVB_PRODUCER_DEFAULT_SLOT_COUNT 256
#define IBVB_PRODUCER_DEFAULT_SLOT_SIZE (1u << 20)
#define IBVB_PRODUCER_DEFAULT_MAX_ITEMS 64
#define IBVB_PRODUCER_DEFAULT_META_SIZE (64u << 10)

/* A grant (spec §14.1): the uids and gids allowed to join consumer group `name` (a member's hello carries
 * ibvb_group_id(name)). A peer is allowed when its uid (SO_PEERCRED) is listed, or its primary gid or one of
 * its real supplementary groups (SO_PEERGROUPS) is; uid 0 always is. */
struct ibvb_group_grant {
	const char *name;      /* 1-64 bytes of UTF-8 */
	const uint32_t *uids;
	size_t nuids;
	const uint32_t *gids;
	size_t ngids;
};
#define IBVB_PRODUCER_MAX_GRANTS 64          /* grants per producer */
#define IBVB_PRODUCER_MAX_GRANT_IDS 1024     /* uids + gids per grant */

/* Creation options; all-zero (or a NULL pointer) gives the defaults. */
struct ibvb_producer_opts {
	const char *dir;        /* ring directory; NULL: $IBVBRIDGE_RING_DIR, else /run/ibvbridge as root, else
				 * $XDG_RUNTIME_DIR/ibvbridge, else /dev/shm/ibvbridge-EUID — or, when a stranger
				 * made that one, /tmp/ibvbridge-EUID with a warning (spec 2.2 §1.1); made
				 * component by component, never through a symlink */
	uint64_t slot_count;    /* payload slots, a power of two in 1..2^24 (default 256) */
	uint64_t slot_size;     /* payload bytes per slot, rounded up to 64 (default 1 MiB) */
	uint32_t max_items;     /* item-table entries per slot, 1..65536 (default 64) */
	uint64_t meta_size;     /* stream-metadata area, >= 16 (default 64 KiB) */
	uint32_t policy;        /* IBVB_POLICY_DROP (default) or IBVB_POLICY_BLOCK */
	int hugepages;          /* IBVB_HUGEPAGES_AUTO (default), _REQUIRE or _OFF */
	uint32_t max_consumers; /* consumer-table rows, 1..64 (default 8) */
	const char *group;      /* members of this group may attach too (socket 0660); NULL: owner and root only */
	uint64_t packet_size;   /* packet area for a frame-level transport (default 0) */
	uint64_t features;      /* header features, e.g. IBVB_FEATURE_REPLAY_TIMESTAMPS */
	uint32_t max_observers; /* observer connections (`stat`, `ls`) at once, 1..16 (default 4); more: busy */
	/* Grants (spec §14.1), copied at create: with ngroups > 0 a hello whose group_id no grant names, or whose
	 * peer the grant does not list, is refused with status 2 ("not permitted to join group NAME");
	 * independent consumers are admitted as before. NULL / 0: every group is open to every consumer the
	 * ring admits. At most IBVB_PRODUCER_MAX_GRANTS, each with at most IBVB_PRODUCER_MAX_GRANT_IDS ids. */
	const struct ibvb_group_grant *groups;
	size_t ngroups;
};
#define IBVB_PRODUCER_DEFAULT_MAX_OBSERVERS 4
#define IBVB_PRODUCER_MAX_OBSERVERS 16
#define IBVB_PRODUCER_FD_RESERVE 32 /* new connections are refused while fewer descriptors are left */

/* A slot being filled: the ring's own memory. */
struct ibvb_slot {
	uint8_t *payload;        /* slot_size writable bytes */
	struct ibvb_item *items; /* the slot's item table (max_items entries); fill it with ibvb_producer_add_item */
	uint64_t size;           /* slot_size */
	uint32_t index;          /* slot index (the descriptor's `slot`) */
	uint32_t item_count;     /* entries added */
	uint32_t max_items;
	uint32_t overflow;       /* an item did not fit: ITEMS_OVERFLOW is set on publish */
};

/* What the producer knows about a heap when it publishes it (spec §4.1). */
struct ibvb_publish_info {
	uint64_t heap_cnt;
	uint64_t heap_size;    /* HEAP_LENGTH, or received with IBVB_FLAG_NO_HEAP_SIZE */
	uint64_t received;     /* payload bytes in the slot, <= slot_size */
	uint64_t timestamp_ns; /* CLOCK_REALTIME of the first packet (ibvb_producer_now_ns) */
	uint32_t flags;        /* IBVB_FLAG_* (ITEMS_OVERFLOW is added from the slot) */
	uint32_t packets;
};

/* ---- the handle (fields are private; defined here so the hot path can be inline) ---------------- */

struct ibvb__pwake {
	struct ibvb_region *region;
	struct ibvb_row *row;
};

struct ibvb__pstate; /* everything the service thread shares, behind a mutex (ibvbridge_producer.c) */

struct ibvb_producer {
	/* hot path, read-mostly */
	struct ibvb_ctl *ctl;
	struct ibvb_row *rows;
	uint8_t *data;
	struct ibvb_desc *desc;
	struct ibvb_item *items;
	uint8_t *payload;
	uint8_t *meta;
	uint32_t *free;     /* FIFO of free slots, slot_count entries */
	uint32_t *pos_slot; /* slot named by each unreleased position (& mask); IBVB__NO_SLOT when none */
	uint64_t mask, slot_count, slot_size, meta_size;
	uint32_t max_items, policy;
	/* hot path, written */
	uint64_t pos;          /* next position to stage */
	uint64_t committed;    /* head as last stored */
	uint64_t free_r, free_w;
	/* acquire refills when free_r reaches take_end as well as when the pool is empty: it keeps every
	 * position within slot_count of the oldest one still holding a slot and of every consumer's tail (spec
	 * §14: with consumer groups slots come back out of order). take_end = the window's end + discards; without
	 * groups it equals free_w but for discards, so the pool's emptiness decides as before. */
	uint64_t take_end;
	uint64_t pending_heaps; /* staged heaps (not markers) not yet counted */
	uint32_t ended;        /* END_OF_STREAM is staged: it is final (spec §4.1), nothing may follow it */
	uint64_t hot_gen;      /* the consumer set the wakes below were copied from */
	uint32_t hot_n;
	struct ibvb__pwake hot[IBVB_MAX_CONSUMERS_LIMIT];
	/* shared with the service thread */
	uint8_t pad_[64];
	IBVB_ATOMIC(uint64_t) set_gen; /* bumped (under the state mutex) when the consumer set changes */
	IBVB_ATOMIC(uint32_t) hot_busy; /* 1 while the hot path may use a consumer region outside the mutex: a
					 * detached region is unmapped at once unless it is set (spec 2.1 §C) */
	IBVB_ATOMIC(uint32_t) group_members; /* attached consumer-group members: commit assigns when non-zero */
	struct ibvb__pstate *st;
};
#define IBVB__NO_SLOT 0xFFFFFFFFu

/* ---- out of line ------------------------------------------------------------------------------ */

/* Create ring NAME (1-64 of [A-Za-z0-9_.-], not starting with '.') and start serving it. opts NULL: the
 * defaults. Order (spec §1): open and check the ring directory (mkdir 0755; a directory not owned by the
 * euid, writable by group/others or a symlink is refused: -EPERM); take the lock NAME.v2.lock (a symlink
 * there: -ELOOP; a live producer holds it: -EADDRINUSE "in use by a live producer"); size and reserve the
 * data memory (hugetlb: MAP_POPULATE, a shortage is -ENOMEM naming both sizes in MiB; shmem: refused with
 * -ENOMEM when larger than MemAvailable or the cgroup's limit, then fallocate) and the control memory; write
 * the header, state READY; seal both; bind NAME.v2.sock (0600, or 0660 and --group) through the directory
 * descriptor; start the service thread. Other errors: -EINVAL bad name or option (the message says which),
 * -ENAMETOOLONG the socket path does not fit a sockaddr_un, other -errno. *out = NULL on failure. */
int ibvb_producer_create(struct ibvb_producer **out, const char *name, const struct ibvb_producer_opts *opts);

/* Clean stop (spec §7.6): commit anything staged, state CLOSED (release store), wake every consumer, stop the
 * service thread, close every connection, unlink the socket and the lock, unmap, free. Attached consumers
 * drain what was published, then see the end of stream. Call once the hot path has returned (interrupt a
 * blocked one first); NULL is ignored. It does not publish END_OF_STREAM nor wait for consumers: call
 * ibvb_producer_end_of_stream and (block) ibvb_producer_wait_drained first. */
void ibvb_producer_close(struct ibvb_producer *p);

/* Make a blocked acquire, end_of_stream or wait_drained return -ECANCELED, now and from then on (sticky:
 * the producer is stopping). Safe from any thread and from a signal handler's thread via a flag. */
void ibvb_producer_interrupt(struct ibvb_producer *p);

/* Consumers attached now (the consumers_attached gauge). Any thread. */
int ibvb_producer_consumers(const struct ibvb_producer *p);

/* Wait (block policy, or any) until every attached consumer has released everything published, END_OF_STREAM
 * included. 0 drained; -ENOTCONN no consumer attached (nobody would ever drain it); -ETIMEDOUT after
 * timeout_ms (<0: no limit); -ECANCELED interrupted. Hot-path thread. Commits anything staged first. */
int ibvb_producer_wait_drained(struct ibvb_producer *p, int timeout_ms);

/* Publish the END_OF_STREAM marker (spec §4.1) for the stream-stop heap stop_heap_cnt (0: none), after
 * setting the end_of_stream counter, and commit it (with anything staged). It takes a slot like a heap: when
 * none is free (after reclaiming, and under drop after detaching overrun consumers) it waits up to
 * timeout_ms (0: not at all; <0: no limit) for the consumers, then gives -EAGAIN (close still marks the ring
 * CLOSED, which consumers also read as the end). -ECANCELED interrupted; -EPIPE when the marker was already
 * published (it is final, spec §4.1). Hot-path thread. */
int ibvb_producer_end_of_stream(struct ibvb_producer *p, uint64_t stop_heap_cnt, int timeout_ms);

/* Replace the stream-metadata area (spec §6 seqlock) with len bytes of records (build them with
 * ibvb_meta_encode). -EMSGSIZE when len > meta_size - 16. Call before publishing the heap that carried the
 * descriptors (HAS_DESCRIPTORS). Hot-path thread. */
int ibvb_producer_set_descriptors(struct ibvb_producer *p, const void *records, size_t len);

/* Encode one §6 record into buf (cap bytes): id, ndim (-1: shape unknown) and shape, then name, description,
 * SPEAD format bytes (fmt, fmt_len) and the numpy dtype header text. Returns the record size (a multiple of 8);
 * when that exceeds cap nothing is written (ask with cap 0). */
size_t ibvb_meta_encode(void *buf, size_t cap, uint64_t id, int ndim, const int64_t *shape, const char *name,
			const char *description, const void *fmt, size_t fmt_len, const char *dtype);

/* Counter by index (0..31), any thread. */
uint64_t ibvb_producer_counter(const struct ibvb_producer *p, unsigned idx);
/* The ring's socket path, its session id, its data memory's page size (4096 or the hugepage size), its
 * control and data memfds (for F_GET_SEALS checks; do not close them). */
const char *ibvb_producer_socket_path(const struct ibvb_producer *p);
uint64_t ibvb_producer_session_id(const struct ibvb_producer *p);
uint32_t ibvb_producer_page_size(const struct ibvb_producer *p);
int ibvb_producer_ctl_fd(const struct ibvb_producer *p);
int ibvb_producer_data_fd(const struct ibvb_producer *p);

/* internal, out of line (the hot path's slow paths) */
int ibvb__producer_refill(struct ibvb_producer *p);
void ibvb__producer_commit_groups(struct ibvb_producer *p);
void ibvb__producer_ended(struct ibvb_producer *p, const char *what); /* sets the -EPIPE message */
void ibvb__producer_adopt(struct ibvb_producer *p);
void ibvb__producer_wake(struct ibvb_producer *p, uint32_t i);
uint64_t ibvb__realtime_ns(void);
void ibvb__set_error(const char *msg);

/* ---- hot path (inline; the hot-path thread only) ------------------------------------------------ */

/* CLOCK_REALTIME in ns (vDSO: no system call), for ibvb_publish_info.timestamp_ns. */
static inline uint64_t ibvb_producer_now_ns(void) { return ibvb__realtime_ns(); }
static inline uint64_t ibvb_producer_slot_size(const struct ibvb_producer *p) { return p->slot_size; }
static inline uint64_t ibvb_producer_slot_count(const struct ibvb_producer *p) { return p->slot_count; }
static inline uint32_t ibvb_producer_max_items(const struct ibvb_producer *p) { return p->max_items; }
/* Positions staged but not committed. */
static inline uint64_t ibvb_producer_staged(const struct ibvb_producer *p) { return p->pos - p->committed; }

/* Add n to counter idx (spec §2.3; a relaxed atomic store: readers see it untorn). The producer's thread is
 * the only writer of every counter except consumers_attached, consumer_overruns, consumer_errors and
 * group_lost, which the library keeps: do not change those. heaps is counted by commit. */
static inline void ibvb_producer_add(struct ibvb_producer *p, unsigned idx, uint64_t n)
{
	IBVB_ATOMIC(uint64_t) *c = &p->ctl->stats[idx & (IBVB_STATS_SLOTS - 1)];
	ibvb__store(c, ibvb__load(c, relaxed) + n, relaxed);
}
static inline void ibvb_producer_set(struct ibvb_producer *p, unsigned idx, uint64_t v)
{
	ibvb__store(&p->ctl->stats[idx & (IBVB_STATS_SLOTS - 1)], v, relaxed);
}

/* Take a free slot for a new heap: 0 and *s filled (payload: slot_size writable bytes, an empty item
 * table). When the pool is empty it commits anything staged, then reclaims the slots every attached
 * consumer has released (§7.1, §7.2). Still none: drop policy detaches the slowest consumers as overrun if
 * another is ahead (§7.3), else returns -EAGAIN (the caller drops the heap and counts it:
 * ibvb_producer_add(p, IBVB_CTR_DROPPED_HEAPS, 1)); block policy waits for the slowest consumer (§7.4; with
 * none attached, for one to attach) and returns -ECANCELED once ibvb_producer_interrupt is called. */
static inline int ibvb_producer_acquire(struct ibvb_producer *p, struct ibvb_slot *s)
{
	if (__builtin_expect(p->ended, 0)) {
		ibvb__producer_ended(p, "acquire a slot");
		return -EPIPE;
	}
	if (__builtin_expect(p->free_r == p->free_w || p->free_r == p->take_end, 0)) {
		int rc = ibvb__producer_refill(p);
		if (rc < 0)
			return rc;
	}
	uint32_t idx = p->free[p->free_r & p->mask];
	p->free_r++;
	s->index = idx;
	s->size = p->slot_size;
	s->payload = p->payload + (uint64_t)idx * p->slot_size;
	s->items = p->items + (uint64_t)idx * p->max_items;
	s->item_count = 0;
	s->max_items = p->max_items;
	s->overflow = 0;
	return 0;
}

/* Append an item pointer (spec §5: id without the immediate bit; an address item's value is its offset in
 * the payload, length its bytes; an immediate's value is the value, length its width). 0, or -ENOSPC past
 * max_items (the item is left out and ITEMS_OVERFLOW is set on publish). */
static inline int ibvb_producer_add_item(struct ibvb_slot *s, uint64_t id, uint64_t value, uint64_t length,
					 uint32_t flags)
{
	if (__builtin_expect(s->item_count >= s->max_items, 0)) {
		s->overflow = 1;
		return -ENOSPC;
	}
	struct ibvb_item *it = &s->items[s->item_count++];
	it->id = id;
	it->value = value;
	it->length = length;
	it->flags = flags;
	it->reserved = 0;
	return 0;
}

/* Give an acquired slot back unpublished. */
static inline void ibvb_producer_discard(struct ibvb_producer *p, const struct ibvb_slot *s)
{
	p->free[p->free_w & p->mask] = s->index;
	p->free_w++;
	p->take_end++; /* its position was never taken */
}

/* Write the heap's descriptor at the next position without making it visible (spec §7.3: several heaps may
 * be published with one head store). received is clipped to slot_size. ibvb_producer_commit publishes every
 * staged heap; acquire commits by itself when the pool runs dry. The slot belongs to the ring afterwards.
 * 0; -EPIPE once END_OF_STREAM is staged (it is final, spec §4.1): nothing is staged, the slot goes back to
 * the pool, and acquire and end_of_stream refuse likewise. */
static inline int ibvb_producer_stage(struct ibvb_producer *p, const struct ibvb_slot *s,
				      const struct ibvb_publish_info *h)
{
	if (__builtin_expect(p->ended, 0)) {
		ibvb_producer_discard(p, s);
		ibvb__producer_ended(p, "publish a heap");
		return -EPIPE;
	}
	uint64_t pos = p->pos;
	struct ibvb_desc *d = &p->desc[pos & p->mask];
	d->heap_cnt = h->heap_cnt;
	d->heap_size = h->heap_size;
	d->received = h->received <= p->slot_size ? h->received : p->slot_size;
	d->timestamp_ns = h->timestamp_ns;
	d->slot = s->index;
	d->flags = h->flags | (s->overflow ? IBVB_FLAG_ITEMS_OVERFLOW : 0u);
	d->item_count = s->item_count;
	d->packets = h->packets;
	d->assign = 0;
	d->seq = pos + 1;
	p->pos_slot[pos & p->mask] = s->index;
	p->pos = pos + 1;
	p->pending_heaps += (h->flags & IBVB_FLAG_END_OF_STREAM) ? 0 : 1;
	p->ended = (h->flags & IBVB_FLAG_END_OF_STREAM) != 0;
	return 0;
}

/* Publish every staged heap: count them (heaps), with consumer groups assign each staged position to one
 * member of every group (spec §14, out of line, under the state mutex), release-store head, full fence, then
 * for each attached consumer whose consumer_waiting is set and whose wake_at head has reached: exchange
 * consumer_waiting with 0, consumer_futex += 1, FUTEX_WAKE (spec §7.5). */
static inline void ibvb_producer_commit(struct ibvb_producer *p)
{
	if (p->pos == p->committed)
		return;
	if (p->pending_heaps) {
		ibvb_producer_add(p, IBVB_CTR_HEAPS, p->pending_heaps);
		p->pending_heaps = 0;
	}
	if (__builtin_expect(ibvb__load(&p->group_members, relaxed) != 0, 0)) {
		ibvb__producer_commit_groups(p); /* assigns, stores committed and head, wakes (spec §14) */
		return;
	}
	p->committed = p->pos;
	ibvb__store(&p->hot_busy, 1, relaxed); /* the fence below orders it before the set_gen load */
	ibvb__store(&p->ctl->head, p->pos, release);
	ibvb__fence();
	if (__builtin_expect(ibvb__load(&p->set_gen, acquire) != p->hot_gen, 0))
		ibvb__producer_adopt(p);
	for (uint32_t i = 0; i < p->hot_n; i++)
		if (__builtin_expect(ibvb__load(&p->hot[i].region->consumer_waiting, relaxed) != 0, 0) &&
		    (int64_t)(p->pos - ibvb__load(&p->hot[i].region->wake_at, relaxed)) >= 0)
			ibvb__producer_wake(p, i);
	ibvb__store(&p->hot_busy, 0, release);
}

/* Stage and commit one heap. 0, or -EPIPE after END_OF_STREAM (see stage). */
static inline int ibvb_producer_publish(struct ibvb_producer *p, const struct ibvb_slot *s,
					const struct ibvb_publish_info *h)
{
	int rc = ibvb_producer_stage(p, s, h);
	ibvb_producer_commit(p);
	return rc;
}

/* Stage n heaps (slots[i] with infos[i]) and commit them with one head store. 0, or -EPIPE when a heap came
 * after END_OF_STREAM (those are not staged; their slots go back to the pool). */
static inline int ibvb_producer_publish_n(struct ibvb_producer *p, const struct ibvb_slot *slots,
					  const struct ibvb_publish_info *infos, size_t n)
{
	int rc = 0;
	for (size_t i = 0; i < n; i++)
		if (ibvb_producer_stage(p, &slots[i], &infos[i]) < 0)
			rc = -EPIPE;
	ibvb_producer_commit(p);
	return rc;
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* IBVBRIDGE_PRODUCER_H */
