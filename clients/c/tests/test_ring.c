/* test_ring.c — tests for the ibvbridge C consumer against the test-only C producer.
 * Usage: test_ring [path/to/ibvb-consume]. Each test runs in a forked child with an alarm, so a crash or a
 * hang fails that test only. Prints "N passed, N failed". */
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
#include <sys/file.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ibvbridge.h"
#include "test_producer.h"

static char g_dir[256];
static const char *g_consume;
static int g_fail;

#define CHECK(c)                                                                                                \
	do {                                                                                                    \
		if (!(c)) {                                                                                     \
			fprintf(stderr, "    %s:%d: CHECK(%s) failed [last error: %s]\n", __FILE__, __LINE__, #c,   \
				ibvb_last_error());                                                             \
			g_fail = 1;                                                                             \
			return;                                                                                 \
		}                                                                                               \
	} while (0)
#define CHECK_EQ(a, b)                                                                                          \
	do {                                                                                                    \
		long long _a = (long long)(a), _b = (long long)(b);                                             \
		if (_a != _b) {                                                                                 \
			fprintf(stderr, "    %s:%d: %s == %lld, want %s == %lld [last error: %s]\n", __FILE__,      \
				__LINE__, #a, _a, #b, _b, ibvb_last_error());                                   \
			g_fail = 1;                                                                             \
			return;                                                                                 \
		}                                                                                               \
	} while (0)

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void msleep(int ms) { usleep((useconds_t)ms * 1000); }

static void ctl_of(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/ibvbridge.%s.v1.ctl", g_dir, name); }

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

/* ---------------------------------------------------------------------------------------------------- */

static void t_roundtrip(void)
{
	struct tp p;
	char ctl[512];
	CHECK_EQ(tp_create(&p, g_dir, "rt", NULL), 0);
	ctl_of(ctl, sizeof ctl, "rt");
	for (int i = 0; i < 5; i++)
		CHECK_EQ(pub(&p, 100 + i, 100 + i * 37), 0);
	struct ibvb_ring *r;
	CHECK_EQ(ibvb_attach(&r, ctl, 1000), 0);
	CHECK_EQ(ibvb_session_id(r), p.ctl->session_id);
	CHECK_EQ(ibvb_producer_pid(r), getpid());
	CHECK_EQ(atomic_load(&p.ctl->consumer_pid), getpid());
	CHECK(atomic_load(&p.ctl->consumer_attach_ns) > 0);
	CHECK_EQ(ibvb_slot_count(r), 8);
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
		CHECK_EQ(atomic_load(&p.ctl->tail), i + 1);
	}
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(r, &h), -EAGAIN);
	CHECK_EQ(pub(&p, 200, 64), 0);
	CHECK_EQ(ibvb_wait(r, &h, 1000), 0);
	CHECK_EQ(h.heap_cnt, 200);
	ibvb_release(r, &h);
	ibvb_detach(r);
	CHECK_EQ(atomic_load(&p.ctl->consumer_pid), 0);
	tp_close(&p);
}

/* ibvb_for_each_heap visits every heap published now, holding them; ibvb_advance releases them in one
 * tail store; the loop's rc says why it stopped (nothing more, or end of stream). */
static void t_batch(void)
{
	struct tp p;
	char ctl[512];
	CHECK_EQ(tp_create(&p, g_dir, "batch", NULL), 0);
	ctl_of(ctl, sizeof ctl, "batch");
	struct ibvb_ring *r;
	CHECK_EQ(ibvb_attach(&r, ctl, 1000), 0);
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
	CHECK_EQ(atomic_load(&p.ctl->tail), 0); /* held: nothing released yet */
	ibvb_advance(r, 4);
	CHECK_EQ(ibvb_held(r), 2);
	ibvb_flush_release(r);
	CHECK_EQ(atomic_load(&p.ctl->tail), 4);
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
	CHECK_EQ(atomic_load(&p.ctl->tail), 8); /* positions 0-5, heap 20 at 6, the end-of-stream marker at 7 */
	ibvb_detach(r);
	tp_close(&p);
}

