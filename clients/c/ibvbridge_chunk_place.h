/* ibvbridge_chunk_place.h: the contract of a chunk placement plug-in, `ibvbridge recv --chunk-place
 * LIB.so:FUNCTION` (docs/how-to/chunk-mode.md, docs/ring-layout.md §13). It is spead2's chunk_place
 * (recv::chunk_place_data) for ibvbridge's chunk rings: for each heap, the function is given the heap's
 * cnt, its length and the values of the immediate items named by --chunk-place-items, and says which chunk
 * the heap belongs to, at which heap position in the chunk and at which byte offset in that position.
 *
 * Build a plug-in with `cc -O2 -shared -fPIC -o place.so place.c`; examples/chunk_place/place.c is one.
 *
 * TRUST: the library is trusted code. recv loads it once, with dlopen(path, RTLD_NOW | RTLD_LOCAL), into
 * its own process, with its privileges, and never unloads it; its constructors run at load. A library or
 * symbol that cannot be found makes recv refuse to start, in one line (exit status 2). Load only code you
 * would run as recv's user.
 *
 * CALLS: the function is called on recv's receive goroutine (with --threads N, by the receive threads in
 * turn, under the lock that already serialises them): never two calls at once, but not always on the same
 * OS thread — it must be thread-compatible, it need not be thread-safe. It is called once per heap with the first packet of the
 * heap recv receives, before any of the heap's payload is written. A call whose inputs all equal the
 * previous call's is not repeated (recv may look one packet up more than once): its answer is reused, so
 * an answer should follow from the inputs. It runs for every heap at the full packet rate: it must be fast
 * (a few tens of nanoseconds), must not block, sleep, take locks another thread may hold, or call back
 * into recv. It must not keep the data pointer or the items pointer after it returns.
 *
 * ANSWER: recv checks it against the ring's chunk geometry: a negative chunk_id rejects the heap; so does
 * a heap_index at or above heaps_per_chunk * chunk_axis, a heap_offset at or above chunk_heap_size, or an
 * offset that leaves too little room for the heap's length. A rejected heap is counted in rejected_heaps
 * and nothing of it is written. Chunk ids then follow the ring's rules (§13.4): a window of open chunks,
 * too-old heaps counted in too_old_heaps, chunks published in id order.
 */
#ifndef IBVBRIDGE_CHUNK_PLACE_H
#define IBVBRIDGE_CHUNK_PLACE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The value of an item (or heap length) the heap's packet does not carry: no immediate value is this
 * large (they have at most 56 bits). spead2 uses -1 the same way. */
#define IBVB_CHUNK_PLACE_MISSING UINT64_MAX

/* The placement's inputs and outputs. recv fills the inputs and presets the outputs (chunk_id -1,
 * heap_index 0, heap_offset 0) before each call; the function writes the outputs only. New fields may
 * be added at the end: data_size (the second argument) is sizeof(struct) as recv was built with. */
typedef struct ibvb_chunk_place_data {
	/* In. */
	uint64_t heap_cnt;        /* the heap's cnt (item 0x1) */
	uint64_t heap_size;       /* its heap length (item 0x2), IBVB_CHUNK_PLACE_MISSING without one */
	const uint64_t *items;    /* n_items values, in --chunk-place-items order (MISSING when absent) */
	size_t n_items;
	const char *user_data;    /* --chunk-place-arg's string, NULL without it; the same pointer each call */
	uint32_t heaps_per_chunk; /* the ring's geometry (--chunk-heaps): positions along the time axis */
	uint32_t chunk_axis;      /* positions along the second axis (--chunk-axis COUNT, else 1) */
	uint64_t chunk_heap_size; /* bytes per heap position (--chunk-heap-size) */
	/* Out. */
	int64_t chunk_id;     /* the heap's chunk; negative (the preset -1): reject the heap */
	uint64_t heap_index;  /* its position in the chunk, time-major, axis within: t * chunk_axis + a */
	uint64_t heap_offset; /* byte offset of its payload in the position, usually 0 */
} ibvb_chunk_place_data;

/* The function recv --chunk-place LIB.so:FUNCTION loads, spead2's chunk_place_function. */
typedef void ibvb_chunk_place_fn(ibvb_chunk_place_data *data, size_t data_size);

#ifdef __cplusplus
}
#endif

#endif
