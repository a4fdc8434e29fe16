/* ibvbridge.c — attach/detach, waiting, liveness and metadata for the ibvbridge C consumer.
 * Implements docs/ring-layout.md §6, §7.2, §7.4, §7.6 (consumer side). Only libc. */
#define _GNU_SOURCE
#include "ibvbridge.h"

#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <linux/futex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the ring layout is little-endian; big-endian hosts are not supported"
#endif

#define WAIT_SLICE_NS 250000000LL /* spec §7.4: futex sleeps are at most 250 ms */
#define SPIN_NS 30000LL           /* spin ~30 µs before sleeping */
#define ACTIVE_NAPS 8             /* a stream whose head moved within this many naps is active */
#define RETRY_NS 10000000LL       /* attach: poll every 10 ms */

static _Thread_local char errbuf[512];

const char *ibvb_last_error(void) { return errbuf; }

__attribute__((format(printf, 2, 3))) static int fail(int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(errbuf, sizeof errbuf, fmt, ap);
	va_end(ap);
	return err;
}

static int64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static uint64_t realtime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(int64_t ns)
{
	struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
	nanosleep(&ts, NULL);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#endif
}

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
	/* Shared futex (no FUTEX_PRIVATE_FLAG): the word lives in a mapping shared between processes. */
	return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

/* ---- names and paths ------------------------------------------------------------------------- */

static int valid_name(const char *name)
{
	size_t n = strlen(name);
	if (n < 1 || n > IBVB_NAME_MAX || name[0] == '.')
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
		      c == '.' || c == '-'))
			return 0;
	}
	return 1;
}

static int ctl_paths(const char *arg, char *ctl, char *cons, size_t cap)
{
	if (strchr(arg, '/')) {
		size_t n = strlen(arg);
		if (n < 5 || strcmp(arg + n - 4, ".ctl") != 0)
			return fail(-EINVAL, "control file path %s must end in .ctl", arg);
		if (n + 2 > cap)
			return fail(-ENAMETOOLONG, "control file path %s is too long", arg);
		memcpy(ctl, arg, n + 1);
		memcpy(cons, arg, n - 4);
		memcpy(cons + n - 4, ".cons", 6);
		return 0;
	}
	if (!valid_name(arg))
		return fail(-EINVAL, "ring name \"%s\": use 1-64 characters from [A-Za-z0-9_.-], not starting with '.'",
			    arg);
	snprintf(ctl, cap, "%s/ibvbridge.%s.v%d.ctl", IBVB_DEFAULT_DIR, arg, IBVB_MAJOR);
	snprintf(cons, cap, "%s/ibvbridge.%s.v%d.cons", IBVB_DEFAULT_DIR, arg, IBVB_MAJOR);
	return 0;
}

/* ---- geometry validation (spec §7.2 step 4) ----------------------------------------------------- */

struct region {
	const char *name;
	uint64_t off, size;
};

