/* test_producer.c — test-only producer, see test_producer.h. */
#define _GNU_SOURCE
#include "test_producer.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

static uint64_t now_rt(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

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
	if (!o || !o->slot_shift)
		d.slot_shift = 3;
	memset(p, 0, sizeof *p);
	p->lock_fd = p->ctl_fd = p->dat_fd = -1;
	snprintf(p->ctl_path, sizeof p->ctl_path, "%s/ibvbridge.%s.v1.ctl", dir, name);
	snprintf(p->dat_path, sizeof p->dat_path, "%s/ibvbridge.%s.v1.dat", dir, name);
	snprintf(p->lock_path, sizeof p->lock_path, "%s/ibvbridge.%s.v1.lock", dir, name);
	snprintf(p->cons_path, sizeof p->cons_path, "%s/ibvbridge.%s.v1.cons", dir, name);

	/* §7.1 step 1: one producer per name. */
	p->lock_fd = open(p->lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (p->lock_fd < 0)
		return -errno;
	if (flock(p->lock_fd, LOCK_EX | LOCK_NB) < 0) {
		int e = errno;
		close(p->lock_fd);
		return e == EWOULDBLOCK ? -EBUSY : -e;
	}
	/* step 2: stale files */
	unlink(p->ctl_path);
	unlink(p->dat_path);

	/* step 3: data file */
	uint64_t sc = d.slot_count, off = 0;
	uint64_t desc_off = off;
	off = align_up(off + sc * IBVB_DESC_SIZE, IBVB_REGION_ALIGN);
	uint64_t items_off = off;
	off = align_up(off + sc * d.max_items * IBVB_ITEM_SIZE, IBVB_REGION_ALIGN);
	uint64_t meta_off = off;
	off = align_up(off + d.meta_size, IBVB_REGION_ALIGN);
	uint64_t payload_off = off;
	off = align_up(off + sc * d.slot_size, IBVB_REGION_ALIGN);
	uint64_t packet_off = off;
	off = align_up(off + d.packet_size, IBVB_REGION_ALIGN);
	uint64_t fsz = align_up(off, 4096);

	p->dat_fd = open(p->dat_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (p->dat_fd < 0 || ftruncate(p->dat_fd, (off_t)fsz) < 0)
		return -errno;
	p->data = mmap(NULL, fsz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, p->dat_fd, 0);
	if (p->data == MAP_FAILED)
		return -errno;
	p->data_size = fsz;
	p->desc = (struct ibvb_desc *)(p->data + desc_off);
	p->items = (struct ibvb_item *)(p->data + items_off);
	p->meta = p->data + meta_off;
	p->payload = p->data + payload_off;
	p->slot_count = sc;
	p->mask = sc - 1;
	p->slot_size = d.slot_size;
	p->max_items = d.max_items;
	p->slot_shift = d.slot_shift;
	p->head = d.start_pos;

	/* step 4: control file under a temporary name, locked, filled, READY, renamed into place. */
	char tmp[600];
	snprintf(tmp, sizeof tmp, "%s.tmp%d", p->ctl_path, (int)getpid());
	p->ctl_fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (p->ctl_fd < 0 || ftruncate(p->ctl_fd, IBVB_CTL_SIZE) < 0 || flock(p->ctl_fd, LOCK_EX) < 0)
		return -errno;
	p->ctl = mmap(NULL, IBVB_CTL_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, p->ctl_fd, 0);
	if (p->ctl == MAP_FAILED)
		return -errno;
	struct ibvb_ctl *c = p->ctl;
	c->major = IBVB_MAJOR;
	c->minor = IBVB_MINOR;
	c->ctl_size = IBVB_CTL_SIZE;
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
	c->data_file_size = fsz;
	c->desc_offset = desc_off;
	c->items_offset = items_off;
	c->meta_offset = meta_off;
	c->meta_size = d.meta_size;
	c->payload_offset = payload_off;
	c->packet_offset = packet_off;
	c->packet_size = d.packet_size;
	c->stats_count = IBVB_STATS_COUNT;
	if (p->dat_path[0] != '/' || strlen(p->dat_path) >= IBVB_DATA_PATH_MAX)
		return -EINVAL;
	strcpy(c->data_path, p->dat_path);
	atomic_store(&c->head, d.start_pos);
	atomic_store(&c->tail, d.start_pos);
	atomic_store(&c->consumer_futex, d.futex_start);
	atomic_store(&c->producer_futex, d.futex_start);
	atomic_store(&c->heartbeat_ns, now_rt());
	atomic_store_explicit(&c->magic, IBVB_MAGIC, memory_order_relaxed);
	atomic_store_explicit(&c->state, IBVB_STATE_READY, memory_order_release);
	if (rename(tmp, p->ctl_path) < 0)
		return -errno;
	return 0;
}

void tp_pattern(uint8_t *buf, uint64_t heap_cnt, uint64_t len)
{
	uint8_t base = (uint8_t)(heap_cnt * 31);
	for (uint64_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(base + i);
}

int tp_stage(struct tp *p, uint64_t heap_cnt, const void *payload, uint64_t len, const struct ibvb_item *items,
	     uint32_t nitems, uint32_t flags, uint64_t *pos_out)
{
	uint64_t tail = atomic_load_explicit(&p->ctl->tail, memory_order_acquire);
	if (p->head - tail >= p->slot_count)
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
	d->packets = 1;
	d->reserved = 0;
	d->seq = pos + 1;
	p->head = pos + 1;
	if (pos_out)
		*pos_out = pos;
	return 0;
}

void tp_commit(struct tp *p)
{
	struct ibvb_ctl *c = p->ctl;
	atomic_store_explicit(&c->head, p->head, memory_order_release);
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&c->consumer_waiting, memory_order_relaxed) != 0 &&
	    atomic_exchange(&c->consumer_waiting, 0) == 1) {
		atomic_fetch_add(&c->consumer_futex, 1);
		syscall(SYS_futex, (uint32_t *)&c->consumer_futex, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
	}
}

int tp_publish(struct tp *p, uint64_t heap_cnt, const void *payload, uint64_t len, const struct ibvb_item *items,
	       uint32_t nitems, uint32_t flags)
{
	int rc = tp_stage(p, heap_cnt, payload, len, items, nitems, flags, NULL);
	if (rc == 0) {
		atomic_fetch_add_explicit(&p->ctl->stats[IBVB_CTR_HEAPS], 1, memory_order_relaxed);
		tp_commit(p);
	} else {
		atomic_fetch_add_explicit(&p->ctl->stats[IBVB_CTR_DROPPED_HEAPS], 1, memory_order_relaxed);
	}
	return rc;
}

int tp_publish_eos(struct tp *p)
{
	int rc = tp_stage(p, 0, NULL, 0, NULL, 0, IBVB_FLAG_END_OF_STREAM, NULL);
	if (rc == 0) {
		atomic_store_explicit(&p->ctl->stats[IBVB_CTR_END_OF_STREAM], 1, memory_order_relaxed);
		tp_commit(p);
	}
	return rc;
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

void tp_close(struct tp *p)
{
	struct ibvb_ctl *c = p->ctl;
	atomic_store_explicit(&c->state, IBVB_STATE_CLOSED, memory_order_release);
	atomic_fetch_add(&c->consumer_futex, 1);
	syscall(SYS_futex, (uint32_t *)&c->consumer_futex, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
	unlink(p->ctl_path);
	unlink(p->dat_path);
	tp_abandon(p);
}

void tp_abandon(struct tp *p)
{
	if (p->ctl && p->ctl != MAP_FAILED)
		munmap(p->ctl, IBVB_CTL_SIZE);
	if (p->data && p->data != MAP_FAILED)
		munmap(p->data, p->data_size);
	p->ctl = NULL;
	p->data = NULL;
	if (p->ctl_fd >= 0)
		close(p->ctl_fd);
	if (p->dat_fd >= 0)
		close(p->dat_fd);
	if (p->lock_fd >= 0)
		close(p->lock_fd);
	p->ctl_fd = p->dat_fd = p->lock_fd = -1;
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
