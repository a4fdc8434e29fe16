/* Stage 3 of the example pipeline: a C consumer of ring B (power spectra written by spectrum.py).
 *
 *     cc -O2 -I clients/c examples/pipeline/peak.c clients/c/build/libibvbridge.a -lpthread -o peak
 *     ./peak --ring B [--dir DIR] [--check-pattern]
 *
 * For every heap it finds the spectrum (item 0x2000, float32) in place in the ring — no copy — and the
 * strongest bin; with --check-pattern it also checks the spectrum against the input it must have come from
 * (`ibvbridge send --pattern`: byte i of heap cnt is (cnt*31 + i) mod 256, read as int8 (re, im) pairs) by
 * Parseval's theorem, sum |X_k|^2 = N * sum |x_n|^2. Prints one JSON line at the end of the stream:
 * {"heaps", "checksum" (wrapping u64 sum of each spectrum's little-endian words, as ibvb-consume sums payloads),
 *  "parseval_errors", "peak_bin" (of the first heap), "result"}. Exit 0 at end of stream, 1 otherwise. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ibvbridge.h"

#define SPECTRUM_ID 0x2000
#define CNT_ID 0x1001

static uint64_t checksum(const uint8_t *p, uint64_t n)
{
	uint64_t s = 0, w;
	uint64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		memcpy(&w, p + i, 8);
		s += w;
	}
	if (i < n) {
		w = 0;
		memcpy(&w, p + i, n - i);
		s += w;
	}
	return s;
}

/* Input energy sum |x_n|^2 of heap cnt's pattern of nbytes bytes (int8 re, im pairs). */
static double pattern_energy(uint64_t cnt, uint64_t nbytes)
{
	double e = 0;
	for (uint64_t i = 0; i < nbytes; i++) {
		int8_t v = (int8_t)(uint8_t)(cnt * 31 + i);
		e += (double)v * v;
	}
	return e;
}

int main(int argc, char **argv)
{
	const char *name = NULL, *dir = NULL;
	int check = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--ring") && i + 1 < argc)
			name = argv[++i];
		else if (!strcmp(argv[i], "--dir") && i + 1 < argc)
			dir = argv[++i];
		else if (!strcmp(argv[i], "--check-pattern"))
			check = 1;
		else {
			fprintf(stderr, "usage: peak --ring NAME_OR_SOCKET [--dir DIR] [--check-pattern]\n");
			return 2;
		}
	}
	if (!name) {
		fprintf(stderr, "peak: --ring is required\n");
		return 2;
	}
	struct ibvb_ring *r;
	struct ibvb_attach_opts o = {.dir = dir, .start = IBVB_START_OLDEST};
	if (ibvb_attach_opts(&r, name, 30000, &o) < 0) {
		fprintf(stderr, "peak: %s\n", ibvb_last_error());
		return 1;
	}
	uint64_t heaps = 0, sum = 0, bad = 0;
	long peak_bin = -1;
	struct ibvb_heap h;
	int rc;
	while ((rc = ibvb_wait(r, &h, 30000)) == 0) {
		const struct ibvb_item *it = ibvb_find_item(&h, SPECTRUM_ID), *cnt = ibvb_find_item(&h, CNT_ID);
		if (!it || !cnt || it->length % 4) {
			bad++;
			ibvb_release(r, &h);
			continue;
		}
		const float *p = (const float *)ibvb_item_ptr(&h, it); /* in the ring: no copy */
		uint64_t n = it->length / 4;
		double total = 0;
		long best = 0;
		for (uint64_t k = 0; k < n; k++) {
			total += p[k];
			if (p[k] > p[best])
				best = (long)k;
		}
		if (heaps == 0)
			peak_bin = best;
		if (check) {
			double want = (double)n * pattern_energy(cnt->value, 2 * n);
			if (fabs(total - want) > 1e-4 * want + 1e-3)
				bad++;
		}
		sum += checksum((const uint8_t *)p, it->length);
		heaps++;
		ibvb_release(r, &h);
	}
	const char *result = rc == -ENODATA ? "eos" : rc == -EPIPE ? "producer_gone" : rc == -ETIMEDOUT ? "timeout" : "error";
	printf("{\"heaps\":%" PRIu64 ",\"checksum\":%" PRIu64 ",\"parseval_errors\":%" PRIu64 ",\"peak_bin\":%ld,\"result\":\"%s\"}\n",
	       heaps, sum, bad, peak_bin, result);
	if (rc != -ENODATA)
		fprintf(stderr, "peak: %s: %s\n", result, ibvb_last_error());
	ibvb_detach(r);
	return rc == -ENODATA ? 0 : 1;
}