static int validate_geometry(const char *ring, const struct ibvb_ctl *c)
{
	uint64_t sc = c->slot_count, ss = c->slot_size, fsz = c->data_file_size;
	uint32_t mi = c->max_items, ps = c->page_size;
	if (sc == 0 || sc > IBVB_MAX_SLOT_COUNT || (sc & (sc - 1)) != 0)
		return fail(-EBADMSG, "ring %s corrupt: slot_count %llu is not a power of two in 1..%u", ring,
			    (unsigned long long)sc, IBVB_MAX_SLOT_COUNT);
	if (ss == 0 || ss % 64 != 0)
		return fail(-EBADMSG, "ring %s corrupt: slot_size %llu is not a non-zero multiple of 64", ring,
			    (unsigned long long)ss);
	if (mi == 0 || mi > IBVB_MAX_ITEMS)
		return fail(-EBADMSG, "ring %s corrupt: max_items %u not in 1..%u", ring, mi, IBVB_MAX_ITEMS);
	if (c->desc_size != IBVB_DESC_SIZE)
		return fail(-EBADMSG, "ring %s corrupt: desc_size %u, want %d", ring, c->desc_size, IBVB_DESC_SIZE);
	if (c->item_size != IBVB_ITEM_SIZE)
		return fail(-EBADMSG, "ring %s corrupt: item_size %u, want %d", ring, c->item_size, IBVB_ITEM_SIZE);
	if (ps < 4096 || (ps & (ps - 1)) != 0)
		return fail(-EBADMSG, "ring %s corrupt: page_size %u is not a power of two >= 4096", ring, ps);
	if (fsz == 0 || fsz % ps != 0)
		return fail(-EBADMSG, "ring %s corrupt: data_file_size %llu is not a non-zero multiple of page_size %u",
			    ring, (unsigned long long)fsz, ps);
	if (fsz > (uint64_t)SIZE_MAX / 2)
		return fail(-EBADMSG, "ring %s corrupt: data_file_size %llu too large", ring, (unsigned long long)fsz);
	if (c->meta_size < IBVB_META_HEADER_SIZE)
		return fail(-EBADMSG, "ring %s corrupt: meta_size %llu < %d", ring, (unsigned long long)c->meta_size,
			    IBVB_META_HEADER_SIZE);
	uint64_t desc_bytes, item_bytes, payload_bytes;
	if (__builtin_mul_overflow(sc, (uint64_t)IBVB_DESC_SIZE, &desc_bytes) ||
	    __builtin_mul_overflow(sc, (uint64_t)mi * IBVB_ITEM_SIZE, &item_bytes) ||
	    __builtin_mul_overflow(sc, ss, &payload_bytes))
		return fail(-EBADMSG, "ring %s corrupt: region sizes overflow", ring);
	struct region rg[5] = {
	    {"descriptors", c->desc_offset, desc_bytes},   {"item tables", c->items_offset, item_bytes},
	    {"metadata", c->meta_offset, c->meta_size},     {"payload", c->payload_offset, payload_bytes},
	    {"packet area", c->packet_offset, c->packet_size},
	};
	for (int i = 0; i < 5; i++) {
		uint64_t end;
		if (rg[i].off % IBVB_REGION_ALIGN != 0)
			return fail(-EBADMSG, "ring %s corrupt: %s offset %llu is not %d-aligned", ring, rg[i].name,
				    (unsigned long long)rg[i].off, IBVB_REGION_ALIGN);
		if (__builtin_add_overflow(rg[i].off, rg[i].size, &end) || end > fsz)
			return fail(-EBADMSG, "ring %s corrupt: %s [%llu, +%llu) runs past data_file_size %llu", ring,
				    rg[i].name, (unsigned long long)rg[i].off, (unsigned long long)rg[i].size,
				    (unsigned long long)fsz);
		for (int j = 0; j < i; j++) {
			if (rg[i].size && rg[j].size && rg[i].off < rg[j].off + rg[j].size && rg[j].off < end)
				return fail(-EBADMSG, "ring %s corrupt: %s overlaps %s", ring, rg[i].name, rg[j].name);
		}
	}
	const char *p = c->data_path;
	const char *nul = memchr(p, 0, IBVB_DATA_PATH_MAX);
	if (!nul)
		return fail(-EBADMSG, "ring %s corrupt: data_path is not NUL-terminated", ring);
	if (p[0] != '/')
		return fail(-EBADMSG, "ring %s corrupt: data_path \"%s\" is not absolute", ring, p);
	return 0;
}

/* ---- attach / detach ----------------------------------------------------------------------------- */

enum { OPEN_OK = 0, OPEN_NOT_FOUND = 1, OPEN_NOT_READY = 2 };

