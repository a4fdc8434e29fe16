/* test_producer.c — test-only 2.0 producer, see test_producer.h. */
#define _GNU_SOURCE
#include "test_producer.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
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
#define RO_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL)

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

static uint64_t now_rt(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static long futex_wake(_Atomic uint32_t *w)
{
	return syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* A sealable shmem memfd of size bytes, mapped read-write. */
static int make_mem(const char *what, uint64_t size, int fd_out[1], void **map)
{
	int fd = memfd_create(what, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size) < 0 || fallocate(fd, 0, 0, (off_t)size) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		int e = errno;
		close(fd);
		return -e;
	}
	*fd_out = fd;
	*map = m;
	return 0;
}

static void *server_fn(void *arg);

int tp_create(struct tp *p, const char *dir, const char *name, const struct tp_opts *o)
{
	struct tp_opts d = {0};
	if (o)
		d = *o;
	if (!d.slot_count)
		d.slot_count = 8;
	if (!d.slot_size)
		d.slot_size = 4096;
	if (!d.max_items)
		d.max_items = 8;
	if (!d.meta_size)
		d.meta_size = 4096;
	if (!d.max_consumers)
		d.max_consumers = IBVB_DEFAULT_MAX_CONSUMERS;
	if (!o || !o->slot_shift)
		d.slot_shift = 3;
	memset(p, 0, sizeof *p);
	pthread_mutex_init(&p->mu, NULL);
	p->listen_fd = p->ctl_fd = p->dat_fd = p->stop_pipe[0] = p->stop_pipe[1] = -1;
	for (int i = 0; i < IBVB_MAX_CONSUMERS_LIMIT; i++)
		p->cons[i].fd = -1;
	snprintf(p->name, sizeof p->name, "%s", name);
	snprintf(p->sock_path, sizeof p->sock_path, "%s/%s%s", dir, name, IBVB_SOCK_SUFFIX);
	if (strlen(p->sock_path) >= sizeof(((struct sockaddr_un *)0)->sun_path))
		return -ENAMETOOLONG;

	/* data memory */
	uint64_t sc = d.slot_count, off = 0;
	uint64_t desc_off = off;
	off = align_up(off + sc * IBVB_DESC_SIZE, IBVB_REGION_ALIGN);
	uint64_t items_off = off;
	off = align_up(off + sc * d.max_items * IBVB_ITEM_SIZE, IBVB_REGION_ALIGN);
	uint64_t meta_off = off;
	off = align_up(off + d.meta_size, IBVB_REGION_ALIGN);
	uint64_t payload_off = off;
	off = align_up(off + sc * d.slot_size, IBVB_REGION_ALIGN);
	uint64_t packet_off = d.packet_size ? off : 0;
	off = align_up(off + d.packet_size, IBVB_REGION_ALIGN);
	uint64_t dsz = align_up(off, 4096);
	void *m;
	int rc = make_mem("ibvb-test-data", dsz, &p->dat_fd, &m);
	if (rc < 0)
		return rc;
	p->data = m;
	p->data_size = dsz;
	p->desc = (struct ibvb_desc *)(p->data + desc_off);
	p->items = (struct ibvb_item *)(p->data + items_off);
	p->meta = p->data + meta_off;
	p->payload = p->data + payload_off;
	p->slot_count = sc;
	p->mask = sc - 1;
	p->slot_size = d.slot_size;
	p->max_items = d.max_items;
	p->slot_shift = d.slot_shift;
	p->policy = d.policy;
	p->futex_start = d.futex_start;
	p->head = p->oldest = d.start_pos;

	/* control memory */
	p->max_consumers = d.max_consumers;
	p->ctl_size = IBVB_CTL_SIZE_FOR(d.max_consumers);
	if ((rc = make_mem("ibvb-test-ctl", p->ctl_size, &p->ctl_fd, &m)) < 0)
		return rc;
	p->ctl = m;
	p->rows = (struct ibvb_row *)((uint8_t *)m + IBVB_OFF_CONSUMER_TABLE);
	struct ibvb_ctl *c = p->ctl;
	c->major = IBVB_MAJOR;
	c->minor = IBVB_MINOR;
	c->ctl_size = (uint32_t)p->ctl_size;
	c->policy = d.policy;
	c->session_id = ((uint64_t)getpid() << 32) ^ now_rt() ^ (uint64_t)(uintptr_t)p;
	if (!c->session_id)
		c->session_id = 1;
	c->producer_pid = (uint64_t)getpid();
	c->producer_start_ns = now_rt();
	c->slot_count = sc;
	c->slot_size = d.slot_size;
	c->max_items = d.max_items;
	c->desc_size = IBVB_DESC_SIZE;
	c->item_size = IBVB_ITEM_SIZE;
	c->page_size = 4096;
	c->data_size = dsz;
	c->desc_offset = desc_off;
	c->items_offset = items_off;
	c->meta_offset = meta_off;
	c->meta_size = d.meta_size;
	c->payload_offset = payload_off;
	c->packet_offset = packet_off;
	c->packet_size = d.packet_size;
	c->stats_count = IBVB_STATS_COUNT;
	c->max_consumers = d.max_consumers;
	atomic_store(&c->head, d.start_pos);
	atomic_store(&c->oldest, d.start_pos);
	atomic_store(&c->heartbeat_ns, now_rt());
	atomic_store_explicit(&c->magic, IBVB_MAGIC, memory_order_relaxed);
	atomic_store_explicit(&c->state, IBVB_STATE_READY, memory_order_release);

	/* seals: our writable mappings keep working, nobody can make a new one */
	if (!d.no_seal && (fcntl(p->ctl_fd, F_ADD_SEALS, RO_SEALS) < 0 || fcntl(p->dat_fd, F_ADD_SEALS, RO_SEALS) < 0))
		return -errno;

	/* the socket */
	p->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (p->listen_fd < 0)
		return -errno;
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	strcpy(sa.sun_path, p->sock_path);
	unlink(p->sock_path); /* stale (the test owns the directory) */
	if (bind(p->listen_fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(p->listen_fd, 16) < 0)
		return -errno;
	chmod(p->sock_path, 0600);
	if (!d.no_server) {
		if (pipe2(p->stop_pipe, O_CLOEXEC) < 0)
			return -errno;
		if ((rc = pthread_create(&p->thr, NULL, server_fn, p)) != 0)
			return -rc;
		p->thr_on = 1;
	}
	return 0;
}

/* ---- handshake ------------------------------------------------------------------------------------- */

static void send_error(int fd, uint32_t status, const char *msg)
{
	struct ibvb_error_record er;
	memset(&er, 0, sizeof er);
	er.magic = IBVB_MAGIC;
	er.major = IBVB_MAJOR;
	er.minor = IBVB_MINOR;
	er.status = status;
	snprintf(er.message, sizeof er.message, "%s", msg);
	send(fd, &er, 16 + strlen(er.message) + 1, MSG_NOSIGNAL);
}

static int send_fds(int fd, const void *rec, size_t len, const int *fds, int nfds)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int) * 4)];
	} cm;
	memset(&cm, 0, sizeof cm);
	struct iovec iov = {.iov_base = (void *)rec, .iov_len = len};
	struct msghdr msg;
	memset(&msg, 0, sizeof msg);
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	if (nfds) {
		msg.msg_control = cm.b;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
	}
	return sendmsg(fd, &msg, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -errno;
}