static void t_items(void)
{
	struct tp p;
	char ctl[512];
	CHECK_EQ(tp_create(&p, g_dir, "items", NULL), 0);
	ctl_of(ctl, sizeof ctl, "items");
	CHECK_EQ(pub(&p, 7, 256), 0);
	CHECK_EQ(tp_publish(&p, 8, NULL, 32, NULL, 0, 0), 0);
	struct ibvb_ring *r;
	CHECK_EQ(ibvb_attach(&r, ctl, 1000), 0);
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

static void t_hold_and_full(void)
{
	struct tp p;
	char ctl[512];
	CHECK_EQ(tp_create(&p, g_dir, "hold", NULL), 0);
	ctl_of(ctl, sizeof ctl, "hold");
	for (int i = 0; i < 8; i++)
		CHECK_EQ(pub(&p, i, 64), 0);
	CHECK_EQ(pub(&p, 8, 64), -EAGAIN); /* full: drop */
	CHECK_EQ(atomic_load(&p.ctl->stats[IBVB_CTR_DROPPED_HEAPS]), 1);
	struct ibvb_ring *r;
	CHECK_EQ(ibvb_attach(&r, ctl, 1000), 0);
	struct ibvb_heap h[3];
	for (int i = 0; i < 3; i++)
		CHECK_EQ(ibvb_peek(r, &h[i]), 0);
	CHECK_EQ(ibvb_held(r), 3);
	CHECK_EQ(atomic_load(&p.ctl->tail), 0);
	for (int i = 0; i < 3; i++) /* held views stay intact */
		CHECK(pattern_ok(&h[i]));
	ibvb_release(r, &h[1]); /* batch: releases 0 and 1 */
	CHECK_EQ(atomic_load(&p.ctl->tail), 2);
	ibvb_release(r, &h[0]); /* already released: no-op */
	CHECK_EQ(atomic_load(&p.ctl->tail), 2);
	CHECK_EQ(ibvb_held(r), 1);
	CHECK_EQ(pub(&p, 8, 64), 0);
	CHECK_EQ(pub(&p, 9, 64), 0);
	CHECK_EQ(pub(&p, 10, 64), -EAGAIN);
	CHECK(pattern_ok(&h[2])); /* the held slot was not reused */
	ibvb_release_all(r);
	CHECK_EQ(atomic_load(&p.ctl->tail), 3);
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

static void t_bad_magic(void)
{
	struct tp p;
	char ctl[512];
	struct ibvb_ring *r = NULL;
	CHECK_EQ(tp_create(&p, g_dir, "magic", NULL), 0);
	ctl_of(ctl, sizeof ctl, "magic");
	atomic_store(&p.ctl->magic, 0x1234);
	CHECK_EQ(ibvb_attach(&r, ctl, 0), -EBADMSG);
	CHECK(strstr(ibvb_last_error(), "magic"));
	CHECK(r == NULL);
	atomic_store(&p.ctl->magic, 0); /* 0: not ready yet: waits, then times out */
	int64_t t0 = now_ms();
	CHECK_EQ(ibvb_attach(&r, ctl, 100), -ETIMEDOUT);
	CHECK(now_ms() - t0 >= 90);
	tp_close(&p);
}

static void t_major(void)
{
	struct tp p;
	char ctl[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "major", NULL), 0);
	ctl_of(ctl, sizeof ctl, "major");
	p.ctl->major = 2;
	CHECK_EQ(ibvb_attach(&r, ctl, 0), -EPROTONOSUPPORT);
	CHECK(strstr(ibvb_last_error(), "major 2"));
	CHECK(strstr(ibvb_last_error(), "supports 1"));
	tp_close(&p);
}

static void t_minor(void)
{
	struct tp p;
	char ctl[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "minor", NULL), 0);
	ctl_of(ctl, sizeof ctl, "minor");
	p.ctl->minor = 7;
	p.ctl->features = 0xF0;   /* unknown bits ignored */
	p.ctl->stats_count = 12; /* more counters than we know */
	CHECK_EQ(pub(&p, 1, 10), 0);
	CHECK_EQ(ibvb_attach(&r, ctl, 0), 0);
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

#define NONEXISTENT_DATA "/nonexistent-ibvb-dir/ring.dat"

static void t_geometry(void)
{
	struct tp p;
	char ctl[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "geom", NULL), 0);
	ctl_of(ctl, sizeof ctl, "geom");
	uint8_t saved[0x200];
	memcpy(saved, p.ctl, sizeof saved);
	struct ibvb_ctl *c = p.ctl;
	for (int k = 0;; k++) {
		memcpy(c, saved, sizeof saved);
		/* Point data_path at a file that does not exist: getting -EBADMSG rather than -ENOENT proves the
		 * geometry is rejected before the data file is opened or mapped. */
		strcpy(c->data_path, NONEXISTENT_DATA);
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
		case 13: what = "payload outside file"; c->payload_offset = c->data_file_size; break;
		case 14: what = "meta_offset unaligned"; c->meta_offset += 8; break;
		case 15: what = "meta_size 8"; c->meta_size = 8; break;
		case 16: what = "data_file_size too small"; c->data_file_size -= 4096; break;
		case 17: what = "data_file_size not page multiple"; c->data_file_size += 1; break;
		case 18: what = "slot_size overflow"; c->slot_size = 0xFFFFFFFFFFFFFFC0ULL; break;
		case 19: what = "desc_offset + size overflow"; c->desc_offset = UINT64_MAX - 4095; break;
		case 20: what = "packet_size past file"; c->packet_size = UINT64_MAX - 100; break;
		case 21: what = "ctl_size 8192"; c->ctl_size = 8192; break;
		case 22: what = "state 7"; atomic_store(&c->state, 7); break;
		case 23: what = "data_path relative"; strcpy(c->data_path, "ring.dat"); break;
		case 24: what = "data_path empty"; c->data_path[0] = 0; break;
		case 25: what = "data_path unterminated"; memset(c->data_path, 'a', IBVB_DATA_PATH_MAX);
			c->data_path[0] = '/'; break;
		default: what = NULL;
		}
		if (!what)
			break;
		int rc = ibvb_attach(&r, ctl, 0);
		if (rc != -EBADMSG)
			fprintf(stderr, "    case %d (%s): rc %d (%s)\n", k, what, rc, ibvb_last_error());
		CHECK_EQ(rc, -EBADMSG);
	}
	/* data file size mismatch (needs the real data file) */
	memcpy(c, saved, sizeof saved);
	CHECK_EQ(ftruncate(p.dat_fd, (off_t)p.data_size + 4096), 0);
	CHECK_EQ(ibvb_attach(&r, ctl, 0), -EBADMSG);
	CHECK(strstr(ibvb_last_error(), "bytes"));
	CHECK_EQ(ftruncate(p.dat_fd, (off_t)p.data_size), 0);
	/* none of the failures left the consumer lock held or the ring damaged */
	CHECK_EQ(ibvb_attach(&r, ctl, 0), 0);
	ibvb_detach(r);
	tp_close(&p);

	/* a control file shorter than 4096 bytes is corrupt (never mapped past its end) */
	char shortp[512];
	snprintf(shortp, sizeof shortp, "%s/ibvbridge.short.v1.ctl", g_dir);
	int fd = open(shortp, O_RDWR | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0);
	CHECK_EQ(ftruncate(fd, 100), 0);
	close(fd);
	CHECK_EQ(ibvb_attach(&r, shortp, 0), -EBADMSG);
	unlink(shortp);
}

