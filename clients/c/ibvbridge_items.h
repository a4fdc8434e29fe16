/* ibvbridge_items.h — items by name, in spead2's terms, for C and C++ consumers (libibvbridge).
 *
 *   struct ibvb_descriptors *ds = NULL;
 *   ibvb_descriptors_read(r, &ds);                              // a snapshot of the ring's metadata (§6)
 *   while (ibvb_wait(r, &h, 1000) == 0 || ...) {
 *       if (ibvb_descriptors_stale(r, ds)) ibvb_descriptors_read(r, &ds);  // descriptors arrived or changed
 *       const struct ibvb_descriptor *d;
 *       const struct ibvb_item *ts = ibvb_item_find(&h, ds, "timestamp", &d);
 *       struct ibvb_value v;
 *       if (ts && ibvb_item_decode(&h, ts, d, &v) == 0) printf("%" PRIu64 "\n", v.u);
 *       ibvb_release(r, &h);
 *   }
 *   ibvb_descriptors_free(ds);
 *
 * A snapshot is the caller's own copy: the strings are NUL-terminated, everything is validated when it is
 * read (a malformed record is -EBADMSG), and it stays valid after the heap's release and the detach. It
 * does not change when the producer rewrites the metadata: ibvb_descriptors_stale() says when to read again
 * (after a heap with IBVB_FLAG_HAS_DESCRIPTORS, or when a name is not found).
 */
#ifndef IBVBRIDGE_ITEMS_H
#define IBVBRIDGE_ITEMS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ibvb_ring;
struct ibvb_heap;
struct ibvb_item;

/* One field of a SPEAD format: a type code ('u', 'i', 'f', 'c', 'b') and a width in bits. */
struct ibvb_format_field {
	char code;
	uint32_t bits;
};

/* ibvb_descriptors_read refuses stream metadata longer than this (-EMSGSIZE, one line): the copy is sized
 * by what the producer wrote, never by the header's meta_size alone. */
#define IBVB_DESCRIPTORS_MAX_BYTES (64u << 20)
#define IBVB_FORMAT_MAX 16  /* fields kept per descriptor (a longer format is -EBADMSG) */
#define IBVB_NDIM_MAX 32    /* dimensions kept per descriptor */
#define IBVB_NDIM_UNKNOWN (-1)

/* What a SPEAD item descriptor says (spead2.Descriptor). */
struct ibvb_descriptor {
	uint64_t id;
	const char *name;          /* NUL-terminated, "" when none */
	const char *description;
	int ndim;                  /* IBVB_NDIM_UNKNOWN: the stream gave no shape */
	int64_t shape[IBVB_NDIM_MAX]; /* -1: the variable dimension */
	uint32_t format_len;       /* fields in format (0: the item has a dtype instead) */
	struct ibvb_format_field format[IBVB_FORMAT_MAX];
	const char *format_text;   /* spead2's spelling: "[('u', 48)]", "" when none */
	const char *dtype;         /* numpy dtype string from the header's 'descr', e.g. "<f4"; "" when none */
	const char *dtype_header;  /* the numpy header text as the stream sent it */
	char order;                /* 'C' or 'F' (fortran_order) */
};

struct ibvb_descriptors; /* a snapshot: opaque, owned by the caller */

/* Read the ring's descriptors into a new snapshot (*out; a snapshot already there is freed first). 0, or
 * -ENOMEM, -EBADMSG (a malformed record or format), -EAGAIN (the producer kept rewriting the area). */
int ibvb_descriptors_read(const struct ibvb_ring *r, struct ibvb_descriptors **out);
/* 1 when the ring's metadata changed since the snapshot was read (read it again), else 0. */
int ibvb_descriptors_stale(const struct ibvb_ring *r, const struct ibvb_descriptors *ds);
void ibvb_descriptors_free(struct ibvb_descriptors *ds);

/* Iterate: descriptors in the order the stream announced them; NULL past the end. */
size_t ibvb_descriptor_count(const struct ibvb_descriptors *ds);
const struct ibvb_descriptor *ibvb_descriptor_at(const struct ibvb_descriptors *ds, size_t i);
/* By name or by id; NULL when the snapshot has none. */
const struct ibvb_descriptor *ibvb_descriptor_find(const struct ibvb_descriptors *ds, const char *name);
const struct ibvb_descriptor *ibvb_descriptor_by_id(const struct ibvb_descriptors *ds, uint64_t id);

/* The heap's item called name (NULL when the snapshot has no such descriptor or the heap no such item);
 * *desc (if desc is not NULL) gets its descriptor. */
const struct ibvb_item *ibvb_item_find(const struct ibvb_heap *h, const struct ibvb_descriptors *ds,
				       const char *name, const struct ibvb_descriptor **desc);

/* A scalar decoded by its format, as spead2 decodes it: code 'u' / 'c' / 'b' -> u, 'i' -> i (sign-extended),
 * 'f' -> f. */
struct ibvb_value {
	char code;
	uint64_t u;
	int64_t i;
	double f;
};

/* Decode item it of heap h by descriptor d (a format of one field of at most 64 bits; an immediate is
 * padded at its head, an address item at its tail, as SPEAD says). 0, or -ENOTSUP (an array, several
 * fields or a dtype: read it with ibvb_item_ptr and d->dtype / d->shape), -ERANGE (the item is shorter
 * than the field). */
int ibvb_item_decode(const struct ibvb_heap *h, const struct ibvb_item *it, const struct ibvb_descriptor *d,
		     struct ibvb_value *v);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* IBVBRIDGE_ITEMS_H */
