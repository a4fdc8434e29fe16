/* test_producer_api.c — the public C producer (ibvbridge_producer.h) against the C consumer library and the
 * two tools. Each test runs in a forked child with a 60 s alarm.
 * usage: test_producer_api [path/to/ibvb-consume path/to/ibvb-produce]; IBVB_TEST=substring runs a subset. */
#define _GNU_SOURCE
#include <stdint.h>
struct ibvb_ring;
struct ibvb_desc;
/* What a producer may do while a member copies a descriptor (ibvbridge.h calls it in test builds that
 * define it): test_member_never_hands_out_a_descriptor_rewritten_while_it_copied_it. */
static void torn_copy(struct ibvb_ring *r, uint64_t pos, struct ibvb_desc *copy);
#define IBVB_TEST_DESC_COPIED(r, pos, d) torn_copy((r), (pos), (d))
#include "ibvbridge.h"
#include "harness.h"

#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

static char g_dir[256];
static const char *g_consume, *g_produce;

static void pattern(uint8_t *b, uint64_t cnt, uint64_t len)
{
	for (uint64_t i = 0; i < len; i++)
		b[i] = (uint8_t)(cnt * 31 + i);
}
static int pattern_ok(const uint8_t *b, uint64_t cnt, uint64_t len)
{
	for (uint64_t i = 0; i < len; i++)
		if (b[i] != (uint8_t)(cnt * 31 + i))
			return 0;
	return 1;
}

static struct ibvb_producer_opts opts(uint64_t slots, uint64_t size, uint32_t policy)
{
	struct ibvb_producer_opts o;
	memset(&o, 0, sizeof o);
	o.dir = g_dir;
	o.slot_count = slots;
	o.slot_size = size;
	o.max_items = 4;
	o.meta_size = 4096;
	o.policy = policy;
	o.hugepages = IBVB_HUGEPAGES_OFF;
	return o;
}

/* Publish heap cnt with len pattern bytes and the two test items. -EAGAIN: dropped. */
static int pub(struct ibvb_producer *p, uint64_t cnt, uint64_t len)
{
	struct ibvb_slot s;
	int rc = ibvb_producer_acquire(p, &s);
	if (rc < 0)
		return rc;
	pattern(s.payload, cnt, len);
	ibvb_producer_add_item(&s, 0x1000, 0, len, 0);
	ibvb_producer_add_item(&s, 0x1001, cnt, 5, IBVB_ITEM_IMMEDIATE);
	struct ibvb_publish_info h = {cnt, len, len, ibvb_producer_now_ns(), IBVB_FLAG_COMPLETE, 1};
	ibvb_producer_publish(p, &s, &h);
	return 0;
}

static int attach(struct ibvb_ring **r, const char *name, int start)
{
	struct ibvb_attach_opts ao = {.dir = g_dir, .start = start};
	return ibvb_attach_opts(r, name, 5000, &ao);
}

/* A consumer thread: attach, read until end of stream, check every heap byte for byte. */
struct reader {
	const char *name;
	uint64_t len;         /* payload bytes each heap has */
	int sleep_us;         /* per heap */
	const char *group;    /* a consumer group to join (spec §14), NULL: independent */
	uint64_t cnt_sum;     /* sum of the heap_cnts read */
	int attached;         /* set once attached */
	uint64_t heaps, bad, last_cnt, ooo;
	int rc;               /* how it ended */
	pthread_t thr;
};

static void *reader_fn(void *arg)
{
	struct reader *rd = arg;
	struct ibvb_ring *r;
	struct ibvb_attach_opts ao = {.dir = g_dir, .start = IBVB_START_OLDEST, .group = rd->group};
	rd->rc = ibvb_attach_opts(&r, rd->name, 5000, &ao);
	if (rd->rc < 0) {
		__atomic_store_n(&rd->attached, -1, __ATOMIC_RELEASE);
		return NULL;
	}
	__atomic_store_n(&rd->attached, 1, __ATOMIC_RELEASE);
	for (;;) {
		struct ibvb_heap h;
		int rc = ibvb_wait(r, &h, 10000);
		if (rc == -EINTR)
			continue;
		if (rc < 0) {
			rd->rc = rc;
			break;
		}
		const struct ibvb_item *it = ibvb_find_item(&h, 0x1001), *pl = ibvb_find_item(&h, 0x1000);
		int ok = h.received == rd->len && h.heap_size == rd->len && pattern_ok(h.payload, h.heap_cnt, rd->len) &&
			 it && it->value == h.heap_cnt && ibvb_item_is_immediate(it) && pl && pl->length == rd->len &&
			 h.flags == IBVB_FLAG_COMPLETE && h.item_count == 2;
		rd->bad += !ok;
		if (rd->heaps && (rd->group ? h.heap_cnt <= rd->last_cnt : h.heap_cnt != rd->last_cnt + 1))
			rd->ooo++; /* a member reads its share in order, with gaps */
		rd->cnt_sum += h.heap_cnt;
		rd->last_cnt = h.heap_cnt;
		rd->heaps++;
		if (rd->sleep_us)
			usleep((useconds_t)rd->sleep_us);
		ibvb_release(r, &h);
	}
	ibvb_detach(r);
	return NULL;
}

static void start_member(struct reader *rd, const char *name, const char *group, uint64_t len, int sleep_us)
{
	memset(rd, 0, sizeof *rd);
	rd->name = name;
	rd->group = group;
	rd->len = len;
	rd->sleep_us = sleep_us;
	pthread_create(&rd->thr, NULL, reader_fn, rd);
	while (__atomic_load_n(&rd->attached, __ATOMIC_ACQUIRE) == 0)
		msleep(1);
}

static void start_reader(struct reader *rd, const char *name, uint64_t len, int sleep_us)
{
	start_member(rd, name, NULL, len, sleep_us);
}

static int file_exists(const char *name, const char *suffix)
{
	char path[512];
	struct stat sb;
	snprintf(path, sizeof path, "%s/%s%s", g_dir, name, suffix);
	return lstat(path, &sb) == 0;
}


/* Drain every heap a consumer can read now (peek and release, then store the tail): the count, the heap_cnt
 * sum and the bad bytes; *max_cnt the highest heap_cnt, *min_cnt the lowest. */
static uint64_t drain(struct ibvb_ring *r, uint64_t len, uint64_t *sum, uint64_t *min_cnt, uint64_t *bad)
{
	uint64_t n = 0;
	struct ibvb_heap h;
	while (ibvb_peek(r, &h) == 0) {
		*bad += !pattern_ok(h.payload, h.heap_cnt, len);
		*sum += h.heap_cnt;
		if (h.heap_cnt < *min_cnt)
			*min_cnt = h.heap_cnt;
		n++;
		ibvb_release(r, &h);
	}
	ibvb_flush_release(r);
	return n;
}

static uint64_t wait_counter(struct ibvb_producer *p, unsigned idx, uint64_t want)
{
	for (int i = 0; i < 5000 && ibvb_producer_counter(p, idx) != want; i++)
		msleep(1);
	return ibvb_producer_counter(p, idx);
}

/* ---- tests ----------------------------------------------------------------------------------------- */

static void test_bytes_block(void)
{
	struct ibvb_producer_opts o = opts(8, 4096, IBVB_POLICY_BLOCK);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "bytes-block", &o), 0);
	if (!p)
		return;
	CHECK(file_exists("bytes-block", IBVB_SOCK_SUFFIX) && file_exists("bytes-block", IBVB_LOCK_SUFFIX));
	struct reader rd;
	start_reader(&rd, "bytes-block", 3000, 0);
	CHECK_EQ(rd.attached, 1);
	for (uint64_t c = 1; c <= 2000; c++)
		CHECK_EQ(pub(p, c, 3000), 0);
	CHECK_EQ(ibvb_producer_end_of_stream(p, 0, 5000), 0);
	int rc = ibvb_producer_wait_drained(p, 10000);
	CHECK(rc == 0 || rc == -ENOTCONN);
	pthread_join(rd.thr, NULL);
	CHECK_EQ(rd.rc, -ENODATA);
	CHECK_EQ(rd.heaps, 2000);
	CHECK_EQ(rd.bad, 0);
	CHECK_EQ(rd.ooo, 0);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_HEAPS), 2000);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_END_OF_STREAM), 1);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_DROPPED_HEAPS), 0);
	ibvb_producer_close(p);
	CHECK(!file_exists("bytes-block", IBVB_SOCK_SUFFIX) && !file_exists("bytes-block", IBVB_LOCK_SUFFIX));
	struct ibvb_ring *r;
	struct ibvb_attach_opts ao = {.dir = g_dir};
	CHECK_EQ(ibvb_attach_opts(&r, "bytes-block", 50, &ao), -ENOENT);
}

static void test_bytes_drop(void)
{
	/* a slow reader under drop: heaps are dropped (counted), never a held one overwritten */
	struct ibvb_producer_opts o = opts(8, 1024, IBVB_POLICY_DROP);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "bytes-drop", &o), 0);
	if (!p)
		return;
	struct reader rd;
	start_reader(&rd, "bytes-drop", 1000, 20);
	uint64_t dropped = 0;
	for (uint64_t c = 1; c <= 3000; c++) {
		int rc = pub(p, c, 1000);
		if (rc == -EAGAIN) {
			dropped++;
			ibvb_producer_add(p, IBVB_CTR_DROPPED_HEAPS, 1);
			if (c % 64 == 0)
				usleep(50);
		} else
			CHECK_EQ(rc, 0);
	}
	int rc;
	for (int i = 0; i < 100 && (rc = ibvb_producer_end_of_stream(p, 0, 100)) == -EAGAIN; i++)
		;
	CHECK_EQ(rc, 0);
	pthread_join(rd.thr, NULL);
	CHECK_EQ(rd.rc, -ENODATA);
	CHECK(dropped > 0);
	CHECK_EQ(rd.heaps + dropped, 3000);
	CHECK_EQ(rd.bad, 0);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_DROPPED_HEAPS), dropped);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_CONSUMER_OVERRUNS), 0); /* alone: never overrun */
	ibvb_producer_close(p);
}

static void test_three_consumers(void)
{
	struct ibvb_producer_opts o = opts(16, 2048, IBVB_POLICY_BLOCK);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "three", &o), 0);
	if (!p)
		return;
	struct reader rd[3];
	int rc;
	for (int i = 0; i < 3; i++)
		start_reader(&rd[i], "three", 2000, i * 5);
	CHECK_EQ(ibvb_producer_consumers(p), 3);
	for (uint64_t c = 1; c <= 1500; c++)
		CHECK_EQ(pub(p, c, 2000), 0);
	CHECK_EQ(ibvb_producer_end_of_stream(p, 1500, 5000), 0);
	rc = ibvb_producer_wait_drained(p, 20000);
	CHECK(rc == 0 || rc == -ENOTCONN); /* -ENOTCONN: they read the end and detached already */
	for (int i = 0; i < 3; i++) {
		pthread_join(rd[i].thr, NULL);
		CHECK_EQ(rd[i].rc, -ENODATA);
		CHECK_EQ(rd[i].heaps, 1500);
		CHECK_EQ(rd[i].bad, 0);
		CHECK_EQ(rd[i].ooo, 0);
	}
	ibvb_producer_close(p);
}

static void test_tools(void)
{
	/* ibvb-produce → ibvb-consume --verify across processes, checksums equal */
	char cmd[2048];
	for (int policy = 0; policy < 2; policy++) {
		snprintf(cmd, sizeof cmd,
			 "%s --ring tools%d --dir %s --heaps 3000 --heap-size 1500 --slots 16 --policy %s --wait-consumers 1 "
			 "--pattern --hugepages off > %s/prod%d.json & sleep 0.2; %s --ring tools%d --dir %s --verify > %s/cons%d.json; "
			 "wait $!",
			 g_produce, policy, g_dir, policy ? "block" : "drop", g_dir, policy, g_consume, policy, g_dir, g_dir,
			 policy);
		CHECK_EQ(system(cmd), 0);
		char path[512], a[1024] = "", b[2048] = "";
		snprintf(path, sizeof path, "%s/prod%d.json", g_dir, policy);
		FILE *f = fopen(path, "r");
		if (f) {
			if (!fgets(a, sizeof a, f))
				a[0] = 0;
			fclose(f);
		}
		snprintf(path, sizeof path, "%s/cons%d.json", g_dir, policy);
		f = fopen(path, "r");
		if (f) {
			if (!fgets(b, sizeof b, f))
				b[0] = 0;
			fclose(f);
		}
		unsigned long long ph = 0, pc = 0, pd = 0, ch = 0, cc = 0, ve = 1;
		const char *q;
		CHECK((q = strstr(a, "\"heaps\":")) && sscanf(q, "\"heaps\":%llu", &ph) == 1);
		CHECK((q = strstr(a, "\"checksum\":")) && sscanf(q, "\"checksum\":%llu", &pc) == 1);
		CHECK((q = strstr(a, "\"dropped\":")) && sscanf(q, "\"dropped\":%llu", &pd) == 1);
		CHECK((q = strstr(b, "\"heaps\":")) && sscanf(q, "\"heaps\":%llu", &ch) == 1);
		CHECK((q = strstr(b, "\"checksum\":")) && sscanf(q, "\"checksum\":%llu", &cc) == 1);
		CHECK((q = strstr(b, "\"verify_errors\":")) && sscanf(q, "\"verify_errors\":%llu", &ve) == 1);
		CHECK(strstr(b, "\"result\":\"eos\"") != NULL);
		CHECK_EQ(ve, 0);
		CHECK_EQ(ph, ch);
		CHECK_EQ(ph + pd, 3000);
		if (policy == 1) {
			CHECK_EQ(pd, 0);
		}
		if (pd == 0)
			CHECK(pc == cc);
		if (g_fail)
			fprintf(stderr, "    produce: %s    consume: %s", a, b);
	}
}

static void test_overrun(void)
{
	/* drop: a consumer that holds everything is detached as overrun when another is ahead */
	struct ibvb_producer_opts o = opts(8, 256, IBVB_POLICY_DROP);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "overrun", &o), 0);
	if (!p)
		return;
	struct ibvb_ring *slow, *fast;
	CHECK_EQ(attach(&slow, "overrun", IBVB_START_OLDEST), 0);
	CHECK_EQ(attach(&fast, "overrun", IBVB_START_OLDEST), 0);
	uint64_t got = 0;
	for (uint64_t c = 1; c <= 40; c++) {
		CHECK_EQ(pub(p, c, 200), 0);
		struct ibvb_heap h;
		while (ibvb_peek(fast, &h) == 0) {
			CHECK(pattern_ok(h.payload, h.heap_cnt, 200));
			got++;
			ibvb_release(fast, &h);
		}
		ibvb_flush_release(fast);
	}
	CHECK_EQ(got, 40);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_CONSUMER_OVERRUNS), 1);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_DROPPED_HEAPS), 0);
	CHECK_EQ(ibvb_producer_consumers(p), 1);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(slow, &h), -EOVERFLOW);
	struct ibvb_info in;
	ibvb_info(slow, &in);
	CHECK_EQ(in.row_state, IBVB_CONSUMER_OVERRUN);
	CHECK_EQ(in.lost_heaps, 8);
	ibvb_detach(slow);
	ibvb_detach(fast);
	ibvb_producer_close(p);
}