/* Open and check the control file (§7.2 steps 1-4). Returns OPEN_* or -errno. */
static int open_ctl(const char *ring, const char *path, int *fdp, struct ibvb_ctl **mapp)
{
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return OPEN_NOT_FOUND;
		return fail(-errno, "ring %s: open %s: %s", ring, path, strerror(errno));
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		return fail(-e, "ring %s: fstat %s: %s", ring, path, strerror(e));
	}
	if (!S_ISREG(st.st_mode) || st.st_size < IBVB_CTL_SIZE) {
		close(fd);
		return fail(-EBADMSG, "ring %s corrupt: control file %s is %lld bytes, want %d", ring, path,
			    (long long)st.st_size, IBVB_CTL_SIZE);
	}
	void *m = mmap(NULL, IBVB_CTL_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		int e = errno;
		close(fd);
		return fail(-e, "ring %s: mmap %s: %s", ring, path, strerror(e));
	}
	struct ibvb_ctl *c = m;
	int rc = OPEN_OK;
	uint64_t magic = atomic_load_explicit(&c->magic, memory_order_acquire);
	if (magic == 0) {
		rc = OPEN_NOT_READY;
	} else if (magic != IBVB_MAGIC) {
		rc = fail(-EBADMSG, "ring %s corrupt: bad magic %#llx in %s", ring, (unsigned long long)magic, path);
	} else if (c->major != IBVB_MAJOR) {
		rc = fail(-EPROTONOSUPPORT, "ring %s: ring layout major %u, this client supports %d", ring,
			  c->major, IBVB_MAJOR);
	} else {
		uint32_t state = atomic_load_explicit(&c->state, memory_order_acquire);
		if (state == IBVB_STATE_INIT)
			rc = OPEN_NOT_READY;
		else if (state != IBVB_STATE_READY && state != IBVB_STATE_CLOSED)
			rc = fail(-EBADMSG, "ring %s corrupt: state %u", ring, state);
		else if (c->ctl_size != IBVB_CTL_SIZE)
			rc = fail(-EBADMSG, "ring %s corrupt: ctl_size %u, want %d", ring, c->ctl_size, IBVB_CTL_SIZE);
		else
			rc = validate_geometry(ring, c);
	}
	if (rc != OPEN_OK) {
		munmap(m, IBVB_CTL_SIZE);
		close(fd);
		return rc;
	}
	*fdp = fd;
	*mapp = c;
	return OPEN_OK;
}

static int lock_consumer(const char *ring, const char *cons, const struct ibvb_ctl *c)
{
	/* flock needs no write access. Open without O_CREAT first: with fs.protected_regular an O_CREAT open
	 * of another user's file in sticky /dev/shm fails even when the file exists. */
	int fd = open(cons, O_RDONLY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT)
		fd = open(cons, O_RDONLY | O_CREAT | O_CLOEXEC, 0666);
	if (fd < 0)
		return fail(-errno, "ring %s: consumer lock %s: %s", ring, cons, strerror(errno));
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		int e = errno;
		close(fd);
		if (e == EWOULDBLOCK)
			return fail(-EBUSY, "ring %s busy: another consumer (pid %llu) is attached", ring,
				    (unsigned long long)atomic_load_explicit(&((struct ibvb_ctl *)c)->consumer_pid,
									     memory_order_relaxed));
		return fail(-e, "ring %s: flock %s: %s", ring, cons, strerror(e));
	}
	return fd;
}

