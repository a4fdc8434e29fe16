/* ibvbridge.c — attach/detach, waiting, liveness and metadata for the ibvbridge C consumer.
 * Implements docs/ring-layout.md 2.0 §1 (socket lookup, handshake), §6, §7.4-§7.6 and §9 (consumer side).
 * Only libc. */
#define _GNU_SOURCE
#include "ibvbridge.h"
#include "ibvbridge_internal.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>


#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

#define WAIT_SLICE_NS 250000000LL /* spec §7.5: futex sleeps are at most 250 ms */
#define RETRY_NS 10000000LL       /* attach: retry every 10 ms (spec §9 step 1) */
#define HANDSHAKE_MIN_MS 2000     /* the welcome may take this long even with a shorter attach timeout */
#define MAX_FDS 8                 /* descriptors accepted from one record (extra ones are closed) */






void ibvb_full_fence(void) { atomic_thread_fence(memory_order_seq_cst); }
void ibvb_acquire_fence(void) { atomic_thread_fence(memory_order_acquire); }
void ibvb_release_fence(void) { atomic_thread_fence(memory_order_release); }

uint32_t ibvb_consumer_index(const struct ibvb_ring *r) { return r->consumer_index; }

/* ---- names and the socket (spec §1.1) -------------------------------------------------------------- */


#define MAX_DIRS 3
#define PATH_CAP sizeof(((struct sockaddr_un *)0)->sun_path)
#define DEFAULT_WELCOME_MS 5000 /* spec 2.1 §1.2: the welcome's timeout when the attach has none */

struct target {
	char name[IBVB_NAME_MAX + 1];        /* for messages */
	char sock[IBVB_NAME_MAX + 16];       /* NAME.v2.sock: the file name in a directory */
	int ndirs;
	int given;                           /* the directory (or socket path) was given: untrusted = refuse */
	char dirs[MAX_DIRS][PATH_MAX];       /* candidate directories, in lookup order */
	int warned[MAX_DIRS];                /* an untrusted directory was named in a warning */
	uint32_t dir_uid;                    /* the connected socket's (trusted) directory */
	uint32_t dir_mode;
	int which;                           /* index of that directory */
	uint32_t group_id;                   /* the hello's group_id (spec §14), 0 for none */
};

static int add_dir(struct target *t, const char *dir)
{
	for (int i = 0; i < t->ndirs; i++)
		if (!strcmp(t->dirs[i], dir))
			return 0;
	if (snprintf(t->dirs[t->ndirs], PATH_MAX, "%s", dir) >= PATH_MAX)
		return fail(-ENAMETOOLONG, "ring %s: directory %s is too long", t->name, dir);
	t->ndirs++;
	return 0;
}

static int resolve(const char *arg, const char *dir, struct target *t)
{
	memset(t, 0, sizeof *t);
	size_t n = strlen(arg), sl = strlen(IBVB_SOCK_SUFFIX);
	if (strchr(arg, '/')) {
		if (n <= sl || strcmp(arg + n - sl, IBVB_SOCK_SUFFIX) != 0)
			return fail(-EINVAL, "ring socket path %s must end in %s", arg, IBVB_SOCK_SUFFIX);
		const char *base = strrchr(arg, '/') + 1;
		size_t bl = strlen(base) - sl;
		if (bl > IBVB_NAME_MAX)
			return fail(-EINVAL, "ring socket path %s: the name is longer than %d characters", arg,
				    IBVB_NAME_MAX);
		memcpy(t->name, base, bl);
		memcpy(t->sock, base, strlen(base) + 1);
		t->given = 1;
		if (base - arg >= PATH_MAX)
			return fail(-ENAMETOOLONG, "ring socket path %s is too long", arg);
		t->ndirs = 1;
		if (base - arg == 1)
			snprintf(t->dirs[0], PATH_MAX, "/");
		else
			snprintf(t->dirs[0], PATH_MAX, "%.*s", (int)(base - arg - 1), arg);
		return 0;
	}
	if (!ibvb__valid_name(arg))
		return fail(-EINVAL, "ring name \"%s\": use 1-64 characters from [A-Za-z0-9_.-], not starting with '.'",
			    arg);
	memcpy(t->name, arg, n + 1);
	snprintf(t->sock, sizeof t->sock, "%s%s", arg, IBVB_SOCK_SUFFIX);
	const char *env = getenv(IBVB_DIR_ENV);
	if (dir || (env && env[0])) {
		t->given = 1;
		return add_dir(t, dir ? dir : env);
	}
	char own[PATH_MAX];
	if (ibvb__own_default_dir(own, sizeof own) < 0)
		return fail(-ENAMETOOLONG, "ring %s: the default directory ($XDG_RUNTIME_DIR) is too long", t->name);
	int rc = add_dir(t, own);
	if (rc == 0 && ibvb__next_default_dir(own, sizeof own) == 0)
		rc = add_dir(t, own); /* 2.2: where a producer goes when a stranger made the first */
	return rc < 0 ? rc : add_dir(t, IBVB_RUN_DIR);
}

/* Spec §1.2: the uids a consumer trusts to serve a ring. */
int ibvb_peer_uid_trusted(uint32_t peer_uid, uint32_t euid, uint32_t dir_uid, uint32_t dir_mode)
{
	if (peer_uid == 0 || peer_uid == euid)
		return 1;
	return peer_uid == dir_uid && (dir_mode & (S_IWGRP | S_IWOTH)) == 0;
}

static int check_peer(const struct target *t, int fd)
{
	struct ucred cr;
	socklen_t len = sizeof cr;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
		return fail(-errno, "ring %s: SO_PEERCRED on %s/%s: %s", t->name, t->dirs[t->which], t->sock,
			    strerror(errno));
	if (!ibvb_peer_uid_trusted(cr.uid, geteuid(), t->dir_uid, t->dir_mode))
		return fail(-EPERM, "ring %s: socket %s/%s served by uid %u, which is not trusted", t->name,
			    t->dirs[t->which], t->sock, (unsigned)cr.uid);
	return 0;
}

enum lookup { FOUND, NOT_FOUND, STALE };

/* connect() to NAME.v2.sock inside the directory open as dfd (through /proc/self/fd: the directory checked
 * is the one connected in). 0 and *sock; 1 refused (stale); -errno. */
static int connect_in(const struct target *t, int dfd, int *sock)
{
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof sa.sun_path, "/proc/self/fd/%d/%s", dfd, t->sock);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return fail(-errno, "ring %s: socket: %s", t->name, strerror(errno));
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
		*sock = fd;
		return 0;
	}
	int e = errno;
	close(fd);
	if (e == ECONNREFUSED || e == ENOENT)
		return 1;
	if (e == EACCES || e == EPERM)
		return fail(-EACCES, "ring %s: connect %s/%s: %s", t->name, t->dirs[t->which], t->sock, strerror(e));
	return fail(-e, "ring %s: connect %s/%s: %s", t->name, t->dirs[t->which], t->sock, strerror(e));
}