/* Spec 2.1 §A with the library's producer, in another process (forked): a slow consumer holds heap 1 while
 * a fast one keeps up and the producer laps the slow one; the held heap's bytes are then another heap's,
 * ibvb_heap_valid says 0, its release -ESTALE, the next peek -EOVERFLOW with the 8 heaps lost. */
static void test_overrun_while_held_is_reported_with_forked_producer(void)
{
	int go[2], done[2];
	CHECK_EQ(pipe(go), 0);
	CHECK_EQ(pipe(done), 0);
	pid_t pid = fork();
	if (pid == 0) { /* the producer: create, then publish one heap per byte read from go */
		alarm(30);
		struct ibvb_producer_opts o = opts(8, 256, IBVB_POLICY_DROP);
		struct ibvb_producer *p;
		char c = ibvb_producer_create(&p, "heldlap", &o) == 0 ? 'r' : 'x';
		if (write(done[1], &c, 1) != 1 || c != 'r')
			_exit(1);
		uint64_t cnt = 1;
		while (read(go[0], &c, 1) == 1 && c == 'p') {
			int rc = pub(p, cnt++, 200);
			if (write(done[1], rc == 0 ? "k" : "d", 1) != 1)
				_exit(1);
		}
		ibvb_producer_close(p);
		_exit(0);
	}
	char c;
	CHECK_EQ(read(done[0], &c, 1), 1);
	CHECK_EQ(c, 'r');
	struct ibvb_ring *slow, *fast;
	struct ibvb_heap held, h;
	uint64_t last = 0;
	CHECK_EQ(attach(&slow, "heldlap", IBVB_START_OLDEST), 0);
	CHECK_EQ(attach(&fast, "heldlap", IBVB_START_OLDEST), 0);
	for (int i = 0; i < 9; i++) { /* heap 9 needs the slow consumer's slot: it is detached */
		CHECK_EQ(write(go[1], "p", 1), 1);
		CHECK_EQ(read(done[0], &c, 1), 1);
		CHECK_EQ(c, 'k');
		if (i == 0) {
			CHECK_EQ(ibvb_wait(slow, &held, 2000), 0);
			CHECK(pattern_ok(held.payload, held.heap_cnt, 200));
			CHECK_EQ(ibvb_heap_valid(slow, &held), 1);
		}
		while (ibvb_peek(fast, &h) == 0) {
			CHECK(pattern_ok(h.payload, h.heap_cnt, 200));
			CHECK_EQ(ibvb_heap_valid(fast, &h), 1);
			CHECK_EQ(ibvb_release(fast, &h), 0);
			last = h.heap_cnt;
		}
		ibvb_flush_release(fast);
	}
	CHECK_EQ(last, 9);
	CHECK(!pattern_ok(held.payload, held.heap_cnt, 200)); /* heap 9's bytes */
	CHECK_EQ(ibvb_heap_valid(slow, &held), 0);
	CHECK_EQ(ibvb_peek(slow, &h), -EOVERFLOW);
	CHECK(strstr(ibvb_last_error(), "8 heaps lost"));
	CHECK_EQ(ibvb_release(slow, &held), -ESTALE);
	ibvb_detach(slow);
	ibvb_detach(fast);
	CHECK_EQ(write(go[1], "q", 1), 1);
	int st;
	CHECK_EQ(waitpid(pid, &st, 0), pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_bad_cursor(void)
{
	struct ibvb_producer_opts o = opts(8, 256, IBVB_POLICY_BLOCK);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "badcur", &o), 0);
	if (!p)
		return;
	struct ibvb_ring *bad, *good;
	CHECK_EQ(attach(&bad, "badcur", IBVB_START_OLDEST), 0);
	CHECK_EQ(attach(&good, "badcur", IBVB_START_OLDEST), 0);
	for (uint64_t c = 1; c <= 4; c++)
		CHECK_EQ(pub(p, c, 100), 0);
	atomic_store(&bad->region->tail, 1000); /* past head */
	/* the service thread's cursor refresh (≤ 100 ms) or the next reclaim detaches it */
	int64_t t0 = now_ms();
	while (ibvb_producer_consumers(p) != 1 && now_ms() - t0 < 2000)
		msleep(5);
	CHECK_EQ(ibvb_producer_consumers(p), 1);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_CONSUMER_ERRORS), 1);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(bad, &h), -ECONNRESET);
	/* the other consumer and the producer carry on: a full ring's worth more, then drain */
	uint64_t got = 0;
	for (uint64_t c = 5; c <= 40; c++) {
		CHECK_EQ(pub(p, c, 100), 0);
		while (ibvb_peek(good, &h) == 0) {
			CHECK(pattern_ok(h.payload, h.heap_cnt, 100));
			got++;
			ibvb_release(good, &h);
		}
		ibvb_flush_release(good);
	}
	CHECK_EQ(got, 40);
	/* a cursor moved backwards is as bad */
	atomic_store(&good->region->tail, 3); /* noticed by the service thread's refresh */
	t0 = now_ms();
	while (ibvb_producer_consumers(p) != 0 && now_ms() - t0 < 2000)
		msleep(5);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_CONSUMER_ERRORS), 2);
	ibvb_detach(bad);
	ibvb_detach(good);
	ibvb_producer_close(p);
}

static void test_consumer_killed(void)
{
	/* block: a child consumer holds every heap, is killed -9; the producer carries on */
	struct ibvb_producer_opts o = opts(8, 512, IBVB_POLICY_BLOCK);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "killed", &o), 0);
	if (!p)
		return;
	int pipefd[2];
	CHECK_EQ(pipe(pipefd), 0);
	pid_t child = fork();
	if (child == 0) {
		struct ibvb_ring *r;
		char c = attach(&r, "killed", IBVB_START_OLDEST) == 0 ? 'y' : 'n';
		if (write(pipefd[1], &c, 1) != 1)
			_exit(1);
		for (;;) { /* read and hold everything */
			struct ibvb_heap h;
			if (ibvb_wait(r, &h, 1000) == -ENODATA)
				break;
		}
		pause();
		_exit(0);
	}
	char c = 0;
	CHECK(read(pipefd[0], &c, 1) == 1 && c == 'y');
	struct reader rd;
	start_reader(&rd, "killed", 500, 0);
	CHECK_EQ(ibvb_producer_consumers(p), 2);
	for (uint64_t k = 1; k <= 8; k++)
		CHECK_EQ(pub(p, k, 500), 0);
	int64_t t0 = now_ms();
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	for (uint64_t k = 9; k <= 500; k++) /* blocks until the kill is noticed */
		CHECK_EQ(pub(p, k, 500), 0);
	CHECK(now_ms() - t0 < 3000);
	CHECK_EQ(ibvb_producer_consumers(p), 1);
	CHECK_EQ(ibvb_producer_end_of_stream(p, 0, 5000), 0);
	int rc = ibvb_producer_wait_drained(p, 10000);
	CHECK(rc == 0 || rc == -ENOTCONN);
	pthread_join(rd.thr, NULL);
	CHECK_EQ(rd.heaps, 500);
	CHECK_EQ(rd.bad, 0);
	t0 = now_ms();
	while (ibvb_producer_consumers(p) != 0 && now_ms() - t0 < 2000)
		msleep(5);
	CHECK_EQ(ibvb_producer_consumers(p), 0);
	CHECK_EQ(ibvb_producer_wait_drained(p, 100), -ENOTCONN);
	ibvb_producer_close(p);
}

static void test_refusals(void)
{
	struct ibvb_producer_opts o = opts(4, 64, IBVB_POLICY_DROP);
	struct ibvb_producer *p, *q;
	/* a live producer holds the name */
	CHECK_EQ(ibvb_producer_create(&p, "live", &o), 0);
	CHECK_EQ(ibvb_producer_create(&q, "live", &o), -EADDRINUSE);
	CHECK(q == NULL && strstr(ibvb_last_error(), "in use by a live producer"));
	ibvb_producer_close(p);
	/* stale leftovers (a socket file and a lock nobody holds) are replaced */
	CHECK_EQ(ibvb_producer_create(&p, "live", &o), 0);
	ibvb_producer_close(p);
	/* a planted symlink lock */
	char path[1024], target[512];
	snprintf(target, sizeof target, "%s/victim", g_dir);
	snprintf(path, sizeof path, "%s/planted%s", g_dir, IBVB_LOCK_SUFFIX);
	CHECK_EQ(symlink(target, path), 0);
	CHECK_EQ(ibvb_producer_create(&q, "planted", &o), -ELOOP);
	CHECK(access(target, F_OK) != 0); /* nothing created through the link */
	unlink(path);
	/* bad names and options */
	CHECK_EQ(ibvb_producer_create(&q, ".hidden", &o), -EINVAL);
	CHECK_EQ(ibvb_producer_create(&q, "a/b", &o), -EINVAL);
	struct ibvb_producer_opts bad = o;
	bad.slot_count = 3;
	CHECK_EQ(ibvb_producer_create(&q, "badopt", &bad), -EINVAL);
	bad = o;
	bad.group = "no-such-group-ibvb";
	CHECK_EQ(ibvb_producer_create(&q, "badopt", &bad), -EINVAL);
	/* unsafe ring directories: another owner, world-writable, a symlink */
	char d[512];
	snprintf(d, sizeof d, "%s/owned", g_dir);
	mkdir(d, 0755);
	CHECK_EQ(chown(d, 65534, 65534), 0);
	bad = o;
	bad.dir = d;
	CHECK_EQ(ibvb_producer_create(&q, "x", &bad), -EPERM);
	CHECK(strstr(ibvb_last_error(), "owned by uid 65534") != NULL);
	snprintf(d, sizeof d, "%s/sticky", g_dir);
	mkdir(d, 0755);
	chmod(d, 01777);
	bad.dir = d;
	CHECK_EQ(ibvb_producer_create(&q, "x", &bad), -EPERM);
	CHECK(strstr(ibvb_last_error(), "writable by group or others") != NULL);
	snprintf(d, sizeof d, "%s/link", g_dir);
	CHECK_EQ(symlink(g_dir, d), 0);
	bad.dir = d;
	CHECK_EQ(ibvb_producer_create(&q, "x", &bad), -EPERM);
	/* a missing directory is created 0755 */
	snprintf(d, sizeof d, "%s/new/sub", g_dir);
	bad.dir = d;
	CHECK_EQ(ibvb_producer_create(&q, "x", &bad), 0);
	struct stat sb;
	CHECK(stat(d, &sb) == 0 && (sb.st_mode & 07777) == 0755);
	snprintf(path, sizeof path, "%s/x%s", d, IBVB_SOCK_SUFFIX);
	CHECK(lstat(path, &sb) == 0 && S_ISSOCK(sb.st_mode) && (sb.st_mode & 0777) == 0600);
	ibvb_producer_close(q);
}

static void test_peer_gate(void)
{
	/* a stranger (another uid) is refused with status 2; a full table with status 3 */
	struct ibvb_producer_opts o = opts(4, 64, IBVB_POLICY_DROP);
	o.max_consumers = 1;
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "gate", &o), 0);
	if (!p)
		return;
	if (geteuid() == 0) {
		char sock[512];
		snprintf(sock, sizeof sock, "%s/gate%s", g_dir, IBVB_SOCK_SUFFIX);
		chmod(sock, 0666); /* let the stranger connect: SO_PEERCRED is the real gate */
		pid_t c = fork();
		if (c == 0) {
			if (setgid(65534) || setuid(65534))
				_exit(9);
			struct ibvb_ring *r;
			int rc = ibvb_attach(&r, sock, 2000);
			/* it refuses the root-owned socket in a root-owned dir? no: root is trusted (§1.2) */
			_exit(rc == -EACCES && strstr(ibvb_last_error(), "may not attach") ? 0 : 1);
		}
		int st;
		waitpid(c, &st, 0);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	struct ibvb_ring *a, *b;
	CHECK_EQ(attach(&a, "gate", IBVB_START_HEAD), 0);
	CHECK_EQ(attach(&b, "gate", IBVB_START_HEAD), -EBUSY);
	ibvb_detach(a);
	int64_t t0 = now_ms();
	while (ibvb_producer_consumers(p) != 0 && now_ms() - t0 < 2000)
		msleep(5);
	CHECK_EQ(attach(&b, "gate", IBVB_START_HEAD), 0); /* the row is free again */
	ibvb_detach(b);
	ibvb_producer_close(p);
}

static void test_seals(void)
{
	struct ibvb_producer_opts o = opts(4, 4096, IBVB_POLICY_DROP);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "seals", &o), 0);
	if (!p)
		return;
	int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;
	CHECK_EQ(fcntl(ibvb_producer_ctl_fd(p), F_GET_SEALS) & want, want);
	CHECK_EQ(fcntl(ibvb_producer_data_fd(p), F_GET_SEALS) & want, want);
	CHECK(ftruncate(ibvb_producer_data_fd(p), 0) < 0);
	/* the consumer's region: SHRINK|GROW|SEAL; the consumer library checks them at attach */
	struct ibvb_ring *r;
	CHECK_EQ(attach(&r, "seals", IBVB_START_OLDEST), 0);
	struct ibvb_info in;
	CHECK_EQ(ibvb_info(r, &in), 0);
	CHECK_EQ(in.page_size, 4096);
	CHECK_EQ(in.slot_count, 4);
	CHECK_EQ(in.session_id, ibvb_producer_session_id(p));
	CHECK_EQ(in.state, IBVB_STATE_READY);
	ibvb_detach(r);
	ibvb_producer_close(p);
}

struct intr {
	struct ibvb_producer *p;
	int delay_ms;
};
static void *interrupter(void *arg)
{
	struct intr *x = arg;
	msleep(x->delay_ms);
	ibvb_producer_interrupt(x->p);
	return NULL;
}

static void test_interrupt(void)
{
	struct ibvb_producer_opts o = opts(4, 64, IBVB_POLICY_BLOCK);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "intr", &o), 0);
	if (!p)
		return;
	struct ibvb_ring *r;
	CHECK_EQ(attach(&r, "intr", IBVB_START_OLDEST), 0); /* never releases */
	for (uint64_t c = 1; c <= 4; c++)
		CHECK_EQ(pub(p, c, 64), 0);
	struct intr x = {p, 300};
	pthread_t t;
	pthread_create(&t, NULL, interrupter, &x);
	int64_t t0 = now_ms();
	struct ibvb_slot s;
	CHECK_EQ(ibvb_producer_acquire(p, &s), -ECANCELED);
	int64_t dt = now_ms() - t0;
	CHECK(dt >= 250 && dt < 1000);
	pthread_join(t, NULL);
	CHECK_EQ(ibvb_producer_wait_drained(p, 1000), -ECANCELED);
	/* block with nobody attached: waits for an attach, interrupted as well */
	ibvb_detach(r);
	ibvb_producer_close(p);
	CHECK_EQ(ibvb_producer_create(&p, "intr2", &o), 0);
	for (uint64_t c = 1; c <= 4; c++)
		CHECK_EQ(pub(p, c, 64), 0);
	x.p = p;
	x.delay_ms = 200;
	pthread_create(&t, NULL, interrupter, &x);
	t0 = now_ms();
	CHECK_EQ(ibvb_producer_acquire(p, &s), -ECANCELED);
	CHECK(now_ms() - t0 < 1000);
	pthread_join(t, NULL);
	ibvb_producer_close(p);
}