static void drop_cons(struct tp *p, uint32_t i, uint32_t state, uint64_t lost);

/* p->mu held: consumers whose socket closed are gone (row state 4). */
static void reap_locked(struct tp *p)
{
	for (uint32_t i = 0; i < p->max_consumers; i++) {
		if (p->cons[i].fd < 0)
			continue;
		struct pollfd pfd = {.fd = p->cons[i].fd, .events = POLLIN | POLLRDHUP};
		if (poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLHUP | POLLRDHUP | POLLERR))) {
			/* record the cursor it stored before closing (§7.6), if valid; it no longer counts */
			uint64_t t = atomic_load_explicit(&p->cons[i].region->tail, memory_order_acquire);
			if (t - p->cons[i].released <= p->head - p->cons[i].released)
				atomic_store(&p->rows[i].released, t);
			drop_cons(p, i, IBVB_CONSUMER_GONE, 0);
		}
	}
}

/* Answer one connection (p->mu held). Returns 1 if a consumer was attached, 0 otherwise. */
static int serve_one(struct tp *p, int cfd)
{
	struct pollfd pfd = {.fd = cfd, .events = POLLIN};
	struct ibvb_hello h;
	memset(&h, 0, sizeof h);
	if (poll(&pfd, 1, 2000) <= 0) {
		close(cfd);
		return 0;
	}
	ssize_t n = recv(cfd, &h, sizeof h, MSG_DONTWAIT);
	p->served++;
	if (n != (ssize_t)sizeof h || h.magic != IBVB_MAGIC) {
		send_error(cfd, IBVB_STATUS_PROTOCOL, "malformed hello");
		close(cfd);
		return 0;
	}
	if (h.major != IBVB_MAJOR) {
		char m[200];
		snprintf(m, sizeof m, "ring %s is layout %d.%d; this client speaks %u.%u", p->name, IBVB_MAJOR,
			 IBVB_MINOR, h.major, h.minor);
		send_error(cfd, IBVB_STATUS_VERSION, m);
		close(cfd);
		return 0;
	}
	if (p->refuse_status) {
		send_error(cfd, p->refuse_status, p->refuse_msg);
		close(cfd);
		return 0;
	}
	if (atomic_load(&p->ctl->state) == IBVB_STATE_CLOSED) {
		send_error(cfd, IBVB_STATUS_CLOSING, "the stream has ended");
		close(cfd);
		return 0;
	}
	reap_locked(p);
	uint32_t idx = UINT32_MAX;
	for (uint32_t i = 0; i < p->max_consumers; i++)
		if (p->cons[i].fd < 0) {
			idx = i;
			break;
		}
	if (idx == UINT32_MAX) {
		char m[128];
		snprintf(m, sizeof m, "all %u consumer rows are attached", p->max_consumers);
		send_error(cfd, IBVB_STATUS_BUSY, m);
		close(cfd);
		return 0;
	}
	struct ucred cr = {0};
	socklen_t cl = sizeof cr;
	getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cr, &cl);
	int rfd;
	void *rm;
	if (make_mem("ibvb-test-region", IBVB_REGION_SIZE, &rfd, &rm) < 0) {
		close(cfd);
		return 0;
	}
	if (p->welcome_mode != TP_WELCOME_UNSEALED_REGION)
		fcntl(rfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	struct ibvb_region *g = rm;
	uint64_t start = h.start == IBVB_START_HEAD ? p->head : p->oldest;
	atomic_store(&g->tail, start);
	atomic_store(&g->consumer_futex, p->futex_start);
	struct ibvb_row *row = &p->rows[idx];
	uint32_t gen = atomic_load(&row->generation) + 1;
	atomic_store(&row->generation, gen);
	atomic_store(&row->pid, (uint64_t)cr.pid);
	atomic_store(&row->uid, (uint64_t)cr.uid);
	atomic_store(&row->attach_ns, now_rt());
	atomic_store(&row->released, start);
	atomic_store(&row->wakes, 0);
	atomic_store(&row->lost_heaps, 0);
	atomic_store_explicit(&row->state, IBVB_CONSUMER_ATTACHED, memory_order_release);
	p->cons[idx].fd = cfd;
	p->cons[idx].region = g;
	p->cons[idx].released = start;
	atomic_fetch_add(&p->ctl->stats[IBVB_CTR_CONSUMERS_ATTACHED], 1);

	struct ibvb_welcome w;
	memset(&w, 0, sizeof w);
	w.magic = p->welcome_mode == TP_WELCOME_BAD_MAGIC ? 0x1234 : IBVB_MAGIC;
	w.major = p->welcome_mode == TP_WELCOME_MAJOR3 ? 3 : IBVB_MAJOR;
	w.minor = IBVB_MINOR;
	w.status = IBVB_STATUS_OK;
	w.consumer_index = idx;
	w.generation = gen;
	w.session_id = p->ctl->session_id;
	w.ctl_size = p->ctl_size;
	w.data_size = p->data_size + (p->welcome_mode == TP_WELCOME_DATA_SIZE ? 4096 : 0);
	w.region_size = IBVB_REGION_SIZE;
	int fds[3] = {p->ctl_fd, p->dat_fd, rfd};
	uint8_t rec[300];
	memset(rec, 0xA5, sizeof rec); /* what a later minor appends: ignored */
	memcpy(rec, &w, sizeof w);
	size_t len = p->welcome_mode == TP_WELCOME_SHORT ? 40 : p->welcome_mode == TP_WELCOME_LONG ? 256
		   : p->welcome_mode == TP_WELCOME_TOO_LONG ? 300 : sizeof w;
	send_fds(cfd, rec, len, fds, p->welcome_mode == TP_WELCOME_TWO_FDS ? 2 : 3);
	close(rfd);
	return 1;
}

