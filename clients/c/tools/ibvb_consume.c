/* ibvb-consume — read heaps from an ibvbridge ring (layout 2.x) until end of stream; print one JSON summary.
 *
 * ibvb-consume --ring NAME_OR_SOCKET [--dir DIR] [--start oldest|head] [--verify] [--max-heaps N]
 *              [--timeout-ms T] [--hold N] [--sleep-us U] [--stop-first]
 *              [--max-latency-us L]   (ibvb_set_max_latency: 0 wakes per heap) [--no-touch]
 *              [--group-name NAME]   (a consumer-group member, spec §14: only the heaps assigned to it)
 *
 * Used by the Go cross-process tests and the ring benchmark: the per-heap path makes no syscalls
 * (unless --sleep-us, or the ring is empty) and its checksum loop vectorises.
 * With --verify, a heap found overrun after it was read (ibvb_heap_valid, layout 2.1) counts in
 * overrun_heaps, not verify_errors; the next read then reports the overrun (exit 4).
 * Exit: 0 eos/max, 2 producer_gone, 3 timeout, 4 overrun (detached for falling a ring behind),
 * 5 detached (invalid cursor), 1 other errors. A failure is also one line on stderr.
 * A chunk-mode ring (spec §13) is read chunk by chunk: heaps counts positions (chunks), "chunks" and
 * "heaps_present" (from the presence maps) follow; checksum and --verify cover the present heap positions,
 * position (t, a) of chunk c being heap cnt c × positions + t × axis + a + 1 (send --pattern
 * --timestamp-step); first/last_heap_cnt are chunk ids, incomplete counts incomplete chunks.
 * heap_cnt_sum (wrapping sum of the heap_cnts read, as the Go tool's) and group_id let a test check that a
 * group's members together read every heap exactly once. */
#define _GNU_SOURCE
#include "ibvbridge.h"
#include "tool.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define ITEM_VERIFY_ID 0x1001

const char *const tool_name = "ibvb-consume";

static void usage(int code)
{
	fprintf(code ? stderr : stdout,
		"usage: ibvb-consume --ring NAME_OR_SOCKET [--dir DIR] [--start oldest|head] [--verify] [--wait] [--streams]\n"
		"                    [--max-heaps N] [--timeout-ms T] [--max-latency-us L] [--hold N] [--sleep-us U] [--no-touch]\n"
		"                    [--group-name NAME] [--stop-first]\n"
		"  --ring R           ring name (looked up as R.v2.sock) or the path of its socket (ends in .v2.sock)\n"
		"  --dir DIR          ring directory to look the name up in (default: $IBVBRIDGE_RING_DIR, else\n"
		"                     /run/ibvbridge as root, else $XDG_RUNTIME_DIR/ibvbridge or /dev/shm/ibvbridge-EUID,\n"
		"                     then /run/ibvbridge; directories not owned by you or root are skipped)\n"
		"  --wait             wait up to --timeout-ms for a ring that does not exist yet (else: not found at once)\n"
		"  --streams          read on across stream ends (STREAM_END, recv --keep-going) until the ring ends, each\n"
		"                     stream tallied in \"streams\" (else the first stream end ends the read)\n"
		"  --start S          oldest (default): from the oldest heap the ring holds; head: only new heaps\n"
		"  --verify           check the test pattern and item 0x1001 == heap_cnt, then that the heap was not\n"
		"                     overrun while read (counted in overrun_heaps, not verify_errors)\n"
		"  --no-touch         take and release each heap without reading its payload (checksum 0)\n"
		"  --max-heaps N      stop after N heaps (result max)\n"
		"  --timeout-ms T     attach and per-heap wait timeout (default 10000)\n"
		"  --max-latency-us L let heaps of a moving stream wait up to L us for coalesced wakes (0: a wake per heap)\n"
		"  --hold N           keep the N newest heaps held\n"
		"  --sleep-us U       sleep U us per heap, holding it, before reading it (a slow consumer)\n"
		"  --stop-first       after taking the first heap, stop (SIGSTOP to itself) before reading it, until\n"
		"                     SIGCONT (a consumer stalled mid-read, for tests)\n"
		"  --group-name NAME  join consumer group NAME (spec 14; starts at head): read only the heaps assigned to it\n"
		"Prints one JSON object. Exit: 0 eos/max, 1 error, 2 producer_gone, 3 timeout, 4 overrun, 5 detached.\n");
	exit(code);
}