static void test_block_waits_for_attach(void)
{
	/* block, nobody attached, ring full: acquire waits until a consumer attaches and releases */
	struct ibvb_producer_opts o = opts(4, 64, IBVB_POLICY_BLOCK);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "late", &o), 0);
	if (!p)
		return;
	for (uint64_t c = 1; c <= 4; c++)
		CHECK_EQ(pub(p, c, 64), 0);
	struct reader rd;
	memset(&rd, 0, sizeof rd);
	rd.name = "late";
	rd.len = 64;
	/* attach from another thread after 200 ms; it starts at the oldest heap: 1 */
	pthread_t t;
	struct intr dummy = {p, 0};
	(void)dummy;
	pthread_create(&rd.thr, NULL, reader_fn, &rd);
	for (uint64_t c = 5; c <= 100; c++)
		CHECK_EQ(pub(p, c, 64), 0);
	CHECK_EQ(ibvb_producer_end_of_stream(p, 0, 5000), 0);
	int rc = ibvb_producer_wait_drained(p, 5000);
	CHECK(rc == 0 || rc == -ENOTCONN);
	pthread_join(rd.thr, NULL);
	CHECK_EQ(rd.heaps, 100);
	CHECK_EQ(rd.ooo, 0);
	CHECK_EQ(rd.bad, 0);
	(void)t;
	ibvb_producer_close(p);
}

static void test_drop_keeps_newest(void)
{
	/* drop, nobody attached: the ring keeps the newest slot_count heaps for a later consumer */
	struct ibvb_producer_opts o = opts(8, 128, IBVB_POLICY_DROP);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "newest", &o), 0);
	if (!p)
		return;
	for (uint64_t c = 1; c <= 50; c++)
		CHECK_EQ(pub(p, c, 100), 0);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_DROPPED_HEAPS), 0);
	struct ibvb_ring *r;
	CHECK_EQ(attach(&r, "newest", IBVB_START_OLDEST), 0);
	struct ibvb_heap h;
	uint64_t n = 0, first = 0;
	while (ibvb_peek(r, &h) == 0) {
		if (!n)
			first = h.heap_cnt;
		CHECK(pattern_ok(h.payload, h.heap_cnt, 100));
		n++;
		ibvb_release(r, &h);
	}
	CHECK(n >= 7 && n <= 8);
	CHECK_EQ(first + n - 1, 50);
	ibvb_detach(r);
	ibvb_producer_close(p);
}

static void test_items_meta_batch(void)
{
	struct ibvb_producer_opts o = opts(16, 256, IBVB_POLICY_DROP);
	o.max_items = 2;
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "meta", &o), 0);
	if (!p)
		return;
	struct ibvb_ring *r;
	CHECK_EQ(attach(&r, "meta", IBVB_START_OLDEST), 0);
	/* metadata (§6) */
	uint8_t rec[512];
	int64_t shape[2] = {4, -1};
	size_t n1 = ibvb_meta_encode(rec, sizeof rec, 0x1000, 2, shape, "data", "the payload", "u\x00\x00\x08", 4,
				     "{'descr': '>u1'}");
	size_t n2 = ibvb_meta_encode(rec + n1, sizeof rec - n1, 0x1001, -1, NULL, "cnt", "", "", 0, "");
	CHECK(n1 % 8 == 0 && n2 % 8 == 0);
	CHECK_EQ(ibvb_producer_set_descriptors(p, rec, n1 + n2), 0);
	CHECK_EQ(ibvb_producer_set_descriptors(p, rec, 8000), -EMSGSIZE);
	uint8_t buf[1024];
	size_t need = 0;
	CHECK_EQ(ibvb_read_meta(r, buf, sizeof buf, &need), (long)(n1 + n2));
	size_t off = 0;
	struct ibvb_meta_record m;
	CHECK_EQ(ibvb_meta_next(buf, n1 + n2, &off, &m), 1);
	CHECK(m.id == 0x1000 && m.ndim == 2 && ibvb_meta_dim(&m, 0) == 4 && ibvb_meta_dim(&m, 1) == -1 &&
	      m.name_len == 4 && !memcmp(m.name, "data", 4) && m.format_len == 4);
	CHECK_EQ(ibvb_meta_next(buf, n1 + n2, &off, &m), 1);
	CHECK(m.id == 0x1001 && m.ndim == IBVB_META_NDIM_UNKNOWN);
	CHECK_EQ(ibvb_meta_next(buf, n1 + n2, &off, &m), 0);
	/* items overflow; batch publish with one head store; discard */
	struct ibvb_slot s[4];
	struct ibvb_publish_info hi[4];
	for (int i = 0; i < 4; i++) {
		CHECK_EQ(ibvb_producer_acquire(p, &s[i]), 0);
		CHECK_EQ(ibvb_producer_add_item(&s[i], 0x10, 1, 1, IBVB_ITEM_IMMEDIATE), 0);
		CHECK_EQ(ibvb_producer_add_item(&s[i], 0x11, 0, 8, 0), 0);
		CHECK_EQ(ibvb_producer_add_item(&s[i], 0x12, 2, 1, IBVB_ITEM_IMMEDIATE), i == 3 ? -ENOSPC : -ENOSPC);
		memset(s[i].payload, i, 8);
		struct ibvb_publish_info x = {100 + (uint64_t)i, 8, 8, 1, IBVB_FLAG_COMPLETE | IBVB_FLAG_HAS_DESCRIPTORS, 1};
		hi[i] = x;
	}
	struct ibvb_slot extra;
	memset(&extra, 0, sizeof extra);
	CHECK_EQ(ibvb_producer_acquire(p, &extra), 0);
	ibvb_producer_discard(p, &extra);
	ibvb_producer_stage(p, &s[0], &hi[0]);
	CHECK_EQ(ibvb_producer_staged(p), 1);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(r, &h), -EAGAIN); /* staged is not published */
	ibvb_producer_publish_n(p, &s[1], &hi[1], 3);
	CHECK_EQ(ibvb_producer_staged(p), 0);
	for (int i = 0; i < 4; i++) {
		CHECK_EQ(ibvb_peek(r, &h), 0);
		CHECK_EQ(h.heap_cnt, 100 + i);
		CHECK_EQ(h.item_count, 2);
		CHECK_EQ(h.flags, IBVB_FLAG_COMPLETE | IBVB_FLAG_HAS_DESCRIPTORS | IBVB_FLAG_ITEMS_OVERFLOW);
		CHECK(h.payload[0] == i && h.payload[7] == i);
		ibvb_release(r, &h);
	}
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_HEAPS), 4);
	/* EOS, then CLOSED: the consumer reads end of stream both ways */
	CHECK_EQ(ibvb_producer_end_of_stream(p, 77, 0), 0);
	CHECK_EQ(ibvb_peek(r, &h), -ENODATA);
	ibvb_producer_close(p);
	CHECK_EQ(ibvb_peek(r, &h), -ENODATA);
	CHECK_EQ(ibvb_wait(r, &h, 100), -ENODATA);
	ibvb_detach(r);
}

/* END_OF_STREAM is final (spec §4.1): after the marker, publishing a slot taken before it, acquiring,
 * publish_n and a second marker are all refused with -EPIPE and a message; the consumer sees nothing after
 * the marker (head did not move). */
static void test_nothing_published_after_end_of_stream(void)
{
	struct ibvb_producer_opts o = opts(8, 256, IBVB_POLICY_DROP);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "eosfinal", &o), 0);
	if (!p)
		return;
	struct ibvb_ring *r;
	CHECK_EQ(attach(&r, "eosfinal", IBVB_START_OLDEST), 0);
	struct ibvb_slot early[2];
	CHECK_EQ(ibvb_producer_acquire(p, &early[0]), 0);
	CHECK_EQ(ibvb_producer_acquire(p, &early[1]), 0);
	CHECK_EQ(ibvb_producer_end_of_stream(p, 5, 0), 0);
	uint64_t head = ibvb__load(&p->ctl->head, acquire);
	struct ibvb_publish_info h = {6, 8, 8, 1, IBVB_FLAG_COMPLETE, 1};
	CHECK_EQ(ibvb_producer_publish(p, &early[0], &h), -EPIPE);
	CHECK(strstr(ibvb_last_error(), "END_OF_STREAM is final") != NULL);
	struct ibvb_publish_info hn[1] = {{7, 8, 8, 1, IBVB_FLAG_COMPLETE, 1}};
	CHECK_EQ(ibvb_producer_publish_n(p, &early[1], hn, 1), -EPIPE);
	struct ibvb_slot s;
	CHECK_EQ(ibvb_producer_acquire(p, &s), -EPIPE);
	CHECK_EQ(ibvb_producer_end_of_stream(p, 9, 0), -EPIPE);
	CHECK_EQ(ibvb__load(&p->ctl->head, acquire), head);
	struct ibvb_heap hp;
	CHECK_EQ(ibvb_peek(r, &hp), -ENODATA);
	CHECK_EQ(ibvb_peek(r, &hp), -EAGAIN); /* past the marker: nothing followed it */
	ibvb_detach(r);
	ibvb_producer_close(p);
}

/* Spec §6 metadata reader: a re-described id yields only its last record; an area the producer never
 * finishes rewriting gives -EBUSY "metadata area busy" (after 1000 tries and 10 ms), not a spin. */
static void test_meta_repeated_id_keeps_last_and_busy_gives_up(void)
{
	struct ibvb_producer_opts o = opts(8, 256, IBVB_POLICY_DROP);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "metadup", &o), 0);
	if (!p)
		return;
	struct ibvb_ring *r;
	CHECK_EQ(attach(&r, "metadup", IBVB_START_OLDEST), 0);
	uint8_t rec[512];
	size_t n1 = ibvb_meta_encode(rec, sizeof rec, 0x1000, -1, NULL, "first", "", "", 0, "");
	size_t n2 = ibvb_meta_encode(rec + n1, sizeof rec - n1, 0x1001, -1, NULL, "other", "", "", 0, "");
	size_t n3 = ibvb_meta_encode(rec + n1 + n2, sizeof rec - n1 - n2, 0x1000, -1, NULL, "last", "", "", 0, "");
	CHECK_EQ(ibvb_producer_set_descriptors(p, rec, n1 + n2 + n3), 0);
	uint8_t buf[1024];
	long len = ibvb_read_meta(r, buf, sizeof buf, NULL);
	CHECK_EQ(len, (long)(n1 + n2 + n3));
	size_t off = 0;
	struct ibvb_meta_record m;
	CHECK_EQ(ibvb_meta_next(buf, (size_t)len, &off, &m), 1);
	CHECK(m.id == 0x1001 && m.name_len == 5 && !memcmp(m.name, "other", 5));
	CHECK_EQ(ibvb_meta_next(buf, (size_t)len, &off, &m), 1);
	CHECK(m.id == 0x1000 && m.name_len == 4 && !memcmp(m.name, "last", 4));
	CHECK_EQ(ibvb_meta_next(buf, (size_t)len, &off, &m), 0);
	/* a producer stuck mid-rewrite: the sequence stays odd */
	struct ibvb_meta_header *mh = (struct ibvb_meta_header *)p->meta;
	atomic_store(&mh->seq, atomic_load(&mh->seq) | 1);
	CHECK_EQ(ibvb_read_meta(r, buf, sizeof buf, NULL), -EBUSY);
	CHECK(strstr(ibvb_last_error(), "metadata area busy") != NULL);
	ibvb_detach(r);
	ibvb_producer_close(p);
}

/* A minor never adds a header or row state (spec §8): a consumer reading an unknown one reports a corrupt
 * ring (-EBADMSG), not "nothing yet" or a detach. */
static void test_unknown_header_or_row_state_is_corrupt(void)
{
	struct ibvb_producer_opts o = opts(8, 256, IBVB_POLICY_DROP);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "unkstate", &o), 0);
	if (!p)
		return;
	struct ibvb_ring *r;
	CHECK_EQ(attach(&r, "unkstate", IBVB_START_OLDEST), 0);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(r, &h), -EAGAIN);
	atomic_store(&p->ctl->state, 7);
	CHECK_EQ(ibvb_peek(r, &h), -EBADMSG);
	CHECK(strstr(ibvb_last_error(), "unknown header state 7") != NULL);
	atomic_store(&p->ctl->state, IBVB_STATE_READY);
	atomic_store(&p->rows[ibvb_consumer_index(r)].state, 9);
	CHECK_EQ(ibvb_peek(r, &h), -EBADMSG);
	CHECK(strstr(ibvb_last_error(), "unknown consumer row state 9") != NULL);
	atomic_store(&p->rows[ibvb_consumer_index(r)].state, IBVB_CONSUMER_ATTACHED);
	ibvb_detach(r);
	ibvb_producer_close(p);
}

/* Send a consumer hello changed by off/val (u32 at off; off < 0: none), of len bytes; return the answer's
 * status (0xFF: no record), descriptors closed; *fdp keeps the connection open when non-NULL. */
static uint32_t hello_status2(const char *sock, int off, uint32_t val, int off2, uint32_t val2, size_t len,
			      int *fdp)
{
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	snprintf(a.sun_path, sizeof a.sun_path, "%s", sock);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
		if (fd >= 0)
			close(fd);
		return 0xFE;
	}
	uint8_t h[32] = {0};
	struct ibvb_hello *hh = (struct ibvb_hello *)h;
	hh->magic = IBVB_MAGIC;
	hh->major = IBVB_MAJOR;
	hh->minor = IBVB_MINOR;
	hh->role = IBVB_ROLE_CONSUMER;
	if (off >= 0)
		memcpy(h + off, &val, 4);
	if (off2 >= 0)
		memcpy(h + off2, &val2, 4);
	(void)!write(fd, h, len);
	uint8_t buf[IBVB_ERROR_RECORD_MAX];
	union {
		char b[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} cb;
	struct iovec iov = {buf, sizeof buf};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b, .msg_controllen = sizeof cb.b};
	ssize_t n = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
			for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++)
				close(((int *)CMSG_DATA(c))[i]);
	uint32_t status = 0xFF;
	if (n >= 16)
		memcpy(&status, buf + 12, 4);
	if (fdp)
		*fdp = fd;
	else
		close(fd);
	return status;
}

static uint32_t hello_status(const char *sock, int off, uint32_t val, size_t len, int *fdp)
{
	return hello_status2(sock, off, val, -1, 0, len, fdp);
}

/* Spec §14 on the C producer: three members of one group and an independent monitor, block policy on a
 * 16-slot ring. Every heap goes to exactly one member (counts and heap_cnt sums add up, each member gets a
 * share, bytes verified), the monitor reads every heap, nothing is lost, and the members' rows carry the
 * group_id and assigned counts that add up to the stream. */
