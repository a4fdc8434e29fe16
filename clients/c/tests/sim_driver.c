/* The ring simulation's driver for the C producer (internal/ringsim; docs/ring-layout.md §7, §14).
 *
 * The Go harness plays the consumers itself (raw hellos, their mapped regions); this program runs the
 * producer's side and answers one line per command read on stdin (the protocol of
 * clients/python/tests/sim_driver.py):
 *
 *   create DIR SLOTS ROWS POLICY START  -> ok SOCKET_PATH   (START must be 0: the C producer starts there)
 *   publish EOS WAIT_MS                 -> published | dropped | full | pending
 *   await WAIT_MS                       -> published | full | pending
 *   unread                              -> ok   (reads every cursor under the lock, as the heartbeat does)
 *   free                                -> N    (reclaims, then counts free slots; never while pending)
 *   quit                                -> bye
 *
 * Publishing runs on one worker thread (the hot path). The producer's source is included so that the
 * cursor read and the reclaim (static there) can be called as its heartbeat and its acquire call them. */
#include "../ibvbridge_producer.c"

#include <stdio.h>
#include <string.h>

static struct ibvb_producer *prod;
static pthread_t worker;
static pthread_mutex_t wmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wcv = PTHREAD_COND_INITIALIZER;
static int busy, eos_req, pending; /* pending: a publish answered "pending", its result not yet given */
static const char *result;

static void *run(void *arg)
{
	(void)arg;
	const char *r;
	if (eos_req) {
		int rc = ibvb_producer_end_of_stream(prod, 0, 0);
		r = rc == 0 ? "published" : "full";
	} else {
		struct ibvb_slot s;
		int rc = ibvb_producer_acquire(prod, &s);
		if (rc == -EAGAIN) {
			ibvb_producer_add(prod, IBVB_CTR_DROPPED_HEAPS, 1); /* the caller counts what it drops */
			r = "dropped";
		} else if (rc < 0) {
			r = "full";
		} else {
			struct ibvb_publish_info h = {.heap_cnt = 1, .flags = IBVB_FLAG_COMPLETE, .packets = 1};
			r = ibvb_producer_publish(prod, &s, &h) == 0 ? "published" : "full";
		}
	}
	pthread_mutex_lock(&wmu);
	result = r;
	busy = 0;
	pthread_cond_broadcast(&wcv);
	pthread_mutex_unlock(&wmu);
	return NULL;
}

/* wait_ms for the worker: its result, or "pending" (still waiting). */
static const char *await_worker(long ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&wmu);
	while (busy && pthread_cond_timedwait(&wcv, &wmu, &ts) == 0)
		;
	int done = !busy;
	const char *r = done ? result : "pending";
	pthread_mutex_unlock(&wmu);
	if (done)
		pthread_join(worker, NULL);
	return r;
}

int main(void)
{
	char line[4096];
	setvbuf(stdout, NULL, _IOLBF, 0);
	while (fgets(line, sizeof line, stdin)) {
		char cmd[32] = "", dir[3000] = "", policy[16] = "";
		unsigned long long slots = 0, rows = 0, start = 0;
		long a = 0, b = 0;
		if (sscanf(line, "%31s", cmd) != 1)
			continue;
		if (!strcmp(cmd, "create")) {
			if (sscanf(line, "%*s %2999s %llu %llu %15s %llu", dir, &slots, &rows, policy, &start) != 5 || start) {
				printf("error: create DIR SLOTS ROWS POLICY 0 (the C producer starts at position 0)\n");
				continue;
			}
			struct ibvb_producer_opts o = {.dir = dir, .slot_count = slots, .slot_size = 64, .max_items = 1,
						       .meta_size = 4096, .hugepages = IBVB_HUGEPAGES_OFF,
						       .max_consumers = (uint32_t)rows, .max_observers = 16,
						       .policy = strcmp(policy, "block") ? IBVB_POLICY_DROP : IBVB_POLICY_BLOCK};
			int rc = ibvb_producer_create(&prod, "sim", &o);
			if (rc < 0)
				printf("error: create: %s\n", strerror(-rc));
			else
				printf("ok %s\n", ibvb_producer_socket_path(prod));
		} else if (!strcmp(cmd, "publish")) {
			sscanf(line, "%*s %ld %ld", &a, &b);
			eos_req = (int)a;
			busy = 1;
			pthread_create(&worker, NULL, run, NULL);
			const char *r = await_worker(b);
			pending = !strcmp(r, "pending");
			printf("%s\n", r);
		} else if (!strcmp(cmd, "await")) {
			sscanf(line, "%*s %ld", &a);
			const char *r = pending ? await_worker(a) : "none";
			pending = !strcmp(r, "pending");
			printf("%s\n", r);
		} else if (!strcmp(cmd, "unread")) {
			pthread_mutex_lock(&prod->st->mu);
			read_cursors_locked(prod, 0);
			pthread_mutex_unlock(&prod->st->mu);
			printf("ok\n");
		} else if (!strcmp(cmd, "free")) {
			pthread_mutex_lock(&prod->st->mu);
			reclaim_locked(prod);
			unsigned long long n = prod->free_w - prod->free_r;
			pthread_mutex_unlock(&prod->st->mu);
			printf("%llu\n", n);
		} else if (!strcmp(cmd, "quit")) {
			if (prod) {
				ibvb_producer_interrupt(prod);
				if (pending)
					await_worker(3000);
				ibvb_producer_close(prod);
			}
			printf("bye\n");
			return 0;
		}
	}
	return 0;
}
