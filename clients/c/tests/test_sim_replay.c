/* The checker checked: sim_replay (tests/sim_replay.c) passes a stream the C producer agrees with and
 * stops, exit 1, naming the seed and step, when one expected value in it is changed.
 *
 *   test_sim_replay SIM_REPLAY [STREAM]
 *
 * A small stream written here covers an attach, publishes, a control word, an assign word, a free count and
 * a drop; STREAM (the Makefile writes one with internal/ringsim/simlog when Go is installed) is played
 * whole, then with one 'O' record's value and one 'P' record's result flipped. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

struct rec {
	uint8_t kind, a;
	uint16_t b;
	uint32_t c;
	uint64_t x, y, z;
};

static const char *bin;
static int failures;

/* Play n records through sim_replay: its exit status and its stdout (first line) in out. */
static int play(const struct rec *r, size_t n, char *out, size_t cap)
{
	char path[] = "/tmp/test_sim_replay.XXXXXX";
	int fd = mkstemp(path);
	if (fd < 0) {
		perror("mkstemp");
		exit(2);
	}
	unlink(path); /* nothing left behind */
	if (write(fd, r, n * sizeof *r) != (ssize_t)(n * sizeof *r) || lseek(fd, 0, SEEK_SET) != 0) {
		perror("write stream");
		exit(2);
	}
	int pfd[2];
	if (pipe(pfd) < 0) {
		perror("pipe");
		exit(2);
	}
	pid_t pid = fork();
	if (pid == 0) {
		dup2(fd, 0);
		dup2(pfd[1], 1);
		int null = open("/dev/null", O_WRONLY);
		dup2(null, 2);
		execl(bin, bin, (char *)NULL);
		_exit(127);
	}
	close(fd);
	close(pfd[1]);
	size_t len = 0;
	ssize_t k;
	while (len + 1 < cap && (k = read(pfd[0], out + len, cap - 1 - len)) > 0)
		len += (size_t)k;
	out[len] = 0;
	out[strcspn(out, "\n")] = 0;
	close(pfd[0]);
	int st;
	waitpid(pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void expect(const char *name, const struct rec *r, size_t n, int want_rc, const char *want_out)
{
	char out[512];
	int rc = play(r, n, out, sizeof out);
	if (rc != want_rc || strcmp(out, want_out)) {
		printf("FAIL %s: exit %d \"%s\", want exit %d \"%s\"\n", name, rc, out, want_rc, want_out);
		failures++;
	} else
		printf("ok   %s: %s\n", name, out);
}

/* A drop ring of 4 slots, one consumer (seed 7): publish 4, the consumer releases 1, a fifth publish
 * takes the released slot; then 4 more find the ring full and overrun nobody (the consumer holding it back
 * is the only one): dropped. */
static size_t small_stream(struct rec *r)
{
	size_t n = 0;
	r[n++] = (struct rec){.kind = 'N', .a = 0, .b = 2, .c = 4, .x = 0, .y = 7};
	/* step 0: attach at the oldest position: row 0, generation 1, tail 0 */
	r[n++] = (struct rec){.kind = 'A', .a = 0, .b = 1, .c = 0, .x = 0, .y = 0, .z = 0 | 0ull << 16 | 1ull << 32};
	r[n++] = (struct rec){.kind = 'S'};
	r[n++] = (struct rec){.kind = 'O', .a = 4, .c = 0x1000, .x = 1};    /* row 0 state attached */
	r[n++] = (struct rec){.kind = 'O', .a = 4, .c = 0x1004, .x = 1};    /* row 0 generation */
	r[n++] = (struct rec){.kind = 'F', .x = 4};
	r[n++] = (struct rec){.kind = 'E', .c = 0};
	/* step 1: four heaps */
	for (int i = 0; i < 4; i++)
		r[n++] = (struct rec){.kind = 'P', .b = 0};
	r[n++] = (struct rec){.kind = 'S'};
	r[n++] = (struct rec){.kind = 'O', .a = 8, .c = 0x200, .x = 4};     /* head */
	r[n++] = (struct rec){.kind = 'M', .x = 3, .y = 0};                 /* no group: assign word 0 */
	r[n++] = (struct rec){.kind = 'E', .c = 1};
	/* step 2: the consumer releases 1, a heap takes its slot, the next four are dropped */
	r[n++] = (struct rec){.kind = 'W', .a = 0, .c = 0, .x = 1};
	r[n++] = (struct rec){.kind = 'P', .b = 0};
	for (int i = 0; i < 4; i++)
		r[n++] = (struct rec){.kind = 'P', .b = 1};
	r[n++] = (struct rec){.kind = 'S'};
	r[n++] = (struct rec){.kind = 'O', .a = 8, .c = 0x200, .x = 5};     /* head */
	r[n++] = (struct rec){.kind = 'O', .a = 8, .c = 0x520, .x = 4};     /* dropped_heaps */
	r[n++] = (struct rec){.kind = 'O', .a = 8, .c = 0x1020, .x = 1};    /* row 0 released */
	r[n++] = (struct rec){.kind = 'E', .c = 2};
	/* step 3: the consumer hangs up; its row says gone */
	r[n++] = (struct rec){.kind = 'C', .c = 0};
	r[n++] = (struct rec){.kind = 'S'};
	r[n++] = (struct rec){.kind = 'O', .a = 4, .c = 0x1000, .x = 4};
	r[n++] = (struct rec){.kind = 'E', .c = 3};
	r[n++] = (struct rec){.kind = 'Z'};
	return n;
}

/* Index of the k-th record of kind (and, for 'P', a published heap), or -1; *seed and *step say where. */
static long find(const struct rec *r, size_t n, char kind, size_t k, uint64_t *seed, uint64_t *step)
{
	uint64_t s = 0, e = 0;
	for (size_t i = 0; i < n; i++) {
		if (r[i].kind == 'N')
			s = r[i].y, e = 0;
		else if (r[i].kind == 'E')
			e++;
		else if (r[i].kind == kind && (kind != 'P' || (r[i].a == 0 && r[i].b == 0)) && k-- == 0) {
			*seed = s, *step = e;
			return (long)i;
		}
	}
	return -1;
}

static void generated(const char *path)
{
	FILE *f = fopen(path, "re");
	struct stat sb;
	if (!f || fstat(fileno(f), &sb) < 0 || sb.st_size % (off_t)sizeof(struct rec)) {
		printf("FAIL stream %s: %s\n", path, f ? "not whole records" : strerror(errno));
		failures++;
		return;
	}
	size_t n = (size_t)sb.st_size / sizeof(struct rec);
	struct rec *r = malloc(n * sizeof *r);
	if (!r || fread(r, sizeof *r, n, f) != n) {
		printf("FAIL stream %s: read\n", path);
		failures++;
		return;
	}
	fclose(f);
	uint64_t steps = 0, scen = 0;
	for (size_t i = 0; i < n; i++)
		steps += r[i].kind == 'E', scen += r[i].kind == 'N';
	char want[512];
	snprintf(want, sizeof want, "ok %llu %llu 0", (unsigned long long)steps, (unsigned long long)scen);
	expect("generated stream", r, n, 0, want);

	uint64_t seed, step;
	long i = find(r, n, 'O', n / 20 /* well inside the stream */, &seed, &step);
	if (i < 0)
		i = find(r, n, 'O', 0, &seed, &step);
	if (i < 0) {
		printf("FAIL generated stream: no 'O' record\n");
		failures++;
	} else {
		struct rec keep = r[i];
		r[i].x ^= 1;
		snprintf(want, sizeof want, "seed %llu step %llu: ", (unsigned long long)seed, (unsigned long long)step);
		char out[512];
		int rc = play(r, n, out, sizeof out);
		if (rc != 1 || strncmp(out, want, strlen(want)) || !strstr(out, ": got ") || !strstr(out, ", want ")) {
			printf("FAIL flipped 'O' at offset 0x%x: exit %d \"%s\", want exit 1 \"%s...\"\n", keep.c, rc, out, want);
			failures++;
		} else
			printf("ok   flipped 'O' at offset 0x%x: %s\n", keep.c, out);
		r[i] = keep;
	}
	i = find(r, n, 'P', 3, &seed, &step);
	if (i < 0) {
		printf("FAIL generated stream: no published heap\n");
		failures++;
	} else {
		r[i].b = 1;
		snprintf(want, sizeof want, "seed %llu step %llu: publish: got published, want dropped",
			 (unsigned long long)seed, (unsigned long long)step);
		expect("flipped 'P' result", r, n, 1, want);
	}
	free(r);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: test_sim_replay SIM_REPLAY [STREAM]\n");
		return 2;
	}
	bin = argv[1];
	struct rec r[64], m[64];
	size_t n = small_stream(r);
	expect("small stream", r, n, 0, "ok 4 1 0");

	memcpy(m, r, sizeof r);
	m[12].x = 5; /* step 1's head */
	expect("head changed", m, n, 1, "seed 7 step 1: head: got 4, want 5");
	memcpy(m, r, sizeof r);
	m[16].b = 1; /* step 2's publish into the released slot */
	expect("publish result changed", m, n, 1, "seed 7 step 2: publish: got published, want dropped");
	memcpy(m, r, sizeof r);
	m[17].b = 0; /* step 2's first drop */
	expect("drop result changed", m, n, 1, "seed 7 step 2: publish: got dropped, want published");
	memcpy(m, r, sizeof r);
	m[23].x = 3; /* step 2's dropped_heaps */
	expect("dropped_heaps changed", m, n, 1, "seed 7 step 2: dropped_heaps: got 4, want 3");
	memcpy(m, r, sizeof r);
	m[1].z = 1ull << 16 | 1ull << 32; /* attach: row 1 */
	expect("attach row changed", m, n, 1, "seed 7 step 0: attach row: got 0, want 1");
	memcpy(m, r, sizeof r);
	m[5].x = 3; /* free slots */
	expect("free slots changed", m, n, 1, "seed 7 step 0: free slots: got 4, want 3");
	memcpy(m, r, sizeof r);
	m[28].x = 1; /* the row after the hang-up */
	expect("row state after close changed", m, n, 1, "seed 7 step 3: row 0 state: got 4, want 1");
	memcpy(m, r, sizeof r);
	m[13].y = 1; /* assign word */
	expect("assign word changed", m, n, 1, "seed 7 step 1: assign word of position 3: got 0, want 1");

	if (argc > 2)
		generated(argv[2]);
	else
		printf("skip generated stream: none given (the Makefile writes one with Go's simlog when go is installed)\n");
	if (failures) {
		printf("test_sim_replay: %d failed\n", failures);
		return 1;
	}
	printf("test_sim_replay: all passed\n");
	return 0;
}