static void t_desc_corrupt(void)
{
	struct tp p;
	char ctl[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "desc", NULL), 0);
	ctl_of(ctl, sizeof ctl, "desc");
	CHECK_EQ(pub(&p, 5, 100), 0);
	CHECK_EQ(ibvb_attach(&r, ctl, 0), 0);
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
	ibvb_detach(r);
	tp_close(&p);
}

static void t_busy(void)
{
	struct tp p;
	char ctl[512];
	struct ibvb_ring *a, *b;
	CHECK_EQ(tp_create(&p, g_dir, "busy", NULL), 0);
	ctl_of(ctl, sizeof ctl, "busy");
	for (int i = 0; i < 3; i++)
		CHECK_EQ(pub(&p, 10 + i, 64), 0);
	CHECK_EQ(ibvb_attach(&a, ctl, 0), 0);
	CHECK_EQ(ibvb_attach(&b, ctl, 0), -EBUSY);
	CHECK(strstr(ibvb_last_error(), "busy"));
	struct ibvb_heap h1, h2;
	CHECK_EQ(ibvb_peek(a, &h1), 0);
	CHECK_EQ(ibvb_peek(a, &h2), 0);
	ibvb_release(a, &h1); /* h2 is held when a detaches */
	ibvb_detach(a);
	CHECK_EQ(ibvb_attach(&b, ctl, 0), 0);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(b, &h), 0);
	CHECK_EQ(h.heap_cnt, 11); /* continues at tail: the unreleased heap again */
	CHECK(pattern_ok(&h));
	ibvb_release(b, &h);
	CHECK_EQ(ibvb_peek(b, &h), 0);
	CHECK_EQ(h.heap_cnt, 12);
	ibvb_release(b, &h);
	/* by name: not in /dev/shm → ENOENT; invalid names → EINVAL */
	CHECK_EQ(ibvb_attach(&a, "no-such-ring-ibvb-test", 0), -ENOENT);
	CHECK_EQ(ibvb_attach(&a, ".hidden", 0), -EINVAL);
	CHECK_EQ(ibvb_attach(&a, "a b", 0), -EINVAL);
	CHECK_EQ(ibvb_attach(&a, "/tmp/x.dat", 0), -EINVAL);
	ibvb_detach(b);
	tp_close(&p);
}

