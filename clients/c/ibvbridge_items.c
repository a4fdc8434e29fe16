/* ibvbridge_items.c — owns the C view of items by name: snapshots of the ring's item descriptors (spec §6,
 * read with ibvb_read_meta / ibvb_meta_next), their formats and numpy dtypes, and the decoding of scalar
 * items by format as spead2 does it (ibvbridge_items.h). */
#define _GNU_SOURCE
#include "ibvbridge.h"
#include "ibvbridge_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ibvb_descriptors {
	uint64_t seq;                 /* the metadata seq the snapshot was read at */
	size_t count;
	struct ibvb_descriptor *d;    /* count entries; their strings live in arena */
	char *arena;
};

static uint64_t meta_seq(const struct ibvb_ring *r)
{
	const struct ibvb_meta_header *mh = (const struct ibvb_meta_header *)r->meta;
	return atomic_load_explicit(&mh->seq, memory_order_acquire);
}

/* Split a raw SPEAD format into fields of width w (1 code byte, w-1 bytes of big-endian bit count). 1 when
 * every field has a known code and a positive width and they fit IBVB_FORMAT_MAX, else 0. */
static int split_format(const uint8_t *b, uint32_t len, uint32_t w, struct ibvb_descriptor *d)
{
	if (len == 0 || len % w != 0 || len / w > IBVB_FORMAT_MAX)
		return 0;
	uint32_t n = len / w;
	for (uint32_t k = 0; k < n; k++) {
		const uint8_t *f = b + (size_t)k * w;
		uint64_t bits = 0;
		for (uint32_t j = 1; j < w; j++)
			bits = bits << 8 | f[j];
		if (!f[0] || !strchr("uifcb", f[0]) || bits == 0 || bits > UINT32_MAX)
			return 0;
		d->format[k].code = (char)f[0];
		d->format[k].bits = (uint32_t)bits;
	}
	d->format_len = n;
	return 1;
}

/* The value of key in a numpy header ("{'descr': '<f4', 'fortran_order': False, ...}"): a pointer just past
 * "'key':" and any spaces, or NULL. */
static const char *header_value(const char *h, size_t len, const char *key)
{
	size_t kl = strlen(key);
	for (size_t i = 0; i + kl + 2 <= len; i++) {
		if ((h[i] == '\'' || h[i] == '"') && memcmp(h + i + 1, key, kl) == 0 && h[i + 1 + kl] == h[i]) {
			size_t j = i + kl + 2;
			while (j < len && h[j] == ' ')
				j++;
			if (j >= len || h[j] != ':')
				continue;
			j++;
			while (j < len && h[j] == ' ')
				j++;
			return h + j;
		}
	}
	return NULL;
}

/* Fill d's strings from record m into the arena at *a (each NUL-terminated). */
static void fill(struct ibvb_descriptor *d, const struct ibvb_meta_record *m, char **a)
{
	char *p = *a;
	d->name = p;
	memcpy(p, m->name, m->name_len);
	p += m->name_len;
	*p++ = 0;
	d->description = p;
	memcpy(p, m->description, m->description_len);
	p += m->description_len;
	*p++ = 0;
	d->dtype_header = p;
	memcpy(p, m->dtype, m->dtype_len);
	p += m->dtype_len;
	*p++ = 0;
	/* dtype: the quoted 'descr' value (a structured dtype's list is left out: "") */
	d->dtype = p;
	const char *v = header_value(m->dtype, m->dtype_len, "descr");
	size_t end = m->dtype_len;
	if (v && (*v == '\'' || *v == '"')) {
		const char *q = v + 1, *stop = m->dtype + end;
		while (q < stop && *q != *v)
			q++;
		if (q < stop) {
			memcpy(p, v + 1, (size_t)(q - v - 1));
			p += q - v - 1;
		}
	}
	*p++ = 0;
	v = header_value(m->dtype, m->dtype_len, "fortran_order");
	d->order = v && (size_t)(m->dtype + end - v) >= 4 && memcmp(v, "True", 4) == 0 ? 'F' : 'C';
	d->format_text = p;
	if (d->format_len) {
		p += sprintf(p, "[");
		for (uint32_t k = 0; k < d->format_len; k++)
			p += sprintf(p, "%s('%c', %u)", k ? ", " : "", d->format[k].code, d->format[k].bits);
		p += sprintf(p, "]");
	}
	*p++ = 0;
	*a = p;
}

