/* test_ring.c — tests for the ibvbridge C consumer (layout 2.1) against the test-only C producer.
 * Usage: test_ring [path/to/ibvb-consume]. Each test runs in a forked child with an alarm, so a crash or a
 * hang fails that test only. IBVB_TEST=substring runs only matching tests. Prints "N passed, N failed". */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <grp.h>
#include <time.h>
#include <unistd.h>

#include "ibvbridge.h"
#include "harness.h"
#include "test_producer.h"

static char g_dir[256];
static const char *g_consume;

/* The ring's socket path in the test directory. */
static void sock_of(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s.v2.sock", g_dir, name); }

/* A sockaddr for path (the test paths are short; a long one fails the bind). */
static struct sockaddr_un sun_of(const char *path)
{
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	if (strlen(path) < sizeof sa.sun_path)
		memcpy(sa.sun_path, path, strlen(path) + 1);
	return sa;
}

/* This consumer's released cursor, as the producer reads it (its region's tail). */
#define TAIL(r) atomic_load(&(r)->region->tail)

/* Standard heap: pattern payload, item 0x1001 immediate = heap_cnt, address item 0x1600 at [8, 24). */
static int pub(struct tp *p, uint64_t heap_cnt, uint64_t len)
{
	struct ibvb_item it[2] = {
	    {.id = 0x1001, .value = heap_cnt, .length = 6, .flags = IBVB_ITEM_IMMEDIATE},
	    {.id = 0x1600, .value = 8, .length = 16, .flags = 0},
	};
	return tp_publish(p, heap_cnt, NULL, len, it, 2, IBVB_FLAG_COMPLETE);
}

static int pattern_ok(const struct ibvb_heap *h)
{
	for (uint64_t i = 0; i < h->received; i++)
		if (h->payload[i] != (uint8_t)(h->heap_cnt * 31 + i))
			return 0;
	return 1;
}

/* Wait until the producer has n consumers attached (the accept thread serves them). */
static int wait_attached(struct tp *p, int n)
{
	int64_t t0 = now_ms();
	while (tp_attached(p) != n) {
		if (now_ms() - t0 > 5000)
			return -1;
		usleep(500);
	}
	return 0;
}

/* ---------------------------------------------------------------------------------------------------- */

static void t_every_heap_arrives_byte_for_byte(void)
{
	struct tp p;
	char sock[512];
	CHECK_EQ(tp_create(&p, g_dir, "rt", NULL), 0);
	sock_of(sock, sizeof sock, "rt");
	for (int i = 0; i < 5; i++)
		CHECK_EQ(pub(&p, 100 + i, 100 + i * 37), 0);
	struct ibvb_ring *r;
	CHECK_EQ(ibvb_attach(&r, sock, 1000), 0);
	CHECK_EQ(ibvb_session_id(r), p.ctl->session_id);
	CHECK_EQ(ibvb_producer_pid(r), getpid());
	uint32_t idx = ibvb_consumer_index(r);
	CHECK(idx < 8);
	CHECK_EQ(atomic_load(&p.rows[idx].state), IBVB_CONSUMER_ATTACHED);
	CHECK_EQ(atomic_load(&p.rows[idx].pid), getpid()); /* from SO_PEERCRED */
	CHECK_EQ(atomic_load(&p.rows[idx].uid), geteuid());
	CHECK(atomic_load(&p.rows[idx].attach_ns) > 0);
	CHECK_EQ(atomic_load(&p.ctl->stats[IBVB_CTR_CONSUMERS_ATTACHED]), 1);
	CHECK(atomic_load(&r->region->spin_budget_ns) > 0);
	CHECK_EQ(ibvb_slot_count(r), 8);
	CHECK_EQ(ibvb_producer_alive(r), 1);
	for (int i = 0; i < 5; i++) {
		struct ibvb_heap h;
		CHECK_EQ(ibvb_peek(r, &h), 0);
		CHECK_EQ(h.position, i);
		CHECK_EQ(h.heap_cnt, 100 + i);
		CHECK_EQ(h.received, 100 + i * 37);
		CHECK_EQ(h.heap_size, 100 + i * 37);
		CHECK_EQ(h.flags, IBVB_FLAG_COMPLETE);
		CHECK_EQ(h.item_count, 2);
		CHECK_EQ(h.packets, 1);
		CHECK_EQ(h.slot, (i + 3) & 7);
		CHECK(h.timestamp_ns > 0);
		CHECK(pattern_ok(&h));
		ibvb_release(r, &h);
		CHECK_EQ(TAIL(r), i + 1);
	}
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(r, &h), -EAGAIN);
	CHECK_EQ(pub(&p, 200, 64), 0);
	CHECK_EQ(ibvb_wait(r, &h, 1000), 0);
	CHECK_EQ(h.heap_cnt, 200);
	ibvb_release(r, &h);
	CHECK_EQ(tp_reclaim(&p), 1);
	CHECK_EQ(atomic_load(&p.rows[idx].released), 6); /* the producer read and accepted our cursor */
	ibvb_detach(r);
	CHECK_EQ(tp_reclaim(&p), 0); /* our socket closed: the row is gone */
	CHECK_EQ(atomic_load(&p.rows[idx].state), IBVB_CONSUMER_GONE);
	CHECK_EQ(atomic_load(&p.ctl->stats[IBVB_CTR_CONSUMERS_ATTACHED]), 0);
	tp_close(&p);
}

/* ibvb_for_each_heap visits every heap published now, holding them; ibvb_advance releases them in one
 * tail store; the loop's rc says why it stopped (nothing more, or end of stream). */
static void t_for_each_heap_holds_and_advance_releases(void)
{
	struct tp p;
	char sock[512];
	CHECK_EQ(tp_create(&p, g_dir, "batch", NULL), 0);
	sock_of(sock, sizeof sock, "batch");
	struct ibvb_ring *r;
	CHECK_EQ(ibvb_attach(&r, sock, 1000), 0);
	for (int i = 0; i < 6; i++)
		CHECK_EQ(pub(&p, 10 + i, 64), 0);
	struct ibvb_heap h;
	int rc, n = 0;
	ibvb_for_each_heap(r, &h, rc)
	{
		CHECK_EQ(h.heap_cnt, 10 + n);
		CHECK(pattern_ok(&h));
		n++;
	}
	CHECK_EQ(rc, -EAGAIN);
	CHECK_EQ(n, 6);
	CHECK_EQ(ibvb_held(r), 6);
	CHECK_EQ(TAIL(r), 0); /* held: nothing released yet */
	ibvb_advance(r, 4);
	CHECK_EQ(ibvb_held(r), 2);
	ibvb_flush_release(r);
	CHECK_EQ(TAIL(r), 4);
	ibvb_advance(r, 100); /* more than held: everything */
	CHECK_EQ(ibvb_held(r), 0);
	CHECK_EQ(pub(&p, 20, 64), 0);
	CHECK_EQ(tp_publish_eos(&p), 0);
	n = 0;
	ibvb_for_each_heap(r, &h, rc) n++;
	CHECK_EQ(n, 1);
	CHECK_EQ(rc, -ENODATA);
	ibvb_advance(r, 1);
	ibvb_flush_release(r);
	CHECK_EQ(TAIL(r), 8); /* positions 0-5, heap 20 at 6, the end-of-stream marker at 7 */
	ibvb_detach(r);
	tp_close(&p);
}

static void t_items_are_found_by_id(void)
{
	struct tp p;
	char sock[512];
	CHECK_EQ(tp_create(&p, g_dir, "items", NULL), 0);
	sock_of(sock, sizeof sock, "items");
	CHECK_EQ(pub(&p, 7, 256), 0);
	CHECK_EQ(tp_publish(&p, 8, NULL, 32, NULL, 0, 0), 0);
	struct ibvb_ring *r;
	CHECK_EQ(ibvb_attach(&r, sock, 1000), 0);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(r, &h), 0);
	const struct ibvb_item *a = ibvb_find_item(&h, 0x1001), *b = ibvb_find_item(&h, 0x1600), *it;
	CHECK(a && b);
	CHECK(ibvb_item_is_immediate(a));
	CHECK_EQ(a->value, 7);
	CHECK_EQ(a->length, 6);
	CHECK(ibvb_item_ptr(&h, a) == NULL);
	CHECK(!ibvb_item_is_immediate(b));
	CHECK(ibvb_item_ptr(&h, b) == h.payload + 8);
	CHECK_EQ(b->length, 16);
	CHECK(((const uint8_t *)ibvb_item_ptr(&h, b))[0] == (uint8_t)(7 * 31 + 8));
	CHECK(ibvb_find_item(&h, 0x9999) == NULL);
	int n = 0;
	ibvb_for_each_item(&h, it) n++;
	CHECK_EQ(n, 2);
	CHECK_EQ(ibvb_peek(r, &h), 0);
	CHECK_EQ(h.item_count, 0);
	CHECK(ibvb_find_item(&h, 0x1001) == NULL);
	ibvb_release(r, &h);
	ibvb_detach(r);
	tp_close(&p);
}

/* One consumer holding heaps: the drop producer drops new heaps rather than overwrite a held one. */
static void t_held_heaps_make_drop_policy_drop_new_heaps(void)
{
	struct tp p;
	char sock[512];
	CHECK_EQ(tp_create(&p, g_dir, "hold", NULL), 0);
	sock_of(sock, sizeof sock, "hold");
	struct ibvb_ring *r;
	CHECK_EQ(ibvb_attach(&r, sock, 1000), 0);
	for (int i = 0; i < 8; i++)
		CHECK_EQ(pub(&p, i, 64), 0);
	CHECK_EQ(pub(&p, 8, 64), -EAGAIN); /* full: drop the new heap (the only consumer is not detached) */
	CHECK_EQ(atomic_load(&p.ctl->stats[IBVB_CTR_DROPPED_HEAPS]), 1);
	CHECK_EQ(atomic_load(&p.rows[ibvb_consumer_index(r)].state), IBVB_CONSUMER_ATTACHED);
	struct ibvb_heap h[3];
	for (int i = 0; i < 3; i++)
		CHECK_EQ(ibvb_peek(r, &h[i]), 0);
	CHECK_EQ(ibvb_held(r), 3);
	CHECK_EQ(TAIL(r), 0);
	for (int i = 0; i < 3; i++) /* held views stay intact */
		CHECK(pattern_ok(&h[i]));
	ibvb_release(r, &h[1]); /* batch: releases 0 and 1 */
	CHECK_EQ(TAIL(r), 2);
	ibvb_release(r, &h[0]); /* already released: no-op */
	CHECK_EQ(TAIL(r), 2);
	CHECK_EQ(ibvb_held(r), 1);
	CHECK_EQ(pub(&p, 8, 64), 0);
	CHECK_EQ(pub(&p, 9, 64), 0);
	CHECK_EQ(pub(&p, 10, 64), -EAGAIN);
	CHECK_EQ(atomic_load(&p.ctl->oldest), 2);
	CHECK(pattern_ok(&h[2])); /* the held slot was not reused */
	ibvb_release_all(r);
	CHECK_EQ(TAIL(r), 3);
	struct ibvb_heap x;
	for (int i = 3; i < 10; i++) {
		CHECK_EQ(ibvb_peek(r, &x), 0);
		CHECK_EQ(x.heap_cnt, i);
		CHECK(pattern_ok(&x));
		ibvb_release(r, &x);
	}
	CHECK_EQ(ibvb_peek(r, &x), -EAGAIN);
	ibvb_detach(r);
	tp_close(&p);
}

static void t_bad_magic_is_refused(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r = NULL;
	CHECK_EQ(tp_create(&p, g_dir, "magic", NULL), 0);
	sock_of(sock, sizeof sock, "magic");
	atomic_store(&p.ctl->magic, 0x1234);
	CHECK_EQ(ibvb_attach(&r, sock, 0), -EBADMSG);
	CHECK(strstr(ibvb_last_error(), "magic"));
	CHECK(r == NULL);
	atomic_store(&p.ctl->magic, IBVB_MAGIC);
	atomic_store(&p.ctl->state, IBVB_STATE_INIT); /* never handed out: corrupt */
	CHECK_EQ(ibvb_attach(&r, sock, 0), -EBADMSG);
	CHECK(strstr(ibvb_last_error(), "state 0"));
	atomic_store(&p.ctl->state, IBVB_STATE_READY);
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	ibvb_detach(r);
	tp_close(&p);
}

static void t_other_major_is_refused_naming_both(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "major", NULL), 0);
	sock_of(sock, sizeof sock, "major");
	p.ctl->major = 3; /* in the header */
	CHECK_EQ(ibvb_attach(&r, sock, 0), -EPROTONOSUPPORT);
	CHECK(strstr(ibvb_last_error(), "layout 3.")); /* the header's minor follows */
	CHECK(strstr(ibvb_last_error(), "speaks 2.2"));
	p.ctl->major = 2;
	p.welcome_mode = TP_WELCOME_MAJOR3; /* in a welcome (status 0): malformed, spec §1.2 */
	CHECK_EQ(ibvb_attach(&r, sock, 0), -EPROTO);
	CHECK(strstr(ibvb_last_error(), "major 3"));
	p.welcome_mode = TP_WELCOME_OK;
	p.refuse_status = IBVB_STATUS_VERSION; /* the producer's version error record */
	snprintf(p.refuse_msg, sizeof p.refuse_msg, "ring major is layout 2.0; this client speaks 3.0");
	CHECK_EQ(ibvb_attach(&r, sock, 0), -EPROTONOSUPPORT);
	CHECK(strstr(ibvb_last_error(), "this client speaks 3.0"));
	tp_close(&p);
}

