/* The ring simulation's replayer for the C producer (internal/ringsim/replay.go; docs/ring-layout.md §7, §14).
 *
 * Reads the replay stream (32-byte records: the calls the simulation's harness makes of a producer, each
 * with the reference model's answer) on stdin and plays it against the C producer in this process: no
 * socket, no service thread, no waiting. On the first difference it prints one line
 * "seed S step K: WHAT: got G, want W" and exits 1; at the stream's end it prints "ok STEPS SCENARIOS CUT".
 *
 *   go run ./internal/ringsim/simlog -seeds 50 -steps 2000 -nowrap | clients/c/build/sim_replay
 *
 * The producer's source is included so that its static parts can be called as its own threads call them:
 *   - the producer is made by ibvb_producer_create's steps without the ring directory, the socket and the
 *     service thread (claim_name, listen_socket, start_service): every state the service thread changes is
 *     changed here by a record instead, at the point the stream says — an attach by admit() (the part of
 *     the handshake after the hello's checks, which the simulation's hellos all pass), a hang-up by
 *     gone_locked() (what members_gone_locked does on EOF), the heartbeat's cursor read by
 *     read_cursors_locked() ('S'). Nothing else runs between records.
 *   - a block publish never waits: where acquire's refill would call wait_for, the publish is pending
 *     unless wait_for's loop (check_locked, hot_busy set), run while it changes something, finds a slot at
 *     once (a pass may detach a consumer, the next free its slots); each 'S' runs that loop again for a pending
 *     publish, then reads the cursors as the heartbeat does.
 *   - an independent consumer's start = 0 position is the producer's choice (spec §7.1), which the stream
 *     cannot follow as the lockstep run does: an older start is followed by the consumer releasing up to
 *     the model's at once, a newer one cuts the scenario short (start_as_model; counted).
 *   - a consumer's region is zeroed shared memory handed to admit() (as welcome_consumer hands it a fresh
 *     memfd's mapping); once the producer detaches the row it unmaps it, and the stream's stores to that
 *     row are skipped (nobody reads them any more). The unmapped memory goes back to a slab here, so a
 *     producer touching a region after unmapping it would not fault in this program (the lockstep run,
 *     whose regions are truly unmapped, would). */
/* Consumer regions come from a slab mapped once and go back to it when the producer unmaps them: the
 * producer's munmap is routed here (one mmap and one munmap per attach cost more than the rest of the
 * replay, the munmap's TLB flush above all). */
#define munmap replay_munmap
#include "../ibvbridge_producer.c"
#undef munmap
extern int munmap(void *addr, size_t len);

#include <stdio.h>
#include <string.h>

enum { SLAB_REGIONS = 4096 };
static uint8_t *slab;
static uint32_t slab_free[SLAB_REGIONS], slab_nfree, slab_used;

