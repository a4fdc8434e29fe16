/* spead2's chunk_place for `ibvbridge bench python --chunks`: it places heaps as recv --chunk-by 0x1 does,
 * by heap cnt: chunk cnt / heaps, position cnt % heaps, at that position's byte offset; it rejects the
 * stream-stop heap (recv takes the stop before placing; spead2 places every heap, and would open a chunk
 * for it and publish that chunk empty). Built with
 * cc -O2 -shared -fPIC and handed to spead2.recv.ChunkStreamConfig.place as a PyCapsule named
 * "void (void *, size_t, void *)" whose context is the geometry (bench/pyloop.py, compiled_place). */
#include <stddef.h>
#include <stdint.h>

/* The leading fields of spead2::recv::chunk_place_data (spead2/recv_chunk_stream.h), the ones used here. */
struct place_data {
	const uint8_t *packet;
	size_t packet_size;
	int64_t *items; /* ChunkStreamConfig.items = [spead2.HEAP_CNT_ID, 0x06]: the heap cnt, the stream control
	                   item (-1: the heap has none) */
	int64_t chunk_id; /* out; left at -1, the heap is discarded */
	size_t heap_index; /* out */
	size_t heap_offset; /* out: bytes into the chunk's data */
};

/* geometry[0]: heaps per chunk, geometry[1]: bytes per heap position. */
void place(void *data, size_t size, void *user_data)
{
	struct place_data *d = data;
	const int64_t *geometry = user_data;
	int64_t cnt;

	if (size < sizeof *d || geometry[0] < 1)
		return;
	cnt = d->items[0];
	if (cnt < 0 || d->items[1] != -1)
		return;
	d->chunk_id = cnt / geometry[0];
	d->heap_index = (size_t)(cnt % geometry[0]);
	d->heap_offset = d->heap_index * (size_t)geometry[1];
}
