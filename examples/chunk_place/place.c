/* An example chunk placement plug-in for `ibvbridge recv --chunk-place` (clients/c/ibvbridge_chunk_place.h):
 * it places heaps as --chunk-by 0x1600:STEP --chunk-axis 0x4101:COUNT would, so the two can be compared.
 *
 *   cc -O2 -shared -fPIC -I clients/c -o place.so examples/chunk_place/place.c
 *   ibvbridge recv --ring r --chunk-heaps 64 --chunk-heap-size 8K --chunk-axis 0x4101:4 \
 *       --chunk-place ./place.so:place --chunk-place-items 0x1600,0x4101 --chunk-place-arg 8192 7148
 *
 * items[0] is the timestamp, items[1] the antenna; --chunk-place-arg is the timestamp step (samples per
 * heap). A heap without either item, or with an antenna outside the chunk's axis, is rejected. */
#include <stdlib.h>

#include "ibvbridge_chunk_place.h"

void place(ibvb_chunk_place_data *d, size_t data_size)
{
	/* The step, parsed once per argument string (calls never overlap: no lock is needed). */
	static const char *parsed;
	static uint64_t step = 1;
	uint64_t t, ts, ant;

	(void)data_size; /* every field used here has been in the struct from the start */
	if (d->user_data != parsed) {
		parsed = d->user_data;
		step = parsed ? strtoull(parsed, NULL, 0) : 1;
		if (step == 0)
			step = 1;
	}
	if (d->n_items < 2)
		return; /* chunk_id stays -1: rejected */
	ts = d->items[0];
	ant = d->items[1];
	if (ts == IBVB_CHUNK_PLACE_MISSING || ant == IBVB_CHUNK_PLACE_MISSING || ant >= d->chunk_axis)
		return;
	t = ts / step; /* the heap's time index */
	d->chunk_id = (int64_t)(t / d->heaps_per_chunk);
	d->heap_index = (t % d->heaps_per_chunk) * d->chunk_axis + ant;
	d->heap_offset = 0;
}