static void t_not_found(void)
{
	char ctl[512];
	struct ibvb_ring *r;
	ctl_of(ctl, sizeof ctl, "nf");
	int64_t t0 = now_ms();
	CHECK_EQ(ibvb_attach(&r, ctl, 80), -ENOENT);
	CHECK(now_ms() - t0 >= 70);
	CHECK(strstr(ibvb_last_error(), "not found"));
}

struct delayed {
	struct tp *p;
	int ms;
	int action; /* 0 create "late", 1 set READY, 2 publish, 3 close, 4 kill pid */
	pid_t pid;
	int64_t when;
	int rc;
};

static void *delayed_fn(void *arg)
{
	struct delayed *d = arg;
	msleep(d->ms);
	d->when = now_ms();
	switch (d->action) {
	case 0: d->rc = tp_create(d->p, g_dir, "late", NULL); break;
	case 1: atomic_store_explicit(&d->p->ctl->state, IBVB_STATE_READY, memory_order_release); break;
	case 2: d->rc = pub(d->p, 77, 64); break;
	case 3: tp_close(d->p); break;
	case 4: kill(d->pid, SIGKILL); break;
	}
	return NULL;
}

static void t_attach_waits(void)
{
	struct tp p, q;
	char ctl[512];
	struct ibvb_ring *r;
	pthread_t th;
	/* the file appears later */
	struct delayed d = {.p = &q, .ms = 100, .action = 0};
	ctl_of(ctl, sizeof ctl, "late");
	pthread_create(&th, NULL, delayed_fn, &d);
	CHECK_EQ(ibvb_attach(&r, ctl, 3000), 0);
	pthread_join(th, NULL);
	CHECK_EQ(d.rc, 0);
	ibvb_detach(r);
	tp_close(&q);
	/* INIT: wait, time out; then READY arrives while waiting */
	CHECK_EQ(tp_create(&p, g_dir, "init", NULL), 0);
	ctl_of(ctl, sizeof ctl, "init");
	atomic_store(&p.ctl->state, IBVB_STATE_INIT);
	CHECK_EQ(ibvb_attach(&r, ctl, 100), -ETIMEDOUT);
	CHECK(strstr(ibvb_last_error(), "not ready"));
	d = (struct delayed){.p = &p, .ms = 100, .action = 1};
	pthread_create(&th, NULL, delayed_fn, &d);
	CHECK_EQ(ibvb_attach(&r, ctl, 3000), 0);
	pthread_join(th, NULL);
	ibvb_detach(r);
	tp_close(&p);
}

static void t_wait_timeout(void)
{
	struct tp p;
	char ctl[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "wto", NULL), 0);
	ctl_of(ctl, sizeof ctl, "wto");
	CHECK_EQ(ibvb_attach(&r, ctl, 0), 0);
	struct ibvb_heap h;
	int64_t t0 = now_ms();
	CHECK_EQ(ibvb_wait(r, &h, 0), -ETIMEDOUT);
	CHECK(now_ms() - t0 < 50);
	t0 = now_ms();
	CHECK_EQ(ibvb_wait(r, &h, 300), -ETIMEDOUT); /* more than one 250 ms slice */
	int64_t el = now_ms() - t0;
	CHECK(el >= 290 && el < 1000);
	CHECK_EQ(atomic_load(&p.ctl->consumer_waiting), 0);
	ibvb_detach(r);
	tp_close(&p);
}

