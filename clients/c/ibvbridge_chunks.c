/* ibvbridge_chunks.c — chunks of a chunk-mode ring (docs/ring-layout.md §13), consumer side: the geometry
 * read from a private copy of the header and validated at attach (§13.5), and the view of a held position as
 * a chunk, checked against that geometry. */
#include <errno.h>
#include <string.h>

#include "ibvbridge.h"
#include "ibvbridge_internal.h"

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
