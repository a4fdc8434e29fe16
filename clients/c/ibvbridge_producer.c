/* ibvbridge_producer.c — the producer side of docs/ring-layout.md 2.2, see ibvbridge_producer.h.
 * Only libc and pthreads. */
#define _GNU_SOURCE
#include "ibvbridge.h"
#include "ibvbridge_internal.h"

#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>


#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif
#ifndef MFD_HUGETLB
#define MFD_HUGETLB 0x0004U
#endif

#define SEALS_READ_ONLY (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL)
#define SEALS_REGION (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
#define WAIT_SLICE_NS 250000000LL /* spec §7.4: producer futex sleeps are at most 250 ms */
#define SPIN_NS 50000LL           /* spin this long before sleeping (a futex round trip costs ~35 µs) */
#define BEAT_NS 100000000LL       /* heartbeat and table refresh */
#define HELLO_TIMEOUT_NS 2000000000LL
#define MAX_PENDING 16  /* connections that have not said hello yet */
#define MAX_OBSERVERS IBVB_PRODUCER_MAX_OBSERVERS
#define NGROUPS_MAX_PEER 65536 /* the kernel's NGROUPS_MAX */

#ifdef IBVB_TEST_HOOKS
/* Test builds only (make EXTRA_CFLAGS=-DIBVB_TEST_HOOKS: the conformance suite, interop/conformance).
 * IBVBRIDGE_TEST_MUTANT lists guards to break, to prove the suite catches each: row-late (a detached
 * consumer's row is not written before its slots are reused), no-wake (interrupt does not wake a producer
 * asleep on a release futex), no-unmap (a detached consumer's region is left to the next commit or
 * heartbeat); IBVBRIDGE_TEST_WAIT_SLICE_MS replaces the 250 ms slice of a blocked producer. */
static int test_mutant(const char *name)
{
	const char *e = getenv("IBVBRIDGE_TEST_MUTANT");
	return e && strstr(e, name) != NULL;
}
static int64_t test_wait_slice_ns(void)
{
	const char *e = getenv("IBVBRIDGE_TEST_WAIT_SLICE_MS");
	return e && atoll(e) > 0 ? atoll(e) * 1000000LL : WAIT_SLICE_NS;
}
static int64_t test_beat_ns(void) /* IBVBRIDGE_TEST_BEAT_MS: the heartbeat, whose sweep hides no-unmap */
{
	const char *e = getenv("IBVBRIDGE_TEST_BEAT_MS");
	return e && atoll(e) > 0 ? atoll(e) * 1000000LL : BEAT_NS;
}
#else
#define test_mutant(name) 0
#define test_wait_slice_ns() WAIT_SLICE_NS
#define test_beat_ns() BEAT_NS
#endif

/* ---- small helpers ---------------------------------------------------------------------------- */

uint64_t ibvb__realtime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}



static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }


/* ---- private state ---------------------------------------------------------------------------- */

struct pmember {
	int on;                     /* an attached consumer: counts toward the reclaim point */
	int fd;                     /* its connection (-1 until its welcome is sent) */
	struct ibvb_region *region; /* our mapping of its region (never trusted) */
	uint64_t released;          /* last valid tail */
	/* consumer groups (spec §14): group is the hello's group_id (0: independent), v22 a member whose hello
	 * said minor >= 2 (it publishes read and handed); rd its read as accepted (a 2.1 member's: its tail),
	 * queued the positions assigned to it in [rd, head), uq a position at or before its oldest queued one,
	 * swept its released as of the last sweep (positions before it no longer need it), last_pick orders
	 * ties (round robin), assigned is its row's, rel_assigned the assigned positions it released, handed
	 * its region's as last read, own_end 1 + the last position assigned to it in the commit being made */
	uint32_t group, minor;
	int v22;
	uint64_t rd, queued, uq, swept, last_pick, assigned, rel_assigned, handed, own_end;
};

struct pgrave {
	struct ibvb_region *region;
	uint64_t gen; /* set generation at its detach: unmapped once the hot path has adopted it */
};

/* A grant (spec §14.1), the producer's own copy. */
struct pgrant {
	uint32_t id;
	char name[IBVB_NAME_MAX + 1];
	uint32_t *uids, *gids;
	size_t nuids, ngids;
};

struct ibvb__pstate {
	pthread_mutex_t mu; /* the consumer set, rows, reclaim, grave */
	struct pgrant *grants; /* constant after create */
	size_t ngrants;
	pthread_t thr;
	int thr_on;
	int stop_pipe[2];
	int dirfd, lockfd, listen_fd, ctl_fd, data_fd;
	uint64_t ctl_size, data_size;
	uint32_t page_size, max_consumers, max_observers;
	uint64_t fd_limit; /* RLIMIT_NOFILE at create: a connection landing in the last 32 is refused */
	int gid; /* --group, -1 without */
	uid_t euid;
	int closing;
	uint64_t reclaim; /* positions below have had their slots returned to the pool (hot path, under mu) */
	/* Consumer groups (spec §14), all under mu. pos_need, per position (& mask): the rows of group members
	 * that must still release it before its slot is free (0 without groups). scan: positions below it have
	 * been looked at by reclaim and freed unless a member still needs them; from scan to committed every
	 * position holds its slot (where a start = 0 consumer begins). window_end: no position at or past it is
	 * taken (every consumer within slot_count of head, and of the oldest held position). rescan: a member
	 * left and positions below scan may have become free. picks: assignments made (for last_pick). */
	uint64_t *pos_need;
	uint64_t scan, window_end, picks;
	uint64_t skipped_gone; /* group_skipped of departed members */
	int rescan;
	/* settle_front: below it, a departed member's settled positions need no attached independent consumer
	 * either: with nobody attached, reclaim frees them under block too (spec §7.1, §14.7) */
	uint64_t settle_front;
	int settle_front_set;
	uint64_t set_gen; /* under mu; mirrored to p->set_gen */
	int nmembers;
	struct pmember m[IBVB_MAX_CONSUMERS_LIMIT];
	struct pgrave *grave;
	size_t ngrave, capgrave;
	int pend[MAX_PENDING];
	int64_t pend_deadline[MAX_PENDING];
	int pend_short[MAX_PENDING]; /* accepted inside the descriptor reserve: refused busy at its hello */
	int obs[MAX_OBSERVERS];
	int64_t refused_logged;
	_Atomic int interrupted;
	_Atomic(_Atomic uint32_t *) wait_word; /* what a blocked hot path sleeps on, for interrupt */
	_Atomic uint32_t attach_seq;           /* bumped at each attach (block waits on it with none attached) */
	char name[IBVB_NAME_MAX + 1];
	char dir[PATH_MAX];
	char skipped[PATH_MAX + 160]; /* an untrusted default directory skipped for dir */
	char sock_path[PATH_MAX + IBVB_NAME_MAX + 16];
};

/* ---- the ring directory and the lock (spec §1.1) --------------------------------------------- */

/* Why a producer may not use dir as its ring directory (one line in why), or 0 when it may or dir does not
 * exist yet: a symbolic link, not a directory, owned by another uid, writable by group or others. */
static int dir_unusable(const char *dir, uid_t euid, char *why, size_t cap)
{
	struct stat sb;
	if (lstat(dir, &sb) < 0)
		return 0;
	if (S_ISLNK(sb.st_mode))
		snprintf(why, cap, "a symbolic link");
	else if (!S_ISDIR(sb.st_mode))
		snprintf(why, cap, "not a directory");
	else if (sb.st_uid != euid)
		snprintf(why, cap, "owned by uid %u, not %u", (unsigned)sb.st_uid, (unsigned)euid);
	else if (sb.st_mode & 022)
		snprintf(why, cap, "writable by group or others (mode %#o)", (unsigned)(sb.st_mode & 07777));
	else
		return 0;
	return 1;
}

/* Spec 2.2 §1.1: $IBVBRIDGE_RING_DIR, else the caller's own default (/run/ibvbridge for root, else
 * $XDG_RUNTIME_DIR/ibvbridge, else /dev/shm/ibvbridge-EUID). /dev/shm/ibvbridge-EUID that exists but that
 * the producer cannot trust (a stranger may make it first) is skipped with one warning for the next
 * default, /tmp/ibvbridge-EUID, where clients look too: a stranger may not deny the ring by squatting one
 * name. skipped: the warning's reason, for the error should the next one fail too. */
static void default_dir(char *buf, size_t cap, uid_t euid, char *skipped, size_t scap)
{
	const char *e = getenv(IBVB_DIR_ENV);
	char why[160], next[PATH_MAX];
	skipped[0] = 0;
	if (e && *e)
		snprintf(buf, cap, "%s", e);
	else if (ibvb__own_default_dir(buf, cap) < 0)
		buf[0] = 0; /* refused by open_ring_dir */
	else if (ibvb__next_default_dir(next, sizeof next) == 0 && dir_unusable(buf, euid, why, sizeof why)) {
		ibvb__warn("skipping %s: %s; using %s", buf, why, next);
		if (snprintf(skipped, scap, "%s: %s", buf, why) >= (int)scap)
			skipped[scap - 1] = 0;
		snprintf(buf, cap, "%s", next);
	}
}

/* The ring directory, made component by component without following a symlink (spec 2.1 §B); the final one
 * must be ours and not writable by group or others. */
static int open_ring_dir_checked(struct ibvb__pstate *st)
{
	const char *path = st->dir;
	if (!path[0])
		return fail(-ENAMETOOLONG, "ring directory: the default path is too long ($XDG_RUNTIME_DIR)");
	int fd, rc = ibvb__make_dir_nofollow(path, st->euid, &fd);
	if (rc < 0)
		return rc;
	struct stat fst;
	if (fstat(fd, &fst) < 0)
		rc = fail(-errno, "ring directory %s: fstat: %s", path, strerror(errno));
	else if (fst.st_uid != st->euid)
		rc = fail(-EPERM, "unsafe ring directory: %s is owned by uid %u, not %u (remove it, or give --dir)", path,
			  (unsigned)fst.st_uid, (unsigned)st->euid);
	else if (fst.st_mode & 022)
		rc = fail(-EPERM,
			  "unsafe ring directory: %s is writable by group or others (mode %#o): chmod go-w it, or give --dir",
			  path, (unsigned)(fst.st_mode & 07777));
	if (rc < 0) {
		close(fd);
		return rc;
	}
	st->dirfd = fd;
	return 0;
}

/* The second default failed too (spec 2.2 §1.1): its line, and which first one was skipped. */
static int open_ring_dir(struct ibvb__pstate *st)
{
	int rc = open_ring_dir_checked(st);
	if (rc < 0 && st->skipped[0]) {
		char msg[IBVB__ERRBUF_SIZE];
		snprintf(msg, sizeof msg, "%s", ibvb_last_error());
		return fail(rc, "%s (skipped %s; give --dir, or set XDG_RUNTIME_DIR)", msg, st->skipped);
	}
	return rc;
}

static int take_lock(struct ibvb__pstate *st)
{
	char ln[IBVB_NAME_MAX + 16];
	snprintf(ln, sizeof ln, "%s%s", st->name, IBVB_LOCK_SUFFIX);
	for (int tries = 0; tries < 10; tries++) {
		int fd = openat(st->dirfd, ln, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd < 0) {
			int e = errno;
			if (e == ELOOP)
				return fail(-ELOOP, "lock %s/%s is a symbolic link: refusing it (remove it)", st->dir, ln);
			return fail(-e, "lock %s/%s: openat: %s", st->dir, ln, strerror(e));
		}
		if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
			int e = errno;
			close(fd);
			if (e == EWOULDBLOCK)
				return fail(-EADDRINUSE, "create ring %s: in use by a live producer (%s)", st->name,
					    st->sock_path);
			return fail(-e, "lock %s/%s: flock: %s", st->dir, ln, strerror(e));
		}
		struct stat a, b;
		if (fstat(fd, &a) == 0 && fstatat(st->dirfd, ln, &b, AT_SYMLINK_NOFOLLOW) == 0 && a.st_dev == b.st_dev &&
		    a.st_ino == b.st_ino) {
			if (!S_ISREG(a.st_mode)) {
				close(fd);
				return fail(-EPERM, "lock %s/%s is not a regular file", st->dir, ln);
			}
			st->lockfd = fd;
			return 0;
		}
		close(fd); /* unlinked or replaced by its previous owner meanwhile: lock the file there now */
	}
	return fail(-EAGAIN, "lock %s/%s: the lock file keeps changing", st->dir, ln);
}

/* ---- memory (spec §1) ------------------------------------------------------------------------- */