/* One pass over the directories (spec 2.1 §1.1): the first trusted one holding a live socket wins.
 * FOUND (*sock), NOT_FOUND, STALE (*stale_dir: the first refusing socket's directory), or -errno. */
static int try_connect(struct target *t, int *sock, int *stale_dir)
{
	int result = NOT_FOUND;
	uid_t euid = geteuid();
	for (int i = 0; i < t->ndirs; i++) {
		int dfd;
		struct stat st, sst;
		char why[PATH_MAX + 100];
		int rc = ibvb__open_trusted_dir(t->dirs[i], euid, &dfd, &st, why, sizeof why);
		if (rc == -ENOENT)
			continue;
		if (rc == -EPERM && t->given)
			return fail(-EPERM, "ring %s: refusing untrusted directory %s", t->name, why);
		if (rc == -EPERM) {
			if (!t->warned[i])
				ibvb__warn("skipping %s", why);
			t->warned[i] = 1;
			continue;
		}
		if (rc < 0)
			return fail(rc, "ring %s: %s", t->name, why);
		t->which = i;
		if (fstatat(dfd, t->sock, &sst, AT_SYMLINK_NOFOLLOW) < 0) {
			close(dfd);
			continue;
		}
		rc = connect_in(t, dfd, sock);
		close(dfd);
		if (rc < 0)
			return rc;
		if (rc == 0) {
			t->dir_uid = st.st_uid;
			t->dir_mode = st.st_mode;
			return FOUND;
		}
		if (result == NOT_FOUND)
			*stale_dir = i;
		result = STALE;
	}
	return result;
}

/* Connect (spec 2.1 §9 step 1): not found fails at once unless wait; stale is retried until the deadline.
 * Once a stale socket was seen, its disappearance is retried too: a starting producer removes the stale
 * socket before it binds its own, and a client between the two must not report the ring missing. */
static int find_and_connect(struct target *t, int wait, int64_t deadline)
{
	int seen_stale = 0;
	for (;;) {
		int sock = -1, stale = 0;
		int rc = try_connect(t, &sock, &stale);
		if (rc < 0)
			return rc;
		if (rc == FOUND)
			return sock;
		seen_stale |= rc == STALE;
		int64_t now = mono_ns();
		if (now >= deadline || (rc == NOT_FOUND && !wait && !seen_stale)) {
			if (rc == STALE)
				return fail(-ECONNREFUSED,
					    "ring %s: stale socket %s/%s (no producer; `ibvbridge rm --stale` removes it)",
					    t->name, t->dirs[stale], t->sock);
			if (t->ndirs > 1)
				return fail(-ENOENT, "ring %s not found (looked in %s, %s)", t->name, t->dirs[0], t->dirs[1]);
			return fail(-ENOENT, "ring %s not found (looked in %s)", t->name, t->dirs[0]);
		}
		ibvb__sleep_ns(deadline - now < RETRY_NS ? deadline - now : RETRY_NS);
	}
}

/* ---- handshake (spec §1.2, §9 step 3) -------------------------------------------------------------- */

struct welcome_fds {
	int fd[3];
	int n;
};

static void close_fds(int *fds, int n)
{
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

static int send_hello(const struct target *t, int sock, int start)
{
	struct ibvb_hello hello;
	memset(&hello, 0, sizeof hello);
	hello.magic = IBVB_MAGIC;
	hello.major = IBVB_MAJOR;
	hello.minor = IBVB_MINOR;
	hello.role = IBVB_ROLE_CONSUMER;
	hello.start = (uint32_t)start;
	hello.group_id = t->group_id; /* spec §14 */
	ssize_t k = send(sock, &hello, sizeof hello, MSG_NOSIGNAL);
	if (k != (ssize_t)sizeof hello)
		return fail(k < 0 ? -errno : -EPROTO, "ring %s: sending hello: %s", t->name,
			    k < 0 ? strerror(errno) : "short send");
	return 0;
}

/* Wait until the welcome (or an error record) is there, up to deadline_ns (INT64_MAX: forever). */
static int await_record(const struct target *t, int sock, int64_t deadline_ns)
{
	for (;;) {
		int ms = -1;
		if (deadline_ns != INT64_MAX) {
			int64_t left = deadline_ns - mono_ns();
			if (left <= 0)
				return fail(-ETIMEDOUT, "ring %s: the producer did not answer (no welcome in time)", t->name);
			ms = (int)((left + 999999) / 1000000);
		}
		struct pollfd pfd = {.fd = sock, .events = POLLIN};
		int pr = poll(&pfd, 1, ms);
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr < 0)
			return fail(-errno, "ring %s: poll: %s", t->name, strerror(errno));
		if (pr > 0)
			return 0;
	}
}

/* One record into buf (its length, or -errno) and the descriptors that came with it (fds, *nfds). */
static ssize_t recv_record(const struct target *t, int sock, uint8_t *buf, size_t cap, int *fds, int *nfds,
			   int *truncated)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int) * MAX_FDS)];
	} cm;
	struct iovec iov = {.iov_base = buf, .iov_len = cap};
	struct msghdr msg;
	memset(&msg, 0, sizeof msg);
	memset(&cm, 0, sizeof cm);
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = cm.b;
	msg.msg_controllen = sizeof cm.b;
	ssize_t n;
	do
		n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return fail(-errno, "ring %s: receiving welcome: %s", t->name, strerror(errno));
	*nfds = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t cnt = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < cnt && *nfds < MAX_FDS; i++)
			memcpy(&fds[(*nfds)++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
	}
	*truncated = (msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) != 0;
	return n;
}

/* An error record's status as -errno, with the producer's message (m: NUL-terminated). */
static int refused(const struct target *t, const struct ibvb_error_record *er, const char *m)
{
	int rc;
	switch (er->status) {
	case IBVB_STATUS_VERSION:
		rc = fail(-EPROTONOSUPPORT, "ring %s is layout %u.%u; this client speaks %d.%d (%s)", t->name,
			  er->major, er->minor, IBVB_MAJOR, IBVB_MINOR, m);
		break;
	case IBVB_STATUS_NOT_PERMITTED:
		rc = fail(-EACCES, "ring %s: not permitted: %s", t->name, m);
		break;
	case IBVB_STATUS_BUSY:
		rc = fail(-EBUSY, "ring %s busy: %s", t->name, m);
		break;
	case IBVB_STATUS_CLOSING:
		rc = fail(-ESHUTDOWN, "ring %s is closing: %s", t->name, m);
		break;
	case IBVB_STATUS_PROTOCOL:
		rc = fail(-EPROTO, "ring %s: protocol error: %s", t->name, m);
		break;
	default:
		rc = fail(-EPROTO, "ring %s: unknown status %u: %s", t->name, er->status, m);
	}
	return rc;
}