int tp_serve(struct tp *p)
{
	int n = 0;
	pthread_mutex_lock(&p->mu);
	for (;;) {
		int cfd = accept4(p->listen_fd, NULL, NULL, SOCK_CLOEXEC);
		if (cfd < 0)
			break;
		n += serve_one(p, cfd);
	}
	pthread_mutex_unlock(&p->mu);
	return n;
}

static void *server_fn(void *arg)
{
	struct tp *p = arg;
	for (;;) {
		struct pollfd pf[2] = {{.fd = p->listen_fd, .events = POLLIN}, {.fd = p->stop_pipe[0], .events = POLLIN}};
		if (poll(pf, 2, -1) < 0)
			continue;
		if (pf[1].revents)
			return NULL;
		if (pf[0].revents)
			tp_serve(p);
	}
}

/* ---- consumers ------------------------------------------------------------------------------------- */

/* p->mu held */
static void drop_cons(struct tp *p, uint32_t i, uint32_t state, uint64_t lost)
{
	struct tp_cons *k = &p->cons[i];
	if (k->fd < 0)
		return;
	atomic_store(&p->rows[i].lost_heaps, lost);
	atomic_store_explicit(&p->rows[i].state, state, memory_order_release);
	atomic_thread_fence(memory_order_seq_cst); /* 2.1 §A: the row says detached before any slot is reused */
	close(k->fd);
	munmap(k->region, IBVB_REGION_SIZE);
	k->fd = -1;
	k->region = NULL;
	atomic_fetch_sub(&p->ctl->stats[IBVB_CTR_CONSUMERS_ATTACHED], 1);
	if (state == IBVB_CONSUMER_OVERRUN)
		atomic_fetch_add(&p->ctl->stats[IBVB_CTR_CONSUMER_OVERRUNS], 1);
	if (state == IBVB_CONSUMER_BAD_CURSOR)
		atomic_fetch_add(&p->ctl->stats[IBVB_CTR_CONSUMER_ERRORS], 1);
}

