/* ibvb-produce — create an ibvbridge ring (layout 2.x) with the C producer API, publish N heaps, end the
 * stream; print one JSON summary.
 *
 * ibvb-produce --ring NAME [--dir DIR] [--heaps N] [--heap-size BYTES] [--slots N] [--policy drop|block]
 *              [--hugepages auto|require|off] [--wait-consumers N] [--pattern] [--batch N] [--max-observers N]
 *              [--consumer-group NAME=UID|@GID[,...]]...
 *
 * Heap cnt runs 1..N; each heap has an address item 0x1000 (value 0, length heap_size: the payload) and an
 * immediate item 0x1001 (value = heap cnt, length 5). With --pattern byte i of heap cnt's payload is
 * (cnt*31 + i) mod 256 (what ibvb-consume --verify checks); without it each slot is filled once, so a
 * benchmark measures the ring, not the fill. checksum is the wrapping u64 sum of every published payload read
 * as little-endian u64 words, the last one zero-padded: the checksum ibvb-consume prints.
 * Small heaps are published in batches (one head store per --batch heaps; default: 1 for heaps of 64 KiB
 * and more, else min(32, slots/8)).
 * Exit 0 on success, 1 on error (one line on stderr). */
#define _GNU_SOURCE
#include "ibvbridge.h"
#include "tool.h"

#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ITEM_PAYLOAD_ID 0x1000
#define ITEM_CNT_ID 0x1001
#define MAX_BATCH 256

const char *const tool_name = "ibvb-produce";

static struct ibvb_producer *g_prod;
static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
	(void)sig;
	g_stop = 1;
	if (g_prod)
		ibvb_producer_interrupt(g_prod); /* atomics and a futex wake: async-signal-safe */
}

static void usage(int code)
{
	fprintf(code ? stderr : stdout,
		"usage: ibvb-produce --ring NAME [--dir DIR] [--heaps N] [--heap-size BYTES] [--slots N]\n"
		"                    [--policy drop|block] [--hugepages auto|require|off] [--wait-consumers N]\n"
		"                    [--pattern] [--batch N] [--max-observers N]\n"
		"                    [--consumer-group NAME=UID|@GID[,...]]...\n"
		"  --ring NAME          ring to create (socket NAME.v2.sock in the ring directory)\n"
		"  --dir DIR            ring directory (default: $IBVBRIDGE_RING_DIR, else /run/ibvbridge as root,\n"
		"                       else $XDG_RUNTIME_DIR/ibvbridge, else /dev/shm/ibvbridge-EUID, or\n"
		"                       /tmp/ibvbridge-EUID when a stranger made that one)\n"
		"  --heaps N            heaps to publish, heap cnt 1..N (default 1000)\n"
		"  --heap-size BYTES    payload bytes per heap, also the slot size (default 4096)\n"
		"  --slots N            ring slots, a power of two (default 256)\n"
		"  --policy P           drop (default): a full ring drops the heap; block: wait for the consumers\n"
		"  --hugepages H        auto (default), require or off\n"
		"  --wait-consumers N   wait up to 30 s for N consumers before publishing\n"
		"  --pattern            payload byte i = (cnt*31 + i) mod 256 (ibvb-consume --verify)\n"
		"  --batch N            heaps per head store (default: 1 for heaps >= 64 KiB, else min(32, slots/8))\n"
		"  --max-observers N    observer connections (stat, ls) at once, 1..16 (default 4)\n"
		"  --consumer-group G   grant (repeatable): only the users UID (or names) and groups @GID (or @name)\n"
		"                       listed may join consumer group NAME; with any grant, ungranted groups are\n"
		"                       refused (root always may); independent consumers are unaffected\n"
		"Prints one JSON object: heaps, bytes, checksum, dropped, seconds, heaps_per_s. Exit 0 ok, 1 error.\n");
	exit(code);
}

static uint64_t coarse_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void pattern(uint8_t *buf, uint64_t cnt, uint64_t len)
{
	for (uint64_t i = 0; i < len; i++)
		buf[i] = pattern_byte(cnt, i);
}

/* --consumer-group NAME=UID|@GID[,...] (spec §14.1): appended to grants; 0, or -1 with one line said. */
static struct ibvb_group_grant g_grants[IBVB_PRODUCER_MAX_GRANTS];
static uint32_t g_grant_ids[IBVB_PRODUCER_MAX_GRANTS][2][IBVB_PRODUCER_MAX_GRANT_IDS];

static int parse_id(const char *tok, int group, uint32_t *out)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(tok, &end, 10);
	if (*tok && !*end && !errno && tok[0] != '-' && v <= UINT32_MAX) {
		*out = (uint32_t)v;
		return 0;
	}
	if (group) {
		struct group *g = getgrnam(tok);
		if (g)
			*out = (uint32_t)g->gr_gid;
		return g ? 0 : -1;
	}
	struct passwd *pw = getpwnam(tok);
	if (pw)
		*out = (uint32_t)pw->pw_uid;
	return pw ? 0 : -1;
}

