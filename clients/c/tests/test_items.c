/* test_items.c — items by name (ibvbridge_items.h) against the public C producer: descriptor snapshots,
 * lookup by name, formats in both flavours' widths, numpy dtype strings, scalar decoding, staleness and
 * malformed metadata. usage: test_items; IBVB_TEST=substring runs a subset. */
#define _GNU_SOURCE
#include "ibvbridge.h"
#include "harness.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

static char g_dir[256];

static struct ibvb_producer *make(const char *name)
{
	struct ibvb_producer_opts o;
	memset(&o, 0, sizeof o);
	o.dir = g_dir;
	o.slot_count = 8;
	o.slot_size = 4096;
	o.max_items = 8;
	o.meta_size = 4096;
	o.hugepages = IBVB_HUGEPAGES_OFF;
	struct ibvb_producer *p = NULL;
	return ibvb_producer_create(&p, name, &o) == 0 ? p : NULL;
}

static struct ibvb_ring *attach(const char *name)
{
	struct ibvb_attach_opts ao = {.dir = g_dir};
	struct ibvb_ring *r = NULL;
	return ibvb_attach_opts(&r, name, 5000, &ao) == 0 ? r : NULL;
}

/* timestamp u48 (64-48 width), offset i40 (64-40 width), spectrum <f4 (8,), F-ordered matrix, a f64 field */
static size_t records(uint8_t *buf, size_t cap)
{
	size_t n = 0;
	static const uint8_t u48[] = {'u', 0, 48}, i40[] = {'i', 0, 0, 40}, f64[] = {'f', 0, 64};
	int64_t shape[] = {8}, mshape[] = {2, 3};
	n += ibvb_meta_encode(buf + n, cap - n, 0x1600, 0, NULL, "timestamp", "ADC sample count", u48, 3, "");
	n += ibvb_meta_encode(buf + n, cap - n, 0x1601, 0, NULL, "offset", "", i40, 4, "");
	n += ibvb_meta_encode(buf + n, cap - n, 0x1800, 1, shape, "spectrum", "power",
			      NULL, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (8,)}");
	n += ibvb_meta_encode(buf + n, cap - n, 0x1801, 2, mshape, "matrix", "",
			      NULL, 0, "{'descr': '>i2', 'fortran_order': True, 'shape': (2, 3)}");
	n += ibvb_meta_encode(buf + n, cap - n, 0x1802, -1, NULL, "gain", "", f64, 3, "");
	return n;
}

static void t_descriptors_by_name_and_in_order(void)
{
	struct ibvb_producer *p = make("names");
	CHECK(p);
	struct ibvb_ring *r = attach("names");
	CHECK(r);
	struct ibvb_descriptors *ds = NULL;
	CHECK_EQ(ibvb_descriptors_read(r, &ds), 0);
	CHECK_EQ(ibvb_descriptor_count(ds), 0); /* nothing announced yet */
	uint8_t buf[2048];
	size_t n = records(buf, sizeof buf);
	CHECK_EQ(ibvb_producer_set_descriptors(p, buf, n), 0);
	CHECK_EQ(ibvb_descriptors_stale(r, ds), 1);
	CHECK_EQ(ibvb_descriptors_read(r, &ds), 0);
	CHECK_EQ(ibvb_descriptors_stale(r, ds), 0);
	CHECK_EQ(ibvb_descriptor_count(ds), 5);
	const char *names[] = {"timestamp", "offset", "spectrum", "matrix", "gain"};
	for (size_t i = 0; i < 5; i++)
		CHECK(strcmp(ibvb_descriptor_at(ds, i)->name, names[i]) == 0);
	CHECK(ibvb_descriptor_at(ds, 5) == NULL);
	const struct ibvb_descriptor *d = ibvb_descriptor_find(ds, "timestamp");
	CHECK(d && d->id == 0x1600 && d->ndim == 0 && d->format_len == 1 && d->format[0].code == 'u' &&
	      d->format[0].bits == 48);
	CHECK(strcmp(d->format_text, "[('u', 48)]") == 0 && strcmp(d->description, "ADC sample count") == 0);
	CHECK(strcmp(d->dtype, "") == 0);
	d = ibvb_descriptor_find(ds, "offset");
	CHECK(d && d->format_len == 1 && d->format[0].code == 'i' && d->format[0].bits == 40); /* 64-40 width */
	d = ibvb_descriptor_find(ds, "spectrum");
	CHECK(d && strcmp(d->dtype, "<f4") == 0 && d->order == 'C' && d->ndim == 1 && d->shape[0] == 8 &&
	      d->format_len == 0 && strcmp(d->format_text, "") == 0);
	d = ibvb_descriptor_find(ds, "matrix");
	CHECK(d && strcmp(d->dtype, ">i2") == 0 && d->order == 'F' && d->ndim == 2 && d->shape[1] == 3);
	CHECK(ibvb_descriptor_find(ds, "gain")->ndim == IBVB_NDIM_UNKNOWN);
	CHECK(ibvb_descriptor_find(ds, "nosuch") == NULL);
	CHECK(ibvb_descriptor_by_id(ds, 0x1801) == ibvb_descriptor_find(ds, "matrix"));
	ibvb_detach(r);
	/* the snapshot is the caller's: still readable after the detach and the producer's close */
	ibvb_producer_close(p);
	CHECK(strcmp(ibvb_descriptor_at(ds, 2)->dtype_header, "{'descr': '<f4', 'fortran_order': False, 'shape': (8,)}") == 0);
	ibvb_descriptors_free(ds);
}