int ibvb_attach(struct ibvb_ring **out, const char *arg, int timeout_ms)
{
	char ctlp[IBVB_DATA_PATH_MAX + 16], consp[IBVB_DATA_PATH_MAX + 16];
	int ctl_fd = -1, cons_fd = -1, data_fd = -1, rc;
	struct ibvb_ctl *c = NULL;
	const void *data = MAP_FAILED;

	errbuf[0] = 0;
	if (!out || !arg)
		return fail(-EINVAL, "ibvb_attach: NULL argument");
	*out = NULL;
	if ((rc = ctl_paths(arg, ctlp, consp, sizeof ctlp)) < 0)
		return rc;
	int64_t deadline = timeout_ms < 0 ? INT64_MAX : mono_ns() + (int64_t)timeout_ms * 1000000LL;
	for (;;) {
		rc = open_ctl(arg, ctlp, &ctl_fd, &c);
		if (rc < 0)
			return rc;
		if (rc == OPEN_OK)
			break;
		int64_t now = mono_ns();
		if (now >= deadline) {
			if (rc == OPEN_NOT_FOUND)
				return fail(-ENOENT, "ring %s not found (%s)", arg, ctlp);
			return fail(-ETIMEDOUT, "ring %s not ready: still initialising after %d ms", arg, timeout_ms);
		}
		sleep_ns(deadline - now < RETRY_NS ? deadline - now : RETRY_NS);
	}

	if ((cons_fd = lock_consumer(arg, consp, c)) < 0) {
		rc = cons_fd;
		goto err;
	}
	uint64_t fsz = c->data_file_size;
	data_fd = open(c->data_path, O_RDONLY | O_CLOEXEC);
	if (data_fd < 0) {
		rc = fail(-errno, "ring %s: data file %s: %s", arg, c->data_path, strerror(errno));
		goto err;
	}
	struct stat st;
	if (fstat(data_fd, &st) < 0) {
		rc = fail(-errno, "ring %s: fstat %s: %s", arg, c->data_path, strerror(errno));
		goto err;
	}
	if ((uint64_t)st.st_size != fsz) {
		rc = fail(-EBADMSG, "ring %s corrupt: data file %s is %lld bytes, data_file_size says %llu", arg,
			  c->data_path, (long long)st.st_size, (unsigned long long)fsz);
		goto err;
	}
	data = mmap(NULL, (size_t)fsz, PROT_READ, MAP_SHARED, data_fd, 0);
	if (data == MAP_FAILED) {
		rc = fail(-errno, "ring %s: mmap %s: %s", arg, c->data_path, strerror(errno));
		goto err;
	}
	struct ibvb_ring *r = calloc(1, sizeof *r);
	if (!r) {
		rc = fail(-ENOMEM, "ring %s: out of memory", arg);
		goto err;
	}
	r->ctl = c;
	r->data = data;
	r->desc = (const struct ibvb_desc *)((const uint8_t *)data + c->desc_offset);
	r->items = (const struct ibvb_item *)((const uint8_t *)data + c->items_offset);
	r->payload = (const uint8_t *)data + c->payload_offset;
	r->slot_count = c->slot_count;
	r->mask = c->slot_count - 1;
	r->slot_size = c->slot_size;
	r->max_items = c->max_items;
	r->data_size = fsz;
	r->session_id = c->session_id;
	r->max_latency_ns = IBVB_DEFAULT_MAX_LATENCY_NS;
	r->ctl_fd = ctl_fd;
	r->data_fd = data_fd;
	r->cons_fd = cons_fd;
	snprintf(r->ctl_path, sizeof r->ctl_path, "%s", ctlp);
	atomic_store_explicit(&c->consumer_pid, (uint64_t)getpid(), memory_order_relaxed);
	atomic_store_explicit(&c->consumer_attach_ns, realtime_ns(), memory_order_relaxed);
	r->read = r->released = r->stored = r->cached_head = atomic_load_explicit(&c->tail, memory_order_acquire);
	r->release_batch = r->slot_count / 8 < 1 ? 1 : (r->slot_count / 8 > 64 ? 64 : r->slot_count / 8);
	*out = r;
	return 0;
err:
	if (data != MAP_FAILED)
		munmap((void *)data, (size_t)fsz);
	if (data_fd >= 0)
		close(data_fd);
	if (cons_fd >= 0)
		close(cons_fd);
	munmap(c, IBVB_CTL_SIZE);
	close(ctl_fd);
	return rc;
}

void ibvb_detach(struct ibvb_ring *r)
{
	if (!r)
		return;
	ibvb_flush_release(r);
	atomic_store_explicit(&r->ctl->consumer_waiting, 0, memory_order_relaxed);
	atomic_store_explicit(&r->ctl->consumer_pid, 0, memory_order_release);
	munmap((void *)r->data, (size_t)r->data_size);
	munmap(r->ctl, IBVB_CTL_SIZE);
	close(r->data_fd);
	close(r->ctl_fd);
	close(r->cons_fd); /* drops the consumer lock */
	free(r);
}

/* ---- waiting and liveness ------------------------------------------------------------------------ */

int ibvb_producer_alive(const struct ibvb_ring *r)
{
	/* Spec §7.6: the producer holds LOCK_EX on the control file's inode for its lifetime. */
	if (flock(r->ctl_fd, LOCK_SH | LOCK_NB) == 0) {
		flock(r->ctl_fd, LOCK_UN);
		return 0;
	}
	if (errno == EWOULDBLOCK)
		return 1;
	return -errno;
}