static void t_newer_minor_and_unknown_fields_are_accepted(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "minor", NULL), 0);
	sock_of(sock, sizeof sock, "minor");
	p.ctl->minor = 7;
	p.ctl->features = 0xF0;   /* unknown bits ignored */
	p.ctl->stats_count = 15; /* more counters than we know */
	CHECK_EQ(pub(&p, 1, 10), 0);
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	struct ibvb_info in;
	CHECK_EQ(ibvb_info(r, &in), 0);
	CHECK_EQ(in.minor, 7);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(r, &h), 0);
	CHECK(pattern_ok(&h));
	ibvb_release(r, &h);
	ibvb_detach(r);
	tp_close(&p);
}

/* Every bad header value is refused with -EBADMSG, validated from the read-only control memory before the
 * data memory is mapped; a failed attach leaves nothing held (the last attach succeeds). */
static void t_corrupt_geometry_is_refused_before_mapping(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "geom", NULL), 0);
	sock_of(sock, sizeof sock, "geom");
	uint8_t saved[0x200];
	memcpy(saved, p.ctl, sizeof saved);
	struct ibvb_ctl *c = p.ctl;
	for (int k = 0;; k++) {
		memcpy(c, saved, sizeof saved);
		const char *what;
		switch (k) {
		case 0: what = "slot_count 3"; c->slot_count = 3; break;
		case 1: what = "slot_count 0"; c->slot_count = 0; break;
		case 2: what = "slot_count 2^25"; c->slot_count = 1u << 25; break;
		case 3: what = "slot_size 100"; c->slot_size = 100; break;
		case 4: what = "slot_size 0"; c->slot_size = 0; break;
		case 5: what = "max_items 0"; c->max_items = 0; break;
		case 6: what = "max_items 65537"; c->max_items = 65537; break;
		case 7: what = "desc_size 48"; c->desc_size = 48; break;
		case 8: what = "item_size 16"; c->item_size = 16; break;
		case 9: what = "page_size 1000"; c->page_size = 1000; break;
		case 10: what = "page_size 2048"; c->page_size = 2048; break;
		case 11: what = "items overlap descriptors"; c->items_offset = c->desc_offset; break;
		case 12: what = "payload overlaps metadata"; c->payload_offset = c->meta_offset; break;
		case 13: what = "payload outside data"; c->payload_offset = c->data_size; break;
		case 14: what = "meta_offset unaligned"; c->meta_offset += 8; break;
		case 15: what = "meta_size 8"; c->meta_size = 8; break;
		case 16: what = "data_size smaller than the welcome's"; c->data_size -= 4096; break;
		case 17: what = "data_size not page multiple"; c->data_size += 1; break;
		case 18: what = "slot_size overflow"; c->slot_size = 0xFFFFFFFFFFFFFFC0ULL; break;
		case 19: what = "desc_offset + size overflow"; c->desc_offset = UINT64_MAX - 4095; break;
		case 20: what = "packet_size past data"; c->packet_size = UINT64_MAX - 100; break;
		case 21: what = "ctl_size 12288"; c->ctl_size = 12288; break;
		case 22: what = "state 7"; atomic_store(&c->state, 7); break;
		case 23: what = "max_consumers 0"; c->max_consumers = 0; break;
		case 24: what = "max_consumers 65"; c->max_consumers = 65; break;
		case 25: what = "max_consumers 40 (ctl_size too small)"; c->max_consumers = 40; break;
		default: what = NULL;
		}
		if (!what)
			break;
		int rc = ibvb_attach(&r, sock, 0);
		if (rc != -EBADMSG)
			fprintf(stderr, "    case %d (%s): rc %d (%s)\n", k, what, rc, ibvb_last_error());
		CHECK_EQ(rc, -EBADMSG);
		CHECK(strstr(ibvb_last_error(), "corrupt"));
	}
	memcpy(c, saved, sizeof saved);
	/* the data memory's size differs from the welcome's (fstat, before mapping) */
	p.welcome_mode = TP_WELCOME_DATA_SIZE;
	CHECK_EQ(ibvb_attach(&r, sock, 0), -EBADMSG);
	CHECK(strstr(ibvb_last_error(), "bytes"));
	p.welcome_mode = TP_WELCOME_OK;
	/* none of the failures left a row held or the ring damaged */
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	CHECK_EQ(tp_attached(&p), 1);
	ibvb_detach(r);
	tp_close(&p);
}

/* Spec §9 step 5: a region of size 0 is checked only for offset <= data_size — not alignment, not overlap
 * (§2.1: an empty packet area's offset may be left at the unaligned end of the payload slots). */
static void t_zero_size_region_needs_only_offset_within_data(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "zero", NULL), 0);
	sock_of(sock, sizeof sock, "zero");
	struct ibvb_ctl *c = p.ctl;
	uint64_t pe = c->payload_offset + c->slot_count * c->slot_size, ds = c->data_size;
	uint64_t offs[] = {pe - 32, ds - 8, ds, ds + 1};
	int ok[] = {1, 1, 1, 0};
	c->packet_size = 0;
	for (int i = 0; i < 4; i++) {
		c->packet_offset = offs[i];
		int rc = ibvb_attach(&r, sock, 0);
		if (rc == 0) {
			CHECK_EQ(tp_attached(&p), 1);
			ibvb_detach(r);
			tp_reclaim(&p);
		}
		if (ok[i] != (rc == 0))
			fprintf(stderr, "    packet_offset %llu (data_size %llu): rc %d (%s)\n", (unsigned long long)offs[i],
				(unsigned long long)ds, rc, ibvb_last_error());
		CHECK_EQ(rc, ok[i] ? 0 : -EBADMSG);
	}
	tp_close(&p);
}

/* Spec §9.1 / §0: the client validates a private copy of the header and never reads a validated field from
 * producer memory again. A producer that rewrites meta_offset, meta_size and slot_count after the attach
 * cannot make the client read outside its mappings: the metadata is still read where it was validated. */
static void t_header_rewritten_after_attach_is_not_reread(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "reread", NULL), 0);
	sock_of(sock, sizeof sock, "reread");
	uint8_t rec[256];
	size_t off = 0;
	tp_meta_record(rec, &off, 0x1000, -1, NULL, "x", "", "", "");
	tp_write_meta(&p, rec, off);
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	p.ctl->meta_offset = 1ULL << 60; /* a hostile producer rewrites its header */
	p.ctl->meta_size = 1ULL << 40;
	p.ctl->slot_count = 1u << 24;
	uint8_t buf[256];
	CHECK_EQ(ibvb_read_meta(r, buf, sizeof buf, NULL), (long)off);
	struct ibvb_descriptors *ds = NULL;
	CHECK_EQ(ibvb_descriptors_read(r, &ds), 0);
	CHECK_EQ(ibvb_descriptor_count(ds), 1);
	ibvb_descriptors_free(ds);
	CHECK_EQ(pub(&p, 1, 10), 0);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(r, &h), 0);
	CHECK(pattern_ok(&h));
	ibvb_release(r, &h);
	ibvb_detach(r);
	tp_close(&p);
}

static void t_corrupt_descriptor_is_refused_unconsumed(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "desc", NULL), 0);
	sock_of(sock, sizeof sock, "desc");
	CHECK_EQ(pub(&p, 5, 100), 0);
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	struct ibvb_desc *d = &p.desc[0], sd = *d;
	struct ibvb_item *it = &p.items[(uint64_t)d->slot * p.max_items + 1], si = *it;
	struct ibvb_heap h;
	for (int k = 0;; k++) {
		*d = sd;
		*it = si;
		switch (k) {
		case 0: d->seq = 2; break;
		case 1: d->seq = 0; break;
		case 2: d->slot = 8; break;
		case 3: d->item_count = 9; break;
		case 4: d->received = 4097; break;
		case 5: it->value = 4096 - 4; it->length = 8; break;
		case 6: it->value = UINT64_MAX - 1; it->length = 4; break;
		case 7: it->value = 8; it->length = UINT64_MAX; break;
		case 8: it->value = 4097; it->length = 0; break;
		default: k = -1;
		}
		if (k < 0)
			break;
		int rc = ibvb_peek(r, &h);
		if (rc != -EBADMSG)
			fprintf(stderr, "    case %d: rc %d\n", k, rc);
		CHECK_EQ(rc, -EBADMSG);
		CHECK(strstr(ibvb_last_error(), "corrupt"));
		CHECK_EQ(ibvb_wait(r, &h, 0), -EBADMSG);
		CHECK_EQ(ibvb_held(r), 0); /* nothing consumed */
	}
	*d = sd;
	*it = si;
	it->value = 4096 - 16; /* exactly to the end of the slot is fine */
	it->length = 16;
	CHECK_EQ(ibvb_peek(r, &h), 0);
	CHECK_EQ(h.heap_cnt, 5);
	ibvb_release(r, &h);
	/* a corrupt descriptor under a consumer the producer detached is reported as the detach */
	CHECK_EQ(pub(&p, 6, 100), 0);
	p.desc[1].seq = 77;
	tp_detach_row(&p, ibvb_consumer_index(r), IBVB_CONSUMER_OVERRUN, 3);
	CHECK_EQ(ibvb_peek(r, &h), -EOVERFLOW);
	ibvb_detach(r);
	tp_close(&p);
}

/* max_consumers rows: one more is refused as busy; a detach frees a row; a new consumer starts at the
 * oldest heap still held. Bad names and paths. */
static void t_full_consumer_table_is_busy(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *a, *b, *c;
	struct tp_opts o = {.max_consumers = 2};
	CHECK_EQ(tp_create(&p, g_dir, "busy", &o), 0);
	sock_of(sock, sizeof sock, "busy");
	CHECK_EQ(p.ctl_size, 8192); /* 0x1000 + 2 × 128, rounded up */
	for (int i = 0; i < 3; i++)
		CHECK_EQ(pub(&p, 10 + i, 64), 0);
	CHECK_EQ(ibvb_attach(&a, sock, 0), 0);
	CHECK_EQ(ibvb_attach(&b, sock, 0), 0);
	CHECK(ibvb_consumer_index(a) != ibvb_consumer_index(b));
	CHECK_EQ(ibvb_attach(&c, sock, 0), -EBUSY);
	CHECK(strstr(ibvb_last_error(), "busy"));
	CHECK(strstr(ibvb_last_error(), "rows"));
	struct ibvb_heap h1, h2;
	CHECK_EQ(ibvb_peek(a, &h1), 0);
	CHECK_EQ(ibvb_peek(a, &h2), 0);
	ibvb_release(a, &h1); /* h2 is held when a detaches */
	uint32_t ia = ibvb_consumer_index(a);
	ibvb_detach(a);
	CHECK_EQ(ibvb_attach(&c, sock, 0), 0);
	CHECK_EQ(ibvb_consumer_index(c), ia); /* the freed row, next generation */
	CHECK_EQ(atomic_load(&p.rows[ia].generation), 2);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(c, &h), 0);
	CHECK_EQ(h.heap_cnt, 10); /* b still holds everything: the oldest heap is heap 10 */
	CHECK(pattern_ok(&h));
	ibvb_release(c, &h);
	CHECK_EQ(ibvb_peek(b, &h), 0); /* b unaffected */
	CHECK_EQ(h.heap_cnt, 10);
	ibvb_release(b, &h);
	/* by name: not in the default directories → ENOENT; invalid names and paths → EINVAL */
	CHECK_EQ(ibvb_attach(&a, "no-such-ring-ibvb-test", 0), -ENOENT);
	CHECK_EQ(ibvb_attach(&a, ".hidden", 0), -EINVAL);
	CHECK_EQ(ibvb_attach(&a, "a b", 0), -EINVAL);
	CHECK_EQ(ibvb_attach(&a, "/tmp/x.ctl", 0), -EINVAL);
	CHECK_EQ(ibvb_attach(&a, "/tmp/x.v1.sock", 0), -EINVAL);
	struct ibvb_attach_opts bad = {.start = 7};
	CHECK_EQ(ibvb_attach_opts(&a, sock, 0, &bad), -EINVAL);
	ibvb_detach(b);
	ibvb_detach(c);
	tp_close(&p);
}

/* Spec 2.1 §1.1: a ring no directory holds fails at once, naming where it looked, unless the caller asked to
 * wait (IBVB_ATTACH_WAIT: retried until the timeout); a stale socket (ECONNREFUSED) is retried until the
 * timeout, then reported as stale. */