struct waker {
	struct tp *p;
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
		while (atomic_load(&w->p->ctl->consumer_waiting) == 0) {
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
	char ctl[512];
	struct ibvb_ring *r;
	struct tp_opts o = {.futex_start = futex_start};
	CHECK_EQ(tp_create(&p, g_dir, name, &o), 0);
	ctl_of(ctl, sizeof ctl, name);
	CHECK_EQ(ibvb_attach(&r, ctl, 0), 0);
	struct waker w = {.p = &p, .rounds = rounds};
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
	CHECK_EQ(atomic_load(&p.ctl->consumer_futex), (uint32_t)(futex_start + rounds));
	ibvb_detach(r);
	tp_close(&p);
}

static void t_wait_wakes(void) { wake_rounds("wake", 0, 5); }
static void t_futex_wrap(void) { wake_rounds("fwrap", 0xFFFFFFFEu, 5); }

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

/* With naps (ibvb_set_max_latency) a moving stream is read without asking the producer for wakes: every
 * heap still arrives in order, none waits much longer than the nap, and the consumer never announces
 * itself while the stream moves. An idle stream then goes back to the futex: a wait times out on time
 * and a heap after the pause is still delivered. */
static void t_wait_naps(void)
{
	struct tp p;
	char ctl[512];
	struct ibvb_ring *r;
	struct tp_opts o = {.slot_count = 64};
	CHECK_EQ(tp_create(&p, g_dir, "naps", &o), 0);
	ctl_of(ctl, sizeof ctl, "naps");
	CHECK_EQ(ibvb_attach(&r, ctl, 0), 0);
	ibvb_set_max_latency(r, 2000000); /* 2 ms */
	struct trickle t = {.p = &p, .heaps = 40, .gap_us = 500};
	pthread_t th;
	pthread_create(&th, NULL, trickle_fn, &t);
	uint32_t futex_before = atomic_load(&p.ctl->consumer_futex);
	for (int i = 0; i < t.heaps; i++) {
		struct ibvb_heap h;
		CHECK_EQ(ibvb_wait(r, &h, 5000), 0);
		CHECK_EQ(h.heap_cnt, 2000 + i);
		ibvb_release(r, &h);
	}
	pthread_join(th, NULL);
	/* the first wait may find an idle stream and sleep on the futex once; a wake per heap would be 40 */
	CHECK(atomic_load(&p.ctl->consumer_futex) - futex_before <= 2);
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

static void t_producer_death(void)
{
	char ctl[512];
	int pfd[2];
	CHECK_EQ(pipe(pfd), 0);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct tp p;
		close(pfd[0]);
		if (tp_create(&p, g_dir, "death", NULL) != 0)
			_exit(1);
		for (int i = 0; i < 3; i++)
			pub(&p, i, 64);
		char c = 'x';
		if (write(pfd[1], &c, 1) != 1)
			_exit(1);
		for (;;)
			pause();
	}
	close(pfd[1]);
	char c;
	CHECK_EQ(read(pfd[0], &c, 1), 1);
	close(pfd[0]);
	ctl_of(ctl, sizeof ctl, "death");
	struct ibvb_ring *r;
	int rc = ibvb_attach(&r, ctl, 1000);
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
	/* published-but-unread heaps come out before EPIPE even when the producer is already dead */
	ibvb_detach(r);
}

static void t_death_before_drain(void)
{
	char ctl[512];
	int pfd[2];
	CHECK_EQ(pipe(pfd), 0);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct tp p;
		close(pfd[0]);
		if (tp_create(&p, g_dir, "death2", NULL) != 0)
			_exit(1);
		for (int i = 0; i < 4; i++)
			pub(&p, i, 64);
		char c = 'x';
		if (write(pfd[1], &c, 1) != 1)
			_exit(1);
		for (;;)
			pause();
	}
	close(pfd[1]);
	char c;
	CHECK_EQ(read(pfd[0], &c, 1), 1);
	close(pfd[0]);
	ctl_of(ctl, sizeof ctl, "death2");
	struct ibvb_ring *r;
	int rc = ibvb_attach(&r, ctl, 1000);
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

static void t_closed(void)
{
	struct tp p;
	char ctl[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "closed", NULL), 0);
	ctl_of(ctl, sizeof ctl, "closed");
	CHECK_EQ(pub(&p, 1, 64), 0);
	CHECK_EQ(pub(&p, 2, 64), 0);
	CHECK_EQ(ibvb_attach(&r, ctl, 0), 0);
	tp_close(&p); /* unlinks the files; our mappings stay valid */
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(r, &h), 0);
	CHECK(pattern_ok(&h));
	ibvb_release(r, &h);
	CHECK_EQ(ibvb_wait(r, &h, 1000), 0);
	ibvb_release(r, &h);
	CHECK_EQ(ibvb_peek(r, &h), -ENODATA);
	CHECK_EQ(ibvb_wait(r, &h, 1000), -ENODATA);
	ibvb_detach(r);

	/* a consumer asleep in wait is woken by the close */
	CHECK_EQ(tp_create(&p, g_dir, "closed2", NULL), 0);
	ctl_of(ctl, sizeof ctl, "closed2");
	CHECK_EQ(ibvb_attach(&r, ctl, 0), 0);
	struct delayed d = {.p = &p, .ms = 100, .action = 3};
	pthread_t th;
	pthread_create(&th, NULL, delayed_fn, &d);
	CHECK_EQ(ibvb_wait(r, &h, 5000), -ENODATA);
	int64_t lat = now_ms() - d.when;
	pthread_join(th, NULL);
	CHECK(lat < 150);
	ibvb_detach(r);
}