static void test_group_members_share_every_heap_once_beside_a_monitor(void)
{
	struct ibvb_producer_opts o = opts(16, 512, IBVB_POLICY_BLOCK);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "groupshare", &o), 0);
	if (!p)
		return;
	struct reader mem[3], mon;
	for (int i = 0; i < 3; i++)
		start_member(&mem[i], "groupshare", "work", 300, 0);
	start_reader(&mon, "groupshare", 300, 0);
	const uint64_t n = 3000;
	for (uint64_t c = 1; c <= n; c++)
		CHECK_EQ(pub(p, c, 300), 0);
	CHECK_EQ(ibvb_producer_end_of_stream(p, 0, 5000), 0);
	uint64_t heaps = 0, sum = 0;
	for (int i = 0; i < 3; i++) {
		pthread_join(mem[i].thr, NULL);
		CHECK_EQ(mem[i].rc, -ENODATA);
		CHECK_EQ(mem[i].bad, 0);
		CHECK_EQ(mem[i].ooo, 0);
		CHECK(mem[i].heaps > 0);
		heaps += mem[i].heaps;
		sum += mem[i].cnt_sum;
	}
	pthread_join(mon.thr, NULL);
	CHECK_EQ(heaps, n);
	CHECK_EQ(sum, n * (n + 1) / 2);
	CHECK_EQ(mon.rc, -ENODATA);
	CHECK_EQ(mon.heaps, n);
	CHECK_EQ(mon.cnt_sum, n * (n + 1) / 2);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_GROUP_LOST), 0);
	CHECK_EQ(p->ctl->stats_count, 20); /* 2.2: through streams_ended */
	uint64_t assigned = 0;
	int rows = 0;
	for (uint32_t i = 0; i < 8; i++)
		if (atomic_load(&p->rows[i].group_id) == ibvb_group_id("work")) {
			assigned += atomic_load(&p->rows[i].assigned);
			rows++;
		} else if (atomic_load(&p->rows[i].state) != 0) {
			CHECK_EQ(atomic_load(&p->rows[i].assigned), 0); /* the monitor */
		}
	CHECK_EQ(rows, 3);
	CHECK_EQ(assigned, n);
	ibvb_producer_close(p);
}

/* A producer (slots × 256 bytes, policy) of ring name and two members a, b of group "g", attached in that
 * order; 0 (the check failed and said why) when any of them could not be made. */
static int two_members(const char *name, uint64_t slots, uint32_t policy, struct ibvb_producer **p,
		       struct ibvb_ring **a, struct ibvb_ring **b)
{
	struct ibvb_producer_opts o = opts(slots, 256, policy);
	struct ibvb_attach_opts ao = {.dir = g_dir, .group = "g"};
	*a = *b = NULL;
	int rc = ibvb_producer_create(p, name, &o);
	if (rc == 0)
		rc = ibvb_attach_opts(a, name, 5000, &ao);
	if (rc == 0)
		rc = ibvb_attach_opts(b, name, 5000, &ao);
	if (rc != 0) {
		fprintf(stderr, "    two_members(%s): %d [last error: %s]\n", name, rc, ibvb_last_error());
		g_fail = 1;
	}
	return rc == 0;
}

/* Spec §14: a member that leaves (its socket closed) holding assigned heaps loses them for its group —
 * group_lost counts them, nobody else gets them — their slots come back, and a new member given the same
 * row inherits none of them: it reads only heaps published after it joined. */
static void test_group_member_leaving_loses_its_heaps_and_its_row_inherits_none(void)
{
	struct ibvb_producer *p;
	struct ibvb_ring *a, *b, *c;
	if (!two_members("groupleave", 16, IBVB_POLICY_DROP, &p, &a, &b))
		return;
	struct ibvb_attach_opts ao = {.dir = g_dir, .group = "g"};
	struct ibvb_info ia;
	CHECK_EQ(ibvb_info(a, &ia), 0);
	for (uint64_t cnt = 1; cnt <= 8; cnt++)
		CHECK_EQ(pub(p, cnt, 200), 0);
	uint64_t sum = 0, min = UINT64_MAX, bad = 0;
	uint64_t got_b = drain(b, 200, &sum, &min, &bad);
	uint64_t assigned_a = atomic_load(&p->rows[ia.consumer_index].assigned);
	CHECK(got_b > 0 && assigned_a > 1);
	CHECK_EQ(got_b + assigned_a, 8);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(a, &h), 0); /* a reads one of its heaps and releases it, then leaves */
	sum += h.heap_cnt;
	ibvb_release(a, &h);
	ibvb_detach(a);
	CHECK_EQ(wait_counter(p, IBVB_CTR_GROUP_LOST, assigned_a - 1), assigned_a - 1);
	CHECK_EQ(ibvb_producer_consumers(p), 1);
	CHECK_EQ(ibvb_attach_opts(&c, "groupleave", 5000, &ao), 0);
	struct ibvb_info ic;
	CHECK_EQ(ibvb_info(c, &ic), 0);
	CHECK_EQ(ic.consumer_index, ia.consumer_index); /* the departed member's row */
	for (uint64_t cnt = 9; cnt <= 16; cnt++)
		CHECK_EQ(pub(p, cnt, 200), 0);
	uint64_t min_c = UINT64_MAX, sum_c = 0;
	uint64_t got_c = drain(c, 200, &sum_c, &min_c, &bad);
	got_b += drain(b, 200, &sum, &min, &bad);
	CHECK(got_c > 0);
	CHECK(min_c > 8); /* nothing of the departed member's */
	CHECK_EQ(got_b + got_c, 16 - (assigned_a - 1) - 1);
	CHECK_EQ(bad, 0);
	CHECK_EQ(atomic_load(&p->rows[ic.consumer_index].assigned), got_c);
	/* every slot came back: a whole ring more is taken without a drop */
	for (uint64_t cnt = 17; cnt <= 32; cnt++)
		CHECK_EQ(pub(p, cnt, 200), 0);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_DROPPED_HEAPS), 0);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_GROUP_LOST), assigned_a - 1);
	ibvb_detach(b);
	ibvb_detach(c);
	ibvb_producer_close(p);
}

/* Spec §14.1: a group's name is 1 … 64 bytes; a longer one is refused at attach with one clear line,
 * before any connection (it would hash like any other and join a group nobody named). */
static void test_attach_refuses_a_group_name_over_64_bytes(void)
{
	char name[IBVB_GROUP_NAME_MAX + 2];
	memset(name, 'g', sizeof name - 1);
	name[sizeof name - 1] = 0;
	struct ibvb_attach_opts ao = {.dir = g_dir, .group = name};
	struct ibvb_ring *r = NULL;
	CHECK_EQ(ibvb_attach_opts(&r, "nosuchring", 100, &ao), -EINVAL);
	CHECK(r == NULL);
	CHECK(strstr(ibvb_last_error(), "want 1 to 64 bytes") != NULL);
	name[IBVB_GROUP_NAME_MAX] = 0; /* 64 bytes: allowed (no ring: not found, not refused for the name) */
	CHECK(ibvb_attach_opts(&r, "nosuchring", 0, &ao) != -EINVAL);
}

/* The rewrite torn_copy makes: while member ring copies position pos's descriptor, producer publishes
 * heaps cnt from .. to (the last of them rewrites that descriptor), and the copy ends up with the new assign
 * (the member's bit) beside the old seq — the mix a plain copy can get. */
static struct {
	struct ibvb_ring *ring;
	struct ibvb_producer *producer;
	uint64_t pos, from, to, bit;
	int published;
} g_torn;

/* Read and release every heap r has now, counting heap cnts 1 … 10 in seen (others in seen[0]) and heaps
 * whose 200 pattern bytes are wrong in *bad. */
static void tally_all(struct ibvb_ring *r, uint64_t seen[11], uint64_t *bad)
{
	struct ibvb_heap h;
	while (ibvb_peek(r, &h) == 0) {
		*bad += !pattern_ok(h.payload, h.heap_cnt, 200);
		seen[h.heap_cnt < 11 ? h.heap_cnt : 0]++;
		ibvb_release(r, &h);
	}
	ibvb_flush_release(r);
}

static void torn_copy(struct ibvb_ring *r, uint64_t pos, struct ibvb_desc *copy)
{
	if (r != g_torn.ring || pos != g_torn.pos)
		return;
	g_torn.ring = NULL; /* once */
	for (uint64_t cnt = g_torn.from; cnt <= g_torn.to; cnt++)
		g_torn.published += pub(g_torn.producer, cnt, 200) == 0;
	copy->assign |= g_torn.bit;
}

/* Spec §14.4: a member loads seq again after copying a descriptor. Position 1 is the other member's; while
 * member a copies it the producer publishes through position 9, whose descriptor replaces position 1's, and
 * a's copy holds the new assign (a's bit) with the old seq. a must see the lap (the seq it loads again is
 * 10), move on to its own position 2, and never hand out position 1; every heap goes to exactly one member. */
static void test_member_never_hands_out_a_descriptor_rewritten_while_it_copied_it(void)
{
	struct ibvb_producer *p;
	struct ibvb_ring *a, *b;
	if (!two_members("torncopy", 8, IBVB_POLICY_DROP, &p, &a, &b))
		return;
	struct ibvb_info ia, ib;
	CHECK_EQ(ibvb_info(a, &ia), 0);
	CHECK_EQ(ibvb_info(b, &ib), 0);
	uint64_t abit = 1ull << ia.consumer_index, bbit = 1ull << ib.consumer_index;
	for (uint64_t cnt = 1; cnt <= 4; cnt++)
		CHECK_EQ(pub(p, cnt, 200), 0);
	/* round robin among idle members, lowest row first: a 0 and 2, b 1 and 3 */
	CHECK_EQ(p->desc[0].assign, abit);
	CHECK_EQ(p->desc[1].assign, bbit);
	CHECK_EQ(p->desc[2].assign, abit);
	uint64_t bad = 0, seen[11] = {0};
	struct ibvb_heap h;
	tally_all(b, seen, &bad);
	CHECK_EQ(ibvb_peek(a, &h), 0);
	CHECK_EQ(h.position, 0);
	seen[h.heap_cnt < 11 ? h.heap_cnt : 0]++;
	ibvb_release(a, &h);
	ibvb_flush_release(a);
	g_torn.ring = a, g_torn.producer = p, g_torn.pos = 1, g_torn.from = 5, g_torn.to = 10, g_torn.bit = abit;
	CHECK_EQ(ibvb_peek(a, &h), 0);
	CHECK_EQ(g_torn.published, 6); /* positions 4 … 9: position 9's descriptor is position 1's */
	CHECK_EQ(p->desc[1].seq, 10);
	CHECK_EQ(h.position, 2); /* its own, after the lap; never position 1 */
	CHECK_EQ(h.heap_cnt, 3);
	CHECK(pattern_ok(h.payload, h.heap_cnt, 200));
	seen[h.heap_cnt < 11 ? h.heap_cnt : 0]++;
	ibvb_release(a, &h);
	tally_all(a, seen, &bad);
	tally_all(b, seen, &bad);
	CHECK_EQ(bad, 0);
	CHECK_EQ(seen[0], 0);
	for (uint64_t cnt = 1; cnt <= 10; cnt++)
		CHECK_EQ(seen[cnt], 1);
	ibvb_detach(a);
	ibvb_detach(b);
	ibvb_producer_close(p);
}

/* Spec §14's window under drop: a member holding its first heap while the other member and the ring move
 * on holds the ring back by a whole ring at position 16 — the producer publishes nothing past slot_count of
 * the oldest held position; it detaches the holder as overrun (the other is ahead) instead of dropping, and
 * the held heap is lost for the group, counted once. */
static void test_group_member_a_ring_behind_is_overrun_not_overwritten(void)
{
	struct ibvb_producer *p;
	struct ibvb_ring *a, *b;
	if (!two_members("groupwin", 16, IBVB_POLICY_DROP, &p, &a, &b))
		return;
	uint64_t sum = 0, min = UINT64_MAX, bad = 0, got_b = 0;
	struct ibvb_heap held;
	int holding = 0;
	for (uint64_t cnt = 1; cnt <= 40; cnt++) {
		CHECK_EQ(pub(p, cnt, 200), 0);
		if (!holding && ibvb_peek(a, &held) == 0)
			holding = 1; /* a holds this heap and reads nothing more */
		if (cnt == 16)
			CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_CONSUMER_OVERRUNS), 0);
		got_b += drain(b, 200, &sum, &min, &bad);
	}
	CHECK(holding);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_CONSUMER_OVERRUNS), 1);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_DROPPED_HEAPS), 0);
	uint64_t lost = ibvb_producer_counter(p, IBVB_CTR_GROUP_LOST);
	CHECK(lost >= 1);
	CHECK_EQ(got_b + lost, 40);
	CHECK_EQ(bad, 0);
	CHECK_EQ(ibvb_heap_valid(a, &held), 0);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(a, &h), -EOVERFLOW);
	ibvb_detach(a);
	ibvb_detach(b);
	ibvb_producer_close(p);
}

/* Spec §14's starvation rule under block: a member that keeps its last 3 heaps (fewer than a quarter of a
 * 16-slot ring) and reads a fourth before it releases the oldest, beside a member that releases each heap at
 * once, is always handed its next heap before the ring fills: 300 heaps, every one read by one of them. A
 * stall (the ring full of the other member's heaps) would block acquire forever: a watchdog interrupts it
 * after 10 s, and the publish fails. */
struct watchdog {
	struct ibvb_producer *p;
	int done;
};

static void *watchdog_fn(void *arg)
{
	struct watchdog *w = arg;
	for (int i = 0; i < 1000 && !__atomic_load_n(&w->done, __ATOMIC_ACQUIRE); i++)
		msleep(10);
	if (!__atomic_load_n(&w->done, __ATOMIC_ACQUIRE))
		ibvb_producer_interrupt(w->p);
	return NULL;
}

static void test_group_member_holding_under_a_quarter_never_stalls_block(void)
{
	struct ibvb_producer *p;
	struct ibvb_ring *a, *b;
	if (!two_members("grouphold", 16, IBVB_POLICY_BLOCK, &p, &a, &b))
		return;
	struct watchdog w = {p, 0};
	pthread_t wt;
	pthread_create(&wt, NULL, watchdog_fn, &w);
	struct ibvb_heap held[4];
	int nheld = 0;
	uint64_t sum = 0, n = 0, min = UINT64_MAX, bad = 0;
	for (uint64_t cnt = 1; cnt <= 300; cnt++) {
		int rc = pub(p, cnt, 200);
		CHECK_EQ(rc, 0);
		if (rc < 0)
			break;
		n += drain(b, 200, &sum, &min, &bad);
		while (nheld < 4 && ibvb_peek(a, &held[nheld]) == 0) {
			bad += !pattern_ok(held[nheld].payload, held[nheld].heap_cnt, 200);
			sum += held[nheld].heap_cnt;
			n++;
			nheld++;
		}
		while (nheld > 3) { /* a keeps its last 3 */
			ibvb_release(a, &held[0]);
			memmove(held, held + 1, (size_t)--nheld * sizeof held[0]);
		}
	}
	__atomic_store_n(&w.done, 1, __ATOMIC_RELEASE);
	pthread_join(wt, NULL);
	CHECK_EQ(n, 300);
	CHECK_EQ(sum, 300 * 301 / 2);
	CHECK_EQ(bad, 0);
	ibvb_detach(a);
	ibvb_detach(b);
	ibvb_producer_close(p);
}

