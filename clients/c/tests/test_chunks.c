/* test_chunks.c — the C client's chunks (docs/ring-layout.md §13) against the test-only C producer with a
 * chunk geometry poked into its header: the geometry validated at attach, each chunk descriptor checked
 * against it, data and presence viewed in place, validity and release as for heaps. (recv's real chunk
 * rings are read by ibvb-consume in interop/chunks_test.go.)
 * usage: test_chunks; IBVB_TEST=substring runs a subset. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ibvbridge.h"
#include "harness.h"
#include "test_producer.h"

static char g_dir[256];

enum { H = 4, A = 2, S = 16, NP = H * A, CB = NP * S, SLOT = 192 };

/* A ring "name" whose header says CHUNKS with this geometry (written before anyone attaches). */
static int chunk_ring(struct tp *p, const char *name, uint32_t heaps, uint32_t axis, uint64_t heap_size,
		      uint64_t step)
{
	struct tp_opts o = {.slot_size = SLOT};
	int rc = tp_create(p, g_dir, name, &o);
	if (rc < 0)
		return rc;
	p->ctl->features |= IBVB_FEATURE_CHUNKS;
	p->ctl->chunk_heaps = heaps;
	p->ctl->chunk_axis = axis;
	p->ctl->chunk_heap_size = heap_size;
	p->ctl->chunk_step = step;
	p->ctl->chunk_time_item = 0x1600;
	p->ctl->chunk_axis_item = 0x4101;
	return 0;
}

/* Publish chunk cid: position k holds bytes (cid*64 + k*8 + i), then presence; descriptor fields as given. */
static int pub_chunk(struct tp *p, uint64_t cid, const uint8_t *presence, uint32_t flags, uint64_t heap_size,
		     uint64_t received)
{
	uint8_t buf[CB + NP];
	for (int k = 0; k < NP; k++)
		for (int i = 0; i < S; i++)
			buf[k * S + i] = (uint8_t)(cid * 64 + k * 8 + i);
	memcpy(buf + CB, presence, NP);
	uint64_t pos;
	int rc = tp_stage(p, cid, buf, sizeof buf, NULL, 0, flags, &pos);
	if (rc < 0)
		return rc;
	p->desc[pos & p->mask].heap_size = heap_size;
	p->desc[pos & p->mask].received = received;
	tp_commit(p);
	return 0;
}

static struct ibvb_ring *attach(const char *name)
{
	char sock[512];
	struct ibvb_ring *r = NULL;
	snprintf(sock, sizeof sock, "%s/%s.v2.sock", g_dir, name);
	return ibvb_attach(&r, sock, 1000) == 0 ? r : NULL;
}

static const uint8_t all[NP] = {1, 1, 1, 1, 1, 1, 1, 1};