void ibvb__wake_producer(struct ibvb_ring *r)
{
	if (atomic_exchange_explicit(&r->ctl->producer_waiting, 0, memory_order_seq_cst) == 1) {
		atomic_fetch_add_explicit(&r->ctl->producer_futex, 1, memory_order_seq_cst);
		futex(&r->ctl->producer_futex, FUTEX_WAKE, INT_MAX, NULL);
	}
}

int ibvb__corrupt_desc(struct ibvb_ring *r, uint64_t pos, const char *what, uint64_t v1, uint64_t v2)
{
	(void)r;
	return fail(-EBADMSG, "ring corrupt: descriptor at position %llu: bad %s (%llu vs %llu)",
		    (unsigned long long)pos, what, (unsigned long long)v1, (unsigned long long)v2);
}

/* The producer is gone: deliver what it published, then report. */
static int after_producer_gone(struct ibvb_ring *r, struct ibvb_heap *h)
{
	int rc = ibvb_peek(r, h);
	if (rc != -EAGAIN)
		return rc;
	return fail(-EPIPE, "ring producer gone (pid %llu) without closing the ring",
		    (unsigned long long)r->ctl->producer_pid);
}

void ibvb_set_max_latency(struct ibvb_ring *r, int64_t ns) { r->max_latency_ns = ns > 0 ? ns : 0; }

int ibvb_wait(struct ibvb_ring *r, struct ibvb_heap *h, int timeout_ms)
{
	int rc = ibvb_peek(r, h);
	if (rc != -EAGAIN)
		return rc;
	int64_t start = mono_ns();
	int64_t deadline = timeout_ms < 0 ? INT64_MAX : start + (int64_t)timeout_ms * 1000000LL;
	struct ibvb_ctl *c = r->ctl;

	for (;;) {
		/* A stream that is moving: nap instead of spinning or asking for a wake (ibvb_set_max_latency). */
		if (r->max_latency_ns > 0) {
			int64_t now = mono_ns();
			uint64_t head = atomic_load_explicit(&c->head, memory_order_acquire);
			if (head != r->active_head) {
				r->active_head = head;
				r->active_ns = now;
			}
			if (now - r->active_ns < ACTIVE_NAPS * r->max_latency_ns && now < deadline) {
				int64_t nap = r->max_latency_ns < deadline - now ? r->max_latency_ns : deadline - now;
				struct timespec ts = {nap / 1000000000LL, nap % 1000000000LL};
				if (nanosleep(&ts, NULL) < 0 && errno == EINTR) {
					if ((rc = ibvb_peek(r, h)) != -EAGAIN)
						return rc;
					return fail(-EINTR, "wait interrupted by a signal");
				}
				if ((rc = ibvb_peek(r, h)) != -EAGAIN)
					return rc;
				continue;
			}
		}
		/* Spin briefly: a cross-core futex wake costs tens of µs. */
		int64_t spin_end = mono_ns() + SPIN_NS;
		for (;;) {
			for (int i = 0; i < 64; i++) {
				cpu_relax();
				if ((rc = ibvb_peek(r, h)) != -EAGAIN)
					return rc;
			}
			if (mono_ns() >= spin_end)
				break;
		}
		/* §7.4 step 1: announce, full fence, re-check. */
		uint32_t f = atomic_load_explicit(&c->consumer_futex, memory_order_acquire);
		atomic_store_explicit(&c->consumer_waiting, 1, memory_order_relaxed);
		atomic_thread_fence(memory_order_seq_cst);
		rc = ibvb_peek(r, h); /* re-reads head (acquire); step 2: CLOSED and drained → -ENODATA */
		if (rc != -EAGAIN) {
			atomic_store_explicit(&c->consumer_waiting, 0, memory_order_relaxed);
			return rc;
		}
		int64_t now = mono_ns();
		if (now >= deadline) {
			atomic_store_explicit(&c->consumer_waiting, 0, memory_order_relaxed);
			if (ibvb_producer_alive(r) == 0)
				return after_producer_gone(r, h);
			return fail(-ETIMEDOUT, "no heap within %d ms", timeout_ms);
		}
		int64_t slice = deadline - now < WAIT_SLICE_NS ? deadline - now : WAIT_SLICE_NS;
		struct timespec ts = {slice / 1000000000LL, slice % 1000000000LL};
		long w = futex(&c->consumer_futex, FUTEX_WAIT, f, &ts);
		int e = w < 0 ? errno : 0;
		if (e == EINTR) {
			atomic_store_explicit(&c->consumer_waiting, 0, memory_order_relaxed);
			if ((rc = ibvb_peek(r, h)) != -EAGAIN)
				return rc;
			return fail(-EINTR, "wait interrupted by a signal");
		}
		if (e == ETIMEDOUT && ibvb_producer_alive(r) == 0) {
			atomic_store_explicit(&c->consumer_waiting, 0, memory_order_relaxed);
			return after_producer_gone(r, h);
		}
		/* woken, EAGAIN (futex word already moved) or timeout with a live producer: go round */
	}
}