static int handshake(const struct target *t, int sock, int start, int64_t deadline_ns, struct ibvb_welcome *w,
		     struct welcome_fds *wf)
{
	uint8_t buf[IBVB_ERROR_RECORD_MAX];
	int fds[MAX_FDS], nfds = 0, trunc = 0, rc;
	if ((rc = send_hello(t, sock, start)) < 0 || (rc = await_record(t, sock, deadline_ns)) < 0)
		return rc;
	ssize_t n = recv_record(t, sock, buf, sizeof buf, fds, &nfds, &trunc);
	if (n < 0)
		return (int)n;
	if (n == 0) {
		rc = fail(-EPROTO, "ring %s: the producer closed the connection without a welcome", t->name);
		goto bad;
	}
	if (trunc) {
		rc = fail(-EPROTO, "ring %s: malformed welcome: record or descriptors truncated", t->name);
		goto bad;
	}
	if (n < 16) {
		rc = fail(-EPROTO, "ring %s: malformed welcome: %zd bytes", t->name, n);
		goto bad;
	}
	struct ibvb_error_record er;
	memset(&er, 0, sizeof er);
	memcpy(&er, buf, (size_t)n);
	if (er.magic != IBVB_MAGIC) {
		rc = fail(-EPROTO, "ring %s: malformed welcome: bad magic %#llx", t->name, (unsigned long long)er.magic);
		goto bad;
	}
	if (er.status != IBVB_STATUS_OK) {
		char m[sizeof er.message + 1];
		size_t ml = n > 16 ? (size_t)n - 16 : 0;
		memcpy(m, er.message, ml);
		m[ml] = 0; /* the message is NUL-terminated; this bounds one that is not */
		rc = refused(t, &er, m);
		goto bad;
	}
	if (n < IBVB_WELCOME_SIZE) {
		rc = fail(-EPROTO, "ring %s: malformed welcome: %zd bytes, want %d", t->name, n, IBVB_WELCOME_SIZE);
		goto bad;
	}
	memcpy(w, buf, sizeof *w);
	if (w->major != IBVB_MAJOR) { /* another major refuses with status 1: a welcome claiming one is malformed */
		rc = fail(-EPROTO, "ring %s: malformed welcome: status 0 with major %u (this client speaks %d.%d)",
			  t->name, w->major, IBVB_MAJOR, IBVB_MINOR);
		goto bad;
	}
	if (nfds != 3) {
		rc = fail(-EPROTO, "ring %s: malformed welcome: %d descriptors, want 3", t->name, nfds);
		goto bad;
	}
	if (w->consumer_index == IBVB_NO_CONSUMER_INDEX || w->region_size != IBVB_REGION_SIZE) {
		rc = fail(-EPROTO, "ring %s: malformed welcome: consumer_index %u, region_size %llu", t->name,
			  w->consumer_index, (unsigned long long)w->region_size);
		goto bad;
	}
	memcpy(wf->fd, fds, sizeof wf->fd);
	wf->n = 3;
	return 0;
bad:
	close_fds(fds, nfds);
	return rc;
}

/* ---- seals, sizes and geometry (spec §9 steps 4-5) ------------------------------------------------- */

static int check_fd(const struct target *t, int fd, const char *what, int seals, uint64_t size)
{
	int s = fcntl(fd, F_GET_SEALS);
	if (s < 0)
		return fail(-EBADMSG, "ring %s: %s memory is not sealable (F_GET_SEALS: %s)", t->name, what,
			    strerror(errno));
	if ((s & seals) != seals)
		return fail(-EBADMSG, "ring %s: %s memory is missing seals (has %#x, needs %#x)", t->name, what, s,
			    seals);
	struct stat st;
	if (fstat(fd, &st) < 0)
		return fail(-errno, "ring %s: fstat %s memory: %s", t->name, what, strerror(errno));
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != size)
		return fail(-EBADMSG, "ring %s: %s memory is %lld bytes, the welcome says %llu", t->name, what,
			    (long long)st.st_size, (unsigned long long)size);
	return 0;
}

struct span {
	const char *name;
	uint64_t off, size;
};

static int validate_ctl(const struct target *t, const struct ibvb_ctl *c, const struct ibvb_welcome *w)
{
	const char *ring = t->name;
	uint64_t magic = atomic_load_explicit(&c->magic, memory_order_acquire);
	if (magic != IBVB_MAGIC)
		return fail(-EBADMSG, "ring %s corrupt: bad magic %#llx", ring, (unsigned long long)magic);
	if (c->major != IBVB_MAJOR)
		return fail(-EPROTONOSUPPORT, "ring %s is layout %u.%u; this client speaks %d.%d", ring, c->major,
			    c->minor, IBVB_MAJOR, IBVB_MINOR);
	uint32_t state = atomic_load_explicit(&c->state, memory_order_acquire);
	if (state != IBVB_STATE_READY && state != IBVB_STATE_CLOSED)
		return fail(-EBADMSG, "ring %s corrupt: state %u", ring, state);
	uint32_t mc = c->max_consumers;
	if (mc < 1 || mc > IBVB_MAX_CONSUMERS_LIMIT)
		return fail(-EBADMSG, "ring %s corrupt: max_consumers %u not in 1..%d", ring, mc,
			    IBVB_MAX_CONSUMERS_LIMIT);
	if (c->ctl_size != IBVB_CTL_SIZE_FOR(mc) || c->ctl_size != w->ctl_size)
		return fail(-EBADMSG, "ring %s corrupt: ctl_size %u, want %llu for %u consumers (welcome: %llu)", ring,
			    c->ctl_size, (unsigned long long)IBVB_CTL_SIZE_FOR(mc), mc,
			    (unsigned long long)w->ctl_size);
	if (w->consumer_index >= mc)
		return fail(-EBADMSG, "ring %s corrupt: consumer_index %u >= max_consumers %u", ring,
			    w->consumer_index, mc);
	if (c->session_id != w->session_id)
		return fail(-EBADMSG, "ring %s corrupt: session_id %#llx, the welcome says %#llx", ring,
			    (unsigned long long)c->session_id, (unsigned long long)w->session_id);
	uint64_t sc = c->slot_count, ss = c->slot_size, dsz = c->data_size;
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
	if (dsz == 0 || dsz % ps != 0)
		return fail(-EBADMSG, "ring %s corrupt: data_size %llu is not a non-zero multiple of page_size %u",
			    ring, (unsigned long long)dsz, ps);
	if (dsz != w->data_size)
		return fail(-EBADMSG, "ring %s corrupt: data_size %llu, the welcome says %llu", ring,
			    (unsigned long long)dsz, (unsigned long long)w->data_size);
	if (dsz > (uint64_t)SIZE_MAX / 2)
		return fail(-EBADMSG, "ring %s corrupt: data_size %llu too large", ring, (unsigned long long)dsz);
	if (c->meta_size < IBVB_META_HEADER_SIZE)
		return fail(-EBADMSG, "ring %s corrupt: meta_size %llu < %d", ring, (unsigned long long)c->meta_size,
			    IBVB_META_HEADER_SIZE);
	uint64_t desc_bytes, item_bytes, payload_bytes;
	if (__builtin_mul_overflow(sc, (uint64_t)IBVB_DESC_SIZE, &desc_bytes) ||
	    __builtin_mul_overflow(sc, (uint64_t)mi * IBVB_ITEM_SIZE, &item_bytes) ||
	    __builtin_mul_overflow(sc, ss, &payload_bytes))
		return fail(-EBADMSG, "ring %s corrupt: region sizes overflow", ring);
	struct span rg[5] = {
	    {"descriptors", c->desc_offset, desc_bytes},   {"item tables", c->items_offset, item_bytes},
	    {"metadata", c->meta_offset, c->meta_size},     {"payload", c->payload_offset, payload_bytes},
	    {"packet area", c->packet_offset, c->packet_size},
	};
	for (int i = 0; i < 5; i++) {
		uint64_t end;
		if (rg[i].size && rg[i].off % IBVB_REGION_ALIGN != 0) /* size 0: only off <= data_size (§9 step 5) */
			return fail(-EBADMSG, "ring %s corrupt: %s offset %llu is not %d-aligned", ring, rg[i].name,
				    (unsigned long long)rg[i].off, IBVB_REGION_ALIGN);
		if (__builtin_add_overflow(rg[i].off, rg[i].size, &end) || end > dsz)
			return fail(-EBADMSG, "ring %s corrupt: %s [%llu, +%llu) runs past data_size %llu", ring,
				    rg[i].name, (unsigned long long)rg[i].off, (unsigned long long)rg[i].size,
				    (unsigned long long)dsz);
		for (int j = 0; j < i; j++) {
			if (rg[i].size && rg[j].size && rg[i].off < rg[j].off + rg[j].size && rg[j].off < end)
				return fail(-EBADMSG, "ring %s corrupt: %s overlaps %s", ring, rg[i].name, rg[j].name);
		}
	}
	return 0;
}