static uint64_t meminfo(const char *key)
{
	FILE *f = fopen("/proc/meminfo", "re");
	if (!f)
		return 0;
	char line[256];
	uint64_t v = 0;
	size_t kl = strlen(key);
	while (fgets(line, sizeof line, f)) {
		if (strncmp(line, key, kl) || line[kl] != ':')
			continue;
		char unit[16] = "";
		unsigned long long n = 0;
		if (sscanf(line + kl + 1, "%llu %15s", &n, unit) >= 1)
			v = strcmp(unit, "kB") == 0 ? (uint64_t)n << 10 : (uint64_t)n;
		break;
	}
	fclose(f);
	return v;
}

static uint64_t read_u64_file(const char *path, int *ok)
{
	*ok = 0;
	FILE *f = fopen(path, "re");
	if (!f)
		return 0;
	unsigned long long v = 0;
	*ok = fscanf(f, "%llu", &v) == 1;
	fclose(f);
	return v;
}

/* What a new shared mapping may take: MemAvailable, or less under a cgroup v2 memory limit; 0: unknown. */
static uint64_t shm_available(void)
{
	uint64_t avail = meminfo("MemAvailable");
	FILE *f = fopen("/proc/self/cgroup", "re");
	if (!f)
		return avail;
	char line[PATH_MAX];
	while (fgets(line, sizeof line, f)) {
		if (strncmp(line, "0::", 3))
			continue;
		line[strcspn(line, "\n")] = 0;
		char p1[PATH_MAX + 64], p2[PATH_MAX + 64];
		snprintf(p1, sizeof p1, "/sys/fs/cgroup%s/memory.max", line + 3);
		snprintf(p2, sizeof p2, "/sys/fs/cgroup%s/memory.current", line + 3);
		int ok1, ok2;
		uint64_t l = read_u64_file(p1, &ok1), u = read_u64_file(p2, &ok2); /* "max" does not parse */
		if (ok1 && ok2 && u < l && (avail == 0 || l - u < avail))
			avail = l - u;
	}
	fclose(f);
	return avail;
}

/* Size a memfd and map it read-write, every page reserved first (no SIGBUS path): hugetlb reserves at mmap
 * (MAP_POPULATE), shmem is checked against what is available and fallocated. */
static int size_and_map(int fd, uint64_t size, int huge, void **out)
{
	if (ftruncate(fd, (off_t)size) < 0)
		return fail(-errno, "ftruncate: %s", strerror(errno));
	if (!huge) {
		uint64_t avail = shm_available();
		if (avail > 0 && size > avail)
			return fail(-ENOMEM,
				    "the ring needs %llu MiB of shared memory and %llu MiB are available: use fewer or smaller slots",
				    (unsigned long long)(size >> 20), (unsigned long long)(avail >> 20));
		if (fallocate(fd, 0, 0, (off_t)size) < 0) {
			int e = errno;
			if (e == ENOSPC || e == ENOMEM)
				return fail(-ENOMEM,
					    "the ring needs %llu MiB of shared memory and the system has %llu MiB available: use fewer or smaller slots",
					    (unsigned long long)(size >> 20), (unsigned long long)(shm_available() >> 20));
			return fail(-e, "fallocate: %s", strerror(e));
		}
	}
	void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | (huge ? MAP_POPULATE : 0), fd, 0);
	if (m == MAP_FAILED) {
		int e = errno;
		if (huge && e == ENOMEM)
			return fail(-ENOMEM,
				    "the ring needs %llu MiB of hugepages and %llu MiB are free (echo N > /proc/sys/vm/nr_hugepages)",
				    (unsigned long long)(size >> 20),
				    (unsigned long long)((meminfo("HugePages_Free") * meminfo("Hugepagesize")) >> 20));
		return fail(-e, "mmap: %s", strerror(e));
	}
	*out = m;
	return 0;
}

struct geometry {
	uint64_t desc_off, items_off, meta_off, payload_off, packet_off, data_size;
};

/* off += n, then rounded up to a; 0 on overflow. */
static int grow(uint64_t *off, uint64_t n, uint64_t a)
{
	uint64_t v;
	if (__builtin_add_overflow(*off, n, &v) || __builtin_add_overflow(v, a - 1, &v))
		return 0;
	*off = v & ~(a - 1);
	return 1;
}

/* The data memory's regions (spec §2), every size overflow-checked (spec 2.1 §C). 0, or -EINVAL. */
static int layout(const struct ibvb_producer_opts *o, uint64_t page, struct geometry *g)
{
	memset(g, 0, sizeof *g);
	uint64_t off = 0, desc, items, payload;
	int ok = !__builtin_mul_overflow(o->slot_count, (uint64_t)IBVB_DESC_SIZE, &desc) &&
		 !__builtin_mul_overflow(o->slot_count, (uint64_t)o->max_items * IBVB_ITEM_SIZE, &items) &&
		 !__builtin_mul_overflow(o->slot_count, o->slot_size, &payload);
	g->desc_off = off;
	ok = ok && grow(&off, desc, IBVB_REGION_ALIGN);
	g->items_off = off;
	ok = ok && grow(&off, items, IBVB_REGION_ALIGN);
	g->meta_off = off;
	ok = ok && grow(&off, o->meta_size, IBVB_REGION_ALIGN);
	g->payload_off = off;
	ok = ok && grow(&off, payload, IBVB_REGION_ALIGN);
	g->packet_off = o->packet_size ? off : 0;
	ok = ok && grow(&off, o->packet_size, IBVB_REGION_ALIGN) && grow(&off, 0, page) && off <= (uint64_t)SIZE_MAX / 2;
	g->data_size = off;
	if (!ok)
		return fail(-EINVAL, "%llu slots of %llu bytes (%u items each) overflow a 64-bit ring size",
			    (unsigned long long)o->slot_count, (unsigned long long)o->slot_size, o->max_items);
	return 0;
}