static void t_chunk_views_every_position_in_place(void)
{
	struct tp p;
	CHECK_EQ(chunk_ring(&p, "ck", H, A, S, 4), 0);
	static const uint8_t some[NP] = {1, 0, 1, 2, 1, 1, 0, 1}; /* a 2 is corrupt: not present */
	CHECK_EQ(pub_chunk(&p, 0, all, IBVB_FLAG_CHUNK | IBVB_FLAG_COMPLETE, CB, CB), 0);
	CHECK_EQ(pub_chunk(&p, 2, some, IBVB_FLAG_CHUNK | IBVB_FLAG_INCOMPLETE, CB, 5 * S), 0);
	CHECK_EQ(tp_publish_eos(&p), 0);
	struct ibvb_ring *r = attach("ck");
	CHECK(r != NULL);
	struct ibvb_chunk_geometry g;
	CHECK_EQ(ibvb_chunk_geometry(r, &g), 0);
	CHECK(g.heaps == H && g.axis == A && g.heap_size == S && g.step == 4 && g.time_item == 0x1600 &&
	      g.axis_item == 0x4101 && g.positions == NP && g.chunk_bytes == CB);
	struct ibvb_chunk c;
	CHECK_EQ(ibvb_wait_chunk(r, &c, 1000), 0);
	CHECK_EQ(c.chunk_id, 0);
	CHECK(c.heap.flags & IBVB_FLAG_COMPLETE);
	CHECK(c.data == c.heap.payload && c.present == c.heap.payload + CB); /* in place, no copy */
	for (uint32_t t = 0; t < H; t++)
		for (uint32_t a = 0; a < A; a++) {
			CHECK_EQ(ibvb_chunk_present(&c, t, a), 1);
			CHECK_EQ(ibvb_chunk_heap(&c, t, a)[3], (uint8_t)((t * A + a) * 8 + 3));
		}
	CHECK(ibvb_chunk_heap(&c, H, 0) == NULL && ibvb_chunk_heap(&c, 0, A) == NULL);
	CHECK_EQ(ibvb_chunk_present(&c, H, 0), 0);
	CHECK_EQ(ibvb_heap_valid(r, &c.heap), 1);
	CHECK_EQ(ibvb_release(r, &c.heap), 0);
	CHECK_EQ(ibvb_wait_chunk(r, &c, 1000), 0);
	CHECK_EQ(c.chunk_id, 2);
	CHECK(c.heap.flags & IBVB_FLAG_INCOMPLETE);
	int present = 0;
	for (uint32_t k = 0; k < NP; k++)
		present += ibvb_chunk_present(&c, k / A, k % A);
	CHECK_EQ(present, 5);
	CHECK_EQ(ibvb_chunk_heap(&c, 3, 1)[0], (uint8_t)(2 * 64 + 7 * 8));
	CHECK_EQ(ibvb_release(r, &c.heap), 0);
	CHECK_EQ(ibvb_wait_chunk(r, &c, 1000), -ENODATA);
	ibvb_detach(r);
	tp_close(&p);
}

/* Each bad geometry is refused at attach with -EBADMSG, before the data is used. */
static void t_bad_chunk_geometry_is_refused_at_attach(void)
{
	static const struct {
		uint32_t heaps, axis;
		uint64_t heap_size, step;
	} bad[] = {
	    {0, A, S, 1},     {H, 0, S, 1}, {H, A, 0, 1}, {H, A, S, 0},
	    {H, A, 24, 1},                                   /* 8 × 24 + 8 = 200 > slot_size 192 */
	    {H, A, 1ull << 61, 1},                           /* 8 × 2^61 overflows u64 */
	    {0xFFFFFFFFu, 0xFFFFFFFFu, ~0ull, 1},            /* every product overflows */
	    {1, 1, ~0ull, 1},                                /* the sum with the presence map overflows */
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct tp p;
		char name[16];
		snprintf(name, sizeof name, "bad%zu", i);
		CHECK_EQ(chunk_ring(&p, name, bad[i].heaps, bad[i].axis, bad[i].heap_size, bad[i].step), 0);
		CHECK(attach(name) == NULL);
		CHECK(strstr(ibvb_last_error(), "chunk") != NULL);
		tp_close(&p);
	}
	struct tp p; /* exactly full: 8 × 23 + 8 = 192 */
	CHECK_EQ(chunk_ring(&p, "full", H, A, 23, 1), 0);
	struct ibvb_ring *r = attach("full");
	CHECK(r != NULL);
	ibvb_detach(r);
	tp_close(&p);
}

/* Without the CHUNKS feature the fields are ignored and the chunk calls say -ENOTSUP. */
static void t_no_chunks_feature_is_enotsup(void)
{
	struct tp p;
	CHECK_EQ(chunk_ring(&p, "plain", 0, 7, 0, 0), 0);
	p.ctl->features = 0;
	CHECK_EQ(tp_publish(&p, 1, NULL, 32, NULL, 0, IBVB_FLAG_COMPLETE), 0);
	struct ibvb_ring *r = attach("plain");
	CHECK(r != NULL);
	struct ibvb_chunk_geometry g;
	CHECK_EQ(ibvb_chunk_geometry(r, &g), -ENOTSUP);
	struct ibvb_chunk c;
	CHECK_EQ(ibvb_wait_chunk(r, &c, 1000), -ENOTSUP);
	CHECK_EQ(ibvb_held(r), 1); /* the position stays held: the caller releases it */
	ibvb_detach(r);
	tp_close(&p);
}