static void t_missing_ring_fails_at_once_unless_waiting(void)
{
	char sock[512];
	struct ibvb_ring *r;
	sock_of(sock, sizeof sock, "nf");
	int64_t t0 = now_ms();
	CHECK_EQ(ibvb_attach(&r, sock, 20000), -ENOENT);
	CHECK(now_ms() - t0 < 10000); /* not the 20 s timeout */
	CHECK(strstr(ibvb_last_error(), "ring nf not found (looked in "));
	CHECK(strstr(ibvb_last_error(), g_dir));
	struct ibvb_attach_opts o = {.dir = g_dir, .start = 0, .flags = 0};
	CHECK_EQ(ibvb_attach_opts(&r, "nf", 20000, &o), -ENOENT);
	CHECK(now_ms() - t0 < 10000);
	o.flags = IBVB_ATTACH_WAIT;
	t0 = now_ms();
	CHECK_EQ(ibvb_attach_opts(&r, "nf", 80, &o), -ENOENT);
	CHECK(now_ms() - t0 >= 70);
	CHECK(strstr(ibvb_last_error(), "not found"));
	/* a stale socket (nobody listening: ECONNREFUSED) is retried, then reported as stale */
	int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	sock_of(sock, sizeof sock, "stale");
	struct sockaddr_un sa = sun_of(sock);
	CHECK_EQ(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	close(fd);
	t0 = now_ms();
	CHECK_EQ(ibvb_attach(&r, sa.sun_path, 50), -ECONNREFUSED);
	CHECK(now_ms() - t0 >= 40);
	CHECK(strstr(ibvb_last_error(), "stale socket"));
	CHECK(strstr(ibvb_last_error(), sa.sun_path));
	CHECK(strstr(ibvb_last_error(), "ibvbridge rm --stale"));
	unlink(sa.sun_path);
}

struct delayed {
	struct tp *p;
	int ms;
	int action; /* 0 create "late", 2 publish, 3 close, 4 kill pid, 5 abandon, 6 detach row (overrun) */
	pid_t pid;
	int64_t when;
	int rc;
	uint32_t row;
	const char *path; /* action 7: the stale socket to remove first */
};

static void *delayed_fn(void *arg)
{
	struct delayed *d = arg;
	msleep(d->ms);
	d->when = now_ms();
	switch (d->action) {
	case 0: d->rc = tp_create(d->p, g_dir, "late", NULL); break;
	case 2: d->rc = pub(d->p, 77, 64); break;
	case 3: tp_close(d->p); break;
	case 4: kill(d->pid, SIGKILL); break;
	case 5: tp_abandon(d->p); break;
	case 6: tp_detach_row(d->p, d->row, IBVB_CONSUMER_OVERRUN, 42); break;
	case 7: /* a starting producer: the stale socket goes, then, a moment later, its own is bound */
		unlink(d->path);
		msleep(60);
		d->rc = tp_create(d->p, g_dir, "late", NULL);
		break;
	}
	return NULL;
}

/* A stale socket for ring name (bound, then closed: connections are refused); sock and *sa get its path. */
static void stale_socket(char *sock, size_t cap, const char *name, struct sockaddr_un *sa)
{
	sock_of(sock, cap, name);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	*sa = sun_of(sock);
	CHECK_EQ(bind(fd, (struct sockaddr *)sa, sizeof *sa), 0);
	close(fd);
}

/* A stale socket for ring "late", then, after ms, delayed action (0: its producer starts; 7: the stale
 * socket goes and, 60 ms later, the producer binds its own): ibvb_attach, not asked to wait, connects. */
static void attach_after_stale(int action, int ms)
{
	struct tp q;
	char sock[512];
	struct ibvb_ring *r;
	pthread_t th;
	struct sockaddr_un sa;
	stale_socket(sock, sizeof sock, "late", &sa);
	struct delayed d = {.p = &q, .ms = ms, .action = action, .path = sa.sun_path};
	pthread_create(&th, NULL, delayed_fn, &d);
	int64_t t0 = now_ms();
	CHECK_EQ(ibvb_attach(&r, sock, 3000), 0);
	CHECK(now_ms() - t0 >= 90);
	pthread_join(th, NULL);
	CHECK_EQ(d.rc, 0);
	if (r)
		ibvb_detach(r);
	tp_close(&q);
}

/* The socket appears later; first a stale one (connection refused) is there: retried. */
static void t_attach_retries_a_stale_socket_until_the_producer_comes(void) { attach_after_stale(0, 100); }

/* The same with a gap: once a stale socket was seen, its disappearance is not "not found" — a starting
 * producer removes it before binding its own — so the client, not asked to wait, still waits for the
 * producer within its timeout. */
static void t_attach_awaits_a_producer_that_removed_the_stale_socket(void) { attach_after_stale(7, 40); }

static void t_wait_times_out(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "wto", NULL), 0);
	sock_of(sock, sizeof sock, "wto");
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	struct ibvb_heap h;
	/* a wait of 0 ms never sleeps: the thread makes no voluntary context switch (a futex sleep is one) */
	struct rusage u0, u1;
	CHECK_EQ(getrusage(RUSAGE_THREAD, &u0), 0);
	CHECK_EQ(ibvb_wait(r, &h, 0), -ETIMEDOUT);
	CHECK_EQ(getrusage(RUSAGE_THREAD, &u1), 0);
	CHECK_EQ(u1.ru_nvcsw - u0.ru_nvcsw, 0);
	int64_t t0 = now_ms();
	CHECK_EQ(ibvb_wait(r, &h, 300), -ETIMEDOUT); /* more than one 250 ms slice */
	int64_t el = now_ms() - t0;
	CHECK(el >= 290 && el < 1000);
	CHECK_EQ(atomic_load(&r->region->consumer_waiting), 0);
	ibvb_detach(r);
	tp_close(&p);
}

struct waker {
	struct tp *p;
	struct ibvb_region *region;
	int rounds;
	int64_t published[16];
	int rc;
};

/* Publish only once the consumer has announced itself and is (very likely) asleep on the futex. */
static void *waker_fn(void *arg)
{
	struct waker *w = arg;
	for (int i = 0; i < w->rounds; i++) {
		int64_t t0 = now_ms();
		while (atomic_load(&w->region->consumer_waiting) == 0) {
			if (now_ms() - t0 > 5000) {
				w->rc = -1;
				return NULL;
			}
			usleep(200);
		}
		msleep(20);
		w->published[i] = now_ms();
		if (pub(w->p, 1000 + i, 64) != 0)
			w->rc = -2;
	}
	return NULL;
}

static void wake_rounds(const char *name, uint32_t futex_start, int rounds)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	struct tp_opts o = {.futex_start = futex_start};
	CHECK_EQ(tp_create(&p, g_dir, name, &o), 0);
	sock_of(sock, sizeof sock, name);
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	CHECK_EQ(atomic_load(&r->region->consumer_futex), futex_start);
	struct waker w = {.p = &p, .region = r->region, .rounds = rounds};
	pthread_t th;
	pthread_create(&th, NULL, waker_fn, &w);
	for (int i = 0; i < rounds; i++) {
		struct ibvb_heap h;
		CHECK_EQ(ibvb_wait(r, &h, 5000), 0);
		int64_t lat = now_ms() - w.published[i];
		CHECK_EQ(h.heap_cnt, 1000 + i);
		if (lat > 150)
			fprintf(stderr, "    round %d: woke %lld ms after publish\n", i, (long long)lat);
		CHECK(lat <= 150); /* a lost wake-up would show as a 250 ms slice */
		ibvb_release(r, &h);
	}
	pthread_join(th, NULL);
	CHECK_EQ(w.rc, 0);
	CHECK_EQ(atomic_load(&r->region->consumer_futex), (uint32_t)(futex_start + rounds));
	CHECK_EQ(atomic_load(&p.rows[ibvb_consumer_index(r)].wakes), rounds);
	ibvb_detach(r);
	tp_close(&p);
}

static void t_wait_is_woken_by_publish(void) { wake_rounds("wake", 0, 5); }
static void t_wake_survives_futex_word_wrap(void) { wake_rounds("fwrap", 0xFFFFFFFEu, 5); }

struct trickle {
	struct tp *p;
	int heaps;
	int gap_us;
};

static void *trickle_fn(void *arg)
{
	struct trickle *t = arg;
	for (int i = 0; i < t->heaps; i++) {
		usleep((useconds_t)t->gap_us);
		pub(t->p, 2000 + i, 64);
	}
	return NULL;
}

/* With a latency bound (ibvb_set_max_latency) a moving stream's wakes are coalesced: every heap still
 * arrives in order and the producer wakes the consumer at most a couple of times for 40 heaps (a wake per
 * heap would be 40). An idle stream then sleeps until its next heap: a wait times out on time and a heap
 * after the pause is still delivered. */
static void t_latency_bound_coalesces_wakes(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	struct tp_opts o = {.slot_count = 64};
	CHECK_EQ(tp_create(&p, g_dir, "naps", &o), 0);
	sock_of(sock, sizeof sock, "naps");
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	/* 50 ms, a hundred of the trickle's steps: only a stall that long makes the stream look idle (a wake
	 * per heap after it), so a loaded machine's late sleeps do not */
	ibvb_set_max_latency(r, 50000000);
	struct trickle t = {.p = &p, .heaps = 40, .gap_us = 500};
	pthread_t th;
	pthread_create(&th, NULL, trickle_fn, &t);
	uint32_t futex_before = atomic_load(&r->region->consumer_futex);
	for (int i = 0; i < t.heaps; i++) {
		struct ibvb_heap h;
		CHECK_EQ(ibvb_wait(r, &h, 5000), 0);
		CHECK_EQ(h.heap_cnt, 2000 + i);
		ibvb_release(r, &h);
	}
	pthread_join(th, NULL);
	/* the first wait may find an idle stream and sleep on the futex once; a wake per heap would be 40 */
	CHECK(atomic_load(&r->region->consumer_futex) - futex_before <= 2);
	struct ibvb_heap h;
	int64_t t0 = now_ms();
	CHECK_EQ(ibvb_wait(r, &h, 100), -ETIMEDOUT);
	int64_t el = now_ms() - t0;
	CHECK(el >= 95 && el < 1000);
	CHECK_EQ(pub(&p, 3000, 64), 0);
	CHECK_EQ(ibvb_wait(r, &h, 1000), 0);
	CHECK_EQ(h.heap_cnt, 3000);
	ibvb_release(r, &h);
	ibvb_detach(r);
	tp_close(&p);
}

/* A producer process that creates NAME, publishes n heaps, says so on fd, and waits to be killed. */
static pid_t spawn_producer(const char *name, int n)
{
	int pfd[2];
	if (pipe(pfd) < 0)
		return -1;
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		struct tp p;
		close(pfd[0]);
		if (tp_create(&p, g_dir, name, NULL) != 0)
			_exit(1);
		for (int i = 0; i < n; i++)
			pub(&p, i, 64);
		char c = 'x';
		if (write(pfd[1], &c, 1) != 1)
			_exit(1);
		for (;;)
			pause();
	}
	close(pfd[1]);
	char c;
	ssize_t k = read(pfd[0], &c, 1);
	close(pfd[0]);
	if (k != 1) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		return -1;
	}
	return pid;
}

static void t_producer_death_is_seen_within_a_slice(void)
{
	char sock[512];
	pid_t pid = spawn_producer("death", 3);
	CHECK(pid > 0);
	sock_of(sock, sizeof sock, "death");
	struct ibvb_ring *r;
	int rc = ibvb_attach(&r, sock, 1000);
	if (rc != 0)
		kill(pid, SIGKILL);
	CHECK_EQ(rc, 0);
	CHECK_EQ(ibvb_producer_alive(r), 1);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_wait(r, &h, 1000), 0);
	ibvb_release(r, &h);
	/* kill it while we are about to sleep; the two remaining heaps still come out, then EPIPE */
	struct delayed d = {.ms = 100, .action = 4, .pid = pid};
	pthread_t th;
	pthread_create(&th, NULL, delayed_fn, &d);
	for (int i = 1; i < 3; i++) {
		CHECK_EQ(ibvb_wait(r, &h, 5000), 0);
		CHECK_EQ(h.heap_cnt, i);
		ibvb_release(r, &h);
	}
	int64_t t0 = now_ms();
	rc = ibvb_wait(r, &h, 10000);
	pthread_join(th, NULL);
	int64_t el = now_ms() - d.when;
	waitpid(pid, NULL, 0);
	CHECK_EQ(rc, -EPIPE);
	CHECK(strstr(ibvb_last_error(), "producer gone"));
	CHECK(el < 1000);
	CHECK(now_ms() - t0 < 1500);
	CHECK_EQ(ibvb_producer_alive(r), 0);
	ibvb_detach(r);
}

/* published-but-unread heaps come out before EPIPE even when the producer is already dead */
static void t_dead_producers_heaps_are_read_before_epipe(void)
{
	char sock[512];
	pid_t pid = spawn_producer("death2", 4);
	CHECK(pid > 0);
	sock_of(sock, sizeof sock, "death2");
	struct ibvb_ring *r;
	int rc = ibvb_attach(&r, sock, 1000);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	CHECK_EQ(rc, 0);
	struct ibvb_heap h;
	for (int i = 0; i < 4; i++) {
		CHECK_EQ(ibvb_wait(r, &h, 5000), 0);
		CHECK(pattern_ok(&h));
		ibvb_release(r, &h);
	}
	int64_t t0 = now_ms();
	CHECK_EQ(ibvb_wait(r, &h, -1), -EPIPE); /* never a hang, even with an infinite timeout */
	CHECK(now_ms() - t0 < 1000);
	ibvb_detach(r);
}