/* ---- attach / detach ----------------------------------------------------------------------------- */

int ibvb_attach(struct ibvb_ring **out, const char *arg, int timeout_ms)
{
	return ibvb_attach_opts(out, arg, timeout_ms, NULL);
}

/* The mappings an attach makes, undone together if a later step fails. */
struct mapped {
	const struct ibvb_ctl *ctl; /* NULL until mapped */
	uint64_t ctl_size;
	const void *data;           /* MAP_FAILED until mapped */
	uint64_t data_size;
	void *region;               /* MAP_FAILED until mapped */
	void *own;                  /* private item copies, MAP_FAILED until mapped */
	uint64_t own_size;
	struct ibvb_chunk_geometry chunks; /* spec §13.5, validated with the header */
	struct ibvb_ctl hdr;        /* private copy of the control memory's fixed part: validated, then used (§9.1) */
};

static void unmap_all(struct mapped *mp)
{
	if (mp->own != MAP_FAILED)
		munmap(mp->own, (size_t)mp->own_size);
	if (mp->region != MAP_FAILED)
		munmap(mp->region, IBVB_REGION_SIZE);
	if (mp->data != MAP_FAILED)
		munmap((void *)mp->data, (size_t)mp->data_size);
	if (mp->ctl)
		munmap((void *)mp->ctl, (size_t)mp->ctl_size);
}

/* Attach steps 1-3 (spec §9): find and connect the socket, check the server, hello and welcome. The
 * socket's fd, or -errno (nothing left open). */
static int connect_and_greet(struct target *t, int timeout_ms, int wait, int start, struct ibvb_welcome *w,
			     struct welcome_fds *wf)
{
	int64_t deadline = timeout_ms < 0 ? INT64_MAX : mono_ns() + (int64_t)timeout_ms * 1000000LL;
	int sock = find_and_connect(t, wait, deadline), rc;
	if (sock < 0)
		return sock;
	int64_t hs_deadline = deadline == INT64_MAX ? mono_ns() + DEFAULT_WELCOME_MS * 1000000LL : deadline;
	if (hs_deadline < mono_ns() + HANDSHAKE_MIN_MS * 1000000LL)
		hs_deadline = mono_ns() + HANDSHAKE_MIN_MS * 1000000LL;
	if ((rc = check_peer(t, sock)) < 0 || (rc = handshake(t, sock, start, hs_deadline, w, wf)) < 0) {
		close(sock);
		return rc;
	}
	return sock;
}

/* Step 4: seals and sizes, before mapping anything. */
static int check_memory(const struct target *t, const struct ibvb_welcome *w, const struct welcome_fds *wf)
{
	const int ro_seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE;
	int rc;
	if (w->ctl_size < IBVB_CTL_FIXED_SIZE || w->ctl_size > IBVB_CTL_SIZE_FOR(IBVB_MAX_CONSUMERS_LIMIT) ||
	    w->ctl_size % 4096 != 0)
		return fail(-EBADMSG, "ring %s corrupt: welcome ctl_size %llu", t->name, (unsigned long long)w->ctl_size);
	if (w->data_size == 0 || w->data_size > (uint64_t)SIZE_MAX / 2)
		return fail(-EBADMSG, "ring %s corrupt: welcome data_size %llu", t->name,
			    (unsigned long long)w->data_size);
	if ((rc = check_fd(t, wf->fd[0], "control", ro_seals, w->ctl_size)) < 0 ||
	    (rc = check_fd(t, wf->fd[1], "data", ro_seals, w->data_size)) < 0 ||
	    (rc = check_fd(t, wf->fd[2], "consumer region", F_SEAL_SHRINK | F_SEAL_GROW, IBVB_REGION_SIZE)) < 0)
		return rc;
	return 0;
}

/* Steps 5-6: the control memory read-only, validated before the data is mapped; the data read-only, the
 * region read-write; the private item copies (spec 2.1 §A: as large as the ring's item tables, so within
 * data_size, checked; reserved, not committed: only the entries heaps use are touched). */