static void t_eos(void)
{
	struct tp p;
	char ctl[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "eos", NULL), 0);
	ctl_of(ctl, sizeof ctl, "eos");
	CHECK_EQ(pub(&p, 1, 64), 0);
	CHECK_EQ(pub(&p, 2, 64), 0);
	CHECK_EQ(tp_publish_eos(&p), 0);
	CHECK_EQ(ibvb_attach(&r, ctl, 0), 0);
	struct ibvb_heap h, h2;
	CHECK_EQ(ibvb_peek(r, &h), 0);
	ibvb_release(r, &h);
	CHECK_EQ(ibvb_peek(r, &h), 0);
	ibvb_release(r, &h);
	CHECK_EQ(ibvb_peek(r, &h), -ENODATA);
	CHECK_EQ(atomic_load(&p.ctl->tail), 3); /* the marker is released */
	CHECK_EQ(ibvb_peek(r, &h), -EAGAIN);     /* producer alive, not closed */
	/* with heaps held, the marker is released together with the last of them */
	CHECK_EQ(pub(&p, 3, 64), 0);
	CHECK_EQ(pub(&p, 4, 64), 0);
	CHECK_EQ(tp_publish_eos(&p), 0);
	CHECK_EQ(ibvb_peek(r, &h), 0);
	CHECK_EQ(ibvb_peek(r, &h2), 0);
	CHECK_EQ(ibvb_peek(r, &h2), -ENODATA);
	CHECK_EQ(atomic_load(&p.ctl->tail), 3); /* held heaps not released by the marker */
	CHECK(pattern_ok(&h));
	ibvb_release(r, &h);
	CHECK_EQ(atomic_load(&p.ctl->tail), 4);
	CHECK_EQ(ibvb_peek(r, &h2), -EAGAIN);
	h2.position = 4;
	ibvb_release(r, &h2);
	CHECK_EQ(atomic_load(&p.ctl->tail), 6);
	ibvb_detach(r);
	tp_close(&p);
}

static void t_readonly(void)
{
	struct tp p;
	char ctl[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "ro", NULL), 0);
	ctl_of(ctl, sizeof ctl, "ro");
	CHECK_EQ(pub(&p, 1, 64), 0);
	CHECK_EQ(ibvb_attach(&r, ctl, 0), 0);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(r, &h), 0);
	for (int k = 0; k < 2; k++) {
		pid_t pid = fork();
		CHECK(pid >= 0);
		if (pid == 0) {
			signal(SIGSEGV, SIG_DFL);
			if (k == 0)
				*(volatile uint8_t *)h.payload = 1;
			else
				*(volatile uint64_t *)&r->desc[0].seq = 99;
			_exit(0);
		}
		int st;
		waitpid(pid, &st, 0);
		CHECK(WIFSIGNALED(st));
		CHECK_EQ(WTERMSIG(st), SIGSEGV);
	}
	CHECK(pattern_ok(&h));
	ibvb_release(r, &h);
	ibvb_detach(r);
	tp_close(&p);
}

static void t_wrap(void)
{
	struct tp p;
	char ctl[512];
	struct ibvb_ring *r;
	uint64_t start = UINT64_MAX - 2; /* 2^64 - 3 */
	struct tp_opts o = {.slot_count = 4, .start_pos = start};
	CHECK_EQ(tp_create(&p, g_dir, "wrap", &o), 0);
	ctl_of(ctl, sizeof ctl, "wrap");
	CHECK_EQ(ibvb_attach(&r, ctl, 0), 0);
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
		CHECK_EQ(atomic_load(&p.ctl->tail), pos);
		cnt += 4;
	}
	CHECK_EQ(pos, start + 16);
	CHECK(pos < start); /* wrapped */
	ibvb_detach(r);
	tp_close(&p);
}

static void t_meta(void)
{
	struct tp p;
	char ctl[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "meta", NULL), 0);
	ctl_of(ctl, sizeof ctl, "meta");
	CHECK_EQ(ibvb_attach(&r, ctl, 0), 0);
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

static void t_stats(void)
{
	struct tp p;
	char ctl[512];
	struct ibvb_ring *r;
	CHECK_EQ(tp_create(&p, g_dir, "stats", NULL), 0);
	ctl_of(ctl, sizeof ctl, "stats");
	for (int i = 0; i < 10; i++)
		atomic_store(&p.ctl->stats[i], 100 + i);
	atomic_store(&p.ctl->stats[12], 5); /* beyond stats_count: reads as 0 */
	CHECK_EQ(ibvb_attach(&r, ctl, 0), 0);
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
	CHECK_EQ(ibvb_counter(r, 12), 0);
	CHECK_EQ(ibvb_counter(r, 99), 0);
	CHECK(!strcmp(ibvb_counter_name(8), "discarded_incomplete_heaps"));
	CHECK(ibvb_counter_name(10) == NULL);
	p.ctl->stats_count = 3;
	CHECK_EQ(ibvb_counter(r, 2), 102);
	CHECK_EQ(ibvb_counter(r, 3), 0);
	struct ibvb_info in;
	CHECK_EQ(ibvb_info(r, &in), 0);
	CHECK_EQ(in.major, 1);
	CHECK_EQ(in.state, IBVB_STATE_READY);
	CHECK_EQ(in.slot_size, 4096);
	CHECK_EQ(in.max_items, 8);
	CHECK(!strcmp(in.data_path, p.dat_path));
	ibvb_detach(r);
	tp_close(&p);
}