static int make_data(struct ibvb_producer *p, const struct ibvb_producer_opts *o, struct geometry *g)
{
	struct ibvb__pstate *st = p->st;
	char mname[IBVB_NAME_MAX + 32];
	snprintf(mname, sizeof mname, "ibvbridge.%s.data", st->name);
	void *m = NULL;
	int rc;
	if (o->hugepages != IBVB_HUGEPAGES_OFF) {
		int fd = memfd_create(mname, MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
		struct stat sb;
		memset(&sb, 0, sizeof sb);
		if (fd < 0)
			rc = fail(-errno, "memfd_create(MFD_HUGETLB): %s", strerror(errno));
		else if (fstat(fd, &sb) < 0)
			rc = fail(-errno, "fstat: %s", strerror(errno));
		else if ((rc = layout(o, (uint64_t)sb.st_blksize, g)) == 0)
			rc = size_and_map(fd, g->data_size, 1, &m);
		if (rc == 0) {
			st->data_fd = fd;
			st->page_size = (uint32_t)sb.st_blksize;
			st->data_size = g->data_size;
			p->data = m;
			return 0;
		}
		if (fd >= 0)
			close(fd);
		if (o->hugepages == IBVB_HUGEPAGES_REQUIRE) {
			char msg[512];
			snprintf(msg, sizeof msg, "create ring %s: no hugepages: %s", st->name, ibvb_last_error());
			return fail(rc == -ENOMEM ? -ENOMEM : rc, "%s", msg);
		}
		fprintf(stderr, "ibvbridge: ring %s: no hugepages for the ring data (%s); using 4 KiB pages\n", st->name,
			ibvb_last_error());
	}
	if ((rc = layout(o, 4096, g)) < 0)
		return rc;
	int fd = memfd_create(mname, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return fail(-errno, "memfd_create: %s", strerror(errno));
	if ((rc = size_and_map(fd, g->data_size, 0, &m)) < 0) {
		close(fd);
		return rc;
	}
	st->data_fd = fd;
	st->page_size = 4096;
	st->data_size = g->data_size;
	p->data = m;
	return 0;
}

/* A shmem memfd of size bytes, reserved, mapped read-write. */
static int new_shm(const char *what, uint64_t size, int *fd_out, void **map)
{
	int fd = memfd_create(what, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return fail(-errno, "memfd_create: %s", strerror(errno));
	int rc = size_and_map(fd, size, 0, map);
	if (rc < 0) {
		close(fd);
		return rc;
	}
	*fd_out = fd;
	return 0;
}

/* ---- consumers (spec §2.2, §7.1-§7.3, §14) ---------------------------------------------------- */

/* Return position q's slot to the pool, if it still holds one. Hot path, mu held. */
static void free_pos(struct ibvb_producer *p, uint64_t q)
{
	uint32_t s = p->pos_slot[q & p->mask];
	if (s != IBVB__NO_SLOT) {
		p->free[p->free_w & p->mask] = s;
		p->free_w++;
		p->pos_slot[q & p->mask] = IBVB__NO_SLOT;
	}
}

/* Clip [*from, to) to the positions whose bookkeeping (pos_need, indexed like the descriptors) is still
 * theirs: none before head - slot_count (spec §14.7: every loop over positions covers at most slot_count
 * positions, compared by subtraction). 1 if the clipped range is not empty. to must not be after head. */
static int clip_range(const struct ibvb_producer *p, uint64_t head, uint64_t *from, uint64_t to)
{
	uint64_t df = head - *from, dt = head - to;
	if (df > p->slot_count) {
		df = p->slot_count;
		*from = head - df;
	}
	return df > dt;
}

/* A member's skipped (spec §14.7): assigned positions it released minus the heaps it says it handed out. */
static uint64_t skipped_of(const struct pmember *m)
{
	return m->v22 && m->rel_assigned > m->handed ? m->rel_assigned - m->handed : 0;
}

/* group_skipped (stats 18): the departed members' skipped plus the attached ones'. mu held. */
static void store_skipped_locked(struct ibvb_producer *p)
{
	struct ibvb__pstate *st = p->st;
	uint64_t sum = st->skipped_gone;
	for (uint32_t i = 0; i < st->max_consumers; i++)
		if (st->m[i].on && st->m[i].v22)
			sum += skipped_of(&st->m[i]);
	atomic_store_explicit(&p->ctl->stats[IBVB_CTR_GROUP_SKIPPED], sum, memory_order_relaxed);
}

/* A group member left (spec §14.7), settled at the detach: its bit leaves every position that carries it —
 * what it released before its final tail counts as released, what it had been assigned at or after it is
 * lost for its group (group_lost) — so the next consumer of its row inherits nothing. Positions below scan
 * that nobody needs now are freed by the hot path's next reclaim (rescan: the pool is the hot path's). Any
 * thread, mu held, its region still mapped. */
static void settle_departed_locked(struct ibvb_producer *p, uint32_t i)
{
	struct ibvb__pstate *st = p->st;
	struct pmember *m = &st->m[i];
	uint64_t bit = 1ull << i, lost = 0;
	/* head is stored under mu whenever positions are assigned: every position carrying bit is below it */
	uint64_t end = atomic_load_explicit(&p->ctl->head, memory_order_acquire), q = m->swept;
	if (clip_range(p, end, &q, end))
		for (; q != end; q++) {
			uint64_t *need = &st->pos_need[q & p->mask];
			if (!(*need & bit))
				continue;
			*need &= ~bit;
			if (q - m->released < end - m->released) /* at or after its final tail: never released */
				lost++;
			else
				m->rel_assigned++;
		}
	if (lost)
		atomic_fetch_add_explicit(&p->ctl->stats[IBVB_CTR_GROUP_LOST], lost, memory_order_relaxed);
	if (m->v22) {
		m->handed = atomic_load_explicit(&m->region->handed, memory_order_acquire);
		st->skipped_gone += skipped_of(m);
		atomic_store_explicit(&p->rows[i].skipped, skipped_of(m), memory_order_relaxed);
	}
	m->swept = end;
	m->queued = 0;
	atomic_store_explicit(&p->rows[i].queued, 0, memory_order_relaxed);
	m->group = 0;
	m->v22 = 0;
	st->rescan = 1;
	uint64_t front = end; /* what an attached independent consumer has not released stays held */
	for (uint32_t k = 0; k < st->max_consumers; k++)
		if (k != i && st->m[k].on && !st->m[k].group && (int64_t)(st->m[k].released - front) < 0)
			front = st->m[k].released;
	if (!st->settle_front_set || (int64_t)(st->settle_front - front) < 0)
		st->settle_front = front, st->settle_front_set = 1;
	store_skipped_locked(p);
	atomic_fetch_sub_explicit(&p->group_members, 1, memory_order_relaxed);
}

static void bump_set_locked(struct ibvb_producer *p)
{
	struct ibvb__pstate *st = p->st;
	st->set_gen++;
	atomic_store_explicit(&p->set_gen, st->set_gen, memory_order_seq_cst);
	atomic_store_explicit(&p->ctl->stats[IBVB_CTR_CONSUMERS_ATTACHED], (uint64_t)st->nmembers,
			      memory_order_relaxed);
}

/* After a set_gen bump: 1 if the hot path is not using a consumer region outside the mutex and will adopt
 * the new set before it does (Dekker: it stores hot_busy, fences, loads set_gen; we store set_gen, fence,
 * load hot_busy — one of the two sees the other). mu held. */
static int hot_idle(struct ibvb_producer *p)
{
	atomic_thread_fence(memory_order_seq_cst);
	return atomic_load_explicit(&p->hot_busy, memory_order_relaxed) == 0;
}

/* Unmap the detached regions the hot path can no longer reach (an idle ring never adopts). mu held. */
static void sweep_grave_locked(struct ibvb_producer *p)
{
	struct ibvb__pstate *st = p->st;
	if (st->ngrave == 0 || !hot_idle(p))
		return;
	for (size_t j = 0; j < st->ngrave; j++)
		munmap(st->grave[j].region, IBVB_REGION_SIZE);
	st->ngrave = 0;
}

/* End attachment i (row state 2-4): the row says so (state last), it no longer holds back the reclaim point,
 * its socket is closed, a producer waiting on its release futex is woken, and its region is unmapped once
 * the hot path no longer reads it. mu held. */
static void detach_locked(struct ibvb_producer *p, uint32_t i, uint32_t state, uint64_t lost)
{
	struct ibvb__pstate *st = p->st;
	struct pmember *m = &st->m[i];
	if (!m->on)
		return;
	struct ibvb_row *row = &p->rows[i];
	if (!test_mutant("row-late")) {
		atomic_store_explicit(&row->lost_heaps, lost, memory_order_relaxed);
		atomic_store_explicit(&row->state, state, memory_order_release);
	}
	/* 2.1 §A: the row says detached before any slot it held is reused (a consumer checks it after reading) */
	atomic_thread_fence(memory_order_seq_cst);
	if (state == IBVB_CONSUMER_OVERRUN)
		atomic_fetch_add_explicit(&p->ctl->stats[IBVB_CTR_CONSUMER_OVERRUNS], 1, memory_order_relaxed);
	if (state == IBVB_CONSUMER_BAD_CURSOR)
		atomic_fetch_add_explicit(&p->ctl->stats[IBVB_CTR_CONSUMER_ERRORS], 1, memory_order_relaxed);
	ibvb__futex_wake_all(&m->region->release_futex);
	if (m->group)
		settle_departed_locked(p, i);
	if (m->fd >= 0)
		close(m->fd);
	m->fd = -1;
	m->on = 0;
	st->nmembers--;
	bump_set_locked(p);
	if (hot_idle(p) && !test_mutant("no-unmap")) { /* spec 2.1 §C: unmapped at detach, not at the next publish */
		munmap(m->region, IBVB_REGION_SIZE);
		m->region = NULL;
		return;
	}
	if (st->ngrave == st->capgrave) {
		size_t cap = st->capgrave ? st->capgrave * 2 : 16;
		struct pgrave *g = realloc(st->grave, cap * sizeof *g);
		if (!g) { /* keep the mapping forever rather than unmap what the hot path may read */
			m->region = NULL;
			return;
		}
		st->grave = g;
		st->capgrave = cap;
	}
	st->grave[st->ngrave].region = m->region;
	st->grave[st->ngrave].gen = st->set_gen;
	st->ngrave++;
	m->region = NULL;
}

/* Member i's read as the producer accepts it (spec §14.2): a 2.2 member's region read, taken as its tail
 * when outside [tail, head]; a 2.1 member's tail. Its queued count follows: the positions assigned to it
 * that read passed (or, moved back, uncovered). Any thread, mu held. */
static void accept_read_locked(struct ibvb_producer *p, uint32_t i, uint64_t head)
{
	struct ibvb__pstate *st = p->st;
	struct pmember *m = &st->m[i];
	uint64_t bit = 1ull << i, r = m->released;
	if (m->v22) {
		r = atomic_load_explicit(&m->region->read, memory_order_acquire);
		if (r - m->released > head - m->released)
			r = m->released; /* only harms its own share: not a detach */
		m->handed = atomic_load_explicit(&m->region->handed, memory_order_acquire);
	}
	if (r == m->rd)
		return;
	int fwd = r - m->rd <= head - m->rd;
	uint64_t from = fwd ? m->rd : r, to = fwd ? r : m->rd, q = from;
	if (clip_range(p, head, &q, to))
		for (; q != to; q++)
			if (st->pos_need[q & p->mask] & bit) {
				if (fwd && m->queued)
					m->queued--;
				else if (!fwd)
					m->queued++;
			}
	if (!fwd)
		m->uq = r;
	m->rd = r;
	atomic_store_explicit(&p->rows[i].read, r, memory_order_relaxed);
	atomic_store_explicit(&p->rows[i].queued, m->queued, memory_order_relaxed);
}

/* Read every attached consumer's cursor (spec §7.2): valid ones become its released position (and its row's),
 * an invalid one detaches it (state 3); a group member's read follows (§14.2). hot: called by the hot path,
 * whose committed head bounds the range; else the published head is loaded after each tail (a consumer may
 * have seen a newer head than an earlier load). Frees no slot. mu held. */
static void read_cursors_locked(struct ibvb_producer *p, int hot)
{
	struct ibvb__pstate *st = p->st;
	for (uint32_t i = 0; i < st->max_consumers; i++) {
		struct pmember *m = &st->m[i];
		if (!m->on)
			continue;
		uint64_t t = atomic_load_explicit(&m->region->tail, memory_order_acquire);
		uint64_t head = hot ? p->committed : atomic_load_explicit(&p->ctl->head, memory_order_acquire);
		if (t - m->released > head - m->released) {
			/* spec §2.2: lost_heaps counts from the final valid tail (states 2 and 3 alike) */
			detach_locked(p, i, IBVB_CONSUMER_BAD_CURSOR, head - m->released);
			continue;
		}
		if (t != m->released) {
			m->released = t;
			atomic_store_explicit(&p->rows[i].released, t, memory_order_relaxed);
		}
		if (m->group)
			accept_read_locked(p, i, head);
	}
}

/* Group member i's releases since its last sweep (spec §14): each position it passed that was assigned to
 * it no longer needs it, and is free if reclaim has already looked at it and nobody else needs it. Hot path,
 * mu held. */
static void sweep_locked(struct ibvb_producer *p, uint32_t i)
{
	struct ibvb__pstate *st = p->st;
	struct pmember *m = &st->m[i];
	uint64_t bit = 1ull << i, q = m->swept;
	if (clip_range(p, p->committed, &q, m->released))
		for (; q != m->released; q++) {
			uint64_t *need = &st->pos_need[q & p->mask];
			if (!(*need & bit))
				continue;
			*need &= ~bit;
			m->rel_assigned++;
			if (*need == 0 && q - st->reclaim < st->scan - st->reclaim)
				free_pos(p, q);
		}
	m->swept = m->released;
	if (m->v22)
		atomic_store_explicit(&p->rows[i].skipped, skipped_of(m), memory_order_relaxed);
}

/* A slot may be taken now: the pool has one and its position is within the window (spec §14.5). */
static int slot_ready(const struct ibvb_producer *p)
{
	return p->free_r != p->free_w && (int64_t)(p->take_end - p->free_r) > 0;
}

/* The position the next slot taken would get (acquired slots not yet staged included). */
static uint64_t next_pos(const struct ibvb_producer *p)
{
	return p->free_r - p->take_end + p->st->window_end;
}

/* A 2.2 member's oldest queued position (spec §14.5), committed if none. Every queued position lies within
 * slot_count of head (the window keeps it so), so the search is bounded. Hot path, mu held. */
static uint64_t oldest_queued(struct ibvb_producer *p, struct pmember *m, uint32_t i)
{
	uint64_t head = p->committed, bit = 1ull << i;
	uint64_t q = m->uq - m->rd <= head - m->rd ? m->uq : m->rd;
	if (!m->queued || !clip_range(p, head, &q, head))
		return head;
	while (q != head && !(p->st->pos_need[q & p->mask] & bit))
		q++;
	m->uq = q;
	return q;
}

/* The oldest position still holding a slot, and whether there is one. mu held. */
static int oldest_held(const struct ibvb_producer *p, uint64_t *o)
{
	*o = p->st->reclaim;
	return p->st->reclaim != p->committed;
}

/* Bound the positions the hot path may take slots for (spec §14.5): within slot_count of the oldest
 * position holding a slot, of every independent consumer's and 2.1 member's tail and of every 2.2 member's
 * oldest queued position. Without groups the pool alone keeps these (take_end then moves with free_w).
 * Hot path, mu held. */
static void set_window_locked(struct ibvb_producer *p)
{
	struct ibvb__pstate *st = p->st;
	uint64_t low = st->reclaim;
	for (uint32_t i = 0; i < st->max_consumers; i++) {
		struct pmember *m = &st->m[i];
		if (!m->on)
			continue;
		uint64_t x = m->released;
		if (m->v22) {
			if (!m->queued)
				continue; /* holds nothing unread: does not bound the window, however long it sleeps */
			x = oldest_queued(p, m, i);
		}
		if (x - low > p->pos - low) /* before low */
			low = x;
	}
	uint64_t end = low + p->slot_count;
	p->take_end += end - st->window_end;
	st->window_end = end;
}

/* Return to the pool the slots of positions every attached consumer has released (spec §7.1) — for a group
 * member, only the positions assigned to it (§14.5). With none attached, drop reclaims the oldest held
 * position when no slot can be taken (the ring keeps the newest heaps for a later consumer); block keeps
 * everything. Hot path, mu held. */
static void reclaim_locked(struct ibvb_producer *p)
{
	struct ibvb__pstate *st = p->st;
	if (st->rescan) { /* a member left: what only it held below scan is free */
		uint64_t q = st->reclaim; /* bounded: at most slot_count, and nothing when reclaim is not behind scan */
		if (clip_range(p, p->committed, &q, st->scan))
			for (; q != st->scan; q++)
				if (st->pos_need[q & p->mask] == 0)
					free_pos(p, q);
		while ((int64_t)(st->scan - st->reclaim) > 0 && p->pos_slot[st->reclaim & p->mask] == IBVB__NO_SLOT)
			st->reclaim++;
		st->rescan = 0;
	}
	if (st->nmembers == 0) {
		if (st->settle_front_set) { /* the departed members' settled positions are free, under block too */
			uint64_t q = st->scan;
			if (clip_range(p, p->committed, &q, st->settle_front))
				for (; q != st->settle_front; q++)
					if (st->pos_need[q & p->mask] == 0)
						free_pos(p, q);
			if ((int64_t)(st->settle_front - st->scan) > 0)
				st->scan = st->settle_front;
			st->settle_front_set = 0;
			while ((int64_t)(st->scan - st->reclaim) > 0 && p->pos_slot[st->reclaim & p->mask] == IBVB__NO_SLOT)
				st->reclaim++;
		}
		if (p->policy == IBVB_POLICY_DROP && !slot_ready(p)) {
			uint64_t to = st->reclaim;
			while (to != p->committed && p->pos_slot[to & p->mask] == IBVB__NO_SLOT)
				to++;
			if (to != p->committed)
				to++;
			for (; st->reclaim != to; st->reclaim++)
				free_pos(p, st->reclaim);
			if (st->reclaim - st->scan <= p->committed - st->scan) /* passed scan */
				st->scan = st->reclaim;
		}
	} else if (read_cursors_locked(p, 1), st->nmembers > 0) { /* else every one was detached just now */
		/* The independent consumers' frontier: below it a position is free unless a member needs it. */
		uint64_t to = p->committed;
		int members = 0;
		for (uint32_t i = 0; i < st->max_consumers; i++) {
			struct pmember *m = &st->m[i];
			if (!m->on)
				continue;
			if (m->group) {
				sweep_locked(p, i);
				members = 1;
			} else if (m->released - st->reclaim < to - st->reclaim)
				to = m->released;
		}
		if (members)
			store_skipped_locked(p);
		int in_order = st->reclaim == st->scan;
		if (to - st->reclaim >= st->scan - st->reclaim)
			for (; st->scan != to; st->scan++) {
				if (st->pos_need[st->scan & p->mask] == 0)
					free_pos(p, st->scan);
				else
					in_order = 0;
			}
		if (in_order)
			st->reclaim = st->scan;
		else
			while ((int64_t)(st->scan - st->reclaim) > 0 && p->pos_slot[st->reclaim & p->mask] == IBVB__NO_SLOT)
				st->reclaim++;
	}
	atomic_store_explicit(&p->ctl->oldest, st->scan, memory_order_relaxed);
	set_window_locked(p);
}

/* The attached consumers holding the ring back (spec §14.6), as a mask of rows: for a slot (q the next
 * position) those a bound of §14.5 fails for at q, and in any case those that still need the oldest held
 * position o (an independent whose tail has not passed it, the member whose bit it carries). *at: the
 * position the first of them (lowest row) keeps. Hot path, mu held. */
static uint64_t holders_locked(struct ibvb_producer *p, int for_slot, uint64_t *at)
{
	struct ibvb__pstate *st = p->st;
	uint64_t o, q = next_pos(p), mask = 0;
	int held = oldest_held(p, &o);
	uint64_t need = held ? st->pos_need[o & p->mask] : 0;
	*at = o;
	for (uint32_t i = 0; i < st->max_consumers; i++) {
		struct pmember *m = &st->m[i];
		if (!m->on)
			continue;
		uint64_t bit = 1ull << i, x = m->released;
		int h = m->group ? (need & bit) != 0 : held && (int64_t)(o - m->released) >= 0;
		if (for_slot && !h) {
			if (m->v22)
				x = oldest_queued(p, m, i);
			if ((!m->v22 || m->queued) && q - x >= p->slot_count && q - x < (1ull << 63)) {
				h = 1;
				if (!mask)
					*at = x;
			}
		}
		if (h)
			mask |= bit;
	}
	return mask;
}

/* Drop policy, no slot to take after reclaiming (spec §14.6): if some attached consumer does not hold the
 * ring back, detach every one that does as overrun and reclaim again. 1 if a slot can be taken now. Hot
 * path, mu held. */
static int overrun_locked(struct ibvb_producer *p)
{
	struct ibvb__pstate *st = p->st;
	uint64_t at, hold = holders_locked(p, 1, &at), attached = 0;
	for (uint32_t i = 0; i < st->max_consumers; i++)
		if (st->m[i].on)
			attached |= 1ull << i;
	if (!hold || hold == attached)
		return 0;
	for (uint32_t i = 0; i < st->max_consumers; i++)
		if (hold & (1ull << i))
			detach_locked(p, i, IBVB_CONSUMER_OVERRUN, p->committed - st->m[i].released);
	reclaim_locked(p);
	return slot_ready(p);
}

/* The consumer a waiting producer waits for (spec §14.6): the first (lowest row) of those holding the ring
 * back; -1 with none. *at: the position it keeps. Hot path, mu held. */
static int blocker_locked(struct ibvb_producer *p, int for_slot, uint64_t *at)
{
	uint64_t hold = holders_locked(p, for_slot, at);
	return hold ? __builtin_ctzll(hold) : -1;
}

enum wait_cond { WAIT_SLOT, WAIT_DRAINED };

/* 1 done, 0 not yet, <0 error. mu held. */
static int check_locked(struct ibvb_producer *p, enum wait_cond c)
{
	reclaim_locked(p);
	if (c == WAIT_SLOT) {
		if (!slot_ready(p) && p->policy == IBVB_POLICY_DROP)
			overrun_locked(p);
		return slot_ready(p);
	}
	if (p->st->nmembers == 0)
		return -ENOTCONN;
	return p->st->reclaim == p->committed;
}

/* Wait until c holds (spec §7.4): spin a little, then sleep on the release_futex of the consumer holding the
 * ring back (or, with none attached, for an attach) in ≤ 250 ms slices. deadline_ns 0: none. Hot path. */
static int wait_for_busy(struct ibvb_producer *p, enum wait_cond c, int64_t deadline_ns);

/* wait_for holds the blocker's region outside the mutex: hot_busy keeps it mapped meanwhile. blocked_on and
 * blocked_since_ns (spec §14.6) say whom it waits for, and are cleared when it returns. */
static int wait_for(struct ibvb_producer *p, enum wait_cond c, int64_t deadline_ns)
{
	atomic_store_explicit(&p->hot_busy, 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_seq_cst);
	int rc = wait_for_busy(p, c, deadline_ns);
	atomic_store_explicit(&p->ctl->blocked_on, 0, memory_order_relaxed);
	atomic_store_explicit(&p->ctl->blocked_since_ns, 0, memory_order_relaxed);
	atomic_store_explicit(&p->hot_busy, 0, memory_order_release);
	return rc;
}

#define BLOCK_LOG_AFTER_NS 500000000LL   /* a wait this long is named in the log (spec §14.6: within 1 s) */
#define BLOCK_LOG_EVERY_NS 10000000000LL /* and again this often while it lasts */

/* Name whom a waiting producer waits for (spec §14.6): once a wait has lasted BLOCK_LOG_AFTER_NS, when
 * the consumer changes (at most once a second) and every BLOCK_LOG_EVERY_NS. mu held. */
static void log_blocked_locked(struct ibvb_producer *p, int row, uint64_t at, int64_t began, int64_t now,
			       int *logged_row, int64_t *logged_at)
{
	struct ibvb__pstate *st = p->st;
	if (row < 0 || now - began < BLOCK_LOG_AFTER_NS)
		return;
	if (*logged_row == row && now - *logged_at < BLOCK_LOG_EVERY_NS)
		return;
	if (*logged_row != row && *logged_row >= 0 && now - *logged_at < 1000000000LL)
		return;
	const struct pmember *m = &st->m[row];
	char grp[32] = "independent";
	if (m->group)
		snprintf(grp, sizeof grp, "group %#x", m->group);
	ibvb__warn("ring %s: waiting %.1f s for consumer row %d (pid %llu, %s) to release position %llu", st->name,
		   (double)(now - began) / 1e9, row,
		   (unsigned long long)atomic_load_explicit(&p->rows[row].pid, memory_order_relaxed), grp,
		   (unsigned long long)at);
	*logged_row = row;
	*logged_at = now;
}

static int wait_for_busy(struct ibvb_producer *p, enum wait_cond c, int64_t deadline_ns)
{
	struct ibvb__pstate *st = p->st;
	int64_t began = mono_ns(), spin_until = began + SPIN_NS, logged_at = 0;
	int logged_row = -1, since_set = 0;
	for (;;) {
		if (atomic_load(&st->interrupted))
			return fail(-ECANCELED, "ring %s: interrupted", st->name);
		uint32_t aseq = atomic_load(&st->attach_seq);
		uint64_t at = 0;
		pthread_mutex_lock(&st->mu);
		int ok = check_locked(p, c);
		int slow = ok == 0 ? blocker_locked(p, c == WAIT_SLOT, &at) : -1;
		struct ibvb_region *g = slow >= 0 ? st->m[slow].region : NULL;
		int64_t now = mono_ns();
		if (ok == 0 && now >= spin_until) {
			atomic_store_explicit(&p->ctl->blocked_on, (uint32_t)(slow + 1), memory_order_relaxed);
			if (!since_set) {
				atomic_store_explicit(&p->ctl->blocked_since_ns,
						      ibvb__realtime_ns() - (uint64_t)(now - began), memory_order_relaxed);
				since_set = 1;
			}
			log_blocked_locked(p, slow, at, began, now, &logged_row, &logged_at);
		}
		pthread_mutex_unlock(&st->mu);
		if (ok == -ENOTCONN)
			return fail(-ENOTCONN, "ring %s: no consumer is attached", st->name);
		if (ok)
			return 0;
		if (deadline_ns && now >= deadline_ns)
			return fail(-ETIMEDOUT, "ring %s: timed out waiting for the consumers", st->name);
		if (now < spin_until) {
			for (int k = 0; k < 64; k++)
				ibvb__cpu_relax();
			continue;
		}
		int64_t slice = test_wait_slice_ns();
		if (now - began < BLOCK_LOG_AFTER_NS && BLOCK_LOG_AFTER_NS - (now - began) < slice)
			slice = BLOCK_LOG_AFTER_NS - (now - began) + 1000000; /* wake to name the blocker in time */
		if (deadline_ns && deadline_ns - now < slice)
			slice = deadline_ns - now > 1000000 ? deadline_ns - now : 1000000;
		if (!g) {
			atomic_store(&st->wait_word, &st->attach_seq);
			if (!atomic_load(&st->interrupted))
				ibvb__futex_wait(&st->attach_seq, aseq, slice);
			atomic_store(&st->wait_word, NULL);
			continue;
		}
		uint32_t f = atomic_load(&g->release_futex);
		atomic_store_explicit(&p->ctl->producer_waiting, 1, memory_order_relaxed);
		atomic_thread_fence(memory_order_seq_cst);
		pthread_mutex_lock(&st->mu);
		ok = check_locked(p, c);
		pthread_mutex_unlock(&st->mu);
		if (ok == 0) {
			atomic_store(&st->wait_word, &g->release_futex);
			if (!atomic_load(&st->interrupted))
				ibvb__futex_wait(&g->release_futex, f, slice);
			atomic_store(&st->wait_word, NULL);
		}
		atomic_store_explicit(&p->ctl->producer_waiting, 0, memory_order_relaxed);
	}
}

int ibvb__producer_refill(struct ibvb_producer *p)
{
	struct ibvb__pstate *st = p->st;
	ibvb_producer_commit(p); /* staged heaps become visible, and their slots reclaimable */
	pthread_mutex_lock(&st->mu);
	reclaim_locked(p);
	int empty = !slot_ready(p);
	if (empty && p->policy == IBVB_POLICY_DROP)
		empty = !overrun_locked(p);
	pthread_mutex_unlock(&st->mu);
	if (!empty)
		return 0;
	if (p->policy == IBVB_POLICY_DROP)
		return -EAGAIN; /* no message: this is the hot path of a full ring */
	return wait_for(p, WAIT_SLOT, 0);
}

/* Give each staged position to one member of every group (spec §14.3), from what the members published: a
 * member with nothing queued first, else the one with the fewest positions queued; ties (and among idle
 * members) to the one picked least recently (round robin). The mask goes into the descriptor's assign
 * (before head is stored) and into pos_need. The END_OF_STREAM marker is for everyone and assigned to
 * nobody. No allocation. Hot path, mu held. */
static void assign_locked(struct ibvb_producer *p)
{
	struct ibvb__pstate *st = p->st;
	uint32_t idx[IBVB_MAX_CONSUMERS_LIMIT], n = 0;
	for (uint32_t i = 0; i < st->max_consumers; i++) { /* members, sorted by group (insertion) */
		if (!st->m[i].on || !st->m[i].group)
			continue;
		uint32_t k = n++;
		for (; k > 0 && st->m[idx[k - 1]].group > st->m[i].group; k--)
			idx[k] = idx[k - 1];
		idx[k] = i;
	}
	for (uint64_t q = p->committed; q != p->pos; q++) {
		struct ibvb_desc *d = &p->desc[q & p->mask];
		uint64_t mask = 0;
		for (uint32_t a = 0; a < n && !(d->flags & IBVB_FLAG_END_OF_STREAM);) {
			uint32_t b = a + 1;
			while (b < n && st->m[idx[b]].group == st->m[idx[a]].group)
				b++;
			uint32_t best = idx[a];
			for (uint32_t k = a + 1; k < b; k++) {
				const struct pmember *m = &st->m[idx[k]], *bm = &st->m[best];
				int better;
				if ((m->queued == 0) != (bm->queued == 0))
					better = m->queued == 0;
				else if (m->queued != bm->queued)
					better = m->queued < bm->queued;
				else
					better = m->last_pick < bm->last_pick;
				if (better)
					best = idx[k];
			}
			struct pmember *bm = &st->m[best];
			bm->last_pick = ++st->picks;
			bm->queued++;
			bm->assigned++;
			bm->own_end = q + 1;
			mask |= 1ull << best;
			a = b;
		}
		d->assign = mask;
		st->pos_need[q & p->mask] = mask;
	}
	for (uint32_t k = 0; k < n; k++) {
		atomic_store_explicit(&p->rows[idx[k]].assigned, st->m[idx[k]].assigned, memory_order_relaxed);
		atomic_store_explicit(&p->rows[idx[k]].queued, st->m[idx[k]].queued, memory_order_relaxed);
	}
}

/* Wake consumer i if it sleeps (spec §7.5): exchange consumer_waiting with 0, bump consumer_futex, wake. */
static void wake_region(struct ibvb_region *g, struct ibvb_row *row)
{
	if (atomic_exchange(&g->consumer_waiting, 0) != 0) {
		atomic_fetch_add(&g->consumer_futex, 1);
		ibvb__futex_wake_all(&g->consumer_futex);
		_Atomic uint64_t *w = &row->wakes;
		atomic_store_explicit(w, atomic_load_explicit(w, memory_order_relaxed) + 1, memory_order_relaxed);
	}
}

/* commit with consumer groups attached: fresh cursors, the assignment, head, then the wakes — all under mu,
 * so a member that leaves meanwhile has its bits cleared from every published position before its row can
 * go to a new consumer, who starts at this head (spec §14.7: it inherits nothing). A 2.2 member is woken
 * only for a position assigned to it whose publication reaches its wake_at (§14.4); everyone else as §7.5
 * says. Hot path. */
void ibvb__producer_commit_groups(struct ibvb_producer *p)
{
	struct ibvb__pstate *st = p->st;
	pthread_mutex_lock(&st->mu);
	reclaim_locked(p);
	assign_locked(p);
	p->committed = p->pos;
	atomic_store_explicit(&p->ctl->head, p->pos, memory_order_release);
	atomic_thread_fence(memory_order_seq_cst);
	for (uint32_t i = 0; i < st->max_consumers; i++) {
		struct pmember *m = &st->m[i];
		if (!m->on)
			continue;
		uint64_t end = m->v22 ? m->own_end : p->pos;
		m->own_end = 0;
		if (atomic_load_explicit(&m->region->consumer_waiting, memory_order_relaxed) != 0 && end &&
		    (int64_t)(end - atomic_load_explicit(&m->region->wake_at, memory_order_relaxed)) >= 0)
			wake_region(m->region, &p->rows[i]);
	}
	pthread_mutex_unlock(&st->mu);
}

/* Wake every sleeping consumer whatever its wake_at (the END_OF_STREAM marker, spec §7.5). Hot path. */
static void wake_all(struct ibvb_producer *p)
{
	struct ibvb__pstate *st = p->st;
	pthread_mutex_lock(&st->mu);
	for (uint32_t i = 0; i < st->max_consumers; i++)
		if (st->m[i].on)
			wake_region(st->m[i].region, &p->rows[i]);
	pthread_mutex_unlock(&st->mu);
}

void ibvb__producer_adopt(struct ibvb_producer *p)
{
	struct ibvb__pstate *st = p->st;
	pthread_mutex_lock(&st->mu);
	uint32_t n = 0;
	for (uint32_t i = 0; i < st->max_consumers; i++)
		if (st->m[i].on) {
			p->hot[n].region = st->m[i].region;
			p->hot[n].row = &p->rows[i];
			n++;
		}
	p->hot_n = n;
	p->hot_gen = st->set_gen;
	/* regions detached up to this generation are no longer reachable from the hot path */
	size_t k = 0;
	for (size_t j = 0; j < st->ngrave; j++) {
		if (st->grave[j].gen <= p->hot_gen)
			munmap(st->grave[j].region, IBVB_REGION_SIZE);
		else
			st->grave[k++] = st->grave[j];
	}
	st->ngrave = k;
	pthread_mutex_unlock(&st->mu);
}

void ibvb__producer_wake(struct ibvb_producer *p, uint32_t i) { wake_region(p->hot[i].region, p->hot[i].row); }

/* ---- the handshake (spec §1.2) ---------------------------------------------------------------- */

static void send_error(int fd, uint32_t status, const char *msg)
{
	struct ibvb_error_record er;
	memset(&er, 0, sizeof er);
	er.magic = IBVB_MAGIC;
	er.major = IBVB_MAJOR;
	er.minor = IBVB_MINOR;
	er.status = status;
	snprintf(er.message, sizeof er.message, "%s", msg);
	if (send(fd, &er, 16 + strlen(er.message) + 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
		/* the client is gone: nothing to tell */
	}
}

static int send_fds(int fd, const void *rec, size_t len, const int *fds, int nfds)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int) * 3)];
	} cm;
	memset(&cm, 0, sizeof cm);
	struct iovec iov = {.iov_base = (void *)rec, .iov_len = len};
	struct msghdr msg;
	memset(&msg, 0, sizeof msg);
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = cm.b;
	msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
	memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
	return sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)len ? 0 : -errno;
}

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59
#endif