static int map_ring(const struct target *t, const struct ibvb_welcome *w, const struct welcome_fds *wf,
		    struct mapped *mp)
{
	int rc;
	void *m = mmap(NULL, (size_t)w->ctl_size, PROT_READ, MAP_SHARED, wf->fd[0], 0);
	if (m == MAP_FAILED)
		return fail(-errno, "ring %s: mmap control memory: %s", t->name, strerror(errno));
	mp->ctl = (const struct ibvb_ctl *)m;
	mp->ctl_size = w->ctl_size;
	/* Copy before validating: a producer can rewrite its header at any time, so every value used from here
	 * on is the one checked (spec §9.1), never a second read of shared memory. */
	memcpy(&mp->hdr, m, sizeof mp->hdr);
	if ((rc = validate_ctl(t, &mp->hdr, w)) < 0 || (rc = ibvb__chunk_load(t->name, &mp->hdr, &mp->chunks)) < 0)
		return rc;
	mp->data_size = w->data_size;
	mp->data = mmap(NULL, (size_t)mp->data_size, PROT_READ, MAP_SHARED, wf->fd[1], 0);
	if (mp->data == MAP_FAILED)
		return fail(-errno, "ring %s: mmap data memory (%llu bytes): %s", t->name,
			    (unsigned long long)mp->data_size, strerror(errno));
	mp->region = mmap(NULL, IBVB_REGION_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, wf->fd[2], 0);
	if (mp->region == MAP_FAILED)
		return fail(-errno, "ring %s: mmap consumer region: %s", t->name, strerror(errno));
	mp->own_size = mp->hdr.slot_count * mp->hdr.max_items * IBVB_ITEM_SIZE;
	mp->own = mmap(NULL, (size_t)mp->own_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		       -1, 0);
	if (mp->own == MAP_FAILED)
		return fail(-errno, "ring %s: mmap item copies (%llu bytes): %s", t->name,
			    (unsigned long long)mp->own_size, strerror(errno));
	return 0;
}

/* The handle over validated mappings; the read position is the start the producer stored in tail (§7.1). */
static void init_ring(struct ibvb_ring *r, const struct target *t, const struct ibvb_welcome *w,
		      const struct mapped *mp, int sock)
{
	const struct ibvb_ctl *c = &mp->hdr; /* the validated copy */
	r->ctl = mp->ctl;
	r->row = (const struct ibvb_row *)((const uint8_t *)mp->ctl + IBVB_OFF_CONSUMER_TABLE +
					   (uint64_t)w->consumer_index * IBVB_ROW_SIZE);
	r->region = (struct ibvb_region *)mp->region;
	r->data = (const uint8_t *)mp->data;
	r->own_items = mp->own;
	r->own_items_size = mp->own_size;
	r->desc = (const struct ibvb_desc *)(r->data + c->desc_offset);
	r->items = (const struct ibvb_item *)(r->data + c->items_offset);
	r->payload = r->data + c->payload_offset;
	r->meta = r->data + c->meta_offset;
	r->meta_size = c->meta_size;
	r->slot_count = c->slot_count;
	r->mask = c->slot_count - 1;
	r->slot_size = c->slot_size;
	r->max_items = c->max_items;
	r->data_size = mp->data_size;
	r->ctl_size = mp->ctl_size;
	r->session_id = c->session_id;
	r->consumer_index = w->consumer_index;
	r->generation = w->generation;
	r->row_state_ok = IBVB_CONSUMER_ATTACHED;
	r->chunks = mp->chunks;
	r->max_latency_ns = IBVB_DEFAULT_MAX_LATENCY_NS;
	r->coalesce_heaps = c->slot_count / 2 < 1 ? 1 : c->slot_count / 2;
	r->sock = sock;
	snprintf(r->name, sizeof r->name, "%s", t->name);
	ibvb_set_spin_budget(r, IBVB_DEFAULT_SPIN_BUDGET_NS);
	r->read = r->released = r->stored = r->cached_head =
	    atomic_load_explicit(&r->region->tail, memory_order_acquire);
	r->read_stored = r->read; /* the producer stored read = tail before the welcome */
	r->release_batch = r->slot_count / 8 < 1 ? 1 : (r->slot_count / 8 > 64 ? 64 : r->slot_count / 8);
	r->group_id = t->group_id;
}

uint32_t ibvb_group_id(const char *name)
{
	if (!name || !*name)
		return 0;
	uint32_t h = 0x811C9DC5u; /* FNV-1a 32 (spec §14) */
	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 0x01000193u;
	return h ? h : 1;
}

/* The handle: a group member's also holds mine[slot_count] (which held positions are its own, spec §14)
 * right after it, freed with it. */
static struct ibvb_ring *alloc_ring(const struct target *t, const struct ibvb_welcome *w, const struct mapped *mp)
{
	uint64_t extra = t->group_id ? mp->hdr.slot_count : 0;
	if (t->group_id && w->consumer_index >= 64) {
		fail(-EPROTO, "ring %s: group member given row %u (assign has 64 bits)", t->name, w->consumer_index);
		return NULL;
	}
	if (extra > SIZE_MAX - sizeof(struct ibvb_ring)) {
		fail(-ENOMEM, "ring %s: out of memory", t->name);
		return NULL;
	}
	struct ibvb_ring *r = calloc(1, sizeof *r + (size_t)extra);
	if (!r) {
		fail(-ENOMEM, "ring %s: out of memory", t->name);
		return NULL;
	}
	if (t->group_id) {
		r->mine = (uint8_t *)(r + 1);
		r->group_bit = 1ull << w->consumer_index;
	}
	return r;
}

int ibvb_attach_opts(struct ibvb_ring **out, const char *arg, int timeout_ms, const struct ibvb_attach_opts *opts)
{
	struct target t;
	struct welcome_fds wf = {{-1, -1, -1}, 0};
	struct ibvb_welcome w;
	struct mapped mp;
	memset(&mp, 0, sizeof mp);
	mp.data = MAP_FAILED, mp.region = MAP_FAILED, mp.own = MAP_FAILED;
	memset(&w, 0, sizeof w);
	ibvb__set_error("");
	if (!out || !arg)
		return fail(-EINVAL, "ibvb_attach: NULL argument");
	*out = NULL;
	int start = opts ? opts->start : IBVB_START_OLDEST, rc;
	if (start != IBVB_START_OLDEST && start != IBVB_START_HEAD)
		return fail(-EINVAL, "ibvb_attach: start %d is neither IBVB_START_OLDEST nor IBVB_START_HEAD", start);
	if (opts && opts->group && strlen(opts->group) > IBVB_GROUP_NAME_MAX)
		return fail(-EINVAL, "ibvb_attach: consumer group name %.16s…: want 1 to %d bytes", opts->group,
			    IBVB_GROUP_NAME_MAX);
	if ((rc = resolve(arg, opts ? opts->dir : NULL, &t)) < 0)
		return rc;
	if ((t.group_id = ibvb_group_id(opts ? opts->group : NULL)) != 0)
		start = IBVB_START_HEAD; /* a member always starts at head (spec §14) */
	int sock = connect_and_greet(&t, timeout_ms, opts && (opts->flags & IBVB_ATTACH_WAIT), start, &w, &wf);
	if (sock < 0)
		return sock;
	struct ibvb_ring *r = NULL;
	if ((rc = check_memory(&t, &w, &wf)) < 0 || (rc = map_ring(&t, &w, &wf, &mp)) < 0)
		goto err;
	if (!(r = alloc_ring(&t, &w, &mp))) {
		rc = w.consumer_index >= 64 ? -EPROTO : -ENOMEM;
		goto err;
	}
	close_fds(wf.fd, 3);
	init_ring(r, &t, &w, &mp, sock);
	*out = r;
	return 0;
err:
	unmap_all(&mp);
	close_fds(wf.fd, wf.n);
	close(sock);
	return rc;
}