struct pwaiter {
	struct tp *p;
	uint32_t f;
	int64_t woke;
};

static void *pwaiter_fn(void *arg)
{
	struct pwaiter *w = arg;
	struct timespec ts = {5, 0};
	while (atomic_load(&w->p->ctl->producer_futex) == w->f)
		syscall(SYS_futex, (uint32_t *)&w->p->ctl->producer_futex, FUTEX_WAIT, w->f, &ts, NULL, 0);
	w->woke = now_ms();
	return NULL;
}

static void t_producer_wake(void)
{
	struct tp p;
	char ctl[512];
	struct ibvb_ring *r;
	struct tp_opts o = {.slot_count = 2, .policy = IBVB_POLICY_BLOCK};
	CHECK_EQ(tp_create(&p, g_dir, "pwake", &o), 0);
	ctl_of(ctl, sizeof ctl, "pwake");
	CHECK_EQ(pub(&p, 1, 64), 0);
	CHECK_EQ(pub(&p, 2, 64), 0);
	CHECK_EQ(ibvb_attach(&r, ctl, 0), 0);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(r, &h), 0);
	/* block-policy producer: announce, then sleep on producer_futex */
	struct pwaiter w = {.p = &p, .f = atomic_load(&p.ctl->producer_futex)};
	atomic_store(&p.ctl->producer_waiting, 1);
	pthread_t th;
	pthread_create(&th, NULL, pwaiter_fn, &w);
	msleep(50);
	int64_t t0 = now_ms();
	ibvb_release(r, &h);
	pthread_join(th, NULL);
	CHECK(w.woke - t0 < 100);
	CHECK_EQ(atomic_load(&p.ctl->producer_waiting), 0);
	CHECK_EQ(atomic_load(&p.ctl->producer_futex), w.f + 1);
	CHECK_EQ(pub(&p, 3, 64), 0);
	ibvb_detach(r);
	tp_close(&p);
}

/* ---- ibvb-consume ------------------------------------------------------------------------------ */