/* Spec §14: positions are freed out of order, so an independent consumer attaching with start = 0 begins
 * where every published position still holds its slot (oldest), never at a member's older tail: member a
 * holds heap 1, member b released heaps 2 and 4 (their slots are back), and the new consumer reads from
 * heap 5 on, never the freed holes. */
static void test_group_holes_are_not_read_by_a_new_consumer(void)
{
	struct ibvb_producer *p;
	struct ibvb_ring *a, *b, *mon;
	if (!two_members("groupholes", 16, IBVB_POLICY_DROP, &p, &a, &b))
		return;
	for (uint64_t cnt = 1; cnt <= 4; cnt++)
		CHECK_EQ(pub(p, cnt, 200), 0);
	struct ibvb_heap ha, h;
	CHECK_EQ(ibvb_peek(a, &ha), 0);
	CHECK_EQ(ha.heap_cnt, 1); /* held */
	uint64_t sum = 0, min = UINT64_MAX, bad = 0;
	CHECK_EQ(drain(b, 200, &sum, &min, &bad), 2);
	CHECK_EQ(pub(p, 5, 200), 0); /* its commit reclaims what b released */
	CHECK_EQ(atomic_load(&p->ctl->oldest), 4);
	CHECK_EQ(attach(&mon, "groupholes", IBVB_START_OLDEST), 0);
	CHECK_EQ(pub(p, 6, 200), 0);
	uint64_t mon_sum = 0, mon_min = UINT64_MAX;
	CHECK_EQ(drain(mon, 200, &mon_sum, &mon_min, &bad), 2);
	CHECK_EQ(mon_min, 5);
	CHECK_EQ(mon_sum, 11);
	CHECK_EQ(bad, 0);
	CHECK(ibvb_heap_valid(a, &ha));
	CHECK(pattern_ok(ha.payload, 1, 200));
	CHECK_EQ(ibvb_peek(a, &h), 0); /* a's other heap (3) kept its slot */
	CHECK_EQ(h.heap_cnt, 3);
	CHECK(pattern_ok(h.payload, 3, 200));
	ibvb_detach(mon);
	ibvb_detach(a);
	ibvb_detach(b);
	ibvb_producer_close(p);
}

/* The producer's answers to a hello (spec §1.2): status 5 for a wrong role or start, non-zero reserved bytes
 * or a wrong size, an observer with a group_id (§14); a welcome for a consumer with a group_id; status 1 for
 * another major; a welcome for any minor; a record sent after the welcome ends the attachment. */
static void test_hello_answers_as_specified(void)
{
	struct ibvb_producer_opts o = opts(4, 64, IBVB_POLICY_DROP);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "hello", &o), 0);
	if (!p)
		return;
	const char *sock = ibvb_producer_socket_path(p);
	CHECK_EQ(hello_status(sock, 0x0C, 3, 32, NULL), IBVB_STATUS_PROTOCOL);
	CHECK_EQ(hello_status(sock, 0x10, 2, 32, NULL), IBVB_STATUS_PROTOCOL);
	CHECK_EQ(hello_status(sock, 0x14, 1, 32, NULL), 0); /* group_id 1: a member */
	CHECK_EQ(hello_status2(sock, 0x0C, IBVB_ROLE_OBSERVER, 0x14, 1, 32, NULL), IBVB_STATUS_PROTOCOL);
	CHECK_EQ(hello_status(sock, 0x18, 1, 32, NULL), IBVB_STATUS_PROTOCOL);
	CHECK_EQ(hello_status(sock, 0x1C, 1u << 24, 32, NULL), IBVB_STATUS_PROTOCOL);
	CHECK_EQ(hello_status(sock, -1, 0, 31, NULL), IBVB_STATUS_PROTOCOL);
	CHECK_EQ(hello_status(sock, 0x08, 3, 32, NULL), IBVB_STATUS_VERSION); /* major 3 (minor 0) */
	int fd = -1;
	CHECK_EQ(hello_status(sock, 0x08, IBVB_MAJOR | 99u << 16, 32, &fd), 0); /* minor 99 */
	for (int i = 0; i < 5000 && ibvb_producer_consumers(p) != 1; i++)
		usleep(1000);
	CHECK_EQ(ibvb_producer_consumers(p), 1);
	CHECK_EQ(write(fd, "stray", 5), 5);
	for (int i = 0; i < 5000 && ibvb_producer_consumers(p) != 0; i++)
		usleep(1000);
	CHECK_EQ(ibvb_producer_consumers(p), 0); /* the stray record ended the attachment */
	close(fd);
	ibvb_producer_close(p);
}

static void test_wakes(void)
{
	/* a sleeping consumer is woken by a publish; one wake per sleep (row wakes counts them) */
	struct ibvb_producer_opts o = opts(8, 64, IBVB_POLICY_BLOCK);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "wakes", &o), 0);
	if (!p)
		return;
	struct reader rd;
	start_reader(&rd, "wakes", 64, 0);
	for (uint64_t c = 1; c <= 5; c++) {
		msleep(30); /* the reader is asleep on its futex by now */
		int64_t t0 = now_ms();
		CHECK_EQ(pub(p, c, 64), 0);
		while (__atomic_load_n(&rd.heaps, __ATOMIC_RELAXED) < c && now_ms() - t0 < 200)
			usleep(100);
		CHECK(now_ms() - t0 < 200); /* woken, not found by a 250 ms timeout */
	}
	CHECK(atomic_load(&p->rows[0].wakes) >= 4);
	CHECK(atomic_load(&p->rows[0].wakes) <= 5);
	CHECK_EQ(ibvb_producer_end_of_stream(p, 0, 1000), 0);
	pthread_join(rd.thr, NULL);
	CHECK_EQ(rd.heaps, 5);
	ibvb_producer_close(p);
}

static void test_hugepages(void)
{
	struct ibvb_producer_opts o = opts(4, 1 << 20, IBVB_POLICY_DROP);
	o.hugepages = IBVB_HUGEPAGES_REQUIRE;
	struct ibvb_producer *p;
	int rc = ibvb_producer_create(&p, "huge", &o);
	if (rc == -ENOMEM) {
		CHECK(strstr(ibvb_last_error(), "MiB") != NULL);
		printf("    (no hugepages here: %s)\n", ibvb_last_error());
		return;
	}
	CHECK_EQ(rc, 0);
	if (!p)
		return;
	CHECK(ibvb_producer_page_size(p) > 4096);
	struct ibvb_ring *r;
	CHECK_EQ(attach(&r, "huge", IBVB_START_OLDEST), 0);
	CHECK_EQ(pub(p, 1, 1 << 20), 0);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(r, &h), 0);
	CHECK(pattern_ok(h.payload, 1, 1 << 20));
	ibvb_release(r, &h);
	ibvb_detach(r);
	ibvb_producer_close(p);
	/* too large for the pool: -ENOMEM naming both sizes */
	o.slot_count = 1 << 14;
	rc = ibvb_producer_create(&p, "huge", &o);
	CHECK_EQ(rc, -ENOMEM);
	CHECK(strstr(ibvb_last_error(), "MiB of hugepages") != NULL);
	/* shmem larger than the memory there is: refused up front */
	o.hugepages = IBVB_HUGEPAGES_OFF;
	o.slot_size = 1ull << 30;
	o.slot_count = 1 << 12;
	rc = ibvb_producer_create(&p, "huge", &o);
	CHECK_EQ(rc, -ENOMEM);
	CHECK(strstr(ibvb_last_error(), "MiB of shared memory") != NULL);
}

/* Spec 2.1 §1.1: the ring directory is made component by component without following a symlink. --dir
 * X/link/y/z, where link is another user's symlink to a directory, is refused naming link, and nothing is
 * created through it (2.0 followed it and made y/, z/, the socket and the lock in the attacker's directory);
 * a component owned by another user is refused too. */
static void test_attack_parent_symlink_dir_is_refused(void)
{
	if (geteuid() != 0) {
		fprintf(stderr, "    (skipped: needs root to own the attacker's symlink as another uid)\n");
		return;
	}
	struct ibvb_producer_opts o = opts(4, 64, IBVB_POLICY_DROP);
	struct ibvb_producer *q = NULL;
	char att[512], link[512], d[700], made[700];
	snprintf(att, sizeof att, "%s/attacker", g_dir);
	snprintf(link, sizeof link, "%s/x", g_dir);
	CHECK_EQ(mkdir(att, 0777), 0);
	CHECK_EQ(chown(att, 65534, 65534), 0);
	CHECK_EQ(symlink(att, link), 0);
	CHECK_EQ(lchown(link, 65534, 65534), 0);
	snprintf(d, sizeof d, "%s/y/z", link);
	o.dir = d;
	CHECK_EQ(ibvb_producer_create(&q, "psym", &o), -EPERM);
	CHECK(q == NULL);
	CHECK(strstr(ibvb_last_error(), link));
	CHECK(strstr(ibvb_last_error(), "symbolic link"));
	snprintf(made, sizeof made, "%s/y", att);
	CHECK(access(made, F_OK) != 0); /* nothing made through the link */
	/* the attacker's real directory as a middle component: refused by owner */
	snprintf(d, sizeof d, "%s/y/z", att);
	CHECK_EQ(ibvb_producer_create(&q, "psym", &o), -EPERM);
	CHECK(strstr(ibvb_last_error(), "owned by uid 65534"));
	CHECK(access(made, F_OK) != 0);
	unlink(link);
	rmdir(att);
}

/* Spec 2.1 §C: 50 000 attach/detach cycles on an idle ring (nothing published, so the hot path never adopts
 * a new consumer set): every detached consumer's region is unmapped at its detach, so the producer's
 * mappings and descriptors stay bounded (2.0 kept one 4 KiB mapping per cycle until the next publish). */
static void test_attack_idle_attach_detach_churn_is_bounded(void)
{
	struct ibvb_producer_opts o = opts(4, 64, IBVB_POLICY_DROP);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "churn", &o), 0);
	struct ibvb_ring *r;
	CHECK_EQ(attach(&r, "churn", 0), 0); /* warm up: the first attach's one-off allocations */
	ibvb_detach(r);
	int64_t t0 = now_ms();
	while (ibvb_producer_consumers(p) != 0 && now_ms() - t0 < 5000)
		usleep(1000);
	int maps0 = count_maps(), fds0 = count_fds();
	for (int i = 0; i < 50000; i++) {
		CHECK_EQ(attach(&r, "churn", 0), 0);
		ibvb_detach(r);
	}
	t0 = now_ms();
	while (ibvb_producer_consumers(p) != 0 && now_ms() - t0 < 5000)
		usleep(1000);
	CHECK_EQ(ibvb_producer_consumers(p), 0);
	int maps1 = count_maps(), fds1 = count_fds();
	if (maps1 - maps0 > 8)
		fprintf(stderr, "    maps %d -> %d, fds %d -> %d\n", maps0, maps1, fds0, fds1);
	CHECK(maps1 - maps0 <= 8);
	CHECK(fds1 - fds0 <= 2);
	ibvb_producer_close(p);
}

/* A raw connection saying hello as role (1 consumer, 2 observer); the answer's status (0 welcome), its
 * message in msg. The connection is returned open in *fd (-1 on failure). */
static int raw_hello(const char *sock_path, uint32_t role, int *fd, char *msg, size_t cap)
{
	*fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock_path);
	struct ibvb_hello h = {IBVB_MAGIC, IBVB_MAJOR, IBVB_MINOR, role, 0, 0, {0, 0}};
	struct ibvb_error_record er;
	memset(&er, 0, sizeof er);
	ssize_t n = -1;
	if (connect(*fd, (struct sockaddr *)&sa, sizeof sa) == 0 && send(*fd, &h, sizeof h, 0) == (ssize_t)sizeof h)
		n = recv(*fd, &er, sizeof er - 1, 0); /* any descriptors are closed by the kernel (no cmsg buffer) */
	if (n < 16) {
		close(*fd);
		*fd = -1;
		return -1;
	}
	snprintf(msg, cap, "%s", er.status ? er.message : "");
	return (int)er.status;
}

/* Spec 2.1 §C: observers are limited (default 4): the fifth is refused "busy: 4 observers" while the four
 * hold their places, and a consumer still attaches (2.0 took ~20 000 and then refused consumers for the
 * wrong reason). */
static void test_attack_observer_flood_is_refused_busy(void)
{
	struct ibvb_producer_opts o = opts(4, 64, IBVB_POLICY_DROP);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "obsflood", &o), 0);
	int fds[8];
	char msg[256];
	for (int i = 0; i < 4; i++) {
		CHECK_EQ(raw_hello(ibvb_producer_socket_path(p), IBVB_ROLE_OBSERVER, &fds[i], msg, sizeof msg), 0);
		CHECK(fds[i] >= 0);
	}
	int extra;
	CHECK_EQ(raw_hello(ibvb_producer_socket_path(p), IBVB_ROLE_OBSERVER, &extra, msg, sizeof msg),
		 (int)IBVB_STATUS_BUSY);
	CHECK(strstr(msg, "busy: 4 observers"));
	close(extra);
	struct ibvb_ring *r;
	CHECK_EQ(attach(&r, "obsflood", 0), 0);
	ibvb_detach(r);
	close(fds[0]); /* a place comes free */
	int64_t t0 = now_ms();
	int st = -1;
	while (st != 0 && now_ms() - t0 < 5000) {
		st = raw_hello(ibvb_producer_socket_path(p), IBVB_ROLE_OBSERVER, &fds[0], msg, sizeof msg);
		if (st != 0) {
			if (fds[0] >= 0)
				close(fds[0]);
			usleep(2000);
		}
	}
	CHECK_EQ(st, 0);
	for (int i = 0; i < 4; i++)
		close(fds[i]);
	ibvb_producer_close(p);
}

/* Spec 2.1 §C: the producer keeps a reserve of descriptors: with fewer than 32 left a new connection is
 * refused "busy: out of file descriptors" (2.0 answered with a wrong reason, e.g. memfd_create failing). */
static void test_attack_fd_exhaustion_is_refused_busy(void)
{
	struct rlimit rl = {256, 256};
	CHECK_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0); /* this test's child only */
	struct ibvb_producer_opts o = opts(4, 64, IBVB_POLICY_DROP);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "fdres", &o), 0);
	int hog[256], nh = 0;
	while (nh < 256) { /* leave 20 descriptors: inside the reserve */
		int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			break;
		if (fd >= 256 - 20) {
			close(fd);
			break;
		}
		hog[nh++] = fd;
	}
	struct ibvb_ring *r;
	CHECK_EQ(attach(&r, "fdres", 0), -EBUSY);
	CHECK(strstr(ibvb_last_error(), "out of file descriptors"));
	for (int i = 0; i < nh; i++)
		close(hog[i]);
	CHECK_EQ(attach(&r, "fdres", 0), 0);
	ibvb_detach(r);
	ibvb_producer_close(p);
}

/* Spec 2.1 §C: every size is overflow-checked: 16777216 slots of 1 TiB are refused in one line before
 * anything is created (2.0's Go producer mapped 1.5 GiB and panicked). */