/* Bytes fill() may write for record m: its strings, a dtype no longer than the header, and the format
 * text (at most 24 bytes a field: ", ('c', 4294967295)"). */
static size_t arena_need(const struct ibvb_meta_record *m)
{
	return (size_t)m->name_len + m->description_len + 2 * (size_t)m->dtype_len + IBVB_FORMAT_MAX * 24 + 8;
}

int ibvb_descriptors_read(const struct ibvb_ring *r, struct ibvb_descriptors **out)
{
	ibvb_descriptors_free(*out);
	*out = NULL;
	/* Sized by the length the producer wrote, not by the header's meta_size (which a ring may make huge), and
	 * at most IBVB_DESCRIPTORS_MAX_BYTES. */
	size_t cap = 4096;
	uint8_t *buf = malloc(cap);
	if (!buf)
		return -ENOMEM;
	long len = -EAGAIN;
	uint64_t seq = 0;
	for (int attempt = 0; attempt < 1000 && len == -EAGAIN; attempt++) {
		uint64_t s0 = meta_seq(r);
		size_t need = 0;
		len = ibvb_read_meta(r, buf, cap, &need);
		if (len == -ENOBUFS) {
			if (need > IBVB_DESCRIPTORS_MAX_BYTES) {
				free(buf);
				return ibvb__fail(-EMSGSIZE,
						  "ring %s: %zu bytes of item descriptors exceed the %u this client reads "
						  "(IBVB_DESCRIPTORS_MAX_BYTES)",
						  r->name, need, (unsigned)IBVB_DESCRIPTORS_MAX_BYTES);
			}
			uint8_t *nb = realloc(buf, need);
			if (!nb) {
				free(buf);
				return -ENOMEM;
			}
			buf = nb;
			cap = need;
			len = -EAGAIN; /* read again into the larger buffer */
			continue;
		}
		if (len >= 0 && meta_seq(r) != s0)
			len = -EAGAIN; /* rewritten between the two reads: the seq would not name what we hold */
		seq = s0;
	}
	if (len < 0) {
		free(buf);
		return (int)len;
	}
	/* pass 1: count and size; pass 2: fill */
	size_t off = 0, n = 0, arena = 1;
	struct ibvb_meta_record m;
	int rc;
	while ((rc = ibvb_meta_next(buf, (size_t)len, &off, &m)) == 1) {
		n++;
		arena += arena_need(&m);
	}
	if (rc < 0) {
		free(buf);
		return rc;
	}
	struct ibvb_descriptors *ds = calloc(1, sizeof *ds);
	if (ds) {
		ds->d = calloc(n ? n : 1, sizeof *ds->d);
		ds->arena = malloc(arena);
	}
	if (!ds || !ds->d || !ds->arena) {
		ibvb_descriptors_free(ds);
		free(buf);
		return -ENOMEM;
	}
	char *a = ds->arena;
	off = 0;
	for (size_t i = 0; i < n && ibvb_meta_next(buf, (size_t)len, &off, &m) == 1; i++) {
		struct ibvb_descriptor *d = &ds->d[i];
		d->id = m.id;
		if (m.ndim == IBVB_META_NDIM_UNKNOWN || m.ndim > IBVB_NDIM_MAX) {
			d->ndim = IBVB_NDIM_UNKNOWN;
		} else {
			d->ndim = (int)m.ndim;
			for (uint32_t k = 0; k < m.ndim; k++)
				d->shape[k] = ibvb_meta_dim(&m, k);
		}
		/* The ring keeps the format in the width of the flavour it arrived in: SPEAD-64-48's (3 bytes a
		 * field) is tried first, then SPEAD-64-40's (4); a width that fits none leaves format_len 0. */
		const uint8_t *fb = (const uint8_t *)m.format;
		if (!split_format(fb, m.format_len, 3, d))
			split_format(fb, m.format_len, 4, d);
		fill(d, &m, &a);
	}
	ds->count = n;
	ds->seq = seq;
	free(buf);
	*out = ds;
	return 0;
}