void ibvb_detach(struct ibvb_ring *r)
{
	if (!r)
		return;
	ibvb_flush_release(r); /* §7.6: release what it holds (one tail store), then close */
	atomic_store_explicit(&r->region->consumer_waiting, 0, memory_order_relaxed);
	munmap((void *)r->data, (size_t)r->data_size);
	munmap(r->region, IBVB_REGION_SIZE);
	munmap((void *)r->ctl, (size_t)r->ctl_size);
	munmap(r->own_items, (size_t)r->own_items_size);
	close(r->sock);
	free(r);
}

/* ---- detach by the producer, liveness, waiting ------------------------------------------------------ */

/* The row no longer says "ours" (ibvb__attached failed): why, as -errno with a message; 0 if a clean stop
 * marked it gone (what is published can still be read). Sticky: the next peek reloads head and lands here. */
int ibvb__row_changed(struct ibvb_ring *r)
{
	uint32_t state = atomic_load_explicit(&r->row->state, memory_order_acquire);
	uint32_t gen = atomic_load_explicit(&r->row->generation, memory_order_acquire);
	r->cached_head = r->read;
	if (gen != r->generation)
		return fail(-ECONNRESET, "ring %s: detached: consumer row %u was reused (generation %u, ours %u)",
			    r->name, r->consumer_index, gen, r->generation);
	if (state == r->row_state_ok)
		return 0; /* cannot happen (state is loaded before generation) but is harmless */
	if (state == IBVB_CONSUMER_OVERRUN) {
		uint64_t lost = atomic_load_explicit(&r->row->lost_heaps, memory_order_relaxed);
		return fail(-EOVERFLOW, "ring %s overrun: detached after falling a whole ring behind, %llu heaps lost",
			    r->name, (unsigned long long)lost);
	}
	if (state == IBVB_CONSUMER_BAD_CURSOR)
		return fail(-ECONNRESET, "ring %s: detached: invalid cursor", r->name);
	if (state > IBVB_CONSUMER_GONE) /* a minor never adds a row state (spec §8) */
		return ibvb__corrupt_state(r, "consumer row", state);
	if (state == IBVB_CONSUMER_GONE && r->row_state_ok == IBVB_CONSUMER_ATTACHED &&
	    atomic_load_explicit(&r->ctl->state, memory_order_acquire) == IBVB_STATE_CLOSED) {
		/* a clean stop marked our row gone when it closed the connection: it reuses no slot, so what it
		 * published (and what we hold) stays valid: read what is left */
		r->row_state_ok = IBVB_CONSUMER_GONE;
		r->cached_head = atomic_load_explicit(&r->ctl->head, memory_order_acquire);
		return 0;
	}
	return fail(-ECONNRESET, "ring %s: detached by the producer (row state %u)", r->name, state);
}

int ibvb__stale(struct ibvb_ring *r)
{
	int rc = ibvb__row_changed(r);
	if (rc == 0)
		return 0;
	char why[IBVB__ERRBUF_SIZE];
	snprintf(why, sizeof why, "%s", ibvb_last_error());
	return fail(-ESTALE, "ring %s: a released heap was overrun while held (%s)", r->name, why);
}

int ibvb_producer_alive(const struct ibvb_ring *r)
{
	/* Spec §7.6: the connection is the liveness: POLLHUP, POLLRDHUP or a read of 0 bytes = gone. */
	struct pollfd pfd = {.fd = r->sock, .events = POLLIN | POLLRDHUP};
	int n = poll(&pfd, 1, 0);
	if (n < 0)
		return errno == EINTR ? 1 : -errno;
	if (n == 0)
		return 1;
	if (pfd.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL))
		return 0;
	if (pfd.revents & POLLIN) {
		char b;
		ssize_t k = recv(r->sock, &b, 1, MSG_PEEK | MSG_DONTWAIT);
		if (k == 0)
			return 0;
	}
	return 1;
}

void ibvb__member_flush(struct ibvb_ring *r)
{
	ibvb__member_publish(r);
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&r->ctl->producer_waiting, memory_order_relaxed) != 0)
		ibvb__wake_producer(r); /* as a release does (spec §14.2) */
}

/* Spec §14.4: a 2.2 member found position pos lapped (head more than slot_count ahead of it, or its
 * descriptor rewritten by a later lap). Detached wins; still attached, the positions it missed were not
 * its own (the producer keeps every position assigned to it until it has read it): read moves to
 * head - slot_count, the oldest descriptor that can still be one of its own, and goes on. A member holding
 * a heap cannot be lapped by a producer that keeps the rules: corrupt. */
int ibvb__member_lapped(struct ibvb_ring *r, uint64_t pos)
{
	if (!ibvb__attached(r)) {
		int rc = ibvb__row_changed(r);
		if (rc < 0)
			return rc;
	}
	if (r->released != r->read)
		return ibvb__corrupt_desc(r, pos, "lapped while holding", r->read - r->released, 0);
	/* A descriptor a lap ahead of the head loaded is being written for a position not yet published: load
	 * head again until that store lands — spinning 10 ms, then a millisecond at a time up to 1 s while the
	 * producer lives (one descheduled between the descriptor and the head store, on a busy machine). */
	int64_t t0 = ibvb__mono_ns();
	uint64_t head, to;
	for (;;) {
		head = atomic_load_explicit(&r->ctl->head, memory_order_acquire);
		to = head - r->slot_count;
		if (head - pos <= (1ull << 62) && to - pos <= head - pos && to != pos)
			break; /* head - slot_count is after pos */
		if (ibvb__mono_ns() - t0 <= 10000000) {
			ibvb__cpu_relax();
			continue;
		}
		if (ibvb__mono_ns() - t0 > 1010000000 || !ibvb_producer_alive(r))
			return ibvb__corrupt_desc(r, pos, "lapped descriptor ahead of head", head, pos);
		ibvb__sleep_ns(1000000);
	}
	r->read = r->released = to;
	r->cached_head = head;
	ibvb_flush_release(r);
	ibvb__member_flush(r);
	return 0;
}

void ibvb__wake_producer(struct ibvb_ring *r)
{
	/* Spec §7.4: plain load and store (this consumer is the word's only writer), then a shared wake. */
	_Atomic uint32_t *f = &r->region->release_futex;
	atomic_store_explicit(f, atomic_load_explicit(f, memory_order_relaxed) + 1, memory_order_release);
	ibvb__futex_wake_all(f);
}

int ibvb__corrupt_desc(struct ibvb_ring *r, uint64_t pos, const char *what, uint64_t v1, uint64_t v2)
{
	/* A slot reused under a detached consumer looks corrupt: say detached if the row says so (§7.6). */
	if (!ibvb__attached(r)) {
		int rc = ibvb__row_changed(r);
		if (rc < 0)
			return rc;
	}
	r->cached_head = r->read; /* re-check from head on the next call */
	return fail(-EBADMSG, "ring %s corrupt: descriptor at position %llu: bad %s (%llu vs %llu)", r->name,
		    (unsigned long long)pos, what, (unsigned long long)v1, (unsigned long long)v2);
}

