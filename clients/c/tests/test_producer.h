/* test_producer.h — a minimal test-only ring producer implementing the producer side of
 * docs/ring-layout.md (§7.1 create, §7.5 publish, §7.4 wake, §7.6 close). Not for production use. */
#ifndef IBVB_TEST_PRODUCER_H
#define IBVB_TEST_PRODUCER_H

#include "../ibvbridge.h"

struct tp_opts {
	uint64_t slot_count;  /* default 8 */
	uint64_t slot_size;   /* default 4096 */
	uint32_t max_items;   /* default 8 */
	uint64_t meta_size;   /* default 4096 */
	uint64_t packet_size; /* default 0 */
	uint32_t policy;
	uint64_t start_pos;   /* initial head/tail */
	uint32_t futex_start; /* initial consumer_futex/producer_futex */
	uint32_t slot_shift;  /* slot = (pos + slot_shift) & mask, exercises the slot indirection; default 3 */
};

struct tp {
	char ctl_path[512], dat_path[512], lock_path[512], cons_path[512];
	int lock_fd, ctl_fd, dat_fd;
	struct ibvb_ctl *ctl;
	uint8_t *data;
	uint64_t data_size;
	struct ibvb_desc *desc;
	struct ibvb_item *items;
	uint8_t *payload;
	uint8_t *meta;
	uint64_t head, slot_count, slot_size, mask, meta_seq;
	uint32_t max_items, slot_shift;
};

/* Creates dir/ibvbridge.NAME.v1.{ctl,dat,lock}. Returns 0 or -errno. */
int tp_create(struct tp *p, const char *dir, const char *name, const struct tp_opts *o);
/* Fill len bytes with the ibvb-consume --verify pattern: byte i = (uint8_t)(heap_cnt*31 + i). */
void tp_pattern(uint8_t *buf, uint64_t heap_cnt, uint64_t len);
/* Writes a heap into the next position's slot without publishing it; returns the position.
 * -EAGAIN when the ring is full. payload NULL: pattern. */
int tp_stage(struct tp *p, uint64_t heap_cnt, const void *payload, uint64_t len, const struct ibvb_item *items,
	     uint32_t nitems, uint32_t flags, uint64_t *pos_out);
/* Stage + publish (head store + wake). */
int tp_publish(struct tp *p, uint64_t heap_cnt, const void *payload, uint64_t len, const struct ibvb_item *items,
	       uint32_t nitems, uint32_t flags);
/* Release-stores head = p->head and wakes a sleeping consumer. */
void tp_commit(struct tp *p);
int tp_publish_eos(struct tp *p);
/* Replace the metadata area contents (seqlock write). */
void tp_write_meta(struct tp *p, const void *records, uint64_t len);
/* Clean stop: state CLOSED, wake, unlink .ctl/.dat, unmap, close. */
void tp_close(struct tp *p);
/* Unmap and close without closing the ring (like a producer that vanished), unlinking nothing. */
void tp_abandon(struct tp *p);
/* Append a metadata record into buf at *off (test helper). */
void tp_meta_record(uint8_t *buf, size_t *off, uint64_t id, int ndim, const int64_t *shape, const char *name,
		    const char *desc, const char *fmt, const char *dtype);

#endif