/* The fake producer closes its side without CLOSED (a crash in-process): -EPIPE after the drain; a
 * consumer asleep in wait notices within a futex slice. */
static void t_abandoned_ring_gives_epipe_then_a_stale_socket(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "aband", NULL), 0);
	sock_of(sock, sizeof sock, "aband");
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	CHECK_EQ(pub(&p, 1, 64), 0);
	CHECK_EQ(pub(&p, 2, 64), 0);
	tp_abandon(&p);
	CHECK_EQ(ibvb_producer_alive(r), 0);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_wait(r, &h, 1000), 0);
	CHECK(pattern_ok(&h)); /* our mappings outlive the producer's */
	ibvb_release(r, &h);
	CHECK_EQ(ibvb_wait(r, &h, 1000), 0);
	ibvb_release(r, &h);
	CHECK_EQ(ibvb_wait(r, &h, 1000), -EPIPE);
	CHECK(strstr(ibvb_last_error(), "producer gone"));
	ibvb_detach(r);

	CHECK_EQ(tp_create(&p, g_dir, "aband2", NULL), 0);
	sock_of(sock, sizeof sock, "aband2");
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	struct delayed d = {.p = &p, .ms = 100, .action = 5};
	pthread_t th;
	pthread_create(&th, NULL, delayed_fn, &d);
	CHECK_EQ(ibvb_wait(r, &h, 5000), -EPIPE);
	int64_t lat = now_ms() - d.when;
	pthread_join(th, NULL);
	CHECK(lat < 400); /* ≤ one 250 ms slice */
	ibvb_detach(r);
	/* a new consumer cannot attach to the crashed ring's stale socket */
	CHECK_EQ(ibvb_attach(&r, sock, 30), -ECONNREFUSED);
	CHECK(strstr(ibvb_last_error(), "stale socket"));
	unlink(sock);
}

static void t_closed_ring_is_drained_then_ends(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "closed", NULL), 0);
	sock_of(sock, sizeof sock, "closed");
	CHECK_EQ(pub(&p, 1, 64), 0);
	CHECK_EQ(pub(&p, 2, 64), 0);
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	tp_close(&p); /* closes the connections and unlinks the socket; our mappings stay valid */
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(r, &h), 0);
	CHECK(pattern_ok(&h));
	ibvb_release(r, &h);
	CHECK_EQ(ibvb_wait(r, &h, 1000), 0);
	ibvb_release(r, &h);
	CHECK_EQ(ibvb_peek(r, &h), -ENODATA);
	CHECK_EQ(ibvb_wait(r, &h, 1000), -ENODATA); /* CLOSED and drained: end of stream, not producer gone */
	ibvb_detach(r);

	/* a consumer asleep in wait is woken by the close */
	CHECK_EQ(tp_create(&p, g_dir, "closed2", NULL), 0);
	sock_of(sock, sizeof sock, "closed2");
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	struct delayed d = {.p = &p, .ms = 100, .action = 3};
	pthread_t th;
	pthread_create(&th, NULL, delayed_fn, &d);
	CHECK_EQ(ibvb_wait(r, &h, 5000), -ENODATA);
	int64_t lat = now_ms() - d.when;
	pthread_join(th, NULL);
	CHECK(lat < 150);
	ibvb_detach(r);

	/* attaching to a closed ring: status 4 */
	CHECK_EQ(tp_create(&p, g_dir, "closed3", NULL), 0);
	sock_of(sock, sizeof sock, "closed3");
	atomic_store(&p.ctl->state, IBVB_STATE_CLOSED);
	CHECK_EQ(ibvb_attach(&r, sock, 0), -ESHUTDOWN);
	CHECK(strstr(ibvb_last_error(), "closing"));
	tp_close(&p);
}

static void t_end_of_stream_marker_ends_reading(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "eos", NULL), 0);
	sock_of(sock, sizeof sock, "eos");
	CHECK_EQ(pub(&p, 1, 64), 0);
	CHECK_EQ(pub(&p, 2, 64), 0);
	CHECK_EQ(tp_publish_eos(&p), 0);
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	struct ibvb_heap h, h2;
	CHECK_EQ(ibvb_peek(r, &h), 0);
	ibvb_release(r, &h);
	CHECK_EQ(ibvb_peek(r, &h), 0);
	ibvb_release(r, &h);
	CHECK_EQ(ibvb_peek(r, &h), -ENODATA);
	CHECK_EQ(TAIL(r), 3);                /* the marker is released */
	CHECK_EQ(ibvb_peek(r, &h), -EAGAIN); /* producer alive, not closed */
	/* with heaps held, the marker is released together with the last of them */
	CHECK_EQ(pub(&p, 3, 64), 0);
	CHECK_EQ(pub(&p, 4, 64), 0);
	CHECK_EQ(tp_publish_eos(&p), 0);
	CHECK_EQ(ibvb_peek(r, &h), 0);
	CHECK_EQ(ibvb_peek(r, &h2), 0);
	CHECK_EQ(ibvb_peek(r, &h2), -ENODATA);
	CHECK_EQ(TAIL(r), 3); /* held heaps not released by the marker */
	CHECK(pattern_ok(&h));
	ibvb_release(r, &h);
	CHECK_EQ(TAIL(r), 4);
	CHECK_EQ(ibvb_peek(r, &h2), -EAGAIN);
	h2.position = 4;
	ibvb_release(r, &h2);
	CHECK_EQ(TAIL(r), 6);
	ibvb_detach(r);
	tp_close(&p);
}

/* 2.2: a STREAM_END marker (recv --keep-going) is returned in order as IBVB_STREAM_END with the stop heap's
 * cnt, is released with the heaps before it, and reading goes on into the next stream, whose heap cnts
 * start again; END_OF_STREAM still ends the ring. */
static void t_stream_end_marker_is_seen_in_order_and_reading_goes_on(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "streams", NULL), 0);
	sock_of(sock, sizeof sock, "streams");
	CHECK_EQ(pub(&p, 1, 64), 0);
	CHECK_EQ(tp_publish(&p, 3, NULL, 0, NULL, 0, IBVB_FLAG_STREAM_END), 0);
	CHECK_EQ(pub(&p, 1, 64), 0);
	CHECK_EQ(pub(&p, 2, 64), 0);
	CHECK_EQ(tp_publish(&p, 9, NULL, 0, NULL, 0, IBVB_FLAG_STREAM_END), 0);
	CHECK_EQ(tp_publish_eos(&p), 0);
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	struct ibvb_heap h, h2;
	CHECK_EQ(ibvb_peek(r, &h), 0);
	CHECK_EQ(h.heap_cnt, 1);
	CHECK_EQ(ibvb_peek(r, &h2), IBVB_STREAM_END); /* held heap 1: the marker waits for it */
	CHECK_EQ(h2.heap_cnt, 3);
	CHECK_EQ(h2.position, 1);
	CHECK(h2.flags & IBVB_FLAG_STREAM_END);
	CHECK_EQ(TAIL(r), 0);
	ibvb_release(r, &h);
	CHECK_EQ(TAIL(r), 2); /* heap 1 and the marker after it */
	CHECK_EQ(ibvb_wait(r, &h, 1000), 0);
	CHECK_EQ(h.heap_cnt, 1); /* the next stream counts from 1 again */
	ibvb_release(r, &h);
	CHECK_EQ(ibvb_wait(r, &h, 1000), 0);
	CHECK_EQ(h.heap_cnt, 2);
	ibvb_release(r, &h);
	CHECK_EQ(ibvb_wait(r, &h, 1000), IBVB_STREAM_END);
	CHECK_EQ(h.heap_cnt, 9);
	CHECK_EQ(TAIL(r), 5); /* nothing held: released at once */
	CHECK_EQ(ibvb_wait(r, &h, 1000), -ENODATA); /* the ring's end */
	ibvb_detach(r);
	tp_close(&p);
}

/* 2.2: a TRUNCATED heap is never complete (ibvb_heap_complete), even if a 2.1 producer also set COMPLETE; a
 * cut item is refused by ibvb_item_data (EMSGSIZE) and ibvb_item_decode unless IBVB_PARTIAL asks for its
 * first bytes; an item that is not cut reads as usual. */
static void t_truncated_heap_is_not_complete_and_cut_items_are_refused(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "trunc", NULL), 0);
	sock_of(sock, sizeof sock, "trunc");
	struct ibvb_item items[2] = {{.id = 0x1000, .value = 0, .length = 1024, .flags = 0},
				     {.id = 0x1001, .value = 1024, .length = 4096 - 1024, .flags = IBVB_ITEM_CUT}};
	CHECK_EQ(tp_publish(&p, 1, NULL, 4096, items, 2, IBVB_FLAG_TRUNCATED), 0);
	CHECK_EQ(tp_publish(&p, 2, NULL, 4096, items, 2, IBVB_FLAG_TRUNCATED | IBVB_FLAG_COMPLETE), 0);
	CHECK_EQ(pub(&p, 3, 64), 0);
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	struct ibvb_heap h;
	for (int k = 0; k < 2; k++) {
		CHECK_EQ(ibvb_wait(r, &h, 1000), 0);
		CHECK(!ibvb_heap_complete(&h));
		const struct ibvb_item *whole = ibvb_find_item(&h, 0x1000), *cut = ibvb_find_item(&h, 0x1001);
		CHECK(whole && cut && ibvb_item_is_cut(cut) && !ibvb_item_is_cut(whole));
		size_t n = 0;
		errno = 0;
		CHECK(ibvb_item_data(&h, cut, 0, &n) == NULL);
		CHECK_EQ(errno, EMSGSIZE);
		CHECK(ibvb_item_data(&h, cut, IBVB_PARTIAL, &n) == h.payload + 1024);
		CHECK_EQ(n, 4096 - 1024);
		CHECK(ibvb_item_data(&h, whole, 0, &n) == h.payload);
		CHECK_EQ(n, 1024);
		ibvb_release(r, &h);
	}
	CHECK_EQ(ibvb_wait(r, &h, 1000), 0);
	CHECK(ibvb_heap_complete(&h));
	ibvb_detach(r);
	tp_close(&p);
}

/* The control and data mappings are read-only and cannot be made writable (sealed F_SEAL_FUTURE_WRITE);
 * the region is ours to write. */
static void t_ring_mappings_cannot_be_written(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "ro", NULL), 0);
	sock_of(sock, sizeof sock, "ro");
	CHECK_EQ(pub(&p, 1, 64), 0);
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(r, &h), 0);
	for (int k = 0; k < 3; k++) {
		pid_t pid = fork();
		CHECK(pid >= 0);
		if (pid == 0) {
			signal(SIGSEGV, SIG_DFL);
			if (k == 0)
				*(volatile uint8_t *)h.payload = 1;
			else if (k == 1)
				*(volatile uint64_t *)&r->desc[0].seq = 99;
			else
				*(volatile uint64_t *)(volatile void *)&r->ctl->head = 99;
			_exit(0);
		}
		int st;
		waitpid(pid, &st, 0);
		CHECK(WIFSIGNALED(st));
		CHECK_EQ(WTERMSIG(st), SIGSEGV);
	}
	errno = 0;
	CHECK_EQ(mprotect((void *)r->data, r->data_size, PROT_READ | PROT_WRITE), -1);
	CHECK(errno == EACCES || errno == EPERM);
	errno = 0;
	CHECK_EQ(mprotect((void *)r->ctl, r->ctl_size, PROT_READ | PROT_WRITE), -1);
	CHECK(errno == EACCES || errno == EPERM);
	CHECK(pattern_ok(&h));
	ibvb_release(r, &h);
	ibvb_detach(r);
	tp_close(&p);
}

/* Memory without the required seals is refused (a fake producer could shrink it under us). */
static void t_unsealed_memory_is_refused(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	struct tp_opts o = {.no_seal = 1};
	CHECK_EQ(tp_create(&p, g_dir, "unseal", &o), 0);
	sock_of(sock, sizeof sock, "unseal");
	CHECK_EQ(ibvb_attach(&r, sock, 0), -EBADMSG);
	CHECK(strstr(ibvb_last_error(), "seals"));
	tp_close(&p);
	CHECK_EQ(tp_create(&p, g_dir, "unseal2", NULL), 0);
	sock_of(sock, sizeof sock, "unseal2");
	p.welcome_mode = TP_WELCOME_UNSEALED_REGION;
	CHECK_EQ(ibvb_attach(&r, sock, 0), -EBADMSG);
	CHECK(strstr(ibvb_last_error(), "region"));
	tp_close(&p);
}