static int add_grant(const char *spec, size_t *n)
{
	const char *eq = strchr(spec, '=');
	if (!eq || eq == spec || !eq[1] || eq - spec > IBVB_NAME_MAX) {
		fprintf(stderr, "ibvb-produce: --consumer-group %s: want NAME=UID|@GID[,...]\n", spec);
		return -1;
	}
	if (*n >= IBVB_PRODUCER_MAX_GRANTS) {
		fprintf(stderr, "ibvb-produce: more than %d --consumer-group grants\n", IBVB_PRODUCER_MAX_GRANTS);
		return -1;
	}
	struct ibvb_group_grant *g = &g_grants[*n];
	char *name = strndup(spec, (size_t)(eq - spec)), *list = strdup(eq + 1), *save = NULL;
	if (!name || !list) {
		fprintf(stderr, "ibvb-produce: out of memory\n");
		return -1;
	}
	g->name = name;
	g->uids = g_grant_ids[*n][0];
	g->gids = g_grant_ids[*n][1];
	for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		int grp = tok[0] == '@';
		size_t *cnt = grp ? &g->ngids : &g->nuids;
		uint32_t *ids = g_grant_ids[*n][grp];
		if (g->nuids + g->ngids >= IBVB_PRODUCER_MAX_GRANT_IDS || parse_id(tok + grp, grp, &ids[*cnt]) < 0) {
			fprintf(stderr, "ibvb-produce: --consumer-group %s: bad or unknown %s %s\n", spec,
				grp ? "group" : "user", tok + grp);
			free(list);
			return -1;
		}
		(*cnt)++;
	}
	free(list);
	(*n)++;
	return 0;
}

static int die(const char *what)
{
	fprintf(stderr, "ibvb-produce: %s: %s\n", what, ibvb_last_error());
	return 1;
}