/* The peer's primary gid (SO_PEERCRED) is gid, or one of its real supplementary groups (SO_PEERGROUPS, spec
 * 2.1 §1.2 — not /etc/group). */
static int peer_has_gid(int fd, const struct ucred *cr, gid_t gid)
{
	if (cr->gid == gid)
		return 1;
	gid_t groups[NGROUPS_MAX_PEER];
	socklen_t len = sizeof groups;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0)
		return 0; /* ERANGE: more groups than we take; refused rather than guessed */
	for (size_t i = 0; i < len / sizeof(gid_t); i++)
		if (groups[i] == gid)
			return 1;
	return 0;
}

/* The SO_PEERCRED gate: this euid, root, or a member of --group: the peer's primary gid or one of its real
 * supplementary groups (SO_PEERGROUPS, spec 2.1 §1.2 — not /etc/group). */
static int permitted(const struct ibvb__pstate *st, int fd, const struct ucred *cr)
{
	if (cr->uid == 0 || cr->uid == st->euid)
		return 1;
	if (st->gid < 0)
		return 0;
	return peer_has_gid(fd, cr, (gid_t)st->gid);
}

/* May this peer join the group of this hello's group_id (spec §14.1)? 1 yes; 0 no, with msg set. Every group
 * is open without grants; with them, only a granted group, for its uids and gids (root always). */