int ibvb_descriptors_stale(const struct ibvb_ring *r, const struct ibvb_descriptors *ds)
{
	return !ds || meta_seq(r) != ds->seq;
}

void ibvb_descriptors_free(struct ibvb_descriptors *ds)
{
	if (!ds)
		return;
	free(ds->d);
	free(ds->arena);
	free(ds);
}

size_t ibvb_descriptor_count(const struct ibvb_descriptors *ds) { return ds ? ds->count : 0; }

const struct ibvb_descriptor *ibvb_descriptor_at(const struct ibvb_descriptors *ds, size_t i)
{
	return ds && i < ds->count ? &ds->d[i] : NULL;
}

const struct ibvb_descriptor *ibvb_descriptor_find(const struct ibvb_descriptors *ds, const char *name)
{
	for (size_t i = 0; ds && name && i < ds->count; i++)
		if (strcmp(ds->d[i].name, name) == 0)
			return &ds->d[i];
	return NULL;
}

const struct ibvb_descriptor *ibvb_descriptor_by_id(const struct ibvb_descriptors *ds, uint64_t id)
{
	/* a later record for the same id replaces an earlier one, as a re-announced descriptor does */
	for (size_t i = ds ? ds->count : 0; i-- > 0;)
		if (ds->d[i].id == id)
			return &ds->d[i];
	return NULL;
}

const struct ibvb_item *ibvb_item_find(const struct ibvb_heap *h, const struct ibvb_descriptors *ds,
				       const char *name, const struct ibvb_descriptor **desc)
{
	const struct ibvb_descriptor *d = ibvb_descriptor_find(ds, name);
	if (desc)
		*desc = d;
	return d ? ibvb_find_item(h, d->id) : NULL;
}

int ibvb_item_decode(const struct ibvb_heap *h, const struct ibvb_item *it, const struct ibvb_descriptor *d,
		     struct ibvb_value *v)
{
	if (!d || d->format_len != 1 || d->ndim > 0 || d->format[0].bits > 64)
		return -ENOTSUP;
	uint32_t bits = d->format[0].bits, nbytes = (bits + 7) / 8;
	char code = d->format[0].code;
	if (code == 'f' && bits != 32 && bits != 64)
		return -ENOTSUP;
	uint64_t x = 0;
	if (ibvb_item_is_immediate(it)) {
		if (it->length < nbytes || it->length > 8)
			return -ERANGE;
		x = nbytes == 8 ? it->value : it->value & ((UINT64_C(1) << (8 * nbytes)) - 1); /* padded at the head */
	} else {
		if (it->length < nbytes || ibvb_item_is_cut(it))
			return -ERANGE; /* a cut item's value is not all there */
		const uint8_t *p = ibvb_item_ptr(h, it); /* padded at the tail: the first nbytes, big-endian */
		for (uint32_t k = 0; k < nbytes; k++)
			x = x << 8 | p[k];
	}
	x >>= 8 * nbytes - bits; /* the field is the top bits of its bytes */
	memset(v, 0, sizeof *v);
	v->code = code;
	switch (code) {
	case 'i':
		if (bits < 64 && (x >> (bits - 1)) & 1)
			x |= ~UINT64_C(0) << bits;
		v->i = (int64_t)x;
		v->u = x;
		v->f = (double)v->i;
		break;
	case 'f':
		if (bits == 32) {
			uint32_t w = (uint32_t)x;
			float f;
			memcpy(&f, &w, 4);
			v->f = f;
		} else {
			memcpy(&v->f, &x, 8);
		}
		break;
	case 'b':
		x = x != 0;
		/* fall through */
	default: /* 'u', 'c' */
		v->u = x;
		v->i = (int64_t)x;
		v->f = (double)x;
	}
	return 0;
}