int ibvb__corrupt_state(struct ibvb_ring *r, const char *what, uint32_t state)
{
	r->cached_head = r->read; /* re-check from head on the next call */
	return fail(-EBADMSG, "ring %s corrupt: unknown %s state %u", r->name, what, state);
}

/* The producer is gone: deliver what it published, then report. */
static int after_producer_gone(struct ibvb_ring *r, struct ibvb_heap *h)
{
	int rc = ibvb_peek(r, h);
	if (rc != -EAGAIN)
		return rc;
	return fail(-EPIPE, "ring %s: producer gone (pid %llu) without closing the ring", r->name,
		    (unsigned long long)r->ctl->producer_pid);
}

void ibvb_set_max_latency(struct ibvb_ring *r, int64_t ns) { r->max_latency_ns = ns > 0 ? ns : 0; }

void ibvb_set_spin_budget(struct ibvb_ring *r, int64_t ns)
{
	r->spin_budget_ns = ns > 0 ? ns : 0;
	atomic_store_explicit(&r->region->spin_budget_ns, (uint64_t)r->spin_budget_ns, memory_order_relaxed);
}

/* A wait that found a heap: a moving average of the last ~8 wait lengths, and the stream is active. */
static void note_wait(struct ibvb_ring *r, int64_t start)
{
	r->wait_avg_ns += (mono_ns() - start - r->wait_avg_ns) / 8;
	r->active = 1;
}