static void t_cursors_wrap_around_2_64(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	uint64_t start = UINT64_MAX - 2; /* 2^64 - 3 */
	struct tp_opts o = {.slot_count = 4, .start_pos = start};
	CHECK_EQ(tp_create(&p, g_dir, "wrap", &o), 0);
	sock_of(sock, sizeof sock, "wrap");
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	uint64_t cnt = 0, pos = start;
	for (int round = 0; round < 4; round++) {
		for (int i = 0; i < 4; i++)
			CHECK_EQ(pub(&p, cnt + i, 40 + i), 0);
		CHECK_EQ(pub(&p, 99, 40), -EAGAIN);
		struct ibvb_heap h[4];
		for (int i = 0; i < 4; i++) {
			CHECK_EQ(ibvb_wait(r, &h[i], 1000), 0);
			CHECK_EQ(h[i].position, pos);
			CHECK_EQ(h[i].heap_cnt, cnt + i);
			CHECK(pattern_ok(&h[i]));
			pos++;
		}
		CHECK_EQ(ibvb_held(r), 4);
		ibvb_release(r, &h[3]);
		CHECK_EQ(TAIL(r), pos);
		cnt += 4;
	}
	CHECK_EQ(pos, start + 16);
	CHECK(pos < start); /* wrapped */
	ibvb_detach(r);
	tp_close(&p);
}

static void t_metadata_is_read_consistently(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "meta", NULL), 0);
	sock_of(sock, sizeof sock, "meta");
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	uint8_t buf[1024];
	size_t need;
	CHECK_EQ(ibvb_read_meta(r, buf, sizeof buf, &need), 0);
	uint8_t rec[512];
	size_t n = 0;
	int64_t shape[2] = {8, -1};
	tp_meta_record(rec, &n, 0x1600, 2, shape, "data", "the samples", "", "{'descr': '>u4'}");
	tp_meta_record(rec, &n, 0x1001, -1, NULL, "timestamp", "", "u\x00\x00\x30", "");
	tp_write_meta(&p, rec, n);
	long len = ibvb_read_meta(r, buf, sizeof buf, &need);
	CHECK_EQ(len, (long)n);
	CHECK_EQ(ibvb_read_meta(r, buf, 10, &need), -ENOBUFS);
	CHECK_EQ(need, n);
	struct ibvb_meta_record m;
	size_t off = 0;
	CHECK_EQ(ibvb_meta_next(buf, (size_t)len, &off, &m), 1);
	CHECK_EQ(m.id, 0x1600);
	CHECK_EQ(m.ndim, 2);
	CHECK_EQ(ibvb_meta_dim(&m, 0), 8);
	CHECK_EQ(ibvb_meta_dim(&m, 1), -1);
	CHECK(m.name_len == 4 && !memcmp(m.name, "data", 4));
	CHECK(m.description_len == 11 && !memcmp(m.description, "the samples", 11));
	CHECK_EQ(m.format_len, 0);
	CHECK(m.dtype_len == 16 && !memcmp(m.dtype, "{'descr': '>u4'}", 16));
	CHECK_EQ(ibvb_meta_next(buf, (size_t)len, &off, &m), 1);
	CHECK_EQ(m.id, 0x1001);
	CHECK_EQ(m.ndim, IBVB_META_NDIM_UNKNOWN);
	CHECK(m.name_len == 9 && !memcmp(m.name, "timestamp", 9));
	CHECK_EQ(m.format_len, 1); /* strlen stops at the NUL: fine for a test */
	CHECK_EQ(ibvb_meta_next(buf, (size_t)len, &off, &m), 0);
	/* corrupt records */
	uint32_t bad = 4096;
	memcpy(buf, &bad, 4); /* record_size past length */
	off = 0;
	CHECK_EQ(ibvb_meta_next(buf, (size_t)len, &off, &m), -EBADMSG);
	bad = 0;
	memcpy(buf, &bad, 4); /* zero size: would loop forever */
	off = 0;
	CHECK_EQ(ibvb_meta_next(buf, (size_t)len, &off, &m), -EBADMSG);
	bad = 40;
	memcpy(buf, &bad, 4); /* fields run past record_size */
	off = 0;
	CHECK_EQ(ibvb_meta_next(buf, (size_t)len, &off, &m), -EBADMSG);
	/* length larger than the area */
	uint64_t huge = p.ctl->meta_size;
	memcpy(p.meta + 8, &huge, 8);
	CHECK_EQ(ibvb_read_meta(r, buf, sizeof buf, &need), -EBADMSG);
	ibvb_detach(r);
	tp_close(&p);
}

static void t_stats_counters_are_read_by_name_and_index(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "stats", NULL), 0);
	sock_of(sock, sizeof sock, "stats");
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	for (int i = 0; i < IBVB_CTR_COUNT; i++)
		atomic_store(&p.ctl->stats[i], 100 + i);
	atomic_store(&p.ctl->stats[20], 5); /* beyond stats_count: reads as 0 */
	struct ibvb_stats s;
	CHECK_EQ(ibvb_stats(r, &s), 0);
	CHECK_EQ(s.packets, 100);
	CHECK_EQ(s.bytes, 101);
	CHECK_EQ(s.heaps, 102);
	CHECK_EQ(s.incomplete_heaps, 103);
	CHECK_EQ(s.dropped_heaps, 104);
	CHECK_EQ(s.malformed_packets, 105);
	CHECK_EQ(s.duplicate_packets, 106);
	CHECK_EQ(s.truncated_heaps, 107);
	CHECK_EQ(s.discarded_incomplete_heaps, 108);
	CHECK_EQ(s.end_of_stream, 109);
	CHECK_EQ(s.consumers_attached, 110);
	CHECK_EQ(s.consumer_overruns, 111);
	CHECK_EQ(s.consumer_errors, 112);
	CHECK_EQ(ibvb_counter(r, 20), 0);
	CHECK_EQ(ibvb_counter(r, 99), 0);
	CHECK(!strcmp(ibvb_counter_name(8), "discarded_incomplete_heaps"));
	CHECK(!strcmp(ibvb_counter_name(10), "consumers_attached"));
	CHECK(!strcmp(ibvb_counter_name(12), "consumer_errors"));
	CHECK(!strcmp(ibvb_counter_name(13), "chunks"));
	CHECK(!strcmp(ibvb_counter_name(16), "rejected_heaps"));
	CHECK(!strcmp(ibvb_counter_name(17), "group_lost"));
	CHECK(!strcmp(ibvb_counter_name(18), "group_skipped"));
	CHECK(!strcmp(ibvb_counter_name(19), "streams_ended"));
	CHECK(ibvb_counter_name(20) == NULL);
	p.ctl->stats_count = 3;
	CHECK_EQ(ibvb_counter(r, 2), 102);
	CHECK_EQ(ibvb_counter(r, 3), 0);
	struct ibvb_info in;
	CHECK_EQ(ibvb_info(r, &in), 0);
	CHECK_EQ(in.major, 2);
	CHECK_EQ(in.state, IBVB_STATE_READY);
	CHECK_EQ(in.slot_size, 4096);
	CHECK_EQ(in.max_items, 8);
	CHECK_EQ(in.max_consumers, 8);
	CHECK_EQ(in.ctl_size, p.ctl_size);
	CHECK_EQ(in.data_size, p.data_size);
	CHECK_EQ(in.consumer_index, ibvb_consumer_index(r));
	CHECK_EQ(in.generation, 1);
	CHECK_EQ(in.row_state, IBVB_CONSUMER_ATTACHED);
	ibvb_detach(r);
	tp_close(&p);
}

struct pwaiter {
	struct tp *p;
	uint32_t idx;
	int woke;
	int64_t when;
};

static void *pwaiter_fn(void *arg)
{
	struct pwaiter *w = arg;
	w->woke = tp_wait_release(w->p, w->idx, 5000);
	w->when = now_ms();
	return NULL;
}

/* §7.4: a release while the producer waits bumps the region's release_futex and wakes it; without a
 * waiting producer the release makes no wake. */
static void t_release_wakes_a_waiting_producer(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	struct tp_opts o = {.slot_count = 2, .policy = IBVB_POLICY_BLOCK};
	CHECK_EQ(tp_create(&p, g_dir, "pwake", &o), 0);
	sock_of(sock, sizeof sock, "pwake");
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	CHECK_EQ(pub(&p, 1, 64), 0);
	CHECK_EQ(pub(&p, 2, 64), 0);
	CHECK_EQ(pub(&p, 3, 64), -EAGAIN); /* block: waits for the consumer */
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(r, &h), 0);
	uint32_t f = atomic_load(&r->region->release_futex);
	struct pwaiter w = {.p = &p, .idx = ibvb_consumer_index(r)};
	pthread_t th;
	pthread_create(&th, NULL, pwaiter_fn, &w);
	int64_t t0 = now_ms();
	while (atomic_load(&p.ctl->producer_waiting) == 0 && now_ms() - t0 < 2000)
		usleep(100);
	msleep(30);
	t0 = now_ms();
	ibvb_release(r, &h);
	pthread_join(th, NULL);
	CHECK_EQ(w.woke, 1);
	CHECK(w.when - t0 < 100);
	CHECK_EQ(atomic_load(&r->region->release_futex), f + 1);
	CHECK_EQ(atomic_load(&p.ctl->producer_waiting), 0);
	CHECK_EQ(pub(&p, 3, 64), 0);
	CHECK_EQ(ibvb_peek(r, &h), 0);
	ibvb_release(r, &h); /* nobody waits: no bump */
	CHECK_EQ(atomic_load(&r->region->release_futex), f + 1);
	ibvb_detach(r);
	tp_close(&p);
}

/* ---- several consumers ------------------------------------------------------------------------- */

static void multi(int n)
{
	struct tp p;
	char sock[512], name[32];
	struct ibvb_ring *r[3];
	snprintf(name, sizeof name, "multi%d", n);
	CHECK_EQ(tp_create(&p, g_dir, name, NULL), 0);
	sock_of(sock, sizeof sock, name);
	for (int k = 0; k < n; k++)
		CHECK_EQ(ibvb_attach(&r[k], sock, 0), 0);
	CHECK_EQ(atomic_load(&p.ctl->stats[IBVB_CTR_CONSUMERS_ATTACHED]), n);
	uint64_t cnt = 0;
	for (int round = 0; round < 5; round++) { /* 30 heaps through an 8-slot ring */
		for (int i = 0; i < 6; i++)
			CHECK_EQ(pub(&p, cnt + i, 50 + i), 0);
		for (int k = 0; k < n; k++) {
			for (int i = 0; i < 6; i++) {
				struct ibvb_heap h;
				CHECK_EQ(ibvb_wait(r[k], &h, 1000), 0);
				CHECK_EQ(h.heap_cnt, cnt + i);
				CHECK(pattern_ok(&h));
				ibvb_release(r[k], &h);
			}
			ibvb_flush_release(r[k]);
		}
		cnt += 6;
	}
	CHECK_EQ(atomic_load(&p.ctl->stats[IBVB_CTR_DROPPED_HEAPS]), 0);
	/* the slowest consumer paces the ring: with one of them holding, the others cannot get ahead a ring */
	struct ibvb_heap h;
	CHECK_EQ(pub(&p, 100, 64), 0);
	CHECK_EQ(ibvb_peek(r[0], &h), 0); /* r[0] holds position 30 */
	for (int k = 1; k < n; k++) {
		CHECK_EQ(ibvb_peek(r[k], &h), 0);
		ibvb_release(r[k], &h);
		ibvb_flush_release(r[k]);
	}
	for (int i = 0; i < 7; i++)
		CHECK_EQ(pub(&p, 101 + i, 64), 0);
	CHECK_EQ(tp_reclaim(&p), n);
	CHECK_EQ(atomic_load(&p.ctl->oldest), 30); /* r[0]'s held heap */
	for (int k = 0; k < n; k++)
		ibvb_detach(r[k]);
	tp_close(&p);
}

static void t_two_consumers_each_read_every_heap(void) { multi(2); }
static void t_three_consumers_each_read_every_heap(void) { multi(3); }

/* One consumer detaching (holding heaps) does not disturb another, and stops holding the ring back. */
static void t_detaching_consumer_stops_holding_the_ring(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *a, *b;
	struct tp_opts o = {.policy = IBVB_POLICY_BLOCK};
	CHECK_EQ(tp_create(&p, g_dir, "detone", &o), 0);
	sock_of(sock, sizeof sock, "detone");
	CHECK_EQ(ibvb_attach(&a, sock, 0), 0);
	CHECK_EQ(ibvb_attach(&b, sock, 0), 0);
	for (int i = 0; i < 8; i++)
		CHECK_EQ(pub(&p, i, 64), 0);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(a, &h), 0); /* a holds heap 0 */
	for (int i = 0; i < 8; i++) {
		CHECK_EQ(ibvb_peek(b, &h), 0);
		CHECK_EQ(h.heap_cnt, i);
		ibvb_release(b, &h);
	}
	ibvb_flush_release(b);
	CHECK_EQ(pub(&p, 8, 64), -EAGAIN); /* block: a holds the slot */
	uint32_t ia = ibvb_consumer_index(a);
	ibvb_detach(a);
	CHECK_EQ(pub(&p, 8, 64), 0); /* a's socket closed: it no longer counts */
	CHECK_EQ(atomic_load(&p.rows[ia].state), IBVB_CONSUMER_GONE);
	CHECK_EQ(ibvb_wait(b, &h, 1000), 0);
	CHECK_EQ(h.heap_cnt, 8);
	CHECK(pattern_ok(&h));
	ibvb_release(b, &h);
	CHECK_EQ(ibvb_producer_alive(b), 1);
	CHECK_EQ(ibvb_peek(b, &h), -EAGAIN);
	ibvb_detach(b);
	tp_close(&p);
}