static int grant_permits(const struct ibvb__pstate *st, int fd, const struct ucred *cr, uint32_t group, char *msg,
			 size_t cap)
{
	if (!st->ngrants || !group || cr->uid == 0)
		return 1;
	const struct pgrant *g = NULL;
	for (size_t i = 0; i < st->ngrants && !g; i++)
		if (st->grants[i].id == group)
			g = &st->grants[i];
	if (!g) {
		snprintf(msg, cap, "ring %s: not permitted to join group %#x (no grant names it)", st->name, group);
		return 0;
	}
	for (size_t i = 0; i < g->nuids; i++)
		if (g->uids[i] == cr->uid)
			return 1;
	for (size_t i = 0; i < g->ngids; i++)
		if (peer_has_gid(fd, cr, (gid_t)g->gids[i]))
			return 1;
	snprintf(msg, cap, "ring %s: not permitted to join group %s (uid %u)", st->name, g->name, (unsigned)cr->uid);
	return 0;
}

static void refuse(struct ibvb__pstate *st, int fd, const struct ucred *cr, uint32_t status, const char *msg)
{
	send_error(fd, status, msg);
	close(fd);
	int64_t now = mono_ns();
	if (now - st->refused_logged > 1000000000LL) { /* a stranger in a loop gets one line a second */
		st->refused_logged = now;
		fprintf(stderr, "ibvbridge: ring %s: refused pid %d uid %u: %s\n", st->name, (int)cr->pid,
			(unsigned)cr->uid, msg);
	}
}

/* Give a consumer a row and a region whose tail is its start position, under the lock reclaiming takes
 * (spec §7.1). Returns the row index, or -1 with *status and msg set. */
static int admit(struct ibvb_producer *p, const struct ucred *cr, uint32_t start, uint32_t group, uint32_t minor,
		 struct ibvb_region *g, uint32_t *status, char *msg, size_t cap, uint32_t *gen_out)
{
	struct ibvb__pstate *st = p->st;
	pthread_mutex_lock(&st->mu);
	if (st->closing || atomic_load(&p->ctl->state) == IBVB_STATE_CLOSED) {
		pthread_mutex_unlock(&st->mu);
		*status = IBVB_STATUS_CLOSING;
		snprintf(msg, cap, "ring %s is closing: the stream has ended", st->name);
		return -1;
	}
	int idx = -1;
	for (uint32_t i = 0; i < st->max_consumers; i++)
		if (!st->m[i].on && atomic_load(&p->rows[i].state) != IBVB_CONSUMER_ATTACHED) {
			idx = (int)i;
			break;
		}
	if (idx < 0) {
		pthread_mutex_unlock(&st->mu);
		*status = IBVB_STATUS_BUSY;
		snprintf(msg, cap, "ring %s is busy: %u consumers are attached, the most it takes (max_consumers)",
			 st->name, st->max_consumers);
		return -1;
	}
	uint64_t pos, head = atomic_load_explicit(&p->ctl->head, memory_order_acquire);
	if (start == IBVB_START_HEAD || group) { /* a group member starts at head (spec §14) */
		pos = head;
	} else {
		/* the lowest position an attached independent consumer has not released (at or past scan), else
		 * scan: never below it, where a member may hold some positions' slots while others' were reused */
		read_cursors_locked(p, 0);
		pos = st->scan;
		int found = 0;
		for (uint32_t i = 0; i < st->max_consumers; i++) {
			const struct pmember *m = &st->m[i];
			if (m->on && !m->group && (!found || m->released - st->scan < pos - st->scan))
				pos = m->released, found = 1;
		}
	}
	atomic_store_explicit(&g->read, pos, memory_order_relaxed);
	atomic_store_explicit(&g->tail, pos, memory_order_release);
	struct ibvb_row *row = &p->rows[idx];
	atomic_store(&row->pid, (uint64_t)cr->pid);
	atomic_store(&row->uid, (uint64_t)cr->uid);
	atomic_store(&row->attach_ns, ibvb__realtime_ns());
	atomic_store(&row->released, pos);
	atomic_store(&row->wakes, 0);
	atomic_store(&row->lost_heaps, 0);
	atomic_store(&row->assigned, 0);
	atomic_store(&row->group_id, group);
	atomic_store(&row->client_minor, minor);
	atomic_store(&row->read, pos);
	atomic_store(&row->queued, 0);
	atomic_store(&row->skipped, 0);
	uint32_t gen = atomic_load(&row->generation) + 1;
	atomic_store(&row->generation, gen);
	atomic_store_explicit(&row->state, IBVB_CONSUMER_ATTACHED, memory_order_release); /* last */
	st->m[idx].region = g;
	st->m[idx].released = pos;
	st->m[idx].on = 1;
	st->m[idx].fd = -1; /* set by the caller once the welcome is sent (not polled until then) */
	struct pmember *m = &st->m[idx];
	m->group = group;
	m->minor = minor;
	m->v22 = group && minor >= 2;
	m->queued = m->last_pick = m->assigned = m->rel_assigned = m->handed = m->own_end = 0;
	m->swept = m->rd = m->uq = pos;
	if (group)
		atomic_fetch_add_explicit(&p->group_members, 1, memory_order_relaxed);
	st->nmembers++;
	st->settle_front_set = 0; /* reclaim now finds the frontier from the attached consumers */
	bump_set_locked(p);
	pthread_mutex_unlock(&st->mu);
	*gen_out = gen;
	return idx;
}

/* The hello's checks, in order: a hello at all, the descriptor reserve, permission, the major version, role
 * and start, the reserved bytes. 0 with *cr and *h filled, or -1: refused (an error record) and closed. */
static int check_hello(struct ibvb_producer *p, int fd, int fd_short, struct ucred *cr, struct ibvb_hello *h)
{
	struct ibvb__pstate *st = p->st;
	socklen_t cl = sizeof *cr;
	memset(cr, 0, sizeof *cr);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cr, &cl) < 0) {
		close(fd);
		return -1;
	}
	uint8_t buf[IBVB_ERROR_RECORD_MAX];
	ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
	if (n <= 0) {
		close(fd);
		return -1;
	}
	memset(h, 0, sizeof *h);
	memcpy(h, buf, (size_t)n < sizeof *h ? (size_t)n : sizeof *h);
	char msg[IBVB_ERROR_RECORD_MAX - 16];
	if (n != (ssize_t)sizeof *h || h->magic != IBVB_MAGIC) {
		snprintf(msg, sizeof msg, "ring %s: hello of %zd bytes is not an ibvbridge hello", st->name, n);
		refuse(st, fd, cr, IBVB_STATUS_PROTOCOL, msg);
		return -1;
	}
	if (fd_short) {
		snprintf(msg, sizeof msg, "ring %s busy: out of file descriptors", st->name);
		refuse(st, fd, cr, IBVB_STATUS_BUSY, msg);
		return -1;
	}
	if (!permitted(st, fd, cr)) {
		snprintf(msg, sizeof msg, "ring %s: uid %u may not attach (the producer runs as uid %u)", st->name,
			 (unsigned)cr->uid, (unsigned)st->euid);
		refuse(st, fd, cr, IBVB_STATUS_NOT_PERMITTED, msg);
		return -1;
	}
	if (h->major != IBVB_MAJOR) {
		snprintf(msg, sizeof msg, "ring %s is layout %d.%d; this client speaks %u.%u", st->name, IBVB_MAJOR,
			 IBVB_MINOR, h->major, h->minor);
		refuse(st, fd, cr, IBVB_STATUS_VERSION, msg);
		return -1;
	}
	if ((h->role != IBVB_ROLE_CONSUMER && h->role != IBVB_ROLE_OBSERVER) ||
	    (h->start != IBVB_START_OLDEST && h->start != IBVB_START_HEAD)) {
		snprintf(msg, sizeof msg, "ring %s: role %u, start %u", st->name, h->role, h->start);
		refuse(st, fd, cr, IBVB_STATUS_PROTOCOL, msg);
		return -1;
	}
	/* 2.1: 0x14..0x17 is group_id (spec §14), 0x18..0x1F stay reserved and must be zero */
	if (h->reserved[0] | h->reserved[1]) {
		snprintf(msg, sizeof msg, "ring %s: the hello's reserved bytes are not zero", st->name);
		refuse(st, fd, cr, IBVB_STATUS_PROTOCOL, msg);
		return -1;
	}
	if (h->role == IBVB_ROLE_OBSERVER && h->group_id) {
		snprintf(msg, sizeof msg, "ring %s: an observer in group %#x", st->name, h->group_id);
		refuse(st, fd, cr, IBVB_STATUS_PROTOCOL, msg);
		return -1;
	}
	if (!grant_permits(st, fd, cr, h->group_id, msg, sizeof msg)) {
		refuse(st, fd, cr, IBVB_STATUS_NOT_PERMITTED, msg);
		return -1;
	}
	return 0;
}

