/* The C producer for the conformance suite's long-lived rings (block_produce DIR NAME SLOTS MODE).
 * MODE block: a block ring that publishes, once a consumer attached, until it blocks on its consumers;
 * closing its standard input makes another thread call ibvb_producer_interrupt, so only the producer's wake
 * (not a signal's EINTR) can end the wait; it prints "interrupted" and exits 0 when the blocked acquire
 * returned -ECANCELED. MODE idle: a drop ring that publishes SLOTS/2 heaps, then does nothing until its
 * standard input closes. */
#define _GNU_SOURCE
#include "ibvbridge_producer.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct ibvb_producer *g_p;

static void *watch(void *arg)
{
	(void)arg;
	char buf[64];
	while (read(0, buf, sizeof buf) > 0)
		;
	if (arg == NULL)
		return NULL;
	ibvb_producer_interrupt(g_p);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 5)
		return 2;
	int idle = !strcmp(argv[4], "idle");
	struct ibvb_producer_opts o;
	memset(&o, 0, sizeof o);
	o.dir = argv[1];
	o.slot_count = strtoull(argv[3], NULL, 10);
	o.slot_size = 4096;
	o.max_items = 2;
	o.policy = idle ? IBVB_POLICY_DROP : IBVB_POLICY_BLOCK;
	o.hugepages = IBVB_HUGEPAGES_OFF;
	if (ibvb_producer_create(&g_p, argv[2], &o) < 0) {
		fprintf(stderr, "block_produce: %s\n", ibvb_last_error());
		return 1;
	}
	if (idle) {
		for (uint64_t cnt = 1; cnt <= o.slot_count / 2; cnt++) {
			struct ibvb_slot s;
			struct ibvb_publish_info h = {.heap_cnt = cnt, .flags = IBVB_FLAG_COMPLETE, .packets = 1};
			if (ibvb_producer_acquire(g_p, &s) == 0)
				ibvb_producer_publish(g_p, &s, &h);
		}
		watch(NULL);
		ibvb_producer_close(g_p);
		return 0;
	}
	for (int i = 0; i < 30000 && ibvb_producer_consumers(g_p) < 1; i++)
		usleep(1000);
	pthread_t th;
	pthread_create(&th, NULL, watch, g_p);
	int rc = 0;
	for (uint64_t cnt = 1;; cnt++) {
		struct ibvb_slot s;
		rc = ibvb_producer_acquire(g_p, &s);
		if (rc < 0)
			break;
		struct ibvb_publish_info h;
		memset(&h, 0, sizeof h);
		h.heap_cnt = cnt;
		h.flags = IBVB_FLAG_COMPLETE;
		h.packets = 1;
		ibvb_producer_publish(g_p, &s, &h);
	}
	if (rc == -ECANCELED)
		printf("interrupted\n");
	else
		fprintf(stderr, "block_produce: acquire: %s\n", ibvb_last_error());
	fflush(stdout);
	ibvb_producer_close(g_p);
	return rc == -ECANCELED ? 0 : 1;
}
