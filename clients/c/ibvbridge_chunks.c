/* ibvbridge_chunks.c — chunks of a chunk-mode ring (docs/ring-layout.md §13), consumer side: the geometry
 * read from a private copy of the header and validated at attach (§13.5), and the view of a held position as
 * a chunk, checked against that geometry. */
#include <errno.h>
#include <string.h>

#include "ibvbridge.h"
#include "ibvbridge_internal.h"

int ibvb__chunk_load(const char *ring, const struct ibvb_ctl *c, struct ibvb_chunk_geometry *g)
{
	memset(g, 0, sizeof *g);
	if (!(c->features & IBVB_FEATURE_CHUNKS))
		return 0;
	/* One private copy of the fields (0xA0..0xC8): every check and use below is of the copy. */
	struct {
		uint32_t heaps, axis;
		uint64_t heap_size, step, time_item, axis_item;
	} raw;
	memcpy(&raw, &c->chunk_heaps, sizeof raw);
	uint64_t slot_size = c->slot_size; /* validated by validate_ctl; the header is constant once handed out */
	if (raw.heaps < 1 || raw.axis < 1 || raw.heap_size < 1 || raw.step < 1)
		return fail(-EBADMSG, "ring %s corrupt: chunk geometry %u heaps x %u axis x %llu bytes, step %llu: "
			    "each must be at least 1", ring, raw.heaps, raw.axis, (unsigned long long)raw.heap_size,
			    (unsigned long long)raw.step);
	uint64_t positions = (uint64_t)raw.heaps * raw.axis, bytes, need;
	if (__builtin_mul_overflow(positions, raw.heap_size, &bytes) ||
	    __builtin_add_overflow(bytes, positions, &need) || need > slot_size)
		return fail(-EBADMSG, "ring %s corrupt: a chunk of %u x %u positions of %llu bytes and its presence "
			    "map do not fit a slot of %llu bytes", ring, raw.heaps, raw.axis,
			    (unsigned long long)raw.heap_size, (unsigned long long)slot_size);
	*g = (struct ibvb_chunk_geometry){raw.heaps, raw.axis, raw.heap_size, raw.step, raw.time_item,
					  raw.axis_item, positions, bytes};
	return 0;
}

int ibvb_chunk_geometry(const struct ibvb_ring *r, struct ibvb_chunk_geometry *g)
{
	if (r->chunks.heaps == 0)
		return fail(-ENOTSUP, "ring %s is not in chunk mode", r->name);
	*g = r->chunks;
	return 0;
}

int ibvb_heap_chunk(struct ibvb_ring *r, const struct ibvb_heap *h, struct ibvb_chunk *c)
{
	const struct ibvb_chunk_geometry *g = &r->chunks;
	if (g->heaps == 0)
		return fail(-ENOTSUP, "ring %s is not in chunk mode", r->name);
	if (!(h->flags & IBVB_FLAG_CHUNK))
		return ibvb__corrupt_desc(r, h->position, "flags (no CHUNK)", h->flags, IBVB_FLAG_CHUNK);
	if (h->heap_size != g->chunk_bytes)
		return ibvb__corrupt_desc(r, h->position, "chunk heap_size", h->heap_size, g->chunk_bytes);
	if (h->received > g->chunk_bytes)
		return ibvb__corrupt_desc(r, h->position, "chunk received", h->received, g->chunk_bytes);
	/* h->payload is the slot (slot_size bytes): chunk and presence map lie inside it (checked at attach) */
	c->heap = *h;
	c->chunk_id = h->heap_cnt;
	c->data = h->payload;
	c->present = h->payload + g->chunk_bytes;
	c->heaps = g->heaps;
	c->axis = g->axis;
	c->heap_size = g->heap_size;
	c->positions = g->positions;
	c->chunk_bytes = g->chunk_bytes;
	return 0;
}

int ibvb_wait_chunk(struct ibvb_ring *r, struct ibvb_chunk *c, int timeout_ms)
{
	struct ibvb_heap h;
	int rc = ibvb_wait(r, &h, timeout_ms);
	if (rc < 0)
		return rc;
	return ibvb_heap_chunk(r, &h, c);
}