/* An observer (`stat`, `ls`): the control memory only, while a place among max_observers is free. 1 kept,
 * 0 refused and closed. */
static int welcome_observer(struct ibvb_producer *p, int fd, const struct ucred *cr, struct ibvb_welcome *w)
{
	struct ibvb__pstate *st = p->st;
	char msg[IBVB_ERROR_RECORD_MAX - 16];
	w->consumer_index = IBVB_NO_CONSUMER_INDEX;
	int slot = -1;
	for (uint32_t i = 0; i < st->max_observers; i++)
		if (st->obs[i] < 0) {
			slot = (int)i;
			break;
		}
	if (slot < 0) {
		snprintf(msg, sizeof msg, "ring %s busy: %u observers", st->name, st->max_observers);
		refuse(st, fd, cr, IBVB_STATUS_BUSY, msg);
		return 0;
	}
	if (send_fds(fd, w, sizeof *w, &st->ctl_fd, 1) < 0) {
		close(fd);
		return 0;
	}
	st->obs[slot] = fd; /* held until the observer closes it */
	return 1;
}

/* A consumer: a fresh sealed region, a row (admit), the welcome with the three descriptors. 1 kept, 0
 * refused or failed (closed). */
static int welcome_consumer(struct ibvb_producer *p, int fd, const struct ucred *cr, uint32_t start,
			    uint32_t group, uint32_t minor, struct ibvb_welcome *w)
{
	struct ibvb__pstate *st = p->st;
	char msg[IBVB_ERROR_RECORD_MAX - 16];
	char rname[IBVB_NAME_MAX + 32];
	snprintf(rname, sizeof rname, "ibvbridge.%s.consumer", st->name);
	int rfd;
	void *rm;
	if (new_shm(rname, IBVB_REGION_SIZE, &rfd, &rm) < 0) {
		snprintf(msg, sizeof msg, "ring %s: no memory for a consumer region: %s", st->name, ibvb_last_error());
		refuse(st, fd, cr, IBVB_STATUS_BUSY, msg);
		return 0;
	}
	if (fcntl(rfd, F_ADD_SEALS, SEALS_REGION) < 0) {
		snprintf(msg, sizeof msg, "ring %s: sealing a consumer region: %s", st->name, strerror(errno));
		munmap(rm, IBVB_REGION_SIZE);
		close(rfd);
		refuse(st, fd, cr, IBVB_STATUS_BUSY, msg);
		return 0;
	}
	uint32_t status = 0, gen = 0;
	int idx = admit(p, cr, start, group, minor, rm, &status, msg, sizeof msg, &gen);
	if (idx < 0) {
		munmap(rm, IBVB_REGION_SIZE);
		close(rfd);
		refuse(st, fd, cr, status, msg);
		return 0;
	}
	w->consumer_index = (uint32_t)idx;
	w->generation = gen;
	w->data_size = st->data_size;
	w->region_size = IBVB_REGION_SIZE;
	int fds[3] = {st->ctl_fd, st->data_fd, rfd};
	int rc = send_fds(fd, w, sizeof *w, fds, 3);
	close(rfd); /* the consumer's descriptor is its own now; we keep our mapping */
	pthread_mutex_lock(&st->mu);
	st->m[idx].fd = fd;
	if (rc < 0)
		detach_locked(p, (uint32_t)idx, IBVB_CONSUMER_GONE, 0);
	else {
		atomic_fetch_add(&st->attach_seq, 1);
		ibvb__futex_wake_all(&st->attach_seq);
	}
	pthread_mutex_unlock(&st->mu);
	return rc == 0;
}

/* A connection that has said something: answer its hello. Returns 1 if fd is now kept (a consumer or an
 * observer), 0 if it was closed. */
static int answer_hello(struct ibvb_producer *p, int fd, int fd_short)
{
	struct ucred cr;
	struct ibvb_hello h;
	if (check_hello(p, fd, fd_short, &cr, &h) < 0)
		return 0;
	struct ibvb_welcome w;
	memset(&w, 0, sizeof w);
	w.magic = IBVB_MAGIC;
	w.major = IBVB_MAJOR;
	w.minor = IBVB_MINOR;
	w.status = IBVB_STATUS_OK;
	w.session_id = p->ctl->session_id;
	w.ctl_size = p->st->ctl_size;
	if (h.role == IBVB_ROLE_OBSERVER)
		return welcome_observer(p, fd, &cr, &w);
	return welcome_consumer(p, fd, &cr, h.start, h.group_id, h.minor, &w);
}

/* ---- the service thread ----------------------------------------------------------------------- */

/* A consumer's connection ended (EOF, error, or a stray record): record the cursor it stored before
 * closing if valid (spec §7.6), then row state 4. mu held. */
static void gone_locked(struct ibvb_producer *p, uint32_t i)
{
	struct pmember *m = &p->st->m[i];
	uint64_t t = atomic_load_explicit(&m->region->tail, memory_order_acquire);
	uint64_t head = atomic_load_explicit(&p->ctl->head, memory_order_acquire);
	if (t - m->released <= head - m->released) {
		m->released = t;
		atomic_store(&p->rows[i].released, t);
	}
	detach_locked(p, i, IBVB_CONSUMER_GONE, 0);
}

enum poll_kind { K_STOP, K_LISTEN, K_PEND, K_MEMBER, K_OBS };
#define POLL_MAX (2 + MAX_PENDING + IBVB_MAX_CONSUMERS_LIMIT + MAX_OBSERVERS)

/* What the service thread polls on each pass: the stop pipe, the listener, pending connections (whose hello
 * deadline may come before *wake_at), members and observers. Returns the number of entries. */
static int poll_set(struct ibvb__pstate *st, struct pollfd *pf, int *kind, int *which, int64_t *wake_at)
{
	int n = 0;
	pf[n] = (struct pollfd){.fd = st->stop_pipe[0], .events = POLLIN};
	kind[n++] = K_STOP;
	pf[n] = (struct pollfd){.fd = st->listen_fd, .events = POLLIN};
	kind[n++] = K_LISTEN;
	for (int i = 0; i < MAX_PENDING; i++)
		if (st->pend[i] >= 0) {
			pf[n] = (struct pollfd){.fd = st->pend[i], .events = POLLIN};
			kind[n] = K_PEND;
			which[n++] = i;
			if (st->pend_deadline[i] < *wake_at)
				*wake_at = st->pend_deadline[i];
		}
	pthread_mutex_lock(&st->mu);
	for (uint32_t i = 0; i < st->max_consumers; i++)
		if (st->m[i].on && st->m[i].fd >= 0) {
			pf[n] = (struct pollfd){.fd = st->m[i].fd, .events = POLLIN | POLLRDHUP};
			kind[n] = K_MEMBER;
			which[n++] = (int)i;
		}
	pthread_mutex_unlock(&st->mu);
	for (int i = 0; i < MAX_OBSERVERS; i++)
		if (st->obs[i] >= 0) {
			pf[n] = (struct pollfd){.fd = st->obs[i], .events = POLLIN | POLLRDHUP};
			kind[n] = K_OBS;
			which[n++] = i;
		}
	return n;
}

/* Members whose connection spoke or hung up: the attachment ends. mu held. */
static void members_gone_locked(struct ibvb_producer *p, const struct pollfd *pf, const int *kind,
				const int *which, int n)
{
	struct ibvb__pstate *st = p->st;
	for (int k = 0; k < n; k++) {
		if (kind[k] != K_MEMBER || !pf[k].revents)
			continue;
		uint32_t i = (uint32_t)which[k];
		if (!st->m[i].on || st->m[i].fd != pf[k].fd)
			continue; /* detached meanwhile */
		char b[16];
		ssize_t r = recv(pf[k].fd, b, sizeof b, MSG_DONTWAIT);
		if (r < 0 && (errno == EAGAIN || errno == EINTR) && !(pf[k].revents & (POLLHUP | POLLRDHUP | POLLERR)))
			continue;
		gone_locked(p, i); /* EOF, error, or a record after the welcome: the attachment ends */
	}
}

/* Observers that hung up leave; pending connections that spoke get their answer, silent ones past their
 * hello deadline are closed. */
static void serve_others(struct ibvb_producer *p, const struct pollfd *pf, const int *kind, const int *which,
			 int n, int64_t now)
{
	struct ibvb__pstate *st = p->st;
	for (int k = 0; k < n; k++) {
		if (kind[k] == K_OBS && pf[k].revents) {
			close(st->obs[which[k]]);
			st->obs[which[k]] = -1;
		} else if (kind[k] == K_PEND) {
			int i = which[k];
			if (pf[k].revents) {
				answer_hello(p, st->pend[i], st->pend_short[i]);
				st->pend[i] = -1;
			} else if (now >= st->pend_deadline[i]) {
				close(st->pend[i]); /* a silent stranger holds nothing */
				st->pend[i] = -1;
			}
		}
	}
}

/* Every waiting connection becomes pending (its hello due within HELLO_TIMEOUT_NS); none left: closed. */
static void accept_all(struct ibvb__pstate *st, int64_t now)
{
	for (;;) {
		int cfd = accept4(st->listen_fd, NULL, NULL, SOCK_CLOEXEC);
		if (cfd < 0)
			break;
		int slot = -1;
		for (int i = 0; i < MAX_PENDING; i++)
			if (st->pend[i] < 0) {
				slot = i;
				break;
			}
		if (slot < 0) {
			close(cfd);
			continue;
		}
		st->pend[slot] = cfd;
		/* descriptors are allocated lowest first: cfd this high means fewer than the reserve
		 * are left (a consumer needs 3 more): its hello gets the true reason */
		st->pend_short[slot] = (uint64_t)cfd + IBVB_PRODUCER_FD_RESERVE >= st->fd_limit;
		st->pend_deadline[slot] = now + HELLO_TIMEOUT_NS;
	}
}

static void *service(void *arg)
{
	struct ibvb_producer *p = arg;
	struct ibvb__pstate *st = p->st;
	int64_t next_beat = mono_ns() + test_beat_ns();
	struct pollfd pf[POLL_MAX];
	int kind[POLL_MAX], which[POLL_MAX];
	for (;;) {
		int64_t now = mono_ns(), wake_at = next_beat;
		int n = poll_set(st, pf, kind, which, &wake_at);
		int64_t ms = (wake_at - now + 999999) / 1000000;
		if (ms < 0)
			ms = 0;
		if (poll(pf, (nfds_t)n, (int)ms) < 0 && errno != EINTR)
			usleep(10000);
		if (pf[0].revents)
			return NULL;
		now = mono_ns();
		pthread_mutex_lock(&st->mu);
		members_gone_locked(p, pf, kind, which, n);
		if (now >= next_beat) {
			atomic_store_explicit(&p->ctl->heartbeat_ns, ibvb__realtime_ns(), memory_order_relaxed);
			read_cursors_locked(p, 0); /* keep the table's released columns current for `stat` */
			sweep_grave_locked(p);
			next_beat = now + test_beat_ns();
		}
		pthread_mutex_unlock(&st->mu);
		serve_others(p, pf, kind, which, n, now);
		if (pf[1].revents)
			accept_all(st, now);
	}
}

/* ---- create / close --------------------------------------------------------------------------- */