static void test_size_overflow_is_refused_in_one_line(void)
{
	struct ibvb_producer_opts o = opts(16777216, 1ull << 40, IBVB_POLICY_DROP);
	o.max_items = 1;
	struct ibvb_producer *p = NULL;
	CHECK_EQ(ibvb_producer_create(&p, "huge", &o), -EINVAL);
	CHECK(p == NULL);
	CHECK(strstr(ibvb_last_error(), "16777216 slots of 1099511627776 bytes"));
	CHECK(strstr(ibvb_last_error(), "overflow"));
	CHECK(strchr(ibvb_last_error(), '\n') == NULL);
	char path[600];
	snprintf(path, sizeof path, "%s/huge%s", g_dir, IBVB_LOCK_SUFFIX);
	CHECK(access(path, F_OK) != 0);
}

/* Attach to sock as uid 65533 with the supplementary groups given (setgroups, as a login would not: the
 * uid has no /etc/passwd entry). The child's exit: 0 attached, 2 refused "may not attach", 1 other. */
static int attach_as_stranger(const char *sock, const gid_t *groups, size_t n)
{
	pid_t c = fork();
	if (c == 0) {
		if (setgroups(n, groups) || setgid(65533) || setuid(65533))
			_exit(9);
		struct ibvb_ring *r;
		int rc = ibvb_attach(&r, sock, 2000);
		if (rc == 0)
			_exit(0);
		_exit(rc == -EACCES && strstr(ibvb_last_error(), "may not attach") ? 2 : 1);
	}
	int st;
	waitpid(c, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Spec 2.1 §1.2: --group membership comes from the peer's real groups (SO_PEERGROUPS), not /etc/group: a
 * process given the group with setgroups is admitted (2.0 looked the uid up in /etc/group and refused it),
 * the same uid without the group is refused. */
static void test_group_member_is_admitted_by_its_real_groups(void)
{
	if (geteuid() != 0) {
		fprintf(stderr, "    (skipped: needs root to run a process as another uid with chosen groups)\n");
		return;
	}
	struct group *gr = getgrnam("nogroup");
	CHECK(gr != NULL); /* Debian's gid 65534 */
	struct ibvb_producer_opts o = opts(4, 64, IBVB_POLICY_DROP);
	o.group = "nogroup";
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "grp", &o), 0);
	chmod(ibvb_producer_socket_path(p), 0666); /* the socket's mode is not what is tested: SO_PEER* are */
	gid_t member[1] = {gr->gr_gid};
	CHECK_EQ(attach_as_stranger(ibvb_producer_socket_path(p), member, 1), 0);
	gid_t other[1] = {65533};
	CHECK_EQ(attach_as_stranger(ibvb_producer_socket_path(p), other, 1), 2);
	ibvb_producer_close(p);
}

/* ---- layout 2.2 consumer groups (spec §14) ------------------------------------------------------- */

static int member(struct ibvb_ring **r, const char *name, const char *group)
{
	struct ibvb_attach_opts ao = {.dir = g_dir, .group = group};
	return ibvb_attach_opts(r, name, 5000, &ao);
}

/* Spec §14.3: a member that stopped reading keeps what it was given and gets nothing more while another
 * member waits with nothing queued: the idle one is handed every new position (round robin among the idle),
 * and the rows show what each published and what the producer accepted (client_minor 2, read, queued). */
static void test_group22_idle_member_first_stopped_member_gets_nothing_more(void)
{
	struct ibvb_producer_opts o = opts(16, 256, IBVB_POLICY_DROP);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "g22idle", &o), 0);
	struct ibvb_ring *a, *b;
	CHECK_EQ(member(&a, "g22idle", "g"), 0);
	CHECK_EQ(member(&b, "g22idle", "g"), 0);
	uint32_t ia = ibvb_consumer_index(a), ib = ibvb_consumer_index(b);
	CHECK_EQ(pub(p, 1, 200), 0); /* both idle: the first row */
	CHECK_EQ(pub(p, 2, 200), 0); /* a has 1 queued, b none: b */
	uint64_t sum = 0, min = UINT64_MAX, bad = 0, got_b = 0;
	for (uint64_t cnt = 3; cnt <= 12; cnt++) {
		got_b += drain(b, 200, &sum, &min, &bad); /* b reads what it has: idle again */
		CHECK_EQ(pub(p, cnt, 200), 0);
	}
	got_b += drain(b, 200, &sum, &min, &bad);
	CHECK_EQ(atomic_load(&p->rows[ia].assigned), 1); /* a, stopped, got nothing after heap 1 */
	CHECK_EQ(got_b, 11);
	CHECK_EQ(sum, 12 * 13 / 2 - 1);
	CHECK_EQ(bad, 0);
	CHECK_EQ(atomic_load(&p->rows[ia].client_minor), 2);
	CHECK_EQ(atomic_load(&p->rows[ib].client_minor), 2);
	CHECK_EQ(pub(p, 13, 200), 0); /* b's read (12) is accepted at this commit; 13 goes to b */
	CHECK_EQ(atomic_load(&p->rows[ia].queued), 1);
	CHECK_EQ(atomic_load(&p->rows[ia].read), 0);
	CHECK_EQ(atomic_load(&p->rows[ib].read), 12);
	CHECK_EQ(atomic_load(&p->rows[ib].queued), 1);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(a, &h), 0); /* a wakes up: its heap 1 waited for it */
	CHECK_EQ(h.heap_cnt, 1);
	CHECK(pattern_ok(h.payload, 1, 200));
	CHECK_EQ(ibvb_heap_valid(a, &h), 1);
	CHECK_EQ(ibvb_release(a, &h), 0);
	CHECK_EQ(ibvb_heap_valid(a, &h), 0); /* released: not held any more */
	CHECK_EQ(ibvb_peek(a, &h), -EAGAIN);
	CHECK_EQ(pub(p, 14, 200), 0); /* a read everything: both idle, a picked least recently */
	CHECK_EQ(atomic_load(&p->rows[ia].assigned), 2);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_GROUP_SKIPPED), 0);
	ibvb_detach(a);
	ibvb_detach(b);
	ibvb_producer_close(p);
}

/* Spec §14.2-§14.3: a member working on a heap it holds has nothing queued — what it published as read
 * passed it — so it is handed the next position in turn, while a 2.1 rule (its held heap counted as queued)
 * would give every position to the other member. */
static void test_group22_member_holding_a_heap_it_read_is_idle(void)
{
	struct ibvb_producer_opts o = opts(8, 256, IBVB_POLICY_DROP);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "g22hold", &o), 0);
	struct ibvb_ring *a, *b;
	CHECK_EQ(member(&a, "g22hold", "g"), 0);
	CHECK_EQ(member(&b, "g22hold", "g"), 0);
	uint32_t ia = ibvb_consumer_index(a);
	CHECK_EQ(pub(p, 1, 200), 0);
	CHECK_EQ(pub(p, 2, 200), 0);
	struct ibvb_heap h1, h3;
	CHECK_EQ(ibvb_peek(a, &h1), 0); /* a holds heap 1: read 1 published, tail 0 */
	CHECK_EQ(h1.heap_cnt, 1);
	uint64_t sum = 0, min = UINT64_MAX, bad = 0;
	CHECK_EQ(drain(b, 200, &sum, &min, &bad), 1);
	CHECK_EQ(pub(p, 3, 200), 0); /* both idle: a, picked least recently */
	CHECK_EQ(atomic_load(&p->rows[ia].assigned), 2);
	CHECK_EQ(atomic_load(&p->rows[ia].read), 1);
	CHECK_EQ(atomic_load(&p->rows[ia].released), 0);
	CHECK_EQ(ibvb_peek(a, &h3), 0);
	CHECK_EQ(h3.heap_cnt, 3);
	CHECK_EQ(ibvb_heap_valid(a, &h1), 1);
	CHECK(pattern_ok(h1.payload, 1, 200) && pattern_ok(h3.payload, 3, 200));
	CHECK_EQ(ibvb_release(a, &h3), 0);
	ibvb_detach(a);
	ibvb_detach(b);
	ibvb_producer_close(p);
}

/* Spec §14.4: a sleeping 2.2 member is woken only for its own positions: while it sleeps, a position the
 * producer gives the other member leaves it asleep (its row's wakes unchanged, consumer_waiting still set),
 * and the next one, its own, wakes it. */
struct sleeper {
	struct ibvb_ring *r;
	uint64_t got[8];
	int n, rc;
	pthread_t thr;
};

static void *sleeper_fn(void *arg)
{
	struct sleeper *s = arg;
	ibvb_set_spin_budget(s->r, 0);
	while (s->n < 2) {
		struct ibvb_heap h;
		int rc = ibvb_wait(s->r, &h, 10000);
		if (rc == -EINTR)
			continue;
		if (rc < 0) {
			s->rc = rc;
			return NULL;
		}
		s->got[s->n] = h.heap_cnt;
		__atomic_store_n(&s->n, s->n + 1, __ATOMIC_RELEASE);
		ibvb_release(s->r, &h);
	}
	return NULL;
}

static int wait_asleep(struct ibvb_region *g)
{
	for (int i = 0; i < 5000; i++) {
		if (atomic_load(&g->consumer_waiting))
			return 1;
		msleep(1);
	}
	return 0;
}

static void test_group22_sleeping_member_is_woken_only_for_its_own(void)
{
	struct ibvb_producer_opts o = opts(16, 256, IBVB_POLICY_DROP);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "g22wake", &o), 0);
	struct sleeper s;
	memset(&s, 0, sizeof s);
	struct ibvb_ring *b;
	CHECK_EQ(member(&s.r, "g22wake", "g"), 0);
	CHECK_EQ(member(&b, "g22wake", "g"), 0);
	uint32_t ia = ibvb_consumer_index(s.r);
	pthread_create(&s.thr, NULL, sleeper_fn, &s);
	CHECK(wait_asleep(s.r->region));
	CHECK_EQ(pub(p, 1, 200), 0); /* both idle, a first: its own, it wakes */
	for (int i = 0; i < 5000 && __atomic_load_n(&s.n, __ATOMIC_ACQUIRE) < 1; i++)
		msleep(1);
	CHECK_EQ(__atomic_load_n(&s.n, __ATOMIC_ACQUIRE), 1);
	CHECK(wait_asleep(s.r->region));
	uint64_t wakes = atomic_load(&p->rows[ia].wakes);
	CHECK_EQ(wakes, 1);
	CHECK_EQ(pub(p, 2, 200), 0); /* both idle, b picked least recently: not a's, a sleeps on */
	msleep(50);
	CHECK_EQ(atomic_load(&p->rows[ia].wakes), 1);
	CHECK_EQ(atomic_load(&s.r->region->consumer_waiting), 1);
	CHECK_EQ(__atomic_load_n(&s.n, __ATOMIC_ACQUIRE), 1);
	CHECK_EQ(pub(p, 3, 200), 0); /* b has 2 queued: a's */
	pthread_join(s.thr, NULL);
	CHECK_EQ(s.rc, 0);
	CHECK_EQ(s.got[0], 1);
	CHECK_EQ(s.got[1], 3);
	CHECK_EQ(atomic_load(&p->rows[ia].wakes), 2);
	ibvb_detach(s.r);
	ibvb_detach(b);
	ibvb_producer_close(p);
}

/* Spec §14.4 and §14.7: eight members of one group on a 4-slot ring, each idle member handed one position in
 * eight — so every member's read falls more than a ring behind head between its own positions: it finds its
 * descriptors lapped, skips what was not its own, and still gets every heap the producer gave it. Every heap
 * reaches exactly one member; then the members leave with their tails far behind head, which settles in
 * bounded loops and loses nothing (group_lost 0), and a whole ring more is published without a drop. */
/* A 4-slot drop ring NAME with eight members of group "g" in rows 0..7. 0, or a negative errno. */
static int eight_members(struct ibvb_producer **p, const char *name, struct ibvb_ring **m)
{
	struct ibvb_producer_opts o = opts(4, 256, IBVB_POLICY_DROP);
	o.max_consumers = 8;
	int rc = ibvb_producer_create(p, name, &o);
	for (int i = 0; i < 8 && rc == 0; i++)
		if ((rc = member(&m[i], name, "g")) == 0 && ibvb_consumer_index(m[i]) != (uint32_t)i)
			rc = -EPROTO;
	return rc;
}

static void test_group22_lapped_members_skip_and_settle_bounded(void)
{
	struct ibvb_producer *p;
	struct ibvb_ring *m[8];
	CHECK_EQ(eight_members(&p, "g22lap", m), 0);
	uint64_t sum = 0, min = UINT64_MAX, bad = 0, got[8] = {0}, n = 0;
	for (uint64_t cnt = 1; cnt <= 200; cnt++) {
		CHECK_EQ(pub(p, cnt, 200), 0);
		int k = (int)((cnt - 1) % 8); /* the member that was given it: round robin among the idle */
		got[k] += drain(m[k], 200, &sum, &min, &bad);
	}
	for (int i = 0; i < 8; i++) {
		got[i] += drain(m[i], 200, &sum, &min, &bad);
		n += got[i];
		CHECK_EQ(got[i], 25);
	}
	CHECK_EQ(n, 200);
	CHECK_EQ(sum, 200 * 201 / 2);
	CHECK_EQ(bad, 0);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_DROPPED_HEAPS), 0);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_CONSUMER_OVERRUNS), 0);
	for (int i = 0; i < 7; i++)
		ibvb_detach(m[i]);
	for (int i = 0; i < 5000 && ibvb_producer_consumers(p) != 1; i++)
		msleep(1);
	CHECK_EQ(ibvb_producer_consumers(p), 1);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_GROUP_LOST), 0);
	uint64_t got7 = 0;
	for (uint64_t cnt = 201; cnt <= 208; cnt++) {
		CHECK_EQ(pub(p, cnt, 200), 0);
		got7 += drain(m[7], 200, &sum, &min, &bad);
	}
	CHECK_EQ(got7, 8);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_DROPPED_HEAPS), 0);
	CHECK_EQ(bad, 0);
	ibvb_detach(m[7]);
	ibvb_producer_close(p);
}

/* Spec §14.6 under drop: a member that stopped with a position queued holds the ring back a whole ring
 * later; the other member and an independent monitor keep up, so exactly the stopped member is detached
 * (overrun), its queued position lost for the group, nothing dropped, and the others read on. */
static void test_group22_drop_detaches_exactly_the_member_holding_back(void)
{
	struct ibvb_producer_opts o = opts(8, 256, IBVB_POLICY_DROP);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "g22drop", &o), 0);
	struct ibvb_ring *a, *b, *mon;
	CHECK_EQ(member(&a, "g22drop", "g"), 0);
	CHECK_EQ(member(&b, "g22drop", "g"), 0);
	CHECK_EQ(attach(&mon, "g22drop", IBVB_START_HEAD), 0);
	uint64_t sum = 0, min = UINT64_MAX, bad = 0, got_b = 0, msum = 0, mmin = UINT64_MAX, got_mon = 0;
	for (uint64_t cnt = 1; cnt <= 40; cnt++) {
		CHECK_EQ(pub(p, cnt, 200), 0);
		got_b += drain(b, 200, &sum, &min, &bad);
		got_mon += drain(mon, 200, &msum, &mmin, &bad);
	}
	CHECK_EQ(got_mon, 40);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_CONSUMER_OVERRUNS), 1);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_DROPPED_HEAPS), 0);
	CHECK_EQ(atomic_load(&p->rows[ibvb_consumer_index(a)].state), IBVB_CONSUMER_OVERRUN);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_GROUP_LOST), 1);
	CHECK_EQ(got_b, 39);
	CHECK_EQ(bad, 0);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(a, &h), -EOVERFLOW);
	ibvb_detach(a);
	ibvb_detach(b);
	ibvb_detach(mon);
	ibvb_producer_close(p);
}