void tp_detach_row(struct tp *p, uint32_t i, uint32_t state, uint64_t lost)
{
	pthread_mutex_lock(&p->mu);
	drop_cons(p, i, state, lost);
	pthread_mutex_unlock(&p->mu);
}

/* p->mu held */
static int reclaim_locked(struct tp *p)
{
	int n = 0;
	uint64_t far = 0; /* the largest head - released over attached consumers */
	reap_locked(p);
	for (uint32_t i = 0; i < p->max_consumers; i++) {
		struct tp_cons *k = &p->cons[i];
		if (k->fd < 0)
			continue;
		uint64_t t = atomic_load_explicit(&k->region->tail, memory_order_acquire);
		if (t - k->released > p->head - k->released) {
			drop_cons(p, i, IBVB_CONSUMER_BAD_CURSOR, 0);
			continue;
		}
		k->released = t;
		atomic_store(&p->rows[i].released, t);
		if (p->head - t > far)
			far = p->head - t;
		n++;
	}
	if (n)
		p->oldest = p->head - far;
	atomic_store(&p->ctl->oldest, p->oldest);
	return n;
}

int tp_reclaim(struct tp *p)
{
	pthread_mutex_lock(&p->mu);
	int n = reclaim_locked(p);
	pthread_mutex_unlock(&p->mu);
	return n;
}