/* CPU seconds (user + system) this process has used. */
static double cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* 1 if payload[0:n] is the test pattern byte i = (uint8_t)(heap_cnt*31 + i). */
static int pattern_ok(const uint8_t *p, uint64_t n, uint64_t heap_cnt)
{
	uint8_t bad = 0;
	for (uint64_t i = 0; i < n; i++)
		bad |= (uint8_t)(p[i] ^ pattern_byte(heap_cnt, i));
	return bad == 0;
}

/* Chunk-mode totals. */
struct chunk_totals {
	uint64_t chunks, heaps_present, sum, verify_errors, overrun;
};

/* Account chunk position h (held): count its present heaps, checksum them (touch) and check each against
 * the pattern of its heap cnt (verify); then check validity (read, then check, 2.1): an overrun chunk
 * counts in overrun, its verify errors nowhere. 0, or -1 when h is not a valid chunk (the message set). */
static int account_chunk(struct ibvb_ring *r, const struct ibvb_heap *h, int touch, int verify,
			 struct chunk_totals *ct)
{
	struct ibvb_chunk c;
	if (ibvb_heap_chunk(r, h, &c) < 0)
		return -1;
	int64_t bad = 0;
	uint64_t present = 0;
	for (uint64_t k = 0; k < c.positions; k++) {
		if (c.present[k] != 1)
			continue;
		present++;
		const uint8_t *d = c.data + k * c.heap_size;
		if (touch)
			ct->sum += checksum(d, c.heap_size);
		if (verify && !pattern_ok(d, c.heap_size, c.chunk_id * c.positions + k + 1))
			bad++;
	}
	if (!ibvb_heap_valid(r, h)) {
		ct->overrun++;
		return 0;
	}
	ct->chunks++;
	ct->heaps_present += present;
	ct->verify_errors += (uint64_t)bad;
	return 0;
}

static void json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

/* One stream as read (--streams): the Go tool's StreamTally. */
struct stream_tally {
	uint64_t heaps, heap_cnt_sum;
	int ended;
	uint64_t stop_heap_cnt;
};

static int push_stream(struct stream_tally **st, size_t *n, struct stream_tally t)
{
	if ((*n & (*n - 1)) == 0) { /* 0, 1, 2, 4 ...: grow to the next power of two */
		struct stream_tally *g = realloc(*st, (*n ? 2 * *n : 1) * sizeof **st);
		if (!g)
			return -1;
		*st = g;
	}
	(*st)[(*n)++] = t;
	return 0;
}