static void destroy(struct ibvb_producer *p, int unlink_files)
{
	struct ibvb__pstate *st = p->st;
	if (st) {
		if (st->thr_on) {
			char c = 'x';
			if (write(st->stop_pipe[1], &c, 1) != 1) {
				/* the pipe cannot be full: one byte ever */
			}
			pthread_join(st->thr, NULL);
			st->thr_on = 0;
		}
		pthread_mutex_lock(&st->mu);
		st->closing = 1;
		for (uint32_t i = 0; i < IBVB_MAX_CONSUMERS_LIMIT; i++) {
			struct pmember *m = &st->m[i];
			if (m->region) {
				/* the row stays "attached": the consumer drains what was published, then reads CLOSED */
				atomic_fetch_add(&m->region->consumer_futex, 1);
				ibvb__futex_wake_all(&m->region->consumer_futex);
				munmap(m->region, IBVB_REGION_SIZE);
				m->region = NULL;
			}
			if (m->fd >= 0)
				close(m->fd);
			m->fd = -1;
			m->on = 0;
		}
		for (size_t j = 0; j < st->ngrave; j++)
			munmap(st->grave[j].region, IBVB_REGION_SIZE);
		free(st->grave);
		st->grave = NULL;
		st->ngrave = 0;
		for (int i = 0; i < MAX_PENDING; i++)
			if (st->pend[i] >= 0)
				close(st->pend[i]);
		for (int i = 0; i < MAX_OBSERVERS; i++)
			if (st->obs[i] >= 0)
				close(st->obs[i]);
		pthread_mutex_unlock(&st->mu);
		if (st->listen_fd >= 0)
			close(st->listen_fd);
		if (st->dirfd >= 0 && unlink_files) {
			char fname[IBVB_NAME_MAX + 16];
			if (st->listen_fd >= 0) {
				snprintf(fname, sizeof fname, "%s%s", st->name, IBVB_SOCK_SUFFIX);
				unlinkat(st->dirfd, fname, 0);
			}
			if (st->lockfd >= 0) {
				/* unlinked while still locked: a producer that opened the old inode sees it replaced */
				snprintf(fname, sizeof fname, "%s%s", st->name, IBVB_LOCK_SUFFIX);
				unlinkat(st->dirfd, fname, 0);
			}
		}
		if (p->ctl)
			munmap(p->ctl, st->ctl_size);
		if (p->data)
			munmap(p->data, st->data_size);
		int fds[] = {st->lockfd, st->dirfd, st->ctl_fd, st->data_fd, st->stop_pipe[0], st->stop_pipe[1]};
		for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
			if (fds[i] >= 0)
				close(fds[i]);
		pthread_mutex_destroy(&st->mu);
		for (size_t i = 0; i < st->ngrants; i++) {
			free(st->grants[i].uids);
			free(st->grants[i].gids);
		}
		free(st->grants);
		free(st->pos_need);
		free(st);
	}
	free(p->free);
	free(p->pos_slot);
	free(p);
}

/* Creation step 1: the options with defaults filled in, each checked, every size overflow-checked before
 * anything is created (spec 2.1 §C). */
static int check_opts(const char *name, const struct ibvb_producer_opts *opts, struct ibvb_producer_opts *out)
{
	if (!name || !ibvb__valid_name(name))
		return fail(-EINVAL, "ring name \"%s\": use 1-64 characters from [A-Za-z0-9_.-], not starting with '.'",
			    name ? name : "(null)");
	struct ibvb_producer_opts o;
	memset(&o, 0, sizeof o);
	if (opts)
		o = *opts;
	if (!o.slot_count)
		o.slot_count = IBVB_PRODUCER_DEFAULT_SLOT_COUNT;
	if (!o.slot_size)
		o.slot_size = IBVB_PRODUCER_DEFAULT_SLOT_SIZE;
	if (!o.max_items)
		o.max_items = IBVB_PRODUCER_DEFAULT_MAX_ITEMS;
	if (!o.meta_size)
		o.meta_size = IBVB_PRODUCER_DEFAULT_META_SIZE;
	if (!o.max_consumers)
		o.max_consumers = IBVB_DEFAULT_MAX_CONSUMERS;
	if (!o.max_observers)
		o.max_observers = IBVB_PRODUCER_DEFAULT_MAX_OBSERVERS;
	if (o.max_observers > IBVB_PRODUCER_MAX_OBSERVERS)
		return fail(-EINVAL, "create ring %s: max observers %u must be in 1..%d", name, o.max_observers,
			    IBVB_PRODUCER_MAX_OBSERVERS);
	if (o.slot_count > IBVB_MAX_SLOT_COUNT || (o.slot_count & (o.slot_count - 1)))
		return fail(-EINVAL, "create ring %s: slot count %llu must be a power of two in 1..%u", name,
			    (unsigned long long)o.slot_count, IBVB_MAX_SLOT_COUNT);
	if (o.slot_size > (1ull << 40))
		return fail(-EINVAL, "create ring %s: slot size %llu is too large", name, (unsigned long long)o.slot_size);
	o.slot_size = align_up(o.slot_size, 64);
	if (o.max_items > IBVB_MAX_ITEMS)
		return fail(-EINVAL, "create ring %s: max items %u must be in 1..%u", name, o.max_items, IBVB_MAX_ITEMS);
	if (o.meta_size < IBVB_META_HEADER_SIZE || o.meta_size > (1ull << 40))
		return fail(-EINVAL, "create ring %s: metadata area of %llu bytes", name, (unsigned long long)o.meta_size);
	if (o.max_consumers > IBVB_MAX_CONSUMERS_LIMIT)
		return fail(-EINVAL, "create ring %s: max consumers %u must be in 1..%d", name, o.max_consumers,
			    IBVB_MAX_CONSUMERS_LIMIT);
	if (o.policy != IBVB_POLICY_DROP && o.policy != IBVB_POLICY_BLOCK)
		return fail(-EINVAL, "create ring %s: policy %u (IBVB_POLICY_DROP or IBVB_POLICY_BLOCK)", name, o.policy);
	if (o.hugepages != IBVB_HUGEPAGES_AUTO && o.hugepages != IBVB_HUGEPAGES_REQUIRE && o.hugepages != IBVB_HUGEPAGES_OFF)
		return fail(-EINVAL, "create ring %s: hugepages %d", name, o.hugepages);
	struct geometry probe;
	if (layout(&o, 1u << 30, &probe) < 0)
		return fail(-EINVAL, "create ring %s: %s", name, ibvb_last_error());
	*out = o;
	return 0;
}

/* Step 2: the producer and its private state, every descriptor -1, the directory and socket paths. */
static struct ibvb_producer *new_producer(const char *name, const struct ibvb_producer_opts *o)
{
	struct ibvb_producer *p = calloc(1, sizeof *p);
	struct ibvb__pstate *st = p ? calloc(1, sizeof *st) : NULL;
	if (!st) {
		free(p);
		return NULL;
	}
	p->st = st;
	pthread_mutex_init(&st->mu, NULL);
	st->stop_pipe[0] = st->stop_pipe[1] = st->dirfd = st->lockfd = st->listen_fd = st->ctl_fd = st->data_fd = -1;
	for (int i = 0; i < IBVB_MAX_CONSUMERS_LIMIT; i++)
		st->m[i].fd = -1;
	for (int i = 0; i < MAX_PENDING; i++)
		st->pend[i] = -1;
	for (int i = 0; i < MAX_OBSERVERS; i++)
		st->obs[i] = -1;
	st->gid = -1;
	st->euid = geteuid();
	st->max_consumers = o->max_consumers;
	st->max_observers = o->max_observers;
	struct rlimit rl;
	st->fd_limit = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? rl.rlim_cur : 1u << 20;
	snprintf(st->name, sizeof st->name, "%s", name);
	if (o->dir && *o->dir)
		snprintf(st->dir, sizeof st->dir, "%s", o->dir);
	else
		default_dir(st->dir, sizeof st->dir, st->euid, st->skipped, sizeof st->skipped);
	snprintf(st->sock_path, sizeof st->sock_path, "%s/%s%s", st->dir, name, IBVB_SOCK_SUFFIX);
	return p;
}

/* Step 2b: the grants (spec §14.1), copied: names 1-64 bytes, bounded lists. */
static int copy_grants(struct ibvb_producer *p, const struct ibvb_producer_opts *o)
{
	struct ibvb__pstate *st = p->st;
	if (!o->ngroups)
		return 0;
	if (!o->groups || o->ngroups > IBVB_PRODUCER_MAX_GRANTS)
		return fail(-EINVAL, "create ring %s: %zu group grants (at most %d)", st->name, o->ngroups,
			    IBVB_PRODUCER_MAX_GRANTS);
	st->grants = calloc(o->ngroups, sizeof *st->grants);
	if (!st->grants)
		return fail(-ENOMEM, "create ring %s: out of memory", st->name);
	st->ngrants = o->ngroups;
	for (size_t i = 0; i < o->ngroups; i++) {
		const struct ibvb_group_grant *g = &o->groups[i];
		struct pgrant *d = &st->grants[i];
		size_t nl = g->name ? strlen(g->name) : 0;
		if (nl < 1 || nl > IBVB_GROUP_NAME_MAX)
			return fail(-EINVAL, "create ring %s: group grant %zu: the name must be 1-%d bytes", st->name, i,
				    IBVB_GROUP_NAME_MAX);
		if (g->nuids + g->ngids > IBVB_PRODUCER_MAX_GRANT_IDS || (g->nuids && !g->uids) || (g->ngids && !g->gids))
			return fail(-EINVAL, "create ring %s: group %s: at most %d uids and gids", st->name, g->name,
				    IBVB_PRODUCER_MAX_GRANT_IDS);
		memcpy(d->name, g->name, nl + 1);
		d->id = ibvb_group_id(g->name);
		d->uids = malloc((g->nuids ? g->nuids : 1) * sizeof *d->uids);
		d->gids = malloc((g->ngids ? g->ngids : 1) * sizeof *d->gids);
		if (!d->uids || !d->gids)
			return fail(-ENOMEM, "create ring %s: out of memory", st->name);
		if (g->nuids)
			memcpy(d->uids, g->uids, g->nuids * sizeof *d->uids);
		if (g->ngids)
			memcpy(d->gids, g->gids, g->ngids * sizeof *d->gids);
		d->nuids = g->nuids;
		d->ngids = g->ngids;
	}
	return 0;
}

/* Step 3: the socket path fits, --group exists, the directory (made safely) and the lock. */
static int claim_name(struct ibvb_producer *p, const struct ibvb_producer_opts *o)
{
	struct ibvb__pstate *st = p->st;
	const char *name = st->name;
	if (strlen(st->sock_path) >= sizeof(((struct sockaddr_un *)0)->sun_path))
		return fail(-ENAMETOOLONG, "create ring %s: socket path %s is too long for a Unix socket", name,
			    st->sock_path);
	if (o->group && *o->group) {
		struct group gr, *res = NULL;
		char buf[8192];
		if (getgrnam_r(o->group, &gr, buf, sizeof buf, &res) != 0 || !res)
			return fail(-EINVAL, "create ring %s: group \"%s\" not found", name, o->group);
		st->gid = (int)gr.gr_gid;
	}
	int rc = open_ring_dir(st);
	return rc < 0 ? rc : take_lock(st);
}

/* Step 4: data memory, then control memory, sized and reserved before a byte is written; the hot path's
 * views of them and its free list. */
static int make_memory(struct ibvb_producer *p, const struct ibvb_producer_opts *o, struct geometry *g)
{
	struct ibvb__pstate *st = p->st;
	const char *name = st->name;
	int rc;
	memset(g, 0, sizeof *g);
	if ((rc = make_data(p, o, g)) < 0)
		return fail(rc, "create ring %s: %s", name, ibvb_last_error());
	st->ctl_size = IBVB_CTL_SIZE_FOR(o->max_consumers);
	char cname[IBVB_NAME_MAX + 32];
	snprintf(cname, sizeof cname, "ibvbridge.%s.ctl", name);
	void *cm;
	if ((rc = new_shm(cname, st->ctl_size, &st->ctl_fd, &cm)) < 0)
		return fail(rc, "create ring %s: control memory: %s", name, ibvb_last_error());
	p->ctl = cm;
	p->rows = (struct ibvb_row *)((uint8_t *)cm + IBVB_OFF_CONSUMER_TABLE);
	p->desc = (struct ibvb_desc *)(p->data + g->desc_off);
	p->items = (struct ibvb_item *)(p->data + g->items_off);
	p->meta = p->data + g->meta_off;
	p->payload = p->data + g->payload_off;
	p->slot_count = o->slot_count;
	p->mask = o->slot_count - 1;
	p->slot_size = o->slot_size;
	p->meta_size = o->meta_size;
	p->max_items = o->max_items;
	p->policy = o->policy;
	p->free = malloc(o->slot_count * sizeof *p->free);
	p->pos_slot = malloc(o->slot_count * sizeof *p->pos_slot);
	st->pos_need = calloc(o->slot_count, sizeof *st->pos_need);
	if (!p->free || !p->pos_slot || !st->pos_need)
		return fail(-ENOMEM, "create ring %s: out of memory", name);
	for (uint64_t i = 0; i < o->slot_count; i++) {
		p->free[i] = (uint32_t)i;
		p->pos_slot[i] = IBVB__NO_SLOT;
	}
	p->free_w = o->slot_count;
	p->take_end = st->window_end = o->slot_count;
	return 0;
}