/* A zeroed region, as a fresh memfd's. */
static struct ibvb_region *region_new(void)
{
	if (!slab) {
		slab = mmap(NULL, (size_t)SLAB_REGIONS * IBVB_REGION_SIZE, PROT_READ | PROT_WRITE,
			    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (slab == MAP_FAILED)
			slab = NULL;
	}
	if (slab && slab_nfree) {
		struct ibvb_region *g = (void *)(slab + (size_t)slab_free[--slab_nfree] * IBVB_REGION_SIZE);
		memset(g, 0, IBVB_REGION_SIZE);
		return g;
	}
	if (slab && slab_used < SLAB_REGIONS)
		return (void *)(slab + (size_t)slab_used++ * IBVB_REGION_SIZE);
	void *g = mmap(NULL, IBVB_REGION_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	return g == MAP_FAILED ? NULL : g;
}

int replay_munmap(void *addr, size_t len)
{
	uint8_t *a = addr;
	if (slab && a >= slab && a < slab + (size_t)SLAB_REGIONS * IBVB_REGION_SIZE) {
		if (len != IBVB_REGION_SIZE || (size_t)(a - slab) % IBVB_REGION_SIZE) {
			fprintf(stderr, "sim_replay: the producer unmaps %zu bytes at region offset %zu\n", len,
				(size_t)(a - slab));
			abort();
		}
		slab_free[slab_nfree++] = (uint32_t)((size_t)(a - slab) / IBVB_REGION_SIZE);
		return 0;
	}
	return munmap(addr, len);
}

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the replay stream is little-endian");

struct rec {
	uint8_t kind, a;
	uint16_t b;
	uint32_t c;
	uint64_t x, y, z;
};
_Static_assert(sizeof(struct rec) == 32, "replay records are 32 bytes");

enum { R_PUBLISHED, R_DROPPED, R_PENDING, R_FULL };
static const char *const result_name[] = {"published", "dropped", "pending", "full"};

static struct ibvb_producer *prod;
static struct ibvb_region *regions[IBVB_MAX_CONSUMERS_LIMIT]; /* by row: the region we store into */
static uint64_t seed, nsteps, nscen, ncut; /* ncut: scenarios cut short at a start the stream cannot follow */
static uint32_t step; /* the step being played in this scenario */
static int pending;   /* a block publish waits */
static int have_scen;
static int skipping; /* the rest of this scenario is cut (start_as_model) */

static _Noreturn void differ(const char *what, const char *got, const char *want)
{
	printf("seed %llu step %u: %s: got %s, want %s\n", (unsigned long long)seed, step, what, got, want);
	fflush(stdout);
	exit(1);
}

static void check_u64(const char *what, uint64_t got, uint64_t want)
{
	if (got == want)
		return;
	char g[32], w[32];
	snprintf(g, sizeof g, "%llu", (unsigned long long)got);
	snprintf(w, sizeof w, "%llu", (unsigned long long)want);
	differ(what, g, w);
}

static _Noreturn void bad_stream(const char *why)
{
	printf("seed %llu step %u: bad replay stream: %s\n", (unsigned long long)seed, step, why);
	exit(2);
}

/* ---- the producer ------------------------------------------------------------------------------- */

static void close_producer(void)
{
	if (!prod)
		return;
	ibvb_producer_close(prod); /* no directory, socket or thread to undo: destroy skips them */
	prod = NULL;
	memset(regions, 0, sizeof regions);
	pending = 0;
}

/* ibvb_producer_create's steps but the ring directory and lock, the socket and the service thread. */
static void new_producer_for(const struct rec *r)
{
	close_producer();
	struct ibvb_producer_opts o = {.dir = "/nonexistent/sim-replay", .slot_count = (uint32_t)r->c, .slot_size = 64,
				       .max_items = 1, .meta_size = 4096, .hugepages = IBVB_HUGEPAGES_OFF,
				       .max_consumers = r->b, .max_observers = 16,
				       .policy = r->a == 1 ? IBVB_POLICY_BLOCK : IBVB_POLICY_DROP};
	if (r->x != 0)
		bad_stream("the C producer starts at position 0 (write the stream with simlog -nowrap)");
	struct ibvb_producer_opts ok;
	struct geometry g;
	int rc = check_opts("sim", &o, &ok);
	struct ibvb_producer *p = rc < 0 ? NULL : new_producer("sim", &ok);
	if (rc == 0 && !p)
		rc = -ENOMEM;
	if (rc == 0 && ((rc = copy_grants(p, &ok)) < 0 || (rc = make_memory(p, &ok, &g)) < 0 ||
			(rc = write_header(p, &ok, &g)) < 0)) {
		destroy(p, 0);
		p = NULL;
	}
	if (!p) {
		printf("seed %llu: create the producer: %s\n", (unsigned long long)seed, ibvb_last_error());
		exit(2);
	}
	prod = p;
}

/* ---- records ------------------------------------------------------------------------------------ */

/* The region of row i while the producer still has it attached (it unmaps it at the detach). */
static struct ibvb_region *region_of(uint32_t i)
{
	if (i >= IBVB_MAX_CONSUMERS_LIMIT || !regions[i])
		return NULL;
	const struct pmember *m = &prod->st->m[i];
	if (!m->on || m->region != regions[i]) {
		regions[i] = NULL;
		return NULL;
	}
	return regions[i];
}

/* An independent consumer's start = 0 (spec §7.1) is the producer's choice: "a position from oldest on whose
 * slot is still held". The lockstep run lets the model follow the producer's choice (Model.Rebase); a
 * stream cannot (replay.go, 'A'): a start older than the model's is followed by the consumer releasing up to
 * the model's start at once, as any consumer may; a newer one ends the scenario here (cut, counted). 1 if
 * the scenario goes on. */
static int start_as_model(struct ibvb_region *g, uint64_t tail, const struct rec *r)
{
	uint64_t y = r->y, head = atomic_load(&prod->ctl->head);
	int indep = r->c == 0 && r->x == IBVB_START_OLDEST;
	if (indep && (int64_t)(y - tail) > 0 && (int64_t)(head - y) >= 0) {
		atomic_store_explicit(&g->tail, y, memory_order_release);
		return 1;
	}
	if (indep && (int64_t)(tail - y) > 0) {
		ncut++;
		skipping = 1;
		return 0;
	}
	check_u64("attach tail", tail, y);
	return 1;
}

static void attach(const struct rec *r)
{
	if (r->a) { /* an observer takes no row: nothing to replay */
		check_u64("observer status", 0, r->z & 0xffff);
		return;
	}
	struct ibvb__pstate *st = prod->st;
	if (r->c == 0 && r->x == IBVB_START_OLDEST) {
		int any = 0;
		for (uint32_t i = 0; i < IBVB_MAX_CONSUMERS_LIMIT && !any; i++)
			any = region_of(i) != NULL;
		if (any) { /* the model reclaims what everyone attached released at once; a producer may later */
			pthread_mutex_lock(&st->mu);
			reclaim_locked(prod);
			pthread_mutex_unlock(&st->mu);
		}
	}
	struct ibvb_region *g = region_new();
	if (!g) {
		printf("seed %llu step %u: map a consumer region: %s\n", (unsigned long long)seed, step, strerror(errno));
		exit(2);
	}
	static struct ucred cr;
	if (!cr.pid)
		cr = (struct ucred){.pid = getpid(), .uid = geteuid(), .gid = getegid()};
	uint32_t status = IBVB_STATUS_OK, gen = 0;
	char msg[IBVB_ERROR_RECORD_MAX - 16];
	int row = admit(prod, &cr, (uint32_t)r->x, r->c, r->b, g, &status, msg, sizeof msg, &gen);
	uint32_t want_status = (uint32_t)(r->z & 0xffff), want_row = (uint32_t)(r->z >> 16 & 0xffff),
		 want_gen = (uint32_t)(r->z >> 32);
	check_u64("attach status", status, want_status);
	if (row < 0) {
		replay_munmap(g, IBVB_REGION_SIZE);
		check_u64("attach row", 0xffff, want_row);
		return;
	}
	check_u64("attach row", (uint64_t)row, want_row);
	check_u64("attach generation", atomic_load(&prod->rows[row].generation), want_gen);
	check_u64("attach generation (welcome)", gen, want_gen);
	uint64_t tail = atomic_load(&g->tail);
	if (tail != r->y && !start_as_model(g, tail, r))
		return;
	pthread_mutex_lock(&st->mu); /* the rest of welcome_consumer, its welcome sent */
	atomic_fetch_add(&st->attach_seq, 1);
	pthread_mutex_unlock(&st->mu);
	regions[row] = g;
}

static void hang_up(const struct rec *r)
{
	struct ibvb__pstate *st = prod->st;
	pthread_mutex_lock(&st->mu);
	if (region_of(r->c))
		gone_locked(prod, r->c); /* members_gone_locked on EOF */
	pthread_mutex_unlock(&st->mu);
	if (r->c < IBVB_MAX_CONSUMERS_LIMIT)
		regions[r->c] = NULL;
}

/* wait_for's loop for a waiting block publish, as it spins with nothing else changing: passes of
 * check_locked until one finds a slot or one changes nothing (a pass may detach a consumer, the next free
 * what it held). 1 if a slot can be taken now. */
static int wait_passes(void)
{
	struct ibvb__pstate *st = prod->st;
	int ok = 0;
	atomic_store_explicit(&prod->hot_busy, 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_seq_cst);
	pthread_mutex_lock(&st->mu);
	for (;;) {
		uint64_t gen = st->set_gen, fw = prod->free_w, te = prod->take_end, sc = st->scan, rc = st->reclaim;
		ok = check_locked(prod, WAIT_SLOT) > 0;
		if (ok || (gen == st->set_gen && fw == prod->free_w && te == prod->take_end && sc == st->scan &&
			   rc == st->reclaim))
			break;
	}
	pthread_mutex_unlock(&st->mu);
	atomic_store_explicit(&prod->hot_busy, 0, memory_order_release);
	return ok;
}

/* The heap's publish once acquire has a slot (as sim_driver publishes it). */
static int take_and_publish(void)
{
	struct ibvb_slot s;
	int rc = ibvb_producer_acquire(prod, &s);
	if (rc == -EAGAIN) {
		ibvb_producer_add(prod, IBVB_CTR_DROPPED_HEAPS, 1); /* the caller counts what it drops */
		return R_DROPPED;
	}
	if (rc < 0)
		return R_FULL;
	struct ibvb_publish_info h = {.heap_cnt = 1, .flags = IBVB_FLAG_COMPLETE, .packets = 1};
	return ibvb_producer_publish(prod, &s, &h) == 0 ? R_PUBLISHED : R_FULL;
}

static int publish(int eos)
{
	if (eos)
		return ibvb_producer_end_of_stream(prod, 0, 0) == 0 ? R_PUBLISHED : R_FULL; /* never waits */
	if (prod->policy == IBVB_POLICY_BLOCK && !prod->ended &&
	    (prod->free_r == prod->free_w || prod->free_r == prod->take_end)) {
		/* acquire would refill: its first half (commit, reclaim), and where it would wait, pending */
		struct ibvb__pstate *st = prod->st;
		ibvb_producer_commit(prod);
		pthread_mutex_lock(&st->mu);
		reclaim_locked(prod);
		int ready = slot_ready(prod);
		pthread_mutex_unlock(&st->mu);
		if (!ready && !wait_passes()) /* refill calls wait_for */
			return R_PENDING;
	}
	return take_and_publish();
}

/* A settle: a waiting publish tried again (wait_for's loop, whose reclaim reads every cursor at the
 * committed head), then every consumer's cursor read as the heartbeat reads them — after the retry's
 * publish, at the new head, as the model reads them again. */
static void settle(const struct rec *r)
{
	struct ibvb__pstate *st = prod->st;
	if (pending && wait_passes()) {
		int res = take_and_publish();
		if (res != R_PUBLISHED)
			differ("waiting publish", result_name[res], "published");
		pending = 0;
	}
	pthread_mutex_lock(&st->mu);
	read_cursors_locked(prod, 0);
	pthread_mutex_unlock(&st->mu);
	if (pending != r->a)
		differ("publish pending after settle", pending ? "yes" : "no", r->a ? "yes" : "no");
}

/* A 'W' record: a release store into the row's region at its field's offset (spec §7.4, §14.2). */
static void store(const struct rec *r)
{
	static const uint32_t off[] = {IBVB_L_REGION_TAIL, IBVB_L_REGION_READ, IBVB_L_REGION_HANDED,
				       IBVB_L_REGION_WAKE_AT, IBVB_L_REGION_CONSUMER_WAITING};
	if (r->a >= sizeof off / sizeof off[0])
		bad_stream("store of an unknown field");
	struct ibvb_region *g = region_of(r->c);
	if (!g)
		return;
	uint8_t *w = (uint8_t *)g + off[r->a];
	if (off[r->a] == IBVB_L_REGION_CONSUMER_WAITING)
		atomic_store_explicit((_Atomic uint32_t *)w, (uint32_t)r->x, memory_order_release);
	else
		atomic_store_explicit((_Atomic uint64_t *)w, r->x, memory_order_release);
}

/* What a control-memory offset names, for the difference's line. */
static void word_name(uint32_t off, char *buf, size_t cap)
{
	static const char *const rowf[] = {[0x00 / 4] = "state", [0x04 / 4] = "generation", [0x20 / 4] = "released",
					   [0x28 / 4] = "wakes", [0x30 / 4] = "lost_heaps", [0x38 / 4] = "assigned",
					   [0x40 / 4] = "group_id", [0x48 / 4] = "read", [0x50 / 4] = "queued"};
	static const char *const stats[] = {[4] = "dropped_heaps", [9] = "end_of_stream", [11] = "consumer_overruns",
					    [12] = "consumer_errors", [17] = "group_lost", [18] = "group_skipped"};
	if (off == IBVB_OFF_HEAD)
		snprintf(buf, cap, "head");
	else if (off >= IBVB_OFF_STATS && off < IBVB_OFF_STATS + 8 * IBVB_STATS_SLOTS && (off - IBVB_OFF_STATS) % 8 == 0 &&
		 stats[(off - IBVB_OFF_STATS) / 8])
		snprintf(buf, cap, "%s", stats[(off - IBVB_OFF_STATS) / 8]);
	else if (off >= IBVB_OFF_CONSUMER_TABLE) {
		uint32_t row = (off - IBVB_OFF_CONSUMER_TABLE) / IBVB_ROW_SIZE, f = (off - IBVB_OFF_CONSUMER_TABLE) % IBVB_ROW_SIZE;
		const char *n = f % 4 == 0 && f / 4 < sizeof rowf / sizeof rowf[0] ? rowf[f / 4] : NULL;
		if (n)
			snprintf(buf, cap, "row %u %s", row, n);
		else
			snprintf(buf, cap, "row %u word 0x%x", row, f);
	} else
		snprintf(buf, cap, "control word 0x%x", off);
}

static void check_word(const struct rec *r)
{
	if ((r->a != 4 && r->a != 8) || r->c % r->a || r->c + r->a > prod->st->ctl_size)
		bad_stream("a control word outside the control memory");
	const uint8_t *w = (const uint8_t *)prod->ctl + r->c;
	uint64_t v = r->a == 8 ? atomic_load_explicit((const _Atomic uint64_t *)w, memory_order_relaxed)
			       : atomic_load_explicit((const _Atomic uint32_t *)w, memory_order_relaxed);
	if (v != r->x) {
		char what[64];
		word_name(r->c, what, sizeof what);
		check_u64(what, v, r->x);
	}
}

static void check_mask(const struct rec *r)
{
	uint64_t v = atomic_load_explicit((const _Atomic uint64_t *)&prod->desc[r->x & prod->mask].assign,
					  memory_order_relaxed);
	if (v != r->y) {
		char what[64];
		snprintf(what, sizeof what, "assign word of position %llu", (unsigned long long)r->x);
		check_u64(what, v, r->y);
	}
}

static void check_free(const struct rec *r)
{
	struct ibvb__pstate *st = prod->st;
	pthread_mutex_lock(&st->mu);
	reclaim_locked(prod);
	uint64_t n = prod->free_w - prod->free_r;
	pthread_mutex_unlock(&st->mu);
	check_u64("free slots", n, r->x);
}

/* 1 at the stream's end. */
static int play(const struct rec *r)
{
	if (r->kind != 'N' && r->kind != 'Z' && !have_scen)
		bad_stream("a record before the first scenario");
	if (skipping && r->kind != 'N' && r->kind != 'Z')
		return 0;
	switch (r->kind) {
	case 'N':
		seed = r->y;
		step = 0;
		skipping = 0;
		have_scen = 1;
		nscen++;
		new_producer_for(r);
		break;
	case 'A':
		attach(r);
		break;
	case 'C':
		hang_up(r);
		break;
	case 'P': {
		if (pending)
			bad_stream("a publish while one is pending");
		if (r->b > R_FULL)
			bad_stream("publish: unknown result");
		int res = publish(r->a);
		if (res != r->b)
			differ(r->a ? "publish end-of-stream" : "publish", result_name[res], result_name[r->b]);
		pending = res == R_PENDING;
		break;
	}
	case 'S':
		settle(r);
		break;
	case 'W':
		store(r);
		break;
	case 'O':
		check_word(r);
		break;
	case 'M':
		check_mask(r);
		break;
	case 'F':
		if (pending)
			bad_stream("free slots counted while a publish is pending");
		check_free(r);
		break;
	case 'E':
		check_u64("step number", r->c, step);
		step++;
		nsteps++;
		break;
	case 'Z':
		close_producer();
		printf("ok %llu %llu %llu\n", (unsigned long long)nsteps, (unsigned long long)nscen, (unsigned long long)ncut);
		return 1;
	default: {
		char k[8];
		snprintf(k, sizeof k, "%u", r->kind);
		bad_stream(k);
	}
	}
	return 0;
}

int main(void)
{
	enum { N = 1 << 16 };
	static struct rec buf[N];
	for (;;) {
		size_t n = fread(buf, sizeof buf[0], N, stdin);
		for (size_t i = 0; i < n; i++)
			if (play(&buf[i]))
				return 0;
		if (n < N) {
			if (ferror(stdin))
				bad_stream("read error");
			bad_stream("the stream ends without its end record (Z)");
		}
	}
}
