/* test_producer.h — a minimal test-only ring producer implementing the producer side of
 * docs/ring-layout.md 2.0: sealed memfds (§1), the listening socket and the handshake (§1.1-§1.2), the
 * consumer table (§2.2) and regions (§3), reclaim from the slowest attached consumer (§7.1-§7.3), wakes
 * (§7.5), end of stream, CLOSED and crash (§7.6). Not for production use.
 *
 * A thread (started by tp_create unless opts.no_server) accepts connections and answers hellos; every
 * tp_* call takes p->mu, so tests may call them from their own thread. Tests may also poke the producer's
 * writable mappings (p->ctl, p->rows, p->desc, ...) directly to corrupt things. */
#ifndef IBVB_TEST_PRODUCER_H
#define IBVB_TEST_PRODUCER_H

#include <pthread.h>

#include "../ibvbridge.h"

struct tp_opts {
	uint64_t slot_count;    /* default 8 */
	uint64_t slot_size;     /* default 4096 */
	uint32_t max_items;     /* default 8 */
	uint64_t meta_size;     /* default 4096 */
	uint64_t packet_size;   /* default 0 */
	uint32_t policy;
	uint64_t start_pos;     /* initial head (and oldest) */
	uint32_t futex_start;   /* initial consumer_futex of every region */
	uint32_t slot_shift;    /* slot = (pos + slot_shift) & mask, exercises the slot indirection; default 3 */
	uint32_t max_consumers; /* default 8 */
	int no_seal;            /* leave ctl and data unsealed (a consumer must refuse them) */
	int no_server;          /* no accept thread: call tp_serve yourself */
};

/* What the next handshakes answer (test hooks). */
enum tp_welcome_mode {
	TP_WELCOME_OK = 0,
	TP_WELCOME_SHORT,          /* a 40-byte welcome */
	TP_WELCOME_BAD_MAGIC,      /* welcome with another magic */
	TP_WELCOME_TWO_FDS,        /* ctl and data only */
	TP_WELCOME_UNSEALED_REGION,/* a region memfd without seals */
	TP_WELCOME_DATA_SIZE,      /* welcome.data_size 4096 too large */
	TP_WELCOME_MAJOR3,         /* welcome.major = 3 */
	TP_WELCOME_LONG,           /* a 256-byte welcome: a later minor's appended fields */
	TP_WELCOME_TOO_LONG,       /* a 300-byte welcome: truncated by the client's 256-byte buffer */
};

struct tp_cons {
	int fd;                     /* the connection; -1 when not attached */
	struct ibvb_region *region; /* our mapping of its region */
	uint64_t released;          /* last cursor accepted (§7.2) */
};

struct tp {
	char sock_path[512], name[80];
	int listen_fd, ctl_fd, dat_fd;
	struct ibvb_ctl *ctl;
	struct ibvb_row *rows;
	uint64_t ctl_size;
	uint32_t max_consumers;
	uint8_t *data;
	uint64_t data_size;
	struct ibvb_desc *desc;
	struct ibvb_item *items;
	uint8_t *payload;
	uint8_t *meta;
	uint64_t head, oldest, slot_count, slot_size, mask;
	uint32_t max_items, slot_shift, policy, futex_start;
	struct tp_cons cons[IBVB_MAX_CONSUMERS_LIMIT];
	pthread_mutex_t mu;
	pthread_t thr;
	int thr_on, stop_pipe[2];
	/* hooks: refuse_status != 0 answers every hello with that error record and refuse_msg */
	uint32_t refuse_status;
	char refuse_msg[200];
	enum tp_welcome_mode welcome_mode;
	int served; /* handshakes answered */
};

/* Creates the ring NAME in dir (dir/NAME.v2.sock, listening). Returns 0 or -errno. */
int tp_create(struct tp *p, const char *dir, const char *name, const struct tp_opts *o);
/* Answer every pending connection now (for opts.no_server). Returns how many were served. */
int tp_serve(struct tp *p);
/* Fill len bytes with the ibvb-consume --verify pattern: byte i = (uint8_t)(heap_cnt*31 + i). */
void tp_pattern(uint8_t *buf, uint64_t heap_cnt, uint64_t len);
/* Writes a heap into the next position's slot without publishing it; *pos_out = its position.
 * -EAGAIN when no slot is free after reclaiming (drop: the heap is dropped). payload NULL: pattern. */
int tp_stage(struct tp *p, uint64_t heap_cnt, const void *payload, uint64_t len, const struct ibvb_item *items,
	     uint32_t nitems, uint32_t flags, uint64_t *pos_out);
/* Stage + publish (head store + wake); counts heaps / dropped_heaps. */
int tp_publish(struct tp *p, uint64_t heap_cnt, const void *payload, uint64_t len, const struct ibvb_item *items,
	       uint32_t nitems, uint32_t flags);
/* Release-stores head = p->head, full fence, wakes waiting consumers (§7.5). */
void tp_commit(struct tp *p);
int tp_publish_eos(struct tp *p);
/* §7.2/§7.3 reclaim: reap consumers whose socket closed (row state 4), read and validate every attached
 * consumer's tail (invalid: state 3), recompute oldest. Returns the number attached. */
int tp_reclaim(struct tp *p);
/* Consumers attached now (after reaping those whose socket closed). */
int tp_attached(struct tp *p);
/* Mark row i detached with this state (2 overrun: lost_heaps = lost) and close its connection. */
void tp_detach_row(struct tp *p, uint32_t i, uint32_t state, uint64_t lost);
/* §7.4 producer side: announce producer_waiting, re-read consumer i's tail, FUTEX_WAIT on its
 * release_futex up to ms. Returns 1 if woken (release_futex moved), 0 on timeout. */
int tp_wait_release(struct tp *p, uint32_t i, int ms);
/* Replace the metadata area contents (seqlock write). */
void tp_write_meta(struct tp *p, const void *records, uint64_t len);
/* Clean stop: state CLOSED, wake every consumer, close connections, unlink the socket, unmap. */
void tp_close(struct tp *p);
/* Crash: close the sockets and unmap without CLOSED, leaving the socket file behind (stale). */
void tp_abandon(struct tp *p);
/* Append a metadata record into buf at *off (test helper). */
void tp_meta_record(uint8_t *buf, size_t *off, uint64_t id, int ndim, const int64_t *shape, const char *name,
		    const char *desc, const char *fmt, const char *dtype);

#endif