/* Step 5: the header (spec §2), magic and state last, then the seals: from here on no client can write,
 * grow or shrink either memory; our own mappings stay writable. */
static int write_header(struct ibvb_producer *p, const struct ibvb_producer_opts *o, const struct geometry *g)
{
	struct ibvb__pstate *st = p->st;
	struct ibvb_ctl *c = p->ctl;
	uint64_t sid = 0;
	while (sid == 0)
		if (getrandom(&sid, sizeof sid, 0) != (ssize_t)sizeof sid)
			sid = ibvb__realtime_ns() ^ ((uint64_t)getpid() << 32);
	c->major = IBVB_MAJOR;
	c->minor = IBVB_MINOR;
	c->ctl_size = (uint32_t)st->ctl_size;
	c->policy = o->policy;
	c->session_id = sid;
	c->producer_pid = (uint64_t)getpid();
	c->producer_start_ns = ibvb__realtime_ns();
	c->slot_count = o->slot_count;
	c->slot_size = o->slot_size;
	c->max_items = o->max_items;
	c->desc_size = IBVB_DESC_SIZE;
	c->item_size = IBVB_ITEM_SIZE;
	c->page_size = st->page_size;
	c->data_size = st->data_size;
	c->desc_offset = g->desc_off;
	c->items_offset = g->items_off;
	c->meta_offset = g->meta_off;
	c->meta_size = o->meta_size;
	c->payload_offset = g->payload_off;
	c->packet_offset = g->packet_off;
	c->packet_size = o->packet_size;
	c->features = o->features;
	c->stats_count = IBVB_STATS_COUNT;
	c->max_consumers = o->max_consumers;
	atomic_store(&c->heartbeat_ns, ibvb__realtime_ns());
	atomic_store(&c->head, 0);
	atomic_store(&c->oldest, 0);
	atomic_store_explicit(&c->magic, IBVB_MAGIC, memory_order_relaxed);
	atomic_store_explicit(&c->state, IBVB_STATE_READY, memory_order_release);
	if (fcntl(st->data_fd, F_ADD_SEALS, SEALS_READ_ONLY) < 0 || fcntl(st->ctl_fd, F_ADD_SEALS, SEALS_READ_ONLY) < 0)
		return fail(-errno, "create ring %s: sealing the ring memory: %s", st->name, strerror(errno));
	return 0;
}

/* Step 6: the socket, bound through the directory descriptor: born 0600 (0660 and --group's with one). */
static int listen_socket(struct ibvb_producer *p, const char *group)
{
	struct ibvb__pstate *st = p->st;
	const char *name = st->name;
	char sname[IBVB_NAME_MAX + 16];
	snprintf(sname, sizeof sname, "%s%s", name, IBVB_SOCK_SUFFIX);
	if (unlinkat(st->dirfd, sname, 0) < 0 && errno != ENOENT) /* stale: we hold the lock */
		return fail(-errno, "create ring %s: remove stale %s: %s", name, st->sock_path, strerror(errno));
	st->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (st->listen_fd < 0)
		return fail(-errno, "create ring %s: socket: %s", name, strerror(errno));
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof sa.sun_path, "/proc/self/fd/%d/%s", st->dirfd, sname);
	mode_t old = umask(0177);
	int brc = bind(st->listen_fd, (struct sockaddr *)&sa, sizeof sa);
	int be = errno;
	umask(old);
	if (brc < 0 || listen(st->listen_fd, 64) < 0) {
		int e = brc < 0 ? be : errno;
		close(st->listen_fd);
		st->listen_fd = -1;
		return fail(-e, "create ring %s: listen on %s: %s", name, st->sock_path, strerror(e));
	}
	if (st->gid >= 0 && (fchownat(st->dirfd, sname, (uid_t)-1, (gid_t)st->gid, AT_SYMLINK_NOFOLLOW) < 0 ||
			     fchmodat(st->dirfd, sname, 0660, 0) < 0))
		return fail(-errno, "create ring %s: give %s to group %s: %s", name, st->sock_path, group,
			    strerror(errno));
	return 0;
}

/* Step 7: the service thread (accepts, handshakes, hang-ups, heartbeat). */
static int start_service(struct ibvb_producer *p)
{
	struct ibvb__pstate *st = p->st;
	if (pipe2(st->stop_pipe, O_CLOEXEC) < 0)
		return fail(-errno, "create ring %s: pipe: %s", st->name, strerror(errno));
	int rc = pthread_create(&st->thr, NULL, service, p);
	if (rc != 0)
		return fail(-rc, "create ring %s: pthread_create: %s", st->name, strerror(rc));
	st->thr_on = 1;
	return 0;
}

int ibvb_producer_create(struct ibvb_producer **out, const char *name, const struct ibvb_producer_opts *opts)
{
	*out = NULL;
	struct ibvb_producer_opts o;
	int rc = check_opts(name, opts, &o);
	if (rc < 0)
		return rc;
	struct ibvb_producer *p = new_producer(name, &o);
	if (!p)
		return fail(-ENOMEM, "create ring %s: out of memory", name);
	struct geometry g;
	if ((rc = copy_grants(p, &o)) < 0 || (rc = claim_name(p, &o)) < 0 || (rc = make_memory(p, &o, &g)) < 0 || (rc = write_header(p, &o, &g)) < 0 ||
	    (rc = listen_socket(p, o.group)) < 0 || (rc = start_service(p)) < 0) {
		destroy(p, p->st->lockfd >= 0);
		return rc;
	}
	*out = p;
	return 0;
}

void ibvb_producer_close(struct ibvb_producer *p)
{
	if (!p)
		return;
	ibvb_producer_commit(p);
	ibvb_producer_interrupt(p);
	/* CLOSED is stored after the last head; consumers are woken by destroy after it */
	atomic_store_explicit(&p->ctl->state, IBVB_STATE_CLOSED, memory_order_release);
	atomic_thread_fence(memory_order_seq_cst);
	destroy(p, 1);
}

void ibvb_producer_interrupt(struct ibvb_producer *p)
{
	struct ibvb__pstate *st = p->st;
	atomic_store(&st->interrupted, 1);
	atomic_fetch_add(&st->attach_seq, 1);
	ibvb__futex_wake_all(&st->attach_seq);
	_Atomic uint32_t *w = atomic_load(&st->wait_word);
	if (w && !test_mutant("no-wake"))
		ibvb__futex_wake_all(w); /* at worst a word just unmapped: EFAULT, harmless */
}

int ibvb_producer_consumers(const struct ibvb_producer *p)
{
	return (int)atomic_load_explicit(&p->ctl->stats[IBVB_CTR_CONSUMERS_ATTACHED], memory_order_relaxed);
}

int ibvb_producer_wait_drained(struct ibvb_producer *p, int timeout_ms)
{
	ibvb_producer_commit(p);
	return wait_for(p, WAIT_DRAINED, timeout_ms < 0 ? 0 : mono_ns() + (int64_t)timeout_ms * 1000000LL + 1);
}

void ibvb__producer_ended(struct ibvb_producer *p, const char *what)
{
	(void)fail(-EPIPE, "ring %s: cannot %s: the stream has ended (END_OF_STREAM is final)", p->st->name, what);
}

int ibvb_producer_end_of_stream(struct ibvb_producer *p, uint64_t stop_heap_cnt, int timeout_ms)
{
	struct ibvb__pstate *st = p->st;
	if (p->ended) {
		ibvb__producer_ended(p, "publish a second end-of-stream marker");
		return -EPIPE;
	}
	if (p->free_r == p->free_w || p->free_r == p->take_end) {
		ibvb_producer_commit(p);
		pthread_mutex_lock(&st->mu);
		int ok = check_locked(p, WAIT_SLOT);
		pthread_mutex_unlock(&st->mu);
		if (!ok) {
			if (timeout_ms == 0)
				return fail(-EAGAIN, "ring %s: no free slot for the end-of-stream marker", st->name);
			int rc = wait_for(p, WAIT_SLOT, timeout_ms < 0 ? 0 : mono_ns() + (int64_t)timeout_ms * 1000000LL + 1);
			if (rc == -ETIMEDOUT)
				return fail(-EAGAIN, "ring %s: no free slot for the end-of-stream marker within %d ms",
					    st->name, timeout_ms);
			if (rc < 0)
				return rc;
		}
	}
	struct ibvb_slot s;
	int rc = ibvb_producer_acquire(p, &s); /* a slot is free: no wait */
	if (rc < 0)
		return fail(rc, "ring %s: no free slot for the end-of-stream marker", st->name);
	/* spec §2.3: 1 once the marker is published, so not before a slot for it is taken; before the publish,
	 * so a consumer that sees the marker reads the counter set */
	ibvb_producer_set(p, IBVB_CTR_END_OF_STREAM, 1);
	struct ibvb_publish_info h;
	memset(&h, 0, sizeof h);
	h.heap_cnt = stop_heap_cnt;
	h.flags = IBVB_FLAG_END_OF_STREAM;
	h.timestamp_ns = ibvb__realtime_ns();
	ibvb_producer_publish(p, &s, &h);
	/* The end of the stream wakes consumers whose wakes are coalesced too (wake_at not reached), and group
	 * members for whom the marker is not an assigned position. */
	wake_all(p);
	return 0;
}

int ibvb_producer_set_descriptors(struct ibvb_producer *p, const void *records, size_t len)
{
	if (len > p->meta_size - IBVB_META_HEADER_SIZE)
		return fail(-EMSGSIZE, "ring %s: %zu bytes of descriptors do not fit the %llu-byte metadata area",
			    p->st->name, len, (unsigned long long)p->meta_size);
	struct ibvb_meta_header *h = (struct ibvb_meta_header *)p->meta;
	uint64_t s = atomic_load_explicit(&h->seq, memory_order_relaxed);
	if (s & 1)
		s++;
	atomic_store_explicit(&h->seq, s + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	uint64_t l = len;
	memcpy(&h->length, &l, 8);
	if (len)
		memcpy(p->meta + IBVB_META_HEADER_SIZE, records, len);
	atomic_store_explicit(&h->seq, s + 2, memory_order_release);
	return 0;
}

size_t ibvb_meta_encode(void *buf, size_t cap, uint64_t id, int ndim, const int64_t *shape, const char *name,
			const char *description, const void *fmt, size_t fmt_len, const char *dtype)
{
	uint32_t nl = (uint32_t)strlen(name), dl = (uint32_t)strlen(description), fl = (uint32_t)fmt_len,
		 tl = (uint32_t)strlen(dtype);
	uint32_t nd = ndim < 0 ? IBVB_META_NDIM_UNKNOWN : (uint32_t)ndim;
	uint32_t nshape = ndim < 0 ? 0 : (uint32_t)ndim;
	size_t size = (size_t)align_up((uint64_t)IBVB_META_RECORD_HEADER_SIZE + nshape * 8ull + nl + dl + fl + tl, 8);
	if (size > cap || !buf)
		return size;
	uint8_t *r = buf;
	memset(r, 0, size);
	uint32_t size32 = (uint32_t)size;
	memcpy(r + 0, &size32, 4);
	memcpy(r + 4, &nd, 4);
	memcpy(r + 8, &id, 8);
	memcpy(r + 16, &nl, 4);
	memcpy(r + 20, &dl, 4);
	memcpy(r + 24, &fl, 4);
	memcpy(r + 28, &tl, 4);
	if (nshape)
		memcpy(r + 32, shape, nshape * 8ull);
	uint8_t *s = r + 32 + nshape * 8ull;
	memcpy(s, name, nl);
	s += nl;
	memcpy(s, description, dl);
	s += dl;
	if (fl)
		memcpy(s, fmt, fl);
	s += fl;
	memcpy(s, dtype, tl);
	return size;
}

uint64_t ibvb_producer_counter(const struct ibvb_producer *p, unsigned idx)
{
	if (idx >= IBVB_STATS_SLOTS)
		return 0;
	return atomic_load_explicit(&p->ctl->stats[idx], memory_order_relaxed);
}

const char *ibvb_producer_socket_path(const struct ibvb_producer *p) { return p->st->sock_path; }
uint64_t ibvb_producer_session_id(const struct ibvb_producer *p) { return p->ctl->session_id; }
uint32_t ibvb_producer_page_size(const struct ibvb_producer *p) { return p->st->page_size; }
int ibvb_producer_ctl_fd(const struct ibvb_producer *p) { return p->st->ctl_fd; }
int ibvb_producer_data_fd(const struct ibvb_producer *p) { return p->st->data_fd; }