static void t_items_found_and_decoded_by_name(void)
{
	struct ibvb_producer *p = make("decode");
	CHECK(p);
	struct ibvb_ring *r = attach("decode");
	CHECK(r);
	uint8_t buf[2048];
	CHECK_EQ(ibvb_producer_set_descriptors(p, buf, records(buf, sizeof buf)), 0);
	struct ibvb_slot s;
	CHECK_EQ(ibvb_producer_acquire(p, &s), 0);
	float spec[8] = {0, 1, 2, 3, 4, 5, 6, 7.5f};
	memcpy(s.payload, spec, sizeof spec);
	double g = -2.25;
	uint64_t gbits;
	memcpy(&gbits, &g, 8);
	for (int k = 0; k < 8; k++) /* gain: an address item, big-endian f64 */
		s.payload[32 + k] = (uint8_t)(gbits >> (56 - 8 * k));
	ibvb_producer_add_item(&s, 0x1600, (UINT64_C(1) << 47) + 9, 6, IBVB_ITEM_IMMEDIATE);
	ibvb_producer_add_item(&s, 0x1601, (UINT64_C(1) << 40) - 3, 5, IBVB_ITEM_IMMEDIATE); /* -3 in 40 bits */
	ibvb_producer_add_item(&s, 0x1800, 0, 32, 0);
	ibvb_producer_add_item(&s, 0x1802, 32, 8, 0);
	struct ibvb_publish_info info = {1, 40, 40, ibvb_producer_now_ns(), IBVB_FLAG_COMPLETE, 1};
	ibvb_producer_publish(p, &s, &info);
	struct ibvb_heap h;
	CHECK_EQ(ibvb_wait(r, &h, 2000), 0);
	struct ibvb_descriptors *ds = NULL;
	CHECK_EQ(ibvb_descriptors_read(r, &ds), 0);
	const struct ibvb_descriptor *d;
	struct ibvb_value v;
	const struct ibvb_item *it = ibvb_item_find(&h, ds, "timestamp", &d);
	CHECK(it && d);
	CHECK_EQ(ibvb_item_decode(&h, it, d, &v), 0);
	CHECK(v.code == 'u' && v.u == (UINT64_C(1) << 47) + 9);
	it = ibvb_item_find(&h, ds, "offset", &d);
	CHECK_EQ(ibvb_item_decode(&h, it, d, &v), 0);
	CHECK(v.code == 'i' && v.i == -3);
	it = ibvb_item_find(&h, ds, "gain", &d);
	CHECK_EQ(ibvb_item_decode(&h, it, d, &v), 0);
	CHECK(v.code == 'f' && v.f == -2.25);
	it = ibvb_item_find(&h, ds, "spectrum", &d);
	CHECK(it && strcmp(d->dtype, "<f4") == 0);
	CHECK_EQ(ibvb_item_decode(&h, it, d, &v), -ENOTSUP); /* an array: read it through ibvb_item_ptr */
	const float *f = ibvb_item_ptr(&h, it);
	CHECK(it->length == 32 && f[7] == 7.5f);
	CHECK(ibvb_item_find(&h, ds, "matrix", &d) == NULL && d != NULL); /* described, not in this heap */
	CHECK(ibvb_item_find(&h, ds, "nosuch", &d) == NULL && d == NULL);
	ibvb_release(r, &h);
	ibvb_descriptors_free(ds);
	ibvb_detach(r);
	ibvb_producer_close(p);
}