int tp_attached(struct tp *p)
{
	int n = 0;
	pthread_mutex_lock(&p->mu);
	reap_locked(p);
	for (uint32_t i = 0; i < p->max_consumers; i++)
		n += p->cons[i].fd >= 0;
	pthread_mutex_unlock(&p->mu);
	return n;
}

/* ---- publishing ------------------------------------------------------------------------------------ */

void tp_pattern(uint8_t *buf, uint64_t heap_cnt, uint64_t len)
{
	uint8_t base = (uint8_t)(heap_cnt * 31);
	for (uint64_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(base + i);
}

/* p->mu held: make room for one more position (§7.1, §7.3). */
static int make_room(struct tp *p)
{
	if (p->head - p->oldest < p->slot_count)
		return 0;
	int n = reclaim_locked(p);
	if (p->head - p->oldest < p->slot_count)
		return 0;
	if (n == 0) {
		if (p->policy == IBVB_POLICY_BLOCK)
			return -EAGAIN; /* block waits for a consumer */
		p->oldest = p->head - p->slot_count + 1; /* drop: keep the newest heaps */
		atomic_store(&p->ctl->oldest, p->oldest);
		return 0;
	}
	if (p->policy == IBVB_POLICY_DROP) {
		/* detach the slowest as overrun when someone has released more than they have */
		int ahead = 0;
		for (uint32_t i = 0; i < p->max_consumers; i++)
			if (p->cons[i].fd >= 0 && p->cons[i].released != p->oldest)
				ahead = 1;
		if (ahead) {
			for (uint32_t i = 0; i < p->max_consumers; i++)
				if (p->cons[i].fd >= 0 && p->cons[i].released == p->oldest)
					drop_cons(p, i, IBVB_CONSUMER_OVERRUN, p->head - p->cons[i].released);
			reclaim_locked(p);
			if (p->head - p->oldest < p->slot_count)
				return 0;
		}
	}
	return -EAGAIN;
}

static int stage_locked(struct tp *p, uint64_t heap_cnt, const void *payload, uint64_t len,
			const struct ibvb_item *items, uint32_t nitems, uint32_t flags, uint64_t *pos_out)
{
	if (make_room(p) < 0)
		return -EAGAIN;
	uint64_t pos = p->head;
	uint32_t slot = (uint32_t)((pos + p->slot_shift) & p->mask);
	uint8_t *pl = p->payload + (uint64_t)slot * p->slot_size;
	if (len > p->slot_size)
		len = p->slot_size;
	if (payload)
		memcpy(pl, payload, len);
	else
		tp_pattern(pl, heap_cnt, len);
	if (nitems > p->max_items)
		nitems = p->max_items;
	if (nitems)
		memcpy(p->items + (uint64_t)slot * p->max_items, items, nitems * sizeof *items);
	struct ibvb_desc *d = &p->desc[pos & p->mask];
	d->heap_cnt = heap_cnt;
	d->heap_size = len;
	d->received = len;
	d->timestamp_ns = now_rt();
	d->slot = slot;
	d->flags = flags;
	d->item_count = nitems;
	d->packets = flags & IBVB_FLAG_END_OF_STREAM ? 0 : 1;
	d->assign = 0;
	d->seq = pos + 1;
	p->head = pos + 1;
	if (pos_out)
		*pos_out = pos;
	return 0;
}

int tp_stage(struct tp *p, uint64_t heap_cnt, const void *payload, uint64_t len, const struct ibvb_item *items,
	     uint32_t nitems, uint32_t flags, uint64_t *pos_out)
{
	pthread_mutex_lock(&p->mu);
	int rc = stage_locked(p, heap_cnt, payload, len, items, nitems, flags, pos_out);
	pthread_mutex_unlock(&p->mu);
	return rc;
}

/* p->mu held. force: wake every sleeping consumer whatever wake_at says (the end of the stream). */
static void commit_wake_locked(struct tp *p, int force)
{
	struct ibvb_ctl *c = p->ctl;
	atomic_store_explicit(&c->head, p->head, memory_order_release);
	atomic_store(&c->heartbeat_ns, now_rt());
	atomic_thread_fence(memory_order_seq_cst);
	for (uint32_t i = 0; i < p->max_consumers; i++) {
		struct tp_cons *k = &p->cons[i];
		if (k->fd < 0 || atomic_load_explicit(&k->region->consumer_waiting, memory_order_relaxed) == 0)
			continue;
		if (!force && (int64_t)(p->head - atomic_load_explicit(&k->region->wake_at, memory_order_relaxed)) < 0)
			continue; /* coalesced: not yet (spec §7.5) */
		if (atomic_exchange(&k->region->consumer_waiting, 0) != 0) {
			atomic_fetch_add(&k->region->consumer_futex, 1);
			futex_wake(&k->region->consumer_futex);
			atomic_fetch_add(&p->rows[i].wakes, 1);
		}
	}
}

static void commit_locked(struct tp *p) { commit_wake_locked(p, 0); }

void tp_commit(struct tp *p)
{
	pthread_mutex_lock(&p->mu);
	commit_locked(p);
	pthread_mutex_unlock(&p->mu);
}

int tp_publish(struct tp *p, uint64_t heap_cnt, const void *payload, uint64_t len, const struct ibvb_item *items,
	       uint32_t nitems, uint32_t flags)
{
	pthread_mutex_lock(&p->mu);
	int rc = stage_locked(p, heap_cnt, payload, len, items, nitems, flags, NULL);
	if (rc == 0) {
		atomic_fetch_add_explicit(&p->ctl->stats[IBVB_CTR_HEAPS], 1, memory_order_relaxed);
		commit_locked(p);
	} else {
		atomic_fetch_add_explicit(&p->ctl->stats[IBVB_CTR_DROPPED_HEAPS], 1, memory_order_relaxed);
	}
	pthread_mutex_unlock(&p->mu);
	return rc;
}

int tp_publish_eos(struct tp *p)
{
	pthread_mutex_lock(&p->mu);
	int rc = stage_locked(p, 0, NULL, 0, NULL, 0, IBVB_FLAG_END_OF_STREAM, NULL);
	if (rc == 0) {
		atomic_store_explicit(&p->ctl->stats[IBVB_CTR_END_OF_STREAM], 1, memory_order_relaxed);
		commit_wake_locked(p, 1);
	}
	pthread_mutex_unlock(&p->mu);
	return rc;
}

int tp_wait_release(struct tp *p, uint32_t i, int ms)
{
	pthread_mutex_lock(&p->mu);
	struct ibvb_region *g = p->cons[i].fd >= 0 ? p->cons[i].region : NULL;
	pthread_mutex_unlock(&p->mu);
	if (!g)
		return -ENOENT;
	uint32_t f = atomic_load(&g->release_futex);
	uint64_t t = atomic_load(&g->tail);
	atomic_store(&p->ctl->producer_waiting, 1);
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load(&g->tail) == t) {
		struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
		syscall(SYS_futex, (uint32_t *)&g->release_futex, FUTEX_WAIT, f, &ts, NULL, 0);
	}
	atomic_store(&p->ctl->producer_waiting, 0);
	return atomic_load(&g->release_futex) != f;
}

