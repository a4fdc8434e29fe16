/* tool.h — what ibvb-consume and ibvb-produce share: the clock, option parsing, the payload checksum and
 * the test pattern (spead/pattern's in Go, so the three languages' tools agree). Tools only. */
#ifndef IBVB_TOOL_H
#define IBVB_TOOL_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The tool's name for messages; each tool defines it. */
extern const char *const tool_name;

static inline double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The value of option opt, a non-negative integer (0x… and 0… accepted); a bad one exits with one line. */
static inline uint64_t parse_u64(const char *opt, const char *s)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || *end || s[0] == '-' || !s[0]) {
		fprintf(stderr, "%s: bad value for %s: %s\n", tool_name, opt, s);
		exit(1);
	}
	return v;
}

/* Wrapping sum of p[0:n] as little-endian u64 words, last partial word zero-padded. */
static inline uint64_t checksum(const uint8_t *p, uint64_t n)
{
	uint64_t s = 0, words = n / 8, i = 0;
	/* Large heaps: 64 bytes a step with a software prefetch a few KiB ahead. The hardware prefetcher
	 * stops at every 4 KiB page boundary, which leaves a single core's stream latency-bound. */
	if (words >= 1024) {
		uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
		for (; i + 8 <= words; i += 8) {
			const uint8_t *q = p + 8 * i;
			__builtin_prefetch(q + 4096);
			uint64_t w[8];
			memcpy(w, q, 64);
			s0 += w[0] + w[4];
			s1 += w[1] + w[5];
			s2 += w[2] + w[6];
			s3 += w[3] + w[7];
		}
		s = s0 + s1 + s2 + s3;
	}
	for (; i < words; i++) {
		uint64_t w;
		memcpy(&w, p + 8 * i, 8);
		s += w;
	}
	uint64_t rem = n % 8;
	if (rem) {
		uint64_t w = 0;
		memcpy(&w, p + 8 * words, rem);
		s += w;
	}
	return s;
}

/* Byte i of heap cnt's test pattern. */
static inline uint8_t pattern_byte(uint64_t cnt, uint64_t i) { return (uint8_t)((uint8_t)(cnt * 31) + (uint8_t)i); }

#endif