/* Spec §14.6 under block: the producer waits for the member that stopped with a position queued — by name:
 * ctl blocked_on is its row + 1, blocked_since_ns when the wait began, and a log line within a second names
 * its row and pid; when it leaves, its position is lost for the group and the producer goes on. */
static char g_logged[1024];
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static void capture_warn(const char *msg, void *arg)
{
	(void)arg;
	pthread_mutex_lock(&g_log_mu);
	if (!g_logged[0])
		snprintf(g_logged, sizeof g_logged, "%s", msg);
	pthread_mutex_unlock(&g_log_mu);
}

/* Publishes heaps from..to (200 bytes) in a thread, which a full block ring makes wait; rc the first
 * failure, returned_ms when it returned. */
struct blocked_pub {
	struct ibvb_producer *p;
	uint64_t from, to;
	int rc;
	int64_t returned_ms;
	pthread_t thr;
};

static void *blocked_pub_fn(void *arg)
{
	struct blocked_pub *bp = arg;
	for (uint64_t c = bp->from; c <= bp->to && bp->rc == 0; c++)
		bp->rc = pub(bp->p, c, 200);
	__atomic_store_n(&bp->returned_ms, now_ms(), __ATOMIC_RELEASE);
	return NULL;
}

static void test_group22_block_waits_for_the_member_by_name(void)
{
	struct ibvb_producer_opts o = opts(8, 256, IBVB_POLICY_BLOCK);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "g22block", &o), 0);
	ibvb_set_warn_handler(capture_warn, NULL);
	struct ibvb_ring *a, *b;
	CHECK_EQ(member(&a, "g22block", "g"), 0);
	CHECK_EQ(member(&b, "g22block", "g"), 0);
	uint32_t ia = ibvb_consumer_index(a);
	uint64_t sum = 0, min = UINT64_MAX, bad = 0, got_b = 0;
	for (uint64_t cnt = 1; cnt <= 8; cnt++) { /* a is given heap 1 and stops; b takes the rest */
		CHECK_EQ(pub(p, cnt, 200), 0);
		got_b += drain(b, 200, &sum, &min, &bad);
	}
	CHECK_EQ(got_b, 7);
	CHECK_EQ(atomic_load(&p->ctl->blocked_on), 0);
	int64_t t0 = now_ms();
	uint64_t real0 = ibvb_producer_now_ns();
	struct blocked_pub bp = {p, 9, 12, 0, 0, 0};
	pthread_create(&bp.thr, NULL, blocked_pub_fn, &bp);
	while (atomic_load(&p->ctl->blocked_on) == 0 && now_ms() - t0 < 5000)
		msleep(1);
	CHECK_EQ(atomic_load(&p->ctl->blocked_on), ia + 1);
	uint64_t since = atomic_load(&p->ctl->blocked_since_ns);
	CHECK(since >= real0 - 1000000 && since <= ibvb_producer_now_ns());
	int logged = 0;
	while (!logged && now_ms() - t0 < 1500) {
		msleep(10);
		pthread_mutex_lock(&g_log_mu);
		logged = g_logged[0] != 0;
		pthread_mutex_unlock(&g_log_mu);
	}
	CHECK(logged);
	char want[64];
	snprintf(want, sizeof want, "consumer row %u (pid %d, group", ia, (int)getpid());
	CHECK(strstr(g_logged, want) != NULL);
	CHECK(strstr(g_logged, "position 0") != NULL);
	ibvb_detach(a); /* its queued heap 1 is lost for the group; the producer goes on */
	pthread_join(bp.thr, NULL);
	CHECK_EQ(bp.rc, 0);
	CHECK_EQ(atomic_load(&p->ctl->blocked_on), 0);
	got_b += drain(b, 200, &sum, &min, &bad);
	CHECK_EQ(got_b, 11);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_GROUP_LOST), 1);
	CHECK_EQ(bad, 0);
	ibvb_set_warn_handler(NULL, NULL);
	ibvb_detach(b);
	ibvb_producer_close(p);
}

/* Spec §14.7: a member that releases its share without handing it out (it writes its region's tail and read
 * past its positions, handed 0) shows in its row's skipped and in group_skipped; a member that reads its
 * heaps shows 0. */
static void test_group22_released_unread_counts_skipped(void)
{
	struct ibvb_producer_opts o = opts(16, 256, IBVB_POLICY_DROP);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "g22skip", &o), 0);
	struct ibvb_ring *a, *b;
	CHECK_EQ(member(&a, "g22skip", "g"), 0);
	CHECK_EQ(member(&b, "g22skip", "g"), 0);
	for (uint64_t cnt = 1; cnt <= 6; cnt++)
		CHECK_EQ(pub(p, cnt, 200), 0);
	uint32_t ia = ibvb_consumer_index(a), ib = ibvb_consumer_index(b);
	CHECK_EQ(atomic_load(&p->rows[ia].assigned), 3);
	uint64_t sum = 0, min = UINT64_MAX, bad = 0;
	CHECK_EQ(drain(b, 200, &sum, &min, &bad), 3);
	atomic_store(&a->region->read, 6); /* the thief: everything looked at, nothing handed out */
	atomic_store(&a->region->tail, 6);
	CHECK_EQ(pub(p, 7, 200), 0); /* its commit sweeps the releases */
	CHECK_EQ(atomic_load(&p->rows[ia].skipped), 3);
	CHECK_EQ(atomic_load(&p->rows[ib].skipped), 0);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_GROUP_SKIPPED), 3);
	ibvb_detach(b);
	for (int i = 0; i < 5000 && ibvb_producer_consumers(p) != 1; i++)
		msleep(1);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_GROUP_SKIPPED), 3); /* kept when members leave */
	ibvb_detach(a);
	ibvb_producer_close(p);
}

/* Spec §14.1 grants: with grants, a member may join only a granted group and only as a listed uid or gid
 * (status 2, "not permitted to join group NAME"); independent consumers are admitted as before; root
 * always. And ibvb-produce --consumer-group refuses a malformed grant in one line. */
static int join_as(const char *sock, uid_t uid, gid_t gid, const char *group, char *msg, size_t cap)
{
	int pfd[2];
	if (pipe(pfd) < 0)
		return 128;
	pid_t c = fork();
	if (c == 0) {
		close(pfd[0]);
		gid_t groups[1] = {gid};
		if (uid != 0 && (setgroups(1, groups) || setgid(gid) || setuid(uid)))
			_exit(9);
		struct ibvb_ring *r;
		struct ibvb_attach_opts ao = {.group = group};
		int rc = ibvb_attach_opts(&r, sock, 2000, &ao);
		const char *e = ibvb_last_error();
		if (write(pfd[1], e, strlen(e)) < 0)
			_exit(8);
		_exit(rc == 0 ? 0 : rc == -EACCES ? 2 : 1);
	}
	close(pfd[1]);
	ssize_t n = read(pfd[0], msg, cap - 1);
	msg[n > 0 ? n : 0] = 0;
	close(pfd[0]);
	int st;
	waitpid(c, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void test_group22_grants_admit_only_listed_members(void)
{
	if (geteuid() != 0) {
		fprintf(stderr, "    (skipped: needs root to run processes as other uids)\n");
		return;
	}
	struct group *gr = getgrnam("nogroup");
	CHECK(gr != NULL);
	struct ibvb_producer_opts o = opts(4, 64, IBVB_POLICY_DROP);
	o.group = "nogroup";
	uint32_t uids[1] = {65533}, gids[1] = {65532};
	struct ibvb_group_grant g[2] = {{"work", uids, 1, NULL, 0}, {"gwork", NULL, 0, gids, 1}};
	o.groups = g;
	o.ngroups = 2;
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "g22grant", &o), 0);
	const char *sock = ibvb_producer_socket_path(p);
	chmod(sock, 0666);
	char msg[300];
	gid_t ng = gr->gr_gid;
	CHECK_EQ(join_as(sock, 65533, ng, "work", msg, sizeof msg), 0);
	CHECK_EQ(join_as(sock, 65531, ng, "work", msg, sizeof msg), 2);
	CHECK(strstr(msg, "not permitted to join group work") != NULL);
	CHECK_EQ(join_as(sock, 65533, ng, "other", msg, sizeof msg), 2); /* not granted at all */
	CHECK(strstr(msg, "not permitted to join group") != NULL);
	CHECK_EQ(join_as(sock, 65531, ng, NULL, msg, sizeof msg), 0);    /* independent: as before */
	CHECK_EQ(join_as(sock, 0, 0, "other", msg, sizeof msg), 0);      /* root always */
	/* a gid grant: the peer's primary gid (65532 here would not pass the ring's own --group gate, so the
	 * ring's gate is nogroup and the grant's gid a supplementary group) */
	pid_t c = fork();
	if (c == 0) {
		gid_t groups[2] = {ng, 65532};
		if (setgroups(2, groups) || setgid(ng) || setuid(65531))
			_exit(9);
		struct ibvb_ring *r;
		struct ibvb_attach_opts ao = {.group = "gwork"};
		_exit(ibvb_attach_opts(&r, sock, 2000, &ao) == 0 ? 0 : 1);
	}
	int st;
	waitpid(c, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK_EQ(join_as(sock, 65531, ng, "gwork", msg, sizeof msg), 2);
	ibvb_producer_close(p);
	char cmd[600];
	snprintf(cmd, sizeof cmd, "%s --ring g22bad --dir %s --consumer-group nogrant 2>&1", g_produce, g_dir);
	FILE *f = popen(cmd, "r");
	CHECK(f != NULL);
	char line[300] = "";
	if (!fgets(line, sizeof line, f))
		line[0] = 0;
	CHECK(WEXITSTATUS(pclose(f)) == 1);
	CHECK(strstr(line, "want NAME=UID|@GID") != NULL);
}

/* Spec §6 readers keep the last record of a repeated id. The C client did it by rescanning the rest of the
 * buffer for every record (quadratic: 4 MiB took 25 s); now it sorts the ids once. 8 MiB of metadata —
 * 180 000 records, distinct ids but for the last 1000, which describe ids 0..999 again — is iterated well
 * inside the test's alarm (the quadratic walk needs minutes), each repeated id yielding only its last
 * record; a snapshot of the first 1000 ids' records parses too. */
static void test_meta_large_repeated_ids_read_linearly(void)
{
	const size_t nrec = 180000, nid = 1000;
	struct ibvb_producer_opts o = opts(4, 256, IBVB_POLICY_DROP);
	o.meta_size = 12u << 20;
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "metabig", &o), 0);
	size_t one = ibvb_meta_encode(NULL, 0, 0x1000, 0, NULL, "item-000000", "", "", 0, "<u1");
	uint8_t *recs = malloc(nrec * one);
	CHECK(recs != NULL);
	size_t len = 0;
	for (size_t i = 0; i < nrec; i++) {
		char name[16];
		snprintf(name, sizeof name, "item-%06zu", i);
		uint64_t id = i < nrec - nid ? 0x1000 + i : 0x1000 + (i - (nrec - nid));
		len += ibvb_meta_encode(recs + len, one, id, 0, NULL, name, "", "", 0, "<u1");
	}
	CHECK(len > (8u << 20));
	CHECK_EQ(ibvb_producer_set_descriptors(p, recs, len), 0);
	struct ibvb_ring *r;
	CHECK_EQ(attach(&r, "metabig", IBVB_START_OLDEST), 0);
	int64_t t0 = now_ms();
	long got = ibvb_read_meta(r, recs, len, NULL);
	CHECK_EQ(got, (long)len);
	size_t off = 0, n = 0;
	struct ibvb_meta_record m;
	int rc;
	while ((rc = ibvb_meta_next(recs, len, &off, &m)) == 1) {
		size_t k = (size_t)(m.id - 0x1000);
		char want[32];
		snprintf(want, sizeof want, "item-%06zu", k < nid ? nrec - nid + k : k);
		CHECK(m.name_len == strlen(want) && memcmp(m.name, want, m.name_len) == 0); /* the last one */
		n++;
	}
	CHECK_EQ(rc, 0);
	CHECK_EQ(n, nrec - nid);
	int64_t el = now_ms() - t0;
	fprintf(stderr, "    8 MiB of metadata (%zu records) read and iterated in %lld ms\n", nrec, (long long)el);
	CHECK(el < 20000);
	CHECK_EQ(ibvb_producer_set_descriptors(p, recs, (size_t)nid * one), 0);
	struct ibvb_descriptors *ds = NULL;
	CHECK_EQ(ibvb_descriptors_read(r, &ds), 0);
	CHECK_EQ(ibvb_descriptor_count(ds), nid);
	ibvb_descriptors_free(ds);
	free(recs);
	ibvb_detach(r);
	ibvb_producer_close(p);
}

/* The C client's descriptor snapshot is sized by the length the producer wrote, capped at
 * IBVB_DESCRIPTORS_MAX_BYTES: metadata beyond it is refused in one line (-EMSGSIZE), never a malloc of
 * whatever the header says. */
static void test_meta_beyond_the_cap_is_refused_in_one_line(void)
{
	struct ibvb_producer_opts o = opts(4, 256, IBVB_POLICY_DROP);
	o.meta_size = (uint64_t)IBVB_DESCRIPTORS_MAX_BYTES + (1u << 20);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "metacap", &o), 0);
	size_t len = (size_t)IBVB_DESCRIPTORS_MAX_BYTES + 4096, one = 4096;
	uint8_t *recs = calloc(1, len);
	CHECK(recs != NULL);
	char desc[4000];
	memset(desc, 'd', sizeof desc - 1);
	desc[sizeof desc - 1] = 0;
	size_t off = 0;
	for (uint64_t id = 0x1000; off + one <= len; id++) {
		size_t k = ibvb_meta_encode(recs + off, one, id, 0, NULL, "x", desc, "", 0, "<u1");
		CHECK(k > 0 && k <= one);
		off += k;
	}
	CHECK_EQ(ibvb_producer_set_descriptors(p, recs, off), 0);
	free(recs);
	struct ibvb_ring *r;
	CHECK_EQ(attach(&r, "metacap", IBVB_START_OLDEST), 0);
	struct ibvb_descriptors *ds = NULL;
	CHECK_EQ(ibvb_descriptors_read(r, &ds), -EMSGSIZE);
	CHECK(strstr(ibvb_last_error(), "IBVB_DESCRIPTORS_MAX_BYTES") != NULL);
	CHECK(ds == NULL);
	ibvb_detach(r);
	ibvb_producer_close(p);
}