void tp_write_meta(struct tp *p, const void *records, uint64_t len)
{
	_Atomic uint64_t *seq = (_Atomic uint64_t *)p->meta;
	uint64_t s = atomic_load_explicit(seq, memory_order_relaxed);
	atomic_store_explicit(seq, s + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	memcpy(p->meta + 8, &len, 8);
	memcpy(p->meta + 16, records, len);
	atomic_store_explicit(seq, s + 2, memory_order_release);
}

/* ---- stopping ------------------------------------------------------------------------------------- */

static void stop_server(struct tp *p)
{
	if (p->thr_on) {
		char c = 'x';
		if (write(p->stop_pipe[1], &c, 1) != 1)
			abort();
		pthread_join(p->thr, NULL);
		p->thr_on = 0;
	}
	for (int i = 0; i < 2; i++)
		if (p->stop_pipe[i] >= 0)
			close(p->stop_pipe[i]);
	p->stop_pipe[0] = p->stop_pipe[1] = -1;
}

void tp_close(struct tp *p)
{
	stop_server(p);
	pthread_mutex_lock(&p->mu);
	struct ibvb_ctl *c = p->ctl;
	atomic_store_explicit(&c->state, IBVB_STATE_CLOSED, memory_order_release);
	atomic_thread_fence(memory_order_seq_cst);
	for (uint32_t i = 0; i < p->max_consumers; i++) {
		struct tp_cons *k = &p->cons[i];
		if (k->fd < 0)
			continue;
		atomic_store(&k->region->consumer_waiting, 0);
		atomic_fetch_add(&k->region->consumer_futex, 1);
		futex_wake(&k->region->consumer_futex);
	}
	pthread_mutex_unlock(&p->mu);
	unlink(p->sock_path);
	tp_abandon(p);
}

void tp_abandon(struct tp *p)
{
	stop_server(p);
	pthread_mutex_lock(&p->mu);
	for (uint32_t i = 0; i < IBVB_MAX_CONSUMERS_LIMIT; i++) {
		struct tp_cons *k = &p->cons[i];
		if (k->fd >= 0) {
			close(k->fd);
			munmap(k->region, IBVB_REGION_SIZE);
			k->fd = -1;
		}
	}
	if (p->listen_fd >= 0)
		close(p->listen_fd);
	if (p->ctl && p->ctl != MAP_FAILED)
		munmap(p->ctl, p->ctl_size);
	if (p->data && p->data != MAP_FAILED)
		munmap(p->data, p->data_size);
	p->ctl = NULL;
	p->rows = NULL;
	p->data = NULL;
	if (p->ctl_fd >= 0)
		close(p->ctl_fd);
	if (p->dat_fd >= 0)
		close(p->dat_fd);
	p->ctl_fd = p->dat_fd = p->listen_fd = -1;
	pthread_mutex_unlock(&p->mu);
}

void tp_meta_record(uint8_t *buf, size_t *off, uint64_t id, int ndim, const int64_t *shape, const char *name,
		    const char *desc, const char *fmt, const char *dtype)
{
	uint8_t *r = buf + *off;
	uint32_t nl = (uint32_t)strlen(name), dl = (uint32_t)strlen(desc), fl = (uint32_t)strlen(fmt),
		 tl = (uint32_t)strlen(dtype);
	uint32_t nd = ndim < 0 ? 0xFFFFFFFFu : (uint32_t)ndim;
	uint32_t nshape = ndim < 0 ? 0 : (uint32_t)ndim;
	uint32_t size = (uint32_t)align_up(32 + nshape * 8 + nl + dl + fl + tl, 8);
	memset(r, 0, size);
	memcpy(r + 0, &size, 4);
	memcpy(r + 4, &nd, 4);
	memcpy(r + 8, &id, 8);
	memcpy(r + 16, &nl, 4);
	memcpy(r + 20, &dl, 4);
	memcpy(r + 24, &fl, 4);
	memcpy(r + 28, &tl, 4);
	if (nshape)
		memcpy(r + 32, shape, nshape * 8);
	uint8_t *s = r + 32 + nshape * 8;
	memcpy(s, name, nl);
	s += nl;
	memcpy(s, desc, dl);
	s += dl;
	memcpy(s, fmt, fl);
	s += fl;
	memcpy(s, dtype, tl);
	*off += size;
}