int ibvb_wait(struct ibvb_ring *r, struct ibvb_heap *h, int timeout_ms)
{
	int rc = ibvb_peek(r, h);
	if (rc != -EAGAIN)
		return rc;
	int64_t start = mono_ns();
	int64_t deadline = timeout_ms < 0 ? INT64_MAX : start + (int64_t)timeout_ms * 1000000LL;
	struct ibvb_region *g = r->region;

	/* Spin only without a latency bound, and while recent waits averaged at most half the budget. */
	if (r->max_latency_ns == 0 && r->spin_budget_ns > 0 && r->wait_avg_ns <= r->spin_budget_ns / 2) {
		int64_t spin_end = start + r->spin_budget_ns;
		for (;;) {
			for (int i = 0; i < 64; i++) {
				ibvb__cpu_relax();
				if ((rc = ibvb_peek(r, h)) != -EAGAIN) {
					note_wait(r, start);
					return rc;
				}
			}
			if (mono_ns() >= spin_end)
				break;
		}
	}
	for (;;) {
		int coalesce = r->max_latency_ns > 0 && r->active;
		/* §7.5 step 1: say when to be woken, announce, full fence, re-check (peek flushed the release
		 * before saying -EAGAIN). */
		uint32_t f = atomic_load_explicit(&g->consumer_futex, memory_order_acquire);
		atomic_store_explicit(&g->wake_at, r->read + (coalesce ? r->coalesce_heaps : 1), memory_order_relaxed);
		if (r->group_bit)
			ibvb__member_publish(r); /* spec §14.2: read and handed before consumer_waiting */
		atomic_store_explicit(&g->consumer_waiting, 1, memory_order_relaxed);
		atomic_thread_fence(memory_order_seq_cst);
		if (r->group_bit && atomic_load_explicit(&r->ctl->producer_waiting, memory_order_relaxed) != 0)
			ibvb__wake_producer(r);
		rc = ibvb_peek(r, h); /* re-reads head (acquire) and the row; step 2: CLOSED and drained → -ENODATA */
		if (rc != -EAGAIN) {
			atomic_store_explicit(&g->consumer_waiting, 0, memory_order_relaxed);
			if (rc == 0)
				note_wait(r, start);
			return rc;
		}
		int64_t now = mono_ns();
		if (now >= deadline) {
			atomic_store_explicit(&g->consumer_waiting, 0, memory_order_relaxed);
			if (ibvb_producer_alive(r) == 0)
				return after_producer_gone(r, h);
			return fail(-ETIMEDOUT, "no heap within %d ms", timeout_ms);
		}
		int64_t slice = coalesce ? r->max_latency_ns : WAIT_SLICE_NS;
		if (deadline - now < slice)
			slice = deadline - now;
		long wr = ibvb__futex_wait(&g->consumer_futex, f, slice);
		int e = wr < 0 ? errno : 0;
		if (e == EINTR) {
			atomic_store_explicit(&g->consumer_waiting, 0, memory_order_relaxed);
			if ((rc = ibvb_peek(r, h)) != -EAGAIN)
				return rc;
			return fail(-EINTR, "wait interrupted by a signal");
		}
		if (e == ETIMEDOUT && coalesce) {
			/* The latency bound passed: take what came; nothing at all means the stream went idle. */
			if ((rc = ibvb_peek(r, h)) != -EAGAIN) {
				atomic_store_explicit(&g->consumer_waiting, 0, memory_order_relaxed);
				if (rc == 0)
					note_wait(r, start);
				return rc;
			}
			r->active = 0;
		}
		/* §7.5 step 4: after a timeout, the row (the next peek) and the socket */
		if (e == ETIMEDOUT && ibvb_producer_alive(r) == 0) {
			atomic_store_explicit(&g->consumer_waiting, 0, memory_order_relaxed);
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
    "end_of_stream",     "consumers_attached", "consumer_overruns",
    "consumer_errors",   "chunks",          "incomplete_chunks",
    "too_old_heaps",     "rejected_heaps",  "group_lost",
    "group_skipped",     "streams_ended",
};

size_t ibvb_producer_version(const struct ibvb_ring *r, char *buf, size_t len)
{
	size_t n = 0;
	while (n < IBVB_PRODUCER_VERSION_MAX && r->ctl->producer_version[n] != 0)
		n++;
	if (len == 0)
		return n;
	size_t c = n < len - 1 ? n : len - 1;
	memcpy(buf, r->ctl->producer_version, c);
	buf[c] = 0;
	return n;
}

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
	s->consumers_attached = v[IBVB_CTR_CONSUMERS_ATTACHED];
	s->consumer_overruns = v[IBVB_CTR_CONSUMER_OVERRUNS];
	s->consumer_errors = v[IBVB_CTR_CONSUMER_ERRORS];
	return 0;
}

int ibvb_info(const struct ibvb_ring *r, struct ibvb_info *in)
{
	const struct ibvb_ctl *c = r->ctl;
	memset(in, 0, sizeof *in);
	in->major = c->major;
	in->minor = c->minor;
	in->state = atomic_load_explicit(&c->state, memory_order_acquire);
	in->policy = c->policy;
	in->session_id = c->session_id;
	in->producer_pid = c->producer_pid;
	in->producer_start_ns = c->producer_start_ns;
	in->slot_count = c->slot_count;
	in->slot_size = c->slot_size;
	in->max_items = c->max_items;
	in->page_size = c->page_size;
	in->ctl_size = r->ctl_size;
	in->data_size = c->data_size;
	in->meta_size = c->meta_size;
	in->packet_size = c->packet_size;
	in->features = c->features;
	in->stats_count = c->stats_count;
	in->max_consumers = c->max_consumers;
	in->head = atomic_load_explicit(&c->head, memory_order_acquire);
	in->oldest = atomic_load_explicit(&c->oldest, memory_order_relaxed);
	in->heartbeat_ns = atomic_load_explicit(&c->heartbeat_ns, memory_order_relaxed);
	in->tail = atomic_load_explicit(&r->region->tail, memory_order_acquire);
	in->consumer_index = r->consumer_index;
	in->generation = r->generation;
	in->row_state = atomic_load_explicit(&r->row->state, memory_order_acquire);
	in->lost_heaps = atomic_load_explicit(&r->row->lost_heaps, memory_order_relaxed);
	return 0;
}

/* ---- stream metadata (spec §6) ------------------------------------------------------------------- */

#define META_MAX_TRIES 1000u
#define META_MAX_WAIT_NS 10000000LL

long ibvb_read_meta(const struct ibvb_ring *r, void *buf, size_t cap, size_t *need)
{
	const uint8_t *area = r->meta; /* offset and size as validated at attach */
	const struct ibvb_meta_header *mh = (const struct ibvb_meta_header *)area; /* read-only mapping: loads only */
	uint64_t max = r->meta_size - IBVB_META_HEADER_SIZE;
	if (need)
		*need = 0;
	/* Spec §6: give up after 1000 tries or 10 ms, whichever is longer. */
	int64_t t0 = ibvb__mono_ns();
	for (unsigned attempt = 0;; attempt++) {
		if (attempt >= META_MAX_TRIES && ibvb__mono_ns() - t0 >= META_MAX_WAIT_NS)
			return fail(-EBUSY, "ring %s: metadata area busy (rewritten during %u reads)", r->name, attempt);
		uint64_t s1 = atomic_load_explicit(&mh->seq, memory_order_acquire);
		if (s1 == 0)
			return 0;
		if (s1 & 1) {
			if (attempt > 100)
				sched_yield();
			else
				ibvb__cpu_relax();
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

static int meta_next_any(const void *buf, size_t len, size_t *off, struct ibvb_meta_record *rec);

/* Which record of one buffer is the last with its id (spec §6: a reader that meets an id twice keeps the
 * last), built once per iteration — when it starts at offset 0 or meets another buffer — in O(n log n):
 * the (id, index) pairs of the well-formed records sorted, the last of each run marked. Per thread, freed
 * at the thread's exit. */
struct meta_index {
	const void *buf;
	size_t len, n, cap, k; /* k: the record expected next */
	size_t *offs;          /* each record's offset, in order */
	uint8_t *last;         /* 1: no later record has its id */
	struct meta_pair {
		uint64_t id;
		size_t idx;
	} *pairs;
};
static pthread_key_t meta_key;
static pthread_once_t meta_once = PTHREAD_ONCE_INIT;

static void meta_index_free(void *v)
{
	struct meta_index *mi = v;
	if (!mi)
		return;
	free(mi->offs);
	free(mi->last);
	free(mi->pairs);
	free(mi);
}
static void meta_key_init(void) { pthread_key_create(&meta_key, meta_index_free); }

static int pair_cmp(const void *a, const void *b)
{
	const struct meta_pair *x = a, *y = b;
	if (x->id != y->id)
		return x->id < y->id ? -1 : 1;
	return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static struct meta_index *meta_index_build(const void *buf, size_t len)
{
	pthread_once(&meta_once, meta_key_init);
	struct meta_index *mi = pthread_getspecific(meta_key);
	if (!mi) {
		mi = calloc(1, sizeof *mi);
		if (!mi || pthread_setspecific(meta_key, mi) != 0) {
			free(mi);
			return NULL;
		}
	}
	mi->buf = NULL;
	size_t need = len / IBVB_META_RECORD_HEADER_SIZE + 1; /* records are at least 32 bytes */
	if (need > mi->cap) {
		free(mi->offs);
		free(mi->last);
		free(mi->pairs);
		mi->offs = malloc(need * sizeof *mi->offs);
		mi->last = malloc(need);
		mi->pairs = malloc(need * sizeof *mi->pairs);
		mi->cap = mi->offs && mi->last && mi->pairs ? need : 0;
		if (!mi->cap)
			return NULL;
	}
	size_t off = 0, n = 0;
	struct ibvb_meta_record rec;
	char saved[IBVB__ERRBUF_SIZE];
	snprintf(saved, sizeof saved, "%s", ibvb_last_error());
	for (;;) {
		size_t o = off;
		if (meta_next_any(buf, len, &off, &rec) != 1)
			break; /* the end, or a corrupt record: the iterator reports it when it gets there */
		mi->offs[n] = o;
		mi->pairs[n].id = rec.id;
		mi->pairs[n].idx = n;
		mi->last[n] = 0;
		n++;
	}
	ibvb__set_error(saved);
	qsort(mi->pairs, n, sizeof *mi->pairs, pair_cmp);
	for (size_t i = 0; i < n; i++)
		if (i + 1 == n || mi->pairs[i + 1].id != mi->pairs[i].id)
			mi->last[mi->pairs[i].idx] = 1;
	mi->buf = buf;
	mi->len = len;
	mi->n = n;
	mi->k = 0;
	return mi;
}

/* The index of the record at offset o, or n when o starts none. */
static size_t meta_index_find(const struct meta_index *mi, size_t o)
{
	if (mi->k < mi->n && mi->offs[mi->k] == o)
		return mi->k;
	size_t lo = 0, hi = mi->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (mi->offs[mid] < o)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < mi->n && mi->offs[lo] == o ? lo : mi->n;
}

int ibvb_meta_next(const void *buf, size_t len, size_t *off, struct ibvb_meta_record *rec)
{
	pthread_once(&meta_once, meta_key_init);
	struct meta_index *mi = pthread_getspecific(meta_key);
	if (*off == 0 || !mi || mi->buf != buf || mi->len != len)
		mi = meta_index_build(buf, len);
	if (!mi)
		return fail(-ENOMEM, "metadata: out of memory for %zu bytes of records", len);
	for (;;) {
		size_t o = *off;
		int rc = meta_next_any(buf, len, off, rec);
		if (rc != 1)
			return rc;
		size_t k = meta_index_find(mi, o);
		if (k == mi->n)
			return 1; /* an offset the index does not know: the record as it is */
		mi->k = k + 1;
		if (mi->last[k])
			return 1;
		/* a later record describes this id again: it wins */
	}
}

static int meta_next_any(const void *buf, size_t len, size_t *off, struct ibvb_meta_record *rec)
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