/* ---- stats and info ------------------------------------------------------------------------------ */

static const char *const counter_names[IBVB_CTR_COUNT] = {
    "packets",           "bytes",           "heaps",
    "incomplete_heaps",  "dropped_heaps",   "malformed_packets",
    "duplicate_packets", "truncated_heaps", "discarded_incomplete_heaps",
    "end_of_stream",
};

const char *ibvb_counter_name(unsigned idx) { return idx < IBVB_CTR_COUNT ? counter_names[idx] : NULL; }

uint64_t ibvb_counter(const struct ibvb_ring *r, unsigned idx)
{
	if (idx >= IBVB_STATS_SLOTS || idx >= r->ctl->stats_count)
		return 0;
	return atomic_load_explicit(&r->ctl->stats[idx], memory_order_relaxed);
}

int ibvb_stats(const struct ibvb_ring *r, struct ibvb_stats *s)
{
	uint64_t v[IBVB_CTR_COUNT];
	for (unsigned i = 0; i < IBVB_CTR_COUNT; i++)
		v[i] = ibvb_counter(r, i);
	s->packets = v[IBVB_CTR_PACKETS];
	s->bytes = v[IBVB_CTR_BYTES];
	s->heaps = v[IBVB_CTR_HEAPS];
	s->incomplete_heaps = v[IBVB_CTR_INCOMPLETE_HEAPS];
	s->dropped_heaps = v[IBVB_CTR_DROPPED_HEAPS];
	s->malformed_packets = v[IBVB_CTR_MALFORMED_PACKETS];
	s->duplicate_packets = v[IBVB_CTR_DUPLICATE_PACKETS];
	s->truncated_heaps = v[IBVB_CTR_TRUNCATED_HEAPS];
	s->discarded_incomplete_heaps = v[IBVB_CTR_DISCARDED_INCOMPLETE_HEAPS];
	s->end_of_stream = v[IBVB_CTR_END_OF_STREAM];
	return 0;
}

int ibvb_info(const struct ibvb_ring *r, struct ibvb_info *in)
{
	const struct ibvb_ctl *c = r->ctl;
	memset(in, 0, sizeof *in);
	in->major = c->major;
	in->minor = c->minor;
	in->state = atomic_load_explicit(&((struct ibvb_ctl *)c)->state, memory_order_acquire);
	in->policy = c->policy;
	in->session_id = c->session_id;
	in->producer_pid = c->producer_pid;
	in->producer_start_ns = c->producer_start_ns;
	in->slot_count = c->slot_count;
	in->slot_size = c->slot_size;
	in->max_items = c->max_items;
	in->page_size = c->page_size;
	in->data_file_size = c->data_file_size;
	in->meta_size = c->meta_size;
	in->packet_size = c->packet_size;
	in->features = c->features;
	in->stats_count = c->stats_count;
	in->head = atomic_load_explicit(&((struct ibvb_ctl *)c)->head, memory_order_acquire);
	in->tail = atomic_load_explicit(&((struct ibvb_ctl *)c)->tail, memory_order_acquire);
	in->heartbeat_ns = atomic_load_explicit(&((struct ibvb_ctl *)c)->heartbeat_ns, memory_order_relaxed);
	in->data_path = c->data_path;
	return 0;
}