/* An immediate narrower than its format is refused, not read past. */
static void t_too_short_item_is_erange(void)
{
	struct ibvb_descriptor d;
	memset(&d, 0, sizeof d);
	d.format_len = 1;
	d.format[0].code = 'u';
	d.format[0].bits = 48;
	struct ibvb_item it = {0x1600, 5, 4, IBVB_ITEM_IMMEDIATE, 0};
	struct ibvb_heap h;
	memset(&h, 0, sizeof h);
	struct ibvb_value v;
	CHECK_EQ(ibvb_item_decode(&h, &it, &d, &v), -ERANGE);
	uint8_t payload[4] = {1, 2, 3, 4};
	h.payload = payload;
	struct ibvb_item addr = {0x1600, 0, 4, 0, 0};
	CHECK_EQ(ibvb_item_decode(&h, &addr, &d, &v), -ERANGE);
	d.format[0].bits = 12; /* a 12-bit field is the top 12 bits of its two bytes, as spead2 reads it */
	CHECK_EQ(ibvb_item_decode(&h, &addr, &d, &v), 0);
	CHECK_EQ(v.u, 0x010);
	d.format_len = 2;
	CHECK_EQ(ibvb_item_decode(&h, &addr, &d, &v), -ENOTSUP);
}

/* A malformed record is -EBADMSG and leaves no snapshot; an unreadable format leaves format_len 0. */
static void t_malformed_metadata(void)
{
	struct ibvb_producer *p = make("bad");
	CHECK(p);
	struct ibvb_ring *r = attach("bad");
	CHECK(r);
	uint8_t buf[512];
	static const uint8_t junk[] = {'z', 0, 8};
	size_t n = ibvb_meta_encode(buf, sizeof buf, 0x1700, 0, NULL, "odd", "", junk, 3, "{'descr': [('a', '<u1')]}");
	CHECK_EQ(ibvb_producer_set_descriptors(p, buf, n), 0);
	struct ibvb_descriptors *ds = NULL;
	CHECK_EQ(ibvb_descriptors_read(r, &ds), 0);
	const struct ibvb_descriptor *d = ibvb_descriptor_find(ds, "odd");
	CHECK(d && d->format_len == 0 && strcmp(d->dtype, "") == 0);
	buf[0] = 24; /* a record_size below the record header's 32 bytes */
	CHECK_EQ(ibvb_producer_set_descriptors(p, buf, n), 0);
	CHECK_EQ(ibvb_descriptors_read(r, &ds), -EBADMSG);
	CHECK(ds == NULL);
	ibvb_detach(r);
	ibvb_producer_close(p);
}

static const struct test tests[] = {
	{"descriptors_by_name_and_in_order", t_descriptors_by_name_and_in_order},
	{"items_found_and_decoded_by_name", t_items_found_and_decoded_by_name},
	{"too_short_item_is_erange", t_too_short_item_is_erange},
	{"malformed_metadata", t_malformed_metadata},
};

int main(void)
{
	snprintf(g_dir, sizeof g_dir, "/tmp/ibvb-itest.XXXXXX");
	if (!mkdtemp(g_dir)) {
		perror("mkdtemp");
		return 1;
	}
	chmod(g_dir, 0755);
	unsetenv("IBVBRIDGE_RING_DIR");
	return run_tests(tests, sizeof tests / sizeof tests[0], g_dir);
}