/* drop: a stalled consumer is detached as overrun rather than cost the others heaps; it reports -EOVERFLOW
 * with the count, sticky, while the other reads on. */
static void t_stalled_consumer_is_detached_as_overrun(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *a, *b;
	CHECK_EQ(tp_create(&p, g_dir, "overrun", NULL), 0);
	sock_of(sock, sizeof sock, "overrun");
	CHECK_EQ(ibvb_attach(&a, sock, 0), 0);
	CHECK_EQ(ibvb_attach(&b, sock, 0), 0);
	for (int i = 0; i < 8; i++)
		CHECK_EQ(pub(&p, i, 64), 0);
	struct ibvb_heap h;
	for (int i = 0; i < 8; i++) {
		CHECK_EQ(ibvb_peek(b, &h), 0);
		ibvb_release(b, &h);
	}
	ibvb_flush_release(b);
	CHECK_EQ(pub(&p, 8, 64), 0); /* a (at the reclaim point, behind b) is detached */
	uint32_t ia = ibvb_consumer_index(a);
	CHECK_EQ(atomic_load(&p.rows[ia].state), IBVB_CONSUMER_OVERRUN);
	CHECK_EQ(atomic_load(&p.rows[ia].lost_heaps), 8);
	CHECK_EQ(atomic_load(&p.ctl->stats[IBVB_CTR_CONSUMER_OVERRUNS]), 1);
	CHECK_EQ(ibvb_peek(a, &h), -EOVERFLOW);
	CHECK(strstr(ibvb_last_error(), "overrun"));
	CHECK(strstr(ibvb_last_error(), "8 heaps lost"));
	CHECK_EQ(ibvb_peek(a, &h), -EOVERFLOW); /* sticky */
	CHECK_EQ(ibvb_wait(a, &h, 100), -EOVERFLOW);
	CHECK_EQ(ibvb_held(a), 0);
	CHECK_EQ(ibvb_wait(b, &h, 1000), 0);
	CHECK_EQ(h.heap_cnt, 8);
	ibvb_release(b, &h);
	ibvb_detach(a);
	/* a consumer asleep in ibvb_wait learns of the detach within a futex slice */
	struct ibvb_attach_opts ho = {.start = IBVB_START_HEAD};
	CHECK_EQ(ibvb_attach_opts(&a, sock, 0, &ho), 0);
	struct delayed d = {.p = &p, .ms = 50, .action = 6, .row = ibvb_consumer_index(a)};
	pthread_t th;
	pthread_create(&th, NULL, delayed_fn, &d);
	CHECK_EQ(ibvb_wait(a, &h, 5000), -EOVERFLOW);
	int64_t lat = now_ms() - d.when;
	pthread_join(th, NULL);
	CHECK(lat < 400);
	CHECK(strstr(ibvb_last_error(), "42 heaps lost"));
	ibvb_detach(a);
	ibvb_detach(b);
	tp_close(&p);
}

/* Spec 2.1 §A, deterministic: a slow consumer S holds heap 0 while a fast one F keeps up and the producer
 * laps S (drop: S is detached as overrun and its slots are reused). S's held heap is reported invalid after
 * its bytes were rewritten, its release says -ESTALE, and its next peek says overrun with the heaps lost —
 * even for a position below the head it had already seen whose slot the producer has begun to rewrite
 * before writing the new descriptor (2.0 handed that heap out with the new bytes). */
static void t_overrun_while_held_is_reported_not_torn(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *s, *f;
	struct ibvb_heap h0, h;
	CHECK_EQ(tp_create(&p, g_dir, "torn", NULL), 0);
	sock_of(sock, sizeof sock, "torn");
	CHECK_EQ(ibvb_attach(&s, sock, 0), 0);
	CHECK_EQ(ibvb_attach(&f, sock, 0), 0);
	for (int i = 0; i < 4; i++)
		CHECK_EQ(pub(&p, i, 64), 0);
	CHECK_EQ(ibvb_peek(s, &h0), 0); /* S holds heap 0 and has seen head 4 */
	CHECK_EQ(h0.heap_cnt, 0);
	CHECK(pattern_ok(&h0));
	CHECK_EQ(ibvb_heap_valid(s, &h0), 1);
	for (int i = 4; i <= 8; i++) {
		while (ibvb_peek(f, &h) == 0)
			CHECK_EQ(ibvb_release(f, &h), 0); /* F keeps up, and is valid throughout */
		ibvb_flush_release(f);
		CHECK_EQ(pub(&p, i, 64), 0); /* heap 8: the ring is full, F is ahead: S is detached */
	}
	uint32_t is = ibvb_consumer_index(s);
	CHECK_EQ(atomic_load(&p.rows[is].state), IBVB_CONSUMER_OVERRUN);
	CHECK_EQ(atomic_load(&p.rows[is].lost_heaps), 8);
	/* the producer has begun to reuse position 1's slot: new bytes, the old descriptor still in place */
	uint32_t slot1 = p.desc[1].slot;
	memset(p.payload + (uint64_t)slot1 * p.slot_size, 0xEE, 64);
	CHECK(!pattern_ok(&h0)); /* heap 8's bytes now sit in heap 0's slot */
	CHECK_EQ(ibvb_heap_valid(s, &h0), 0);
	CHECK_EQ(ibvb_peek(s, &h), -EOVERFLOW); /* not position 1 with 0xEE bytes */
	CHECK(strstr(ibvb_last_error(), "8 heaps lost"));
	CHECK_EQ(ibvb_release(s, &h0), -ESTALE);
	CHECK(strstr(ibvb_last_error(), "overrun while held"));
	CHECK(strstr(ibvb_last_error(), "8 heaps lost"));
	CHECK_EQ(ibvb_peek(s, &h), -EOVERFLOW); /* sticky */
	CHECK_EQ(ibvb_wait(s, &h, 50), -EOVERFLOW);
	CHECK_EQ(ibvb_peek(f, &h), 0);
	CHECK_EQ(h.heap_cnt, 8);
	CHECK(pattern_ok(&h));
	CHECK_EQ(ibvb_heap_valid(f, &h), 1);
	CHECK_EQ(ibvb_release(f, &h), 0);
	ibvb_detach(s);
	ibvb_detach(f);
	tp_close(&p);
}

/* Spec 2.1 §A: item entries are copied out of the ring and validated once: a producer that rewrites an
 * entry after the heap was handed out changes nothing the consumer sees (ibvb_item_ptr, find_item). */
static void t_items_are_private_copies(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	struct ibvb_heap h;
	CHECK_EQ(tp_create(&p, g_dir, "itemcopy", NULL), 0);
	sock_of(sock, sizeof sock, "itemcopy");
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	CHECK_EQ(pub(&p, 7, 64), 0);
	CHECK_EQ(ibvb_peek(r, &h), 0);
	struct ibvb_item *shared = p.items + (uint64_t)h.slot * p.max_items;
	CHECK(h.items != shared);
	shared[1].value = 1ull << 40; /* a hostile rewrite of the validated offset */
	shared[0].value = 99;
	const struct ibvb_item *it = ibvb_find_item(&h, 0x1600);
	CHECK(it);
	CHECK_EQ(it->value, 8);
	CHECK(ibvb_item_ptr(&h, it) == h.payload + 8);
	CHECK_EQ(ibvb_find_item(&h, 0x1001)->value, 7);
	CHECK_EQ(ibvb_release(r, &h), 0);
	ibvb_detach(r);
	tp_close(&p);
}

/* An invalid cursor gets the consumer detached (state 3): -ECONNRESET; so does a reused row. */
static void t_invalid_cursor_or_reused_row_detaches(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *a, *b;
	CHECK_EQ(tp_create(&p, g_dir, "badcur", NULL), 0);
	sock_of(sock, sizeof sock, "badcur");
	CHECK_EQ(ibvb_attach(&a, sock, 0), 0);
	CHECK_EQ(ibvb_attach(&b, sock, 0), 0);
	CHECK_EQ(pub(&p, 1, 64), 0);
	atomic_store(&a->region->tail, 1000); /* past head: a bug or an attack */
	CHECK_EQ(tp_reclaim(&p), 1);
	CHECK_EQ(atomic_load(&p.rows[ibvb_consumer_index(a)].state), IBVB_CONSUMER_BAD_CURSOR);
	CHECK_EQ(atomic_load(&p.ctl->stats[IBVB_CTR_CONSUMER_ERRORS]), 1);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(a, &h), -ECONNRESET);
	CHECK(strstr(ibvb_last_error(), "invalid cursor"));
	CHECK_EQ(ibvb_wait(a, &h, 100), -ECONNRESET);
	CHECK_EQ(ibvb_peek(b, &h), 0); /* b is fine */
	ibvb_release(b, &h);
	/* the row reused by another attach (generation moved on) */
	uint32_t ib = ibvb_consumer_index(b);
	atomic_store(&p.rows[ib].generation, 99);
	CHECK_EQ(ibvb_peek(b, &h), -ECONNRESET);
	CHECK(strstr(ibvb_last_error(), "reused"));
	ibvb_detach(a);
	ibvb_detach(b);
	tp_close(&p);
}

/* Error records map to -errno, with the producer's message. */
static void t_error_records_map_to_errno(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "errrec", NULL), 0);
	sock_of(sock, sizeof sock, "errrec");
	static const struct {
		uint32_t status;
		int err;
	} cases[] = {
	    {IBVB_STATUS_VERSION, -EPROTONOSUPPORT}, {IBVB_STATUS_NOT_PERMITTED, -EACCES},
	    {IBVB_STATUS_BUSY, -EBUSY},               {IBVB_STATUS_CLOSING, -ESHUTDOWN},
	    {IBVB_STATUS_PROTOCOL, -EPROTO},          {77, -EPROTO},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		p.refuse_status = cases[i].status;
		snprintf(p.refuse_msg, sizeof p.refuse_msg, "producer says no #%zu", i);
		r = (struct ibvb_ring *)1;
		CHECK_EQ(ibvb_attach(&r, sock, 0), cases[i].err);
		CHECK(r == NULL);
		char want[64];
		snprintf(want, sizeof want, "producer says no #%zu", i);
		CHECK(strstr(ibvb_last_error(), want));
		CHECK(strstr(ibvb_last_error(), "errrec"));
	}
	p.refuse_status = 0;
	CHECK_EQ(tp_attached(&p), 0);
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	ibvb_detach(r);
	tp_close(&p);
}

/* Malformed welcomes: -EPROTO (and nothing leaks: every descriptor that came is closed): too short, another
 * magic, two descriptors, longer than 256 bytes (MSG_TRUNC), status 0 with major 3 (spec §1.2). */
static void t_malformed_welcome_is_refused_without_leaks(void)
{
	struct tp p;
	char sock[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "welc", NULL), 0);
	sock_of(sock, sizeof sock, "welc");
	int fds0 = count_fds();
	enum tp_welcome_mode modes[] = {TP_WELCOME_SHORT, TP_WELCOME_BAD_MAGIC, TP_WELCOME_TWO_FDS,
					TP_WELCOME_TOO_LONG, TP_WELCOME_MAJOR3};
	for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
		p.welcome_mode = modes[i];
		CHECK_EQ(ibvb_attach(&r, sock, 0), -EPROTO);
		CHECK(strstr(ibvb_last_error(), "malformed welcome"));
	}
	tp_reclaim(&p); /* the producer (in this process) closes its ends of the failed connections */
	CHECK_EQ(count_fds(), fds0);
	p.welcome_mode = TP_WELCOME_LONG; /* 256 bytes: a later minor may append fields (spec §1.2) */
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	CHECK_EQ(tp_attached(&p), 1);
	ibvb_detach(r);
	tp_reclaim(&p);
	CHECK_EQ(count_fds(), fds0);
	p.welcome_mode = TP_WELCOME_OK;
	CHECK_EQ(ibvb_attach(&r, sock, 0), 0);
	CHECK_EQ(tp_attached(&p), 1); /* waits for the server thread to finish the handshake (closes its region fd) */
	CHECK_EQ(count_fds(), fds0 + 2); /* only the socket stays open (+ the producer's end of it) */
	ibvb_detach(r);
	tp_reclaim(&p);
	CHECK_EQ(count_fds(), fds0);
	tp_close(&p);
}

/* §1.2: the consumer refuses a socket served by a uid it does not trust. A child binds as root in a
 * directory, drops to uid 65534, then listens (SO_PEERCRED reports the listener's uid at listen). */