static int run_consume(const char *ctl, const char *extra1, const char *extra2, char *out, size_t cap, pid_t *pidp,
		       int *outfd)
{
	int pfd[2];
	if (pipe(pfd) < 0)
		return -1;
	pid_t pid = fork();
	if (pid == 0) {
		dup2(pfd[1], 1);
		close(pfd[0]);
		close(pfd[1]);
		execl(g_consume, g_consume, "--ring", ctl, "--verify", "--timeout-ms", "5000", extra1, extra2,
		      (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	*pidp = pid;
	*outfd = pfd[0];
	(void)out;
	(void)cap;
	return 0;
}

static int finish_consume(pid_t pid, int fd, char *out, size_t cap)
{
	size_t n = 0;
	ssize_t k;
	while (n + 1 < cap && (k = read(fd, out + n, cap - 1 - n)) > 0)
		n += (size_t)k;
	out[n] = 0;
	close(fd);
	int st;
	waitpid(pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void t_consume_tool(void)
{
	if (!g_consume) {
		fprintf(stderr, "    (skipped: no ibvb-consume path given)\n");
		return;
	}
	struct tp p;
	char ctl[512], out[4096], want[128];
	pid_t pid;
	int fd;
	CHECK_EQ(tp_create(&p, g_dir, "tool", NULL), 0);
	ctl_of(ctl, sizeof ctl, "tool");
	CHECK_EQ(run_consume(ctl, "--hold", "3", out, sizeof out, &pid, &fd), 0);
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
	int ec = finish_consume(pid, fd, out, sizeof out);
	if (ec != 0 || !strstr(out, "\"result\":\"eos\""))
		fprintf(stderr, "    ibvb-consume exit %d: %s\n", ec, out);
	CHECK_EQ(ec, 0);
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
	snprintf(want, sizeof want, "\"session_id\":%" PRIu64 "}", p.ctl->session_id);
	CHECK(strstr(out, want));
	CHECK_EQ(atomic_load(&p.ctl->tail), p.head); /* everything released, the marker too */

	/* --max-heaps, and out-of-order heap_cnt */
	CHECK_EQ(pub(&p, 10, 64), 0);
	CHECK_EQ(pub(&p, 9, 64), 0);
	CHECK_EQ(pub(&p, 11, 64), 0);
	CHECK_EQ(run_consume(ctl, "--max-heaps", "2", out, sizeof out, &pid, &fd), 0);
	ec = finish_consume(pid, fd, out, sizeof out);
	CHECK_EQ(ec, 0);
	CHECK(strstr(out, "\"result\":\"max\""));
	CHECK(strstr(out, "\"heaps\":2,"));
	CHECK(strstr(out, "\"heap_cnt_out_of_order\":1,"));
	CHECK(strstr(out, "\"verify_errors\":0,"));

	/* timeout: nothing more comes (one heap is left) */
	CHECK_EQ(run_consume(ctl, "--timeout-ms", "200", out, sizeof out, &pid, &fd), 0);
	ec = finish_consume(pid, fd, out, sizeof out);
	CHECK_EQ(ec, 3);
	CHECK(strstr(out, "\"result\":\"timeout\""));
	CHECK(strstr(out, "\"heaps\":1,"));

	/* producer gone */
	tp_abandon(&p);
	CHECK_EQ(run_consume(ctl, "--sleep-us", "10", out, sizeof out, &pid, &fd), 0);
	ec = finish_consume(pid, fd, out, sizeof out);
	CHECK_EQ(ec, 2);
	CHECK(strstr(out, "\"result\":\"producer_gone\""));

	/* not found */
	unlink(p.ctl_path);
	unlink(p.dat_path);
	CHECK_EQ(run_consume(ctl, "--timeout-ms", "50", out, sizeof out, &pid, &fd), 0);
	ec = finish_consume(pid, fd, out, sizeof out);
	CHECK_EQ(ec, 1);
	CHECK(strstr(out, "\"result\":\"error\""));
	CHECK(strstr(out, "not found"));
}

/* ---- runner ------------------------------------------------------------------------------------ */

struct test {
	const char *name;
	void (*fn)(void);
};

static const struct test tests[] = {
    {"roundtrip", t_roundtrip},
    {"batch", t_batch},
    {"items", t_items},
    {"hold_and_full", t_hold_and_full},
    {"bad_magic", t_bad_magic},
    {"major_mismatch", t_major},
    {"newer_minor", t_minor},
    {"geometry_corrupt", t_geometry},
    {"descriptor_corrupt", t_desc_corrupt},
    {"busy_and_takeover", t_busy},
    {"not_found", t_not_found},
    {"attach_waits", t_attach_waits},
    {"wait_timeout", t_wait_timeout},
    {"wait_naps", t_wait_naps},
    {"wait_wakes", t_wait_wakes},
    {"futex_wrap", t_futex_wrap},
    {"producer_death", t_producer_death},
    {"producer_death_before_drain", t_death_before_drain},
    {"closed", t_closed},
    {"end_of_stream", t_eos},
    {"readonly_data", t_readonly},
    {"cursor_wrap", t_wrap},
    {"metadata", t_meta},
    {"stats", t_stats},
    {"producer_wake", t_producer_wake},
    {"consume_tool", t_consume_tool},
};

static void rm_dir(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	char path[1024];
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		unlink(path);
	}
	closedir(d);
	rmdir(dir);
}

int main(int argc, char **argv)
{
	if (argc > 1)
		g_consume = argv[1];
	const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
	snprintf(g_dir, sizeof g_dir, "%s/ibvb-test.XXXXXX", base);
	if (!mkdtemp(g_dir)) {
		perror("mkdtemp");
		return 1;
	}
	const char *only = getenv("IBVB_TEST");
	int passed = 0, failed = 0;
	for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
		if (only && !strstr(tests[i].name, only))
			continue;
		fflush(stdout);
		int64_t t0 = now_ms();
		pid_t pid = fork();
		if (pid == 0) {
			alarm(60);
			g_fail = 0;
			tests[i].fn();
			_exit(g_fail ? 1 : 0);
		}
		int st;
		waitpid(pid, &st, 0);
		int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
		if (WIFSIGNALED(st))
			fprintf(stderr, "    killed by signal %d%s\n", WTERMSIG(st), WTERMSIG(st) == SIGALRM ? " (hang)" : "");
		printf("%-32s %s (%lld ms)\n", tests[i].name, ok ? "ok" : "FAIL", (long long)(now_ms() - t0));
		if (ok)
			passed++;
		else
			failed++;
	}
	rm_dir(g_dir);
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