/* A descriptor that is not a chunk of this geometry is -EBADMSG, naming what is wrong. */
static void t_bad_chunk_descriptor_is_ebadmsg(void)
{
	static const struct {
		uint32_t flags;
		uint64_t heap_size, received;
		const char *what;
	} bad[] = {
	    {IBVB_FLAG_COMPLETE, CB, CB, "no CHUNK"},
	    {IBVB_FLAG_CHUNK | IBVB_FLAG_COMPLETE, CB - 1, CB, "chunk heap_size"},
	    {IBVB_FLAG_CHUNK | IBVB_FLAG_COMPLETE, CB + 1, CB, "chunk heap_size"},
	    {IBVB_FLAG_CHUNK | IBVB_FLAG_COMPLETE, CB, CB + 1, "chunk received"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct tp p;
		char name[16];
		snprintf(name, sizeof name, "bd%zu", i);
		CHECK_EQ(chunk_ring(&p, name, H, A, S, 1), 0);
		CHECK_EQ(pub_chunk(&p, 0, all, bad[i].flags, bad[i].heap_size, bad[i].received), 0);
		struct ibvb_ring *r = attach(name);
		CHECK(r != NULL);
		struct ibvb_chunk c;
		CHECK_EQ(ibvb_wait_chunk(r, &c, 1000), -EBADMSG);
		CHECK(strstr(ibvb_last_error(), bad[i].what) != NULL);
		ibvb_detach(r);
		tp_close(&p);
	}
}

/* Overrun while a chunk is held: ibvb_heap_valid 0 and ibvb_release -ESTALE, as for a heap. */
static void t_chunk_overrun_while_held_is_stale(void)
{
	struct tp p;
	CHECK_EQ(chunk_ring(&p, "ov", H, A, S, 1), 0);
	CHECK_EQ(pub_chunk(&p, 0, all, IBVB_FLAG_CHUNK | IBVB_FLAG_COMPLETE, CB, CB), 0);
	struct ibvb_ring *r = attach("ov");
	CHECK(r != NULL);
	struct ibvb_chunk c;
	CHECK_EQ(ibvb_wait_chunk(r, &c, 1000), 0);
	CHECK_EQ(ibvb_heap_valid(r, &c.heap), 1);
	tp_detach_row(&p, ibvb_consumer_index(r), IBVB_CONSUMER_OVERRUN, 1);
	CHECK_EQ(ibvb_heap_valid(r, &c.heap), 0);
	CHECK_EQ(ibvb_release(r, &c.heap), -ESTALE);
	CHECK_EQ(ibvb_wait_chunk(r, &c, 100), -EOVERFLOW);
	ibvb_detach(r);
	tp_close(&p);
}

static const struct test tests[] = {
    {"chunk_views_every_position_in_place", t_chunk_views_every_position_in_place},
    {"bad_chunk_geometry_refused_at_attach", t_bad_chunk_geometry_is_refused_at_attach},
    {"no_chunks_feature_is_enotsup", t_no_chunks_feature_is_enotsup},
    {"bad_chunk_descriptor_is_ebadmsg", t_bad_chunk_descriptor_is_ebadmsg},
    {"chunk_overrun_while_held_is_stale", t_chunk_overrun_while_held_is_stale},
};

int main(void)
{
	snprintf(g_dir, sizeof g_dir, "/tmp/ibvb-chunks.XXXXXX");
	if (!mkdtemp(g_dir)) {
		perror("mkdtemp");
		return 1;
	}
	unsetenv("IBVBRIDGE_RING_DIR");
	return run_tests(tests, sizeof tests / sizeof tests[0], g_dir);
}