/* ---- stream metadata (spec §6) ------------------------------------------------------------------- */

long ibvb_read_meta(const struct ibvb_ring *r, void *buf, size_t cap, size_t *need)
{
	const uint8_t *area = r->data + r->ctl->meta_offset;
	struct ibvb_meta_header *mh = (struct ibvb_meta_header *)area; /* read-only mapping: loads only */
	uint64_t max = r->ctl->meta_size - IBVB_META_HEADER_SIZE;
	if (need)
		*need = 0;
	for (int attempt = 0; attempt < 100000; attempt++) {
		uint64_t s1 = atomic_load_explicit(&mh->seq, memory_order_acquire);
		if (s1 == 0)
			return 0;
		if (s1 & 1) {
			if (attempt > 100)
				sched_yield();
			else
				cpu_relax();
			continue;
		}
		uint64_t len = *(volatile const uint64_t *)&mh->length;
		int too_long = len > max, too_small = !too_long && len > cap;
		if (!too_long && !too_small)
			memcpy(buf, area + IBVB_META_HEADER_SIZE, (size_t)len);
		atomic_thread_fence(memory_order_acquire);
		uint64_t s2 = atomic_load_explicit(&mh->seq, memory_order_relaxed);
		if (s1 != s2)
			continue;
		if (too_long)
			return fail(-EBADMSG, "ring corrupt: metadata length %llu > meta_size - 16 = %llu",
				    (unsigned long long)len, (unsigned long long)max);
		if (too_small) {
			if (need)
				*need = (size_t)len;
			return fail(-ENOBUFS, "metadata needs %llu bytes, buffer has %zu", (unsigned long long)len,
				    cap);
		}
		return (long)len;
	}
	return fail(-EAGAIN, "metadata kept changing while being read");
}

static uint32_t le32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return v;
}

static uint64_t le64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return v;
}

int ibvb_meta_next(const void *buf, size_t len, size_t *off, struct ibvb_meta_record *rec)
{
	const uint8_t *b = buf;
	size_t o = *off;
	if (o >= len)
		return 0;
	if (len - o < sizeof(struct ibvb_meta_record_header))
		return fail(-EBADMSG, "metadata corrupt: truncated record header at %zu", o);
	const uint8_t *p = b + o;
	uint32_t size = le32(p + 0), ndim = le32(p + 4);
	if (size < sizeof(struct ibvb_meta_record_header) || size % 8 != 0 || size > len - o)
		return fail(-EBADMSG, "metadata corrupt: record_size %u at %zu (length %zu)", size, o, len);
	uint64_t need = sizeof(struct ibvb_meta_record_header);
	uint64_t nshape = ndim == IBVB_META_NDIM_UNKNOWN ? 0 : ndim;
	need += nshape * 8;
	rec->name_len = le32(p + 0x10);
	rec->description_len = le32(p + 0x14);
	rec->format_len = le32(p + 0x18);
	rec->dtype_len = le32(p + 0x1C);
	need += (uint64_t)rec->name_len + rec->description_len + rec->format_len + rec->dtype_len;
	if (need > size)
		return fail(-EBADMSG, "metadata corrupt: record at %zu needs %llu bytes, record_size %u", o,
			    (unsigned long long)need, size);
	rec->id = le64(p + 8);
	rec->ndim = ndim;
	rec->shape = p + 0x20;
	const char *s = (const char *)(p + 0x20 + nshape * 8);
	rec->name = s;
	s += rec->name_len;
	rec->description = s;
	s += rec->description_len;
	rec->format = s;
	s += rec->format_len;
	rec->dtype = s;
	*off = o + size;
	return 1;
}

int64_t ibvb_meta_dim(const struct ibvb_meta_record *rec, uint32_t i)
{
	if (rec->ndim == IBVB_META_NDIM_UNKNOWN || i >= rec->ndim)
		return 0;
	return (int64_t)le64(rec->shape + (size_t)i * 8);
}