int main(int argc, char **argv)
{
	const char *ring = NULL;
	struct ibvb_attach_opts aopts = {.dir = NULL, .start = IBVB_START_OLDEST, .flags = 0};
	int verify = 0, touch = 1, stop_first = 0, streams = 0;
	struct stream_tally *st = NULL, cur = {0, 0, 0, 0};
	size_t nst = 0;
	uint64_t max_heaps = 0, hold = 0, sleep_us = 0, timeout_ms = 10000;
	int64_t max_latency_us = -1; /* -1: the library's default */
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--verify")) {
			verify = 1;
			continue;
		}
		if (!strcmp(a, "--stop-first")) {
			stop_first = 1;
			continue;
		}
		if (!strcmp(a, "--no-touch")) { /* what spead2_recv's main thread does with its heaps */
			touch = 0;
			continue;
		}
		if (!strcmp(a, "--wait")) {
			aopts.flags |= IBVB_ATTACH_WAIT;
			continue;
		}
		if (!strcmp(a, "--streams")) {
			streams = 1;
			continue;
		}
		if (!strcmp(a, "-h") || !strcmp(a, "--help"))
			usage(0);
		if (i + 1 >= argc)
			usage(1);
		const char *v = argv[++i];
		if (!strcmp(a, "--ring"))
			ring = v;
		else if (!strcmp(a, "--dir"))
			aopts.dir = v;
		else if (!strcmp(a, "--group-name"))
			aopts.group = v;
		else if (!strcmp(a, "--start")) {
			if (!strcmp(v, "oldest"))
				aopts.start = IBVB_START_OLDEST;
			else if (!strcmp(v, "head"))
				aopts.start = IBVB_START_HEAD;
			else {
				fprintf(stderr, "ibvb-consume: bad value for --start: %s (oldest or head)\n", v);
				exit(1);
			}
		}
		else if (!strcmp(a, "--max-heaps"))
			max_heaps = parse_u64(a, v);
		else if (!strcmp(a, "--timeout-ms"))
			timeout_ms = parse_u64(a, v);
		else if (!strcmp(a, "--hold"))
			hold = parse_u64(a, v);
		else if (!strcmp(a, "--sleep-us"))
			sleep_us = parse_u64(a, v);
		else if (!strcmp(a, "--max-latency-us"))
			max_latency_us = (int64_t)parse_u64(a, v);
		else
			usage(1);
	}
	if (!ring)
		usage(1);
	if (timeout_ms > INT32_MAX)
		timeout_ms = INT32_MAX;

	uint64_t heap_cnt_sum = 0;
	uint64_t heaps = 0, bytes = 0, sum = 0, verify_errors = 0, overrun_heaps = 0, incomplete = 0, first = 0, last = 0, ooo = 0;
	double t0 = 0, t1 = 0;
	const char *result = "error";
	char errmsg[600] = "";
	int exit_code = 1;

	struct ibvb_ring *r = NULL;
	double cpu0 = 0, cpu1 = 0; /* CPU seconds at attach and at the stream's end: the stream's cost alone */
	struct chunk_totals ct = {0, 0, 0, 0, 0};
	struct ibvb_chunk_geometry cg;
	int rc = ibvb_attach_opts(&r, ring, (int)timeout_ms, &aopts);
	int chunked = rc == 0 && ibvb_chunk_geometry(r, &cg) == 0;
	if (rc < 0) {
		snprintf(errmsg, sizeof errmsg, "%s", ibvb_last_error());
		result = rc == -ETIMEDOUT ? "timeout" : "error";
		exit_code = rc == -ETIMEDOUT ? 3 : 1;
	} else {
		struct ibvb_heap h;
		uint64_t held = 0, oldest = 0;
		if (max_latency_us >= 0)
			ibvb_set_max_latency(r, max_latency_us * 1000);
		cpu0 = cpu_s();
		for (;;) {
			if (max_heaps && heaps >= max_heaps) {
				result = "max";
				exit_code = 0;
				break;
			}
			rc = ibvb_peek(r, &h);
			if (rc == -EAGAIN) {
				do
					rc = ibvb_wait(r, &h, (int)timeout_ms);
				while (rc == -EINTR);
			}
			if (rc == IBVB_STREAM_END && streams) { /* one stream ended, the ring goes on */
				cur.ended = 1;
				cur.stop_heap_cnt = h.heap_cnt;
				if (push_stream(&st, &nst, cur) < 0) {
					snprintf(errmsg, sizeof errmsg, "out of memory");
					break;
				}
				cur = (struct stream_tally){0, 0, 0, 0};
				continue;
			}
			if (rc < 0) {
				if (rc == -ENODATA || rc == IBVB_STREAM_END) { /* without --streams a stream end ends the read */
					result = "eos";
					exit_code = 0;
				} else if (rc == -EPIPE) {
					result = "producer_gone";
					exit_code = 2;
					snprintf(errmsg, sizeof errmsg, "%s", ibvb_last_error());
				} else if (rc == -ETIMEDOUT) {
					result = "timeout";
					exit_code = 3;
					snprintf(errmsg, sizeof errmsg, "%s", ibvb_last_error());
				} else if (rc == -EOVERFLOW) {
					result = "overrun";
					exit_code = 4;
					snprintf(errmsg, sizeof errmsg, "%s", ibvb_last_error());
				} else if (rc == -ECONNRESET) {
					result = "detached";
					exit_code = 5;
					snprintf(errmsg, sizeof errmsg, "%s", ibvb_last_error());
				} else {
					result = "error";
					exit_code = 1;
					snprintf(errmsg, sizeof errmsg, "%s", ibvb_last_error());
				}
				break;
			}
			if (heaps == 0) {
				t0 = now_s();
				first = h.heap_cnt;
			} else if (h.heap_cnt <= last && cur.heaps > 0) { /* a new stream may count from 1 again */
				ooo++;
			}
			last = h.heap_cnt;
			heaps++;
			heap_cnt_sum += h.heap_cnt;
			cur.heaps++;
			cur.heap_cnt_sum += h.heap_cnt;
			if (sleep_us) /* a slow reader: the heap is held meanwhile (and may be overrun under drop) */
				usleep((useconds_t)sleep_us);
			if (stop_first) { /* stalled mid-read: the heap is taken (and was valid), its bytes not read yet */
				stop_first = 0;
				raise(SIGSTOP); /* to this thread: it stops before raise returns */
			}
			bytes += h.received;
			if (h.flags & IBVB_FLAG_INCOMPLETE)
				incomplete++;
			if (chunked && account_chunk(r, &h, touch, verify, &ct) < 0) {
				snprintf(errmsg, sizeof errmsg, "%s", ibvb_last_error());
				break; /* result error, exit 1 */
			} else if (!chunked && touch)
				sum += checksum(h.payload, h.received);
			if (!chunked && verify && !(h.flags & IBVB_FLAG_INCOMPLETE)) { /* holes hold unspecified bytes */
				/* The pattern covers the payload before the heap's item descriptors (send --descriptors
				 * appends them after the data). */
				uint64_t plen = h.received;
				for (uint32_t k = 0; k < h.item_count; k++)
					if (h.items[k].id == 0x5 && !ibvb_item_is_immediate(&h.items[k]) && h.items[k].value < plen)
						plen = h.items[k].value;
				int ok = pattern_ok(h.payload, plen, h.heap_cnt);
				const struct ibvb_item *it = ibvb_find_item(&h, ITEM_VERIFY_ID);
				if (it && (!ibvb_item_is_immediate(it) || it->value != h.heap_cnt))
					ok = 0;
				/* 2.1: the bytes were the heap's only if it is still valid after reading them */
				if (!ibvb_heap_valid(r, &h))
					overrun_heaps++;
				else
					verify_errors += !ok;
			}
			if (hold == 0) {
				ibvb_release(r, &h);
			} else {
				if (held == 0)
					oldest = h.position;
				held++;
				if (held > hold) {
					struct ibvb_heap o = {.position = oldest};
					ibvb_release(r, &o);
					oldest = r->released; /* the next held heap (a group member passes over others') */
					held--;
				}
			}
		}
		t1 = now_s();
		cpu1 = cpu_s();
		ibvb_release_all(r);
	}
	if (streams && (cur.heaps > 0 || nst == 0) && push_stream(&st, &nst, cur) < 0)
		exit_code = 1;
	if (exit_code != 0)
		fprintf(stderr, "ibvb-consume: %s: %s\n", result, errmsg);

	printf("{\"heaps\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"checksum\":%" PRIu64 ",\"verify_errors\":%" PRIu64
	       ",\"overrun_heaps\":%" PRIu64 ",\"incomplete\":%" PRIu64 ",\"first_heap_cnt\":%" PRIu64 ",\"last_heap_cnt\":%" PRIu64
	       ",\"heap_cnt_out_of_order\":%" PRIu64 ",\"seconds\":%.6f,\"cpu_seconds\":%.6f,\"result\":\"%s\",\"error\":",
	       heaps, bytes, sum + ct.sum, verify_errors + ct.verify_errors, overrun_heaps + ct.overrun, incomplete, first, last, ooo, heaps ? t1 - t0 : 0.0, cpu1 - cpu0, result);
	json_str(errmsg);
	printf(",\"chunks\":%" PRIu64 ",\"heaps_present\":%" PRIu64 ",\"heap_cnt_sum\":%" PRIu64
	       ",\"group_id\":%" PRIu32, ct.chunks, ct.heaps_present, heap_cnt_sum, ibvb_group_id(aopts.group));
	if (streams) {
		printf(",\"streams\":[");
		for (size_t k = 0; k < nst; k++)
			printf("%s{\"heaps\":%" PRIu64 ",\"heap_cnt_sum\":%" PRIu64 ",\"ended\":%s,\"stop_heap_cnt\":%" PRIu64 "}",
			       k ? "," : "", st[k].heaps, st[k].heap_cnt_sum, st[k].ended ? "true" : "false", st[k].stop_heap_cnt);
		printf("]");
	}
	free(st);
	printf(",\"counters\":{");
	for (unsigned i = 0; r && i < IBVB_CTR_COUNT; i++)
		printf("%s\"%s\":%" PRIu64, i ? "," : "", ibvb_counter_name(i), ibvb_counter(r, i));
	printf("},\"session_id\":%" PRIu64 "}\n", r ? ibvb_session_id(r) : 0);
	fflush(stdout);
	ibvb_detach(r);
	return exit_code;
}