static void t_socket_of_an_untrusted_uid_is_refused(void)
{
	CHECK(ibvb_peer_uid_trusted(0, 1000, 2000, 040755));
	CHECK(ibvb_peer_uid_trusted(1000, 1000, 2000, 040755));
	CHECK(ibvb_peer_uid_trusted(2000, 1000, 2000, 040755));  /* the directory's owner */
	CHECK(!ibvb_peer_uid_trusted(2000, 1000, 2000, 040775)); /* group-writable directory */
	CHECK(!ibvb_peer_uid_trusted(2000, 1000, 2000, 041777)); /* /tmp-like */
	CHECK(!ibvb_peer_uid_trusted(3000, 1000, 2000, 040755));
	if (geteuid() != 0) {
		fprintf(stderr, "    (uid part skipped: not root)\n");
		return;
	}
	for (int k = 0; k < 3; k++) {
		/* k 0: root's 0700 directory; k 1: 65534's own 0755 directory (trusted owner); k 2: 65534's 0777 */
		char dir[300], sock[400];
		snprintf(dir, sizeof dir, "%s/uid%d", g_dir, k);
		CHECK_EQ(mkdir(dir, 0700), 0);
		if (k > 0) {
			CHECK_EQ(chown(dir, 65534, 65534), 0);
			CHECK_EQ(chmod(dir, k == 1 ? 0755 : 0777), 0);
		}
		snprintf(sock, sizeof sock, "%s/evil.v2.sock", dir);
		int pfd[2];
		CHECK_EQ(pipe(pfd), 0);
		pid_t pid = fork();
		CHECK(pid >= 0);
		if (pid == 0) {
			alarm(10); /* never outlives the test */
			close(pfd[0]);
			int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
			struct sockaddr_un sa = sun_of(sock);
			if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || setgid(65534) < 0 || setuid(65534) < 0 ||
			    listen(fd, 4) < 0)
				_exit(1);
			if (write(pfd[1], "x", 1) != 1)
				_exit(1);
			int c = accept(fd, NULL, NULL); /* then hang up without a welcome */
			char b[64];
			if (c >= 0 && recv(c, b, sizeof b, 0) < 0)
				_exit(1);
			_exit(0);
		}
		close(pfd[1]);
		char c;
		CHECK_EQ(read(pfd[0], &c, 1), 1);
		close(pfd[0]);
		struct ibvb_ring *r;
		int rc = ibvb_attach(&r, sock, 1000);
		if (k == 1) {
			CHECK_EQ(rc, -EPROTO); /* trusted: it got as far as the (missing) welcome */
		} else if (k == 2) {
			/* 2.1: a directory writable by others is refused before connecting */
			kill(pid, SIGKILL);
			CHECK_EQ(rc, -EPERM);
			CHECK(strstr(ibvb_last_error(), "untrusted directory"));
			CHECK(strstr(ibvb_last_error(), "writable by group or others"));
		} else {
			CHECK_EQ(rc, -EPERM);
			CHECK(strstr(ibvb_last_error(), "uid 65534"));
			CHECK(strstr(ibvb_last_error(), "not trusted"));
			kill(pid, SIGKILL);
		}
		waitpid(pid, NULL, 0);
		unlink(sock);
		rmdir(dir);
	}
}

/* start = head skips what was published before the attach; lookup by name with opts.dir and with
 * $IBVBRIDGE_RING_DIR. */
static void t_start_head_skips_and_name_lookup_finds(void)
{
	struct tp p;
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "start", NULL), 0);
	for (int i = 0; i < 3; i++)
		CHECK_EQ(pub(&p, i, 64), 0);
	struct ibvb_attach_opts o = {.dir = g_dir, .start = IBVB_START_HEAD};
	CHECK_EQ(ibvb_attach_opts(&r, "start", 0, &o), 0);
	struct ibvb_heap h;
	CHECK_EQ(TAIL(r), 3);
	CHECK_EQ(ibvb_peek(r, &h), -EAGAIN);
	CHECK_EQ(pub(&p, 3, 64), 0);
	CHECK_EQ(ibvb_peek(r, &h), 0);
	CHECK_EQ(h.heap_cnt, 3);
	ibvb_release(r, &h);
	ibvb_detach(r);
	o.start = IBVB_START_OLDEST;
	CHECK_EQ(ibvb_attach_opts(&r, "start", 0, &o), 0);
	CHECK_EQ(ibvb_peek(r, &h), 0);
	CHECK_EQ(h.heap_cnt, 0);
	ibvb_detach(r);
	setenv("IBVBRIDGE_RING_DIR", g_dir, 1);
	CHECK_EQ(ibvb_attach(&r, "start", 0), 0);
	ibvb_detach(r);
	CHECK_EQ(ibvb_attach(&r, "nostart", 0), -ENOENT);
	CHECK(strstr(ibvb_last_error(), g_dir));
	unsetenv("IBVBRIDGE_RING_DIR");
	tp_close(&p);
}

/* ---- ibvb-consume ------------------------------------------------------------------------------ */

static char g_errfile[300];

/* Start ibvb-consume --ring RING --verify --timeout-ms 5000 EXTRA... with stdout on a pipe and stderr in
 * g_errfile. */