int main(int argc, char **argv)
{
	const char *ring = NULL;
	struct ibvb_producer_opts o;
	memset(&o, 0, sizeof o);
	uint64_t heaps = 1000, heap_size = 4096, wait_consumers = 0, batch = 0;
	int use_pattern = 0;
	o.slot_count = 256;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--pattern")) {
			use_pattern = 1;
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
			o.dir = v;
		else if (!strcmp(a, "--heaps"))
			heaps = parse_u64(a, v);
		else if (!strcmp(a, "--heap-size"))
			heap_size = parse_u64(a, v);
		else if (!strcmp(a, "--slots"))
			o.slot_count = parse_u64(a, v);
		else if (!strcmp(a, "--wait-consumers"))
			wait_consumers = parse_u64(a, v);
		else if (!strcmp(a, "--max-observers"))
			o.max_observers = (uint32_t)(parse_u64(a, v) > UINT32_MAX ? UINT32_MAX : parse_u64(a, v));
		else if (!strcmp(a, "--batch"))
			batch = parse_u64(a, v);
		else if (!strcmp(a, "--consumer-group")) {
			if (add_grant(v, &o.ngroups) < 0)
				return 1;
			o.groups = g_grants;
		}
		else if (!strcmp(a, "--policy")) {
			if (!strcmp(v, "drop"))
				o.policy = IBVB_POLICY_DROP;
			else if (!strcmp(v, "block"))
				o.policy = IBVB_POLICY_BLOCK;
			else {
				fprintf(stderr, "ibvb-produce: bad value for --policy: %s (drop or block)\n", v);
				return 1;
			}
		} else if (!strcmp(a, "--hugepages")) {
			if (!strcmp(v, "auto"))
				o.hugepages = IBVB_HUGEPAGES_AUTO;
			else if (!strcmp(v, "require"))
				o.hugepages = IBVB_HUGEPAGES_REQUIRE;
			else if (!strcmp(v, "off"))
				o.hugepages = IBVB_HUGEPAGES_OFF;
			else {
				fprintf(stderr, "ibvb-produce: bad value for --hugepages: %s (auto, require or off)\n", v);
				return 1;
			}
		} else
			usage(1);
	}
	if (!ring)
		usage(1);
	if (o.slot_count == 0) {
		fprintf(stderr, "ibvb-produce: --slots must be a power of two >= 1\n");
		return 1;
	}
	o.slot_size = heap_size ? heap_size : 64;
	o.max_items = 2;
	o.meta_size = 4096;
	if (batch == 0)
		batch = heap_size >= 65536 ? 1 : (o.slot_count / 8 < 32 ? (o.slot_count / 8 ? o.slot_count / 8 : 1) : 32);
	if (batch > MAX_BATCH)
		batch = MAX_BATCH;

	signal(SIGPIPE, SIG_IGN);
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	struct ibvb_producer *p;
	if (ibvb_producer_create(&p, ring, &o) < 0)
		return die("create");
	g_prod = p;
	uint64_t nslots = ibvb_producer_slot_count(p);
	uint8_t *filled = calloc(nslots, 1);
	uint64_t *slot_sum = calloc(nslots, sizeof *slot_sum);
	uint64_t pattern_sum[256];
	uint8_t pattern_known[256];
	memset(pattern_known, 0, sizeof pattern_known);
	if (!filled || !slot_sum) {
		fprintf(stderr, "ibvb-produce: out of memory\n");
		ibvb_producer_close(p);
		return 1;
	}
	if (wait_consumers) {
		double until = now_s() + 30;
		while ((uint64_t)ibvb_producer_consumers(p) < wait_consumers && now_s() < until && !g_stop)
			usleep(1000);
		if ((uint64_t)ibvb_producer_consumers(p) < wait_consumers) {
			fprintf(stderr, "ibvb-produce: only %d of %" PRIu64 " consumers attached within 30 s\n",
				ibvb_producer_consumers(p), wait_consumers);
			ibvb_producer_close(p);
			return 1;
		}
	}

	uint64_t published = 0, dropped = 0, bytes = 0, sum = 0;
	int rc = 0, exit_code = 0;
	struct ibvb_publish_info h;
	memset(&h, 0, sizeof h);
	h.heap_size = heap_size;
	h.received = heap_size;
	h.flags = IBVB_FLAG_COMPLETE;
	h.packets = 1;
	double t0 = now_s();
	uint64_t staged = 0;
	for (uint64_t cnt = 1; cnt <= heaps && !g_stop; cnt++) {
		struct ibvb_slot s;
		rc = ibvb_producer_acquire(p, &s);
		if (rc == -EAGAIN) { /* drop policy, ring full */
			dropped++;
			ibvb_producer_add(p, IBVB_CTR_DROPPED_HEAPS, 1);
			continue;
		}
		if (rc < 0)
			break;
		if (use_pattern) {
			pattern(s.payload, cnt, heap_size);
			uint8_t b = (uint8_t)(cnt * 31);
			if (!pattern_known[b]) {
				pattern_sum[b] = checksum(s.payload, heap_size);
				pattern_known[b] = 1;
			}
			sum += pattern_sum[b];
		} else {
			if (!filled[s.index]) {
				pattern(s.payload, s.index, heap_size);
				slot_sum[s.index] = checksum(s.payload, heap_size);
				filled[s.index] = 1;
			}
			sum += slot_sum[s.index];
		}
		ibvb_producer_add_item(&s, ITEM_PAYLOAD_ID, 0, heap_size, 0);
		ibvb_producer_add_item(&s, ITEM_CNT_ID, cnt, 5, IBVB_ITEM_IMMEDIATE);
		if (staged == 0)
			h.timestamp_ns = coarse_ns();
		h.heap_cnt = cnt;
		ibvb_producer_stage(p, &s, &h);
		published++;
		bytes += heap_size;
		if (++staged >= batch) {
			ibvb_producer_add(p, IBVB_CTR_PACKETS, staged);
			ibvb_producer_add(p, IBVB_CTR_BYTES, staged * heap_size);
			ibvb_producer_commit(p);
			staged = 0;
		}
	}
	if (staged) {
		ibvb_producer_add(p, IBVB_CTR_PACKETS, staged);
		ibvb_producer_add(p, IBVB_CTR_BYTES, staged * heap_size);
	}
	ibvb_producer_commit(p);
	if (rc < 0 && rc != -EAGAIN) {
		exit_code = die("acquire");
	} else if (!g_stop) {
		rc = ibvb_producer_end_of_stream(p, 0, 10000);
		if (rc < 0)
			exit_code = die("end of stream");
		else if (o.policy == IBVB_POLICY_BLOCK) {
			rc = ibvb_producer_wait_drained(p, 60000);
			if (rc < 0 && rc != -ENOTCONN)
				exit_code = die("wait drained");
		}
	} else {
		fprintf(stderr, "ibvb-produce: interrupted\n");
		exit_code = 1;
	}
	double t1 = now_s();
	g_prod = NULL;
	ibvb_producer_close(p);
	double secs = t1 - t0;
	printf("{\"heaps\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"checksum\":%" PRIu64 ",\"dropped\":%" PRIu64
	       ",\"seconds\":%.6f,\"heaps_per_s\":%.1f}\n",
	       published, bytes, sum, dropped, secs, secs > 0 ? (double)published / secs : 0.0);
	free(filled);
	free(slot_sum);
	return exit_code;
}