/* Spec 2.2 §1.1 / §0: a stranger may not deny the ring. With XDG_RUNTIME_DIR unset, a user's default ring
 * directory is /dev/shm/ibvbridge-UID, which any local user can make first. The producer skips it, with one
 * warning naming it and why, for the next default, /tmp/ibvbridge-UID, and the user's consumer finds the
 * ring there by name (skipping the stranger's directory too). A stranger who squats both gets one clear
 * line naming both. Run in a private mount namespace with its own /dev/shm and /tmp (tmpfs): nothing outside
 * it is touched, and nothing is left when it ends. */
static char g_warned[512];
static void keep_warning(const char *msg, void *arg)
{
	(void)arg;
	if (!g_warned[0])
		snprintf(g_warned, sizeof g_warned, "%s", msg);
}

static int as_uid(uid_t uid, int (*fn)(void))
{
	pid_t c = fork();
	if (c == 0) {
		gid_t g[1] = {65534};
		if (setgroups(1, g) || setgid(65534) || setuid(uid))
			_exit(90);
		_exit(fn());
	}
	int st;
	waitpid(c, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int squat(void)
{
	return mkdir("/dev/shm/ibvbridge-65533", 0755) == 0 && mkdir("/tmp/ibvbridge-65533", 0755) == 0 ? 0 : 1;
}
static int unsquat_tmp(void) { return rmdir("/tmp/ibvbridge-65533") == 0 ? 0 : 1; }

static int victim(void)
{
	unsetenv("XDG_RUNTIME_DIR");
	unsetenv("IBVBRIDGE_RING_DIR");
	ibvb_set_warn_handler(keep_warning, NULL);
	struct ibvb_producer_opts o = opts(4, 64, IBVB_POLICY_DROP);
	o.dir = NULL;
	struct ibvb_producer *p;
	if (ibvb_producer_create(&p, "squatted", &o) < 0) {
		fprintf(stderr, "    victim: create: %s\n", ibvb_last_error());
		return 1;
	}
	int rc = 0;
	if (strcmp(ibvb_producer_socket_path(p), "/tmp/ibvbridge-65533/squatted.v2.sock") != 0)
		rc = 2;
	if (!strstr(g_warned, "skipping /dev/shm/ibvbridge-65533: owned by uid 65534, not 65533; using "
			      "/tmp/ibvbridge-65533"))
		rc = 3;
	struct ibvb_ring *r;
	if (pub(p, 7, 32) != 0 || ibvb_attach(&r, "squatted", 2000) < 0)
		rc = 4;
	else {
		struct ibvb_heap h;
		if (ibvb_peek(r, &h) != 0 || h.heap_cnt != 7)
			rc = 5;
		ibvb_detach(r);
	}
	ibvb_producer_close(p);
	if (rc)
		fprintf(stderr, "    victim: rc %d, socket %s, warning \"%s\"\n", rc, ibvb_producer_socket_path(p) ? "" : "",
			g_warned);
	return rc;
}

static int victim_without_fallback(void)
{
	unsetenv("XDG_RUNTIME_DIR");
	unsetenv("IBVBRIDGE_RING_DIR");
	ibvb_set_warn_handler(keep_warning, NULL);
	struct ibvb_producer_opts o = opts(4, 64, IBVB_POLICY_DROP);
	o.dir = NULL;
	struct ibvb_producer *p;
	int rc = ibvb_producer_create(&p, "squatted", &o);
	if (rc == 0) {
		ibvb_producer_close(p);
		return 1;
	}
	return strstr(ibvb_last_error(), "/tmp/ibvbridge-65533 is owned by uid 65534") &&
			       strstr(ibvb_last_error(), "skipped /dev/shm/ibvbridge-65533: owned by uid 65534")
		       ? 0
		       : 2;
}

static void test_squatted_default_dir_does_not_deny_the_producer(void)
{
	if (geteuid() != 0) {
		fprintf(stderr, "    (skipped: needs root for a private mount namespace and other uids)\n");
		return;
	}
	pid_t c = fork();
	if (c == 0) {
		if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
			fprintf(stderr, "    (skipped: no private mount namespace: %s)\n", strerror(errno));
			_exit(77);
		}
		if (mount("tmpfs", "/dev/shm", "tmpfs", 0, "mode=1777") < 0 ||
		    mount("tmpfs", "/tmp", "tmpfs", 0, "mode=1777") < 0)
			_exit(70);
		if (as_uid(65534, squat) != 0)
			_exit(71);
		if (as_uid(65533, victim_without_fallback) != 0) /* both squatted: one clear line */
			_exit(72);
		if (as_uid(65534, unsquat_tmp) != 0)
			_exit(73);
		_exit(as_uid(65533, victim));
	}
	int st;
	waitpid(c, &st, 0);
	CHECK(WIFEXITED(st));
	if (WEXITSTATUS(st) == 77)
		return;
	CHECK_EQ(WEXITSTATUS(st), 0);
}

/* ibvb_producer_interrupt wakes a producer blocked on a consumer's release futex at once — not at the end of
 * its 250 ms sleep slice. Five rounds (interrupt is sticky: a ring each): the producer blocks on a full
 * block-policy ring whose consumer reads nothing, sleeps (producer_waiting set, then 20 ms more), and is
 * interrupted; the five returns together take well under one slice (each waits ~230 ms without the wake). */
static void test_interrupt_wakes_a_blocked_producer_at_once(void)
{
	int64_t total = 0;
	for (int round = 0; round < 5; round++) {
		struct ibvb_producer_opts o = opts(4, 64, IBVB_POLICY_BLOCK);
		struct ibvb_producer *p;
		char name[32];
		snprintf(name, sizeof name, "intr%d", round);
		CHECK_EQ(ibvb_producer_create(&p, name, &o), 0);
		struct ibvb_ring *r;
		CHECK_EQ(attach(&r, name, IBVB_START_OLDEST), 0);
		for (uint64_t c = 1; c <= 4; c++)
			CHECK_EQ(pub(p, c, 32), 0);
		struct blocked_pub ip = {p, 99, 99, 0, 0, 0};
		pthread_create(&ip.thr, NULL, blocked_pub_fn, &ip);
		int64_t t0 = now_ms();
		while (atomic_load(&p->ctl->producer_waiting) == 0 && now_ms() - t0 < 5000)
			usleep(200);
		CHECK_EQ(atomic_load(&p->ctl->producer_waiting), 1);
		msleep(20); /* asleep on the consumer's release futex by now */
		int64_t t1 = now_ms();
		ibvb_producer_interrupt(p);
		pthread_join(ip.thr, NULL);
		CHECK_EQ(ip.rc, -ECANCELED);
		total += ip.returned_ms - t1;
		ibvb_detach(r);
		ibvb_producer_close(p);
	}
	fprintf(stderr, "    5 interrupted waits returned in %lld ms together\n", (long long)total);
	CHECK(total < 500);
}

/* Spec §7.7: ibvb_heap_valid proves the bytes of a heap this consumer holds; a heap it has released (or
 * never read) is not held, so it is not valid, whatever the row says. */
static void test_heap_valid_is_zero_for_a_heap_not_held(void)
{
	struct ibvb_producer_opts o = opts(8, 256, IBVB_POLICY_DROP);
	struct ibvb_producer *p;
	CHECK_EQ(ibvb_producer_create(&p, "hvalid", &o), 0);
	struct ibvb_ring *r;
	CHECK_EQ(attach(&r, "hvalid", IBVB_START_OLDEST), 0);
	CHECK_EQ(pub(p, 1, 200), 0);
	CHECK_EQ(pub(p, 2, 200), 0);
	struct ibvb_heap h1, h2, later;
	CHECK_EQ(ibvb_peek(r, &h1), 0);
	CHECK_EQ(ibvb_peek(r, &h2), 0);
	CHECK_EQ(ibvb_heap_valid(r, &h1), 1);
	CHECK_EQ(ibvb_heap_valid(r, &h2), 1);
	later = h2;
	later.position = h2.position + 1; /* not read yet */
	CHECK_EQ(ibvb_heap_valid(r, &later), 0);
	CHECK_EQ(ibvb_release(r, &h1), 0);
	CHECK_EQ(ibvb_heap_valid(r, &h1), 0);
	CHECK_EQ(ibvb_heap_valid(r, &h2), 1);
	CHECK_EQ(ibvb_release(r, &h2), 0);
	CHECK_EQ(ibvb_heap_valid(r, &h2), 0);
	ibvb_detach(r);
	ibvb_producer_close(p);
}

/* Spec §14.7: settling a departed member walks at most slot_count positions back from head. Eight members
 * on a 4-slot ring: member 0 releases its first heap, is handed position 8 a ring and more later, reads it
 * (passing over the lapped positions between: its tail moves from 1 to 8 with no commit meanwhile) and
 * leaves holding it. Position 8 is lost for the group — exactly once: a walk from its last swept position
 * (1) would meet position 8's bookkeeping at position 4 first, before its final tail, and count it released. */
static void test_group22_settle_walks_at_most_a_ring(void)
{
	struct ibvb_producer *p;
	struct ibvb_ring *m[8];
	CHECK_EQ(eight_members(&p, "g22settle", m), 0);
	uint64_t sum = 0, min = UINT64_MAX, bad = 0;
	for (uint64_t cnt = 1; cnt <= 8; cnt++) {
		CHECK_EQ(pub(p, cnt, 200), 0);
		CHECK_EQ(drain(m[cnt - 1], 200, &sum, &min, &bad), 1);
	}
	CHECK_EQ(pub(p, 9, 200), 0); /* position 8: member 0's again */
	struct ibvb_heap h;
	CHECK_EQ(ibvb_peek(m[0], &h), 0);
	CHECK_EQ(h.heap_cnt, 9);
	ibvb_detach(m[0]); /* holding it */
	CHECK_EQ(wait_counter(p, IBVB_CTR_GROUP_LOST, 1), 1);
	for (int i = 0; i < 5000 && ibvb_producer_consumers(p) != 7; i++)
		msleep(1);
	CHECK_EQ(ibvb_producer_consumers(p), 7);
	CHECK_EQ(ibvb_producer_counter(p, IBVB_CTR_GROUP_LOST), 1);
	CHECK_EQ(bad, 0);
	for (int i = 1; i < 8; i++)
		ibvb_detach(m[i]);
	ibvb_producer_close(p);
}

static const struct test tests[] = {
	{"producer_bytes_block", test_bytes_block},
	{"producer_bytes_drop", test_bytes_drop},
	{"producer_three_consumers", test_three_consumers},
	{"producer_tools", test_tools},
	{"producer_overrun", test_overrun},
	{"producer_bad_cursor", test_bad_cursor},
	{"producer_consumer_killed", test_consumer_killed},
	{"producer_refusals", test_refusals},
	{"overrun_while_held_is_reported_with_forked_producer", test_overrun_while_held_is_reported_with_forked_producer},
	{"attack_parent_symlink_dir_is_refused", test_attack_parent_symlink_dir_is_refused},
	{"attack_idle_attach_detach_churn_is_bounded", test_attack_idle_attach_detach_churn_is_bounded},
	{"attack_observer_flood_is_refused_busy", test_attack_observer_flood_is_refused_busy},
	{"attack_fd_exhaustion_is_refused_busy", test_attack_fd_exhaustion_is_refused_busy},
	{"size_overflow_is_refused_in_one_line", test_size_overflow_is_refused_in_one_line},
	{"group_member_is_admitted_by_its_real_groups", test_group_member_is_admitted_by_its_real_groups},
	{"producer_peer_gate", test_peer_gate},
	{"producer_seals", test_seals},
	{"producer_interrupt", test_interrupt},
	{"producer_block_waits_attach", test_block_waits_for_attach},
	{"producer_drop_keeps_newest", test_drop_keeps_newest},
	{"producer_items_meta_batch", test_items_meta_batch},
	{"producer_wakes", test_wakes},
	{"hello_answers_as_specified", test_hello_answers_as_specified},
	{"group_members_share_every_heap_once_beside_a_monitor", test_group_members_share_every_heap_once_beside_a_monitor},
	{"group_member_leaving_loses_its_heaps_and_its_row_inherits_none",
	 test_group_member_leaving_loses_its_heaps_and_its_row_inherits_none},
	{"attach_refuses_a_group_name_over_64_bytes", test_attach_refuses_a_group_name_over_64_bytes},
	{"member_never_hands_out_a_descriptor_rewritten_while_it_copied_it",
	 test_member_never_hands_out_a_descriptor_rewritten_while_it_copied_it},
	{"group_member_a_ring_behind_is_overrun_not_overwritten", test_group_member_a_ring_behind_is_overrun_not_overwritten},
	{"group_holes_are_not_read_by_a_new_consumer", test_group_holes_are_not_read_by_a_new_consumer},
	{"group_member_holding_under_a_quarter_never_stalls_block",
	 test_group_member_holding_under_a_quarter_never_stalls_block},
	{"unknown_header_or_row_state_is_corrupt", test_unknown_header_or_row_state_is_corrupt},
	{"meta_repeated_id_keeps_last_and_busy_gives_up", test_meta_repeated_id_keeps_last_and_busy_gives_up},
	{"nothing_published_after_end_of_stream", test_nothing_published_after_end_of_stream},
	{"producer_hugepages", test_hugepages},
	{"group22_idle_member_first_stopped_member_gets_nothing_more",
	 test_group22_idle_member_first_stopped_member_gets_nothing_more},
	{"group22_member_holding_a_heap_it_read_is_idle", test_group22_member_holding_a_heap_it_read_is_idle},
	{"group22_sleeping_member_is_woken_only_for_its_own", test_group22_sleeping_member_is_woken_only_for_its_own},
	{"group22_lapped_members_skip_and_settle_bounded", test_group22_lapped_members_skip_and_settle_bounded},
	{"group22_drop_detaches_exactly_the_member_holding_back",
	 test_group22_drop_detaches_exactly_the_member_holding_back},
	{"group22_block_waits_for_the_member_by_name", test_group22_block_waits_for_the_member_by_name},
	{"group22_released_unread_counts_skipped", test_group22_released_unread_counts_skipped},
	{"group22_grants_admit_only_listed_members", test_group22_grants_admit_only_listed_members},
	{"meta_large_repeated_ids_read_linearly", test_meta_large_repeated_ids_read_linearly},
	{"meta_beyond_the_cap_is_refused_in_one_line", test_meta_beyond_the_cap_is_refused_in_one_line},
	{"squatted_default_dir_does_not_deny_the_producer", test_squatted_default_dir_does_not_deny_the_producer},
	{"interrupt_wakes_a_blocked_producer_at_once", test_interrupt_wakes_a_blocked_producer_at_once},
	{"heap_valid_is_zero_for_a_heap_not_held", test_heap_valid_is_zero_for_a_heap_not_held},
	{"group22_settle_walks_at_most_a_ring", test_group22_settle_walks_at_most_a_ring},
};


int main(int argc, char **argv)
{
	g_consume = argc > 1 ? argv[1] : "build/ibvb-consume";
	g_produce = argc > 2 ? argv[2] : "build/ibvb-produce";
	snprintf(g_dir, sizeof g_dir, "/tmp/ibvb-ptest.XXXXXX");
	if (!mkdtemp(g_dir)) {
		perror("mkdtemp");
		return 1;
	}
	chmod(g_dir, 0755);
	unsetenv("IBVBRIDGE_RING_DIR");
	return run_tests(tests, sizeof tests / sizeof tests[0], g_dir);
}