static int run_consume(const char *ring, const char *const *extra, pid_t *pidp, int *outfd)
{
	int pfd[2];
	if (pipe(pfd) < 0)
		return -1;
	pid_t pid = fork();
	if (pid == 0) {
		dup2(pfd[1], 1);
		close(pfd[0]);
		close(pfd[1]);
		int ef = open(g_errfile, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (ef >= 0)
			dup2(ef, 2);
		const char *argv[32] = {g_consume, "--ring", ring, "--verify", "--timeout-ms", "5000"};
		int n = 6;
		for (int i = 0; extra && extra[i] && n < 31; i++)
			argv[n++] = extra[i];
		argv[n] = NULL;
		execv(g_consume, (char *const *)argv);
		_exit(127);
	}
	close(pfd[1]);
	*pidp = pid;
	*outfd = pfd[0];
	return 0;
}

/* Wait for it; stdout in out; returns the exit code. *errlines = lines it wrote to stderr. */
static int finish_consume(pid_t pid, int fd, char *out, size_t cap, int *errlines)
{
	size_t n = 0;
	ssize_t k;
	while (n + 1 < cap && (k = read(fd, out + n, cap - 1 - n)) > 0)
		n += (size_t)k;
	out[n] = 0;
	close(fd);
	int st;
	waitpid(pid, &st, 0);
	*errlines = 0;
	FILE *f = fopen(g_errfile, "r");
	if (f) {
		int ch;
		while ((ch = fgetc(f)) != EOF)
			*errlines += ch == '\n';
		fclose(f);
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void t_consume_tool_summarises_and_exits_by_result(void)
{
	if (!g_consume) {
		fprintf(stderr, "    (skipped: no ibvb-consume path given)\n");
		return;
	}
	snprintf(g_errfile, sizeof g_errfile, "%s/consume.err", g_dir);
	struct tp p;
	char sock[512], out[4096], want[128];
	pid_t pid;
	int fd, el;
	CHECK_EQ(tp_create(&p, g_dir, "tool", NULL), 0);
	sock_of(sock, sizeof sock, "tool");
	const char *hold[] = {"--hold", "3", NULL};
	CHECK_EQ(run_consume(sock, hold, &pid, &fd), 0);
	CHECK_EQ(wait_attached(&p, 1), 0);
	uint64_t sum = 0;
	uint8_t buf[512];
	int n = 200;
	for (int i = 0; i < n; i++) {
		uint64_t len = 1 + (uint64_t)(i * 13) % 300;
		uint64_t cnt = 5 + (uint64_t)i;
		tp_pattern(buf, cnt, len);
		if (i == 50)
			buf[3] ^= 1; /* one corrupt heap */
		for (uint64_t w = 0; w < len; w += 8) {
			uint64_t v = 0;
			memcpy(&v, buf + w, len - w < 8 ? len - w : 8);
			sum += v;
		}
		struct ibvb_item it = {.id = 0x1001, .value = cnt, .length = 6, .flags = IBVB_ITEM_IMMEDIATE};
		int64_t t0 = now_ms();
		while (tp_publish(&p, cnt, buf, len, &it, 1, i == 60 ? IBVB_FLAG_INCOMPLETE : IBVB_FLAG_COMPLETE) ==
		       -EAGAIN) {
			if (now_ms() - t0 > 5000)
				break;
			usleep(100);
		}
	}
	while (tp_publish_eos(&p) == -EAGAIN)
		usleep(100);
	int ec = finish_consume(pid, fd, out, sizeof out, &el);
	if (ec != 0 || !strstr(out, "\"result\":\"eos\""))
		fprintf(stderr, "    ibvb-consume exit %d: %s\n", ec, out);
	CHECK_EQ(ec, 0);
	CHECK_EQ(el, 0);
	snprintf(want, sizeof want, "\"heaps\":%d,", n);
	CHECK(strstr(out, want));
	snprintf(want, sizeof want, "\"checksum\":%" PRIu64 ",", sum);
	CHECK(strstr(out, want));
	CHECK(strstr(out, "\"verify_errors\":1,"));
	CHECK(strstr(out, "\"incomplete\":1,"));
	CHECK(strstr(out, "\"first_heap_cnt\":5,"));
	CHECK(strstr(out, "\"last_heap_cnt\":204,"));
	CHECK(strstr(out, "\"heap_cnt_out_of_order\":0,"));
	CHECK(strstr(out, "\"result\":\"eos\""));
	CHECK(strstr(out, "\"end_of_stream\":1"));
	CHECK(strstr(out, "\"consumer_overruns\":0"));
	snprintf(want, sizeof want, "\"session_id\":%" PRIu64 "}", p.ctl->session_id);
	CHECK(strstr(out, want));
	CHECK_EQ(tp_reclaim(&p), 0); /* it detached, having released everything, the marker too */
	CHECK_EQ(atomic_load(&p.rows[0].released), p.head);

	/* --max-heaps, out-of-order heap_cnt; by name with --dir, --start head (earlier heaps skipped) */
	const char *maxh[] = {"--max-heaps", "2", "--dir", g_dir, "--start", "head", NULL};
	CHECK_EQ(run_consume("tool", maxh, &pid, &fd), 0);
	CHECK_EQ(wait_attached(&p, 1), 0);
	CHECK_EQ(pub(&p, 10, 64), 0);
	CHECK_EQ(pub(&p, 9, 64), 0);
	CHECK_EQ(pub(&p, 11, 64), 0);
	ec = finish_consume(pid, fd, out, sizeof out, &el);
	CHECK_EQ(ec, 0);
	CHECK(strstr(out, "\"result\":\"max\""));
	CHECK(strstr(out, "\"heaps\":2,"));
	CHECK(strstr(out, "\"first_heap_cnt\":10,"));
	CHECK(strstr(out, "\"heap_cnt_out_of_order\":1,"));
	CHECK(strstr(out, "\"verify_errors\":0,"));

	/* timeout: nothing new comes */
	const char *to[] = {"--timeout-ms", "200", "--start", "head", NULL};
	CHECK_EQ(run_consume(sock, to, &pid, &fd), 0);
	ec = finish_consume(pid, fd, out, sizeof out, &el);
	CHECK_EQ(ec, 3);
	CHECK_EQ(el, 1);
	CHECK(strstr(out, "\"result\":\"timeout\""));
	CHECK(strstr(out, "\"heaps\":0,"));

	/* detached as overrun (exit 4), detached for a bad cursor (exit 5) */
	for (int k = 0; k < 2; k++) {
		const char *hd[] = {"--start", "head", NULL};
		CHECK_EQ(run_consume(sock, hd, &pid, &fd), 0);
		CHECK_EQ(wait_attached(&p, 1), 0);
		uint32_t row = 0;
		for (uint32_t i = 0; i < p.max_consumers; i++)
			if (p.cons[i].fd >= 0)
				row = i;
		tp_detach_row(&p, row, k == 0 ? IBVB_CONSUMER_OVERRUN : IBVB_CONSUMER_BAD_CURSOR, 5);
		ec = finish_consume(pid, fd, out, sizeof out, &el);
		CHECK_EQ(ec, k == 0 ? 4 : 5);
		CHECK_EQ(el, 1);
		CHECK(strstr(out, k == 0 ? "\"result\":\"overrun\"" : "\"result\":\"detached\""));
		if (k == 0)
			CHECK(strstr(out, "5 heaps lost"));
	}

	/* producer gone */
	const char *slp[] = {"--sleep-us", "10", "--start", "head", NULL};
	CHECK_EQ(run_consume(sock, slp, &pid, &fd), 0);
	CHECK_EQ(wait_attached(&p, 1), 0);
	tp_abandon(&p);
	ec = finish_consume(pid, fd, out, sizeof out, &el);
	CHECK_EQ(ec, 2);
	CHECK_EQ(el, 1);
	CHECK(strstr(out, "\"result\":\"producer_gone\""));

	/* the crashed producer's stale socket */
	const char *nf[] = {"--timeout-ms", "50", NULL};
	CHECK_EQ(run_consume(sock, nf, &pid, &fd), 0);
	ec = finish_consume(pid, fd, out, sizeof out, &el);
	CHECK_EQ(ec, 1);
	CHECK_EQ(el, 1);
	CHECK(strstr(out, "\"result\":\"error\""));
	CHECK(strstr(out, "stale socket"));
	unlink(sock);
}

/* 1 once process pid sleeps in nanosleep/clock_nanosleep (ibvb-consume --sleep-us holds a heap then). */
static int in_nanosleep(pid_t pid)
{
	char path[64], buf[128];
	snprintf(path, sizeof path, "/proc/%d/syscall", (int)pid);
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	long nr = strtol(buf, NULL, 10);
	return nr == SYS_nanosleep || nr == SYS_clock_nanosleep;
}

/* Spec 2.1 §A across processes: ibvb-consume --verify is stopped (SIGSTOP) while it holds a heap, the
 * producer laps it while another consumer keeps up, then SIGCONT: the heap it then reads is counted as
 * overrun (overrun_heaps 1), never as a verify error or good data, and it exits 4 (overrun). */
static void t_consume_tool_sigstopped_overrun_counts_overrun_heaps(void)
{
	if (!g_consume) {
		fprintf(stderr, "    (skipped: no ibvb-consume path given)\n");
		return;
	}
	snprintf(g_errfile, sizeof g_errfile, "%s/stopped.err", g_dir);
	struct tp p;
	char sock[512], out[4096];
	pid_t pid;
	int fd, el;
	struct ibvb_ring *f;
	struct ibvb_heap h;
	CHECK_EQ(tp_create(&p, g_dir, "stopped", NULL), 0);
	sock_of(sock, sizeof sock, "stopped");
	const char *slow[] = {"--sleep-us", "200000", NULL};
	CHECK_EQ(run_consume(sock, slow, &pid, &fd), 0);
	CHECK_EQ(wait_attached(&p, 1), 0);
	CHECK_EQ(ibvb_attach(&f, sock, 0), 0);
	CHECK_EQ(pub(&p, 0, 256), 0);
	int64_t t0 = now_ms();
	while (!in_nanosleep(pid) && now_ms() - t0 < 10000)
		usleep(200);
	CHECK(in_nanosleep(pid)); /* it has taken heap 0 and sleeps holding it */
	CHECK_EQ(kill(pid, SIGSTOP), 0);
	int st;
	CHECK_EQ(waitpid(pid, &st, WUNTRACED), pid);
	CHECK(WIFSTOPPED(st));
	for (int i = 1; i <= 9; i++) {
		while (ibvb_peek(f, &h) == 0)
			ibvb_release(f, &h);
		ibvb_flush_release(f);
		CHECK_EQ(pub(&p, (uint64_t)i, 256), 0);
	}
	CHECK_EQ(atomic_load(&p.ctl->stats[IBVB_CTR_CONSUMER_OVERRUNS]), 1);
	CHECK_EQ(kill(pid, SIGCONT), 0);
	int ec = finish_consume(pid, fd, out, sizeof out, &el);
	if (ec != 4)
		fprintf(stderr, "    ibvb-consume exit %d: %s\n", ec, out);
	CHECK_EQ(ec, 4);
	CHECK(strstr(out, "\"heaps\":1,"));
	CHECK(strstr(out, "\"verify_errors\":0,"));
	CHECK(strstr(out, "\"overrun_heaps\":1,"));
	CHECK(strstr(out, "\"result\":\"overrun\""));
	CHECK(strstr(out, "8 heaps lost"));
	ibvb_detach(f);
	tp_close(&p);
}

/* Spec 2.1 §1.1, the squatting attack: as nobody, /dev/shm/ibvbridge-VICTIM (0755) is made and serves a
 * socket with the real ring's name that never answers. The victim (a throwaway uid without XDG_RUNTIME_DIR
 * or IBVBRIDGE_RING_DIR, so that directory is its own default) attaching BY NAME skips it with a warning
 * naming it and why, and reads the real ring's heaps from /run/ibvbridge. 2.0 hung on the silent socket. */
static void t_attack_squatted_user_dir_is_skipped_by_name(void)
{
	if (!g_consume || geteuid() != 0) {
		fprintf(stderr, "    (skipped: needs root to run a squatter and a victim under other uids%s)\n",
			g_consume ? "" : ", and the ibvb-consume path");
		return;
	}
	/* In a mount namespace of this test's own whose /run and /dev/shm are fresh: the machine's ring
	 * directories stay untouched (the test runs in a child of the runner, so nothing else sees it). */
	if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
	    mount("ibvb-run", "/run", "tmpfs", 0, "mode=0755") < 0 || mount("ibvb-shm", "/dev/shm", "tmpfs", 0, "mode=1777") < 0) {
		fprintf(stderr, "    (skipped: no private mount namespace: %s)\n", strerror(errno));
		return;
	}
	const unsigned victim = 65533, squatter = 65534;
	char squat[64], name[64], ssock[160], out[4096], errs[2048];
	struct stat st;
	snprintf(squat, sizeof squat, "%s%u", IBVB_SHM_DIR_PREFIX, victim);
	CHECK(lstat(squat, &st) < 0); /* the test owns this name for its run */
	snprintf(name, sizeof name, "squat-%d", (int)getpid());
	snprintf(ssock, sizeof ssock, "%s/%s%s", squat, name, IBVB_SOCK_SUFFIX);
	int made_run = mkdir(IBVB_RUN_DIR, 0755) == 0;
	struct tp p;
	CHECK_EQ(tp_create(&p, IBVB_RUN_DIR, name, NULL), 0);
	chmod(p.sock_path, 0666); /* the test ring admits the victim */
	for (int i = 0; i < 3; i++)
		CHECK_EQ(pub(&p, 100 + (uint64_t)i, 64), 0);
	int pfd[2];
	CHECK_EQ(pipe(pfd), 0);
	pid_t sq = fork();
	if (sq == 0) {
		alarm(20);
		close(pfd[0]);
		if (setgroups(0, NULL) < 0 || setgid(squatter) < 0 || setuid(squatter) < 0 || mkdir(squat, 0755) < 0)
			_exit(1);
		int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
		struct sockaddr_un sa = sun_of(ssock);
		if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || chmod(ssock, 0777) < 0 || listen(fd, 16) < 0 ||
		    write(pfd[1], "x", 1) != 1)
			_exit(1);
		for (;;) /* a silent listener: accept and never answer */
			if (accept(fd, NULL, NULL) < 0)
				pause();
	}
	close(pfd[1]);
	char c;
	int ready = read(pfd[0], &c, 1) == 1;
	close(pfd[0]);
	snprintf(g_errfile, sizeof g_errfile, "%s/victim.err", g_dir);
	int opfd[2];
	pid_t v = -1;
	if (ready && pipe(opfd) == 0 && (v = fork()) == 0) {
		dup2(opfd[1], 1);
		close(opfd[0]);
		int ef = open(g_errfile, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		dup2(ef, 2);
		unsetenv("XDG_RUNTIME_DIR");
		unsetenv(IBVB_DIR_ENV);
		if (setgroups(0, NULL) < 0 || setgid(victim) < 0 || setuid(victim) < 0)
			_exit(126);
		execl(g_consume, g_consume, "--ring", name, "--verify", "--max-heaps", "3", "--timeout-ms", "5000",
		      (char *)NULL);
		_exit(127);
	}
	int ec = -1, el = 0;
	if (v > 0) {
		close(opfd[1]);
		ec = finish_consume(v, opfd[0], out, sizeof out, &el);
	}
	kill(sq, SIGKILL);
	waitpid(sq, NULL, 0);
	rm_tree(squat);
	tp_close(&p);
	if (made_run)
		rmdir(IBVB_RUN_DIR);
	CHECK(ready);
	CHECK(v > 0);
	int fd = open(g_errfile, O_RDONLY);
	ssize_t n = fd >= 0 ? read(fd, errs, sizeof errs - 1) : -1;
	errs[n > 0 ? n : 0] = 0;
	if (fd >= 0)
		close(fd);
	if (ec != 0)
		fprintf(stderr, "    victim exit %d: %s%s\n", ec, out, errs);
	CHECK_EQ(ec, 0);
	CHECK(strstr(out, "\"heaps\":3,"));
	CHECK(strstr(out, "\"first_heap_cnt\":100,"));
	CHECK(strstr(out, "\"verify_errors\":0,"));
	char want[200];
	snprintf(want, sizeof want, "skipping %s: owned by uid %u, not %u or root", squat, squatter, victim);
	CHECK(strstr(errs, want));
}

/* ---- runner ------------------------------------------------------------------------------------ */

static const struct test tests[] = {
    {"every_heap_arrives_byte_for_byte", t_every_heap_arrives_byte_for_byte},
    {"for_each_heap_holds_and_advance_releases", t_for_each_heap_holds_and_advance_releases},
    {"items_are_found_by_id", t_items_are_found_by_id},
    {"held_heaps_make_drop_policy_drop_new_heaps", t_held_heaps_make_drop_policy_drop_new_heaps},
    {"bad_magic_is_refused", t_bad_magic_is_refused},
    {"other_major_is_refused_naming_both", t_other_major_is_refused_naming_both},
    {"newer_minor_and_unknown_fields_are_accepted", t_newer_minor_and_unknown_fields_are_accepted},
    {"corrupt_geometry_is_refused_before_mapping", t_corrupt_geometry_is_refused_before_mapping},
    {"zero_size_region_needs_only_offset_within_data", t_zero_size_region_needs_only_offset_within_data},
    {"header_rewritten_after_attach_is_not_reread", t_header_rewritten_after_attach_is_not_reread},
    {"corrupt_descriptor_is_refused_unconsumed", t_corrupt_descriptor_is_refused_unconsumed},
    {"full_consumer_table_is_busy", t_full_consumer_table_is_busy},
    {"missing_ring_fails_at_once_unless_waiting", t_missing_ring_fails_at_once_unless_waiting},
    {"attach_retries_a_stale_socket_until_the_producer_comes", t_attach_retries_a_stale_socket_until_the_producer_comes},
    {"attach_awaits_a_producer_that_removed_the_stale_socket", t_attach_awaits_a_producer_that_removed_the_stale_socket},
    {"wait_times_out", t_wait_times_out},
    {"latency_bound_coalesces_wakes", t_latency_bound_coalesces_wakes},
    {"wait_is_woken_by_publish", t_wait_is_woken_by_publish},
    {"wake_survives_futex_word_wrap", t_wake_survives_futex_word_wrap},
    {"producer_death_is_seen_within_a_slice", t_producer_death_is_seen_within_a_slice},
    {"dead_producers_heaps_are_read_before_epipe", t_dead_producers_heaps_are_read_before_epipe},
    {"abandoned_ring_gives_epipe_then_a_stale_socket", t_abandoned_ring_gives_epipe_then_a_stale_socket},
    {"closed_ring_is_drained_then_ends", t_closed_ring_is_drained_then_ends},
    {"end_of_stream_marker_ends_reading", t_end_of_stream_marker_ends_reading},
    {"stream_end_marker_is_seen_in_order_and_reading_goes_on", t_stream_end_marker_is_seen_in_order_and_reading_goes_on},
    {"truncated_heap_is_not_complete_and_cut_items_are_refused", t_truncated_heap_is_not_complete_and_cut_items_are_refused},
    {"ring_mappings_cannot_be_written", t_ring_mappings_cannot_be_written},
    {"unsealed_memory_is_refused", t_unsealed_memory_is_refused},
    {"cursors_wrap_around_2_64", t_cursors_wrap_around_2_64},
    {"metadata_is_read_consistently", t_metadata_is_read_consistently},
    {"stats_counters_are_read_by_name_and_index", t_stats_counters_are_read_by_name_and_index},
    {"release_wakes_a_waiting_producer", t_release_wakes_a_waiting_producer},
    {"two_consumers_each_read_every_heap", t_two_consumers_each_read_every_heap},
    {"three_consumers_each_read_every_heap", t_three_consumers_each_read_every_heap},
    {"detaching_consumer_stops_holding_the_ring", t_detaching_consumer_stops_holding_the_ring},
    {"stalled_consumer_is_detached_as_overrun", t_stalled_consumer_is_detached_as_overrun},
    {"overrun_while_held_is_reported_not_torn", t_overrun_while_held_is_reported_not_torn},
    {"items_are_private_copies", t_items_are_private_copies},
    {"invalid_cursor_or_reused_row_detaches", t_invalid_cursor_or_reused_row_detaches},
    {"error_records_map_to_errno", t_error_records_map_to_errno},
    {"malformed_welcome_is_refused_without_leaks", t_malformed_welcome_is_refused_without_leaks},
    {"socket_of_an_untrusted_uid_is_refused", t_socket_of_an_untrusted_uid_is_refused},
    {"start_head_skips_and_name_lookup_finds", t_start_head_skips_and_name_lookup_finds},
    {"consume_tool_summarises_and_exits_by_result", t_consume_tool_summarises_and_exits_by_result},
    {"attack_squatted_user_dir_is_skipped_by_name", t_attack_squatted_user_dir_is_skipped_by_name},
    {"consume_tool_sigstopped_overrun_counts_overrun_heaps", t_consume_tool_sigstopped_overrun_counts_overrun_heaps},
};


int main(int argc, char **argv)
{
	if (argc > 1)
		g_consume = argv[1];
	/* the ring directory: owner-only, as a producer's (§1.1) */
	snprintf(g_dir, sizeof g_dir, "/tmp/ibvb-test.XXXXXX");
	if (!mkdtemp(g_dir)) {
		perror("mkdtemp");
		return 1;
	}
	unsetenv("IBVBRIDGE_RING_DIR");
	return run_tests(tests, sizeof tests / sizeof tests[0], g_dir);
}
