/* ibvbridge_common.c — the small helpers both halves of libibvbridge use (declared in
 * ibvbridge_internal.h): this thread's error message, the monotonic clock, shared futexes and the ring-name
 * rule. One copy each. */
#define _GNU_SOURCE
#include "ibvbridge.h"
#include "ibvbridge_internal.h"

#include <limits.h>
#include <linux/futex.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char errbuf[IBVB__ERRBUF_SIZE];

const char *ibvb_last_error(void) { return errbuf; }

void ibvb__set_error(const char *msg) { snprintf(errbuf, sizeof errbuf, "%s", msg); }

int ibvb__fail(int err, const char *fmt, ...)
{
	char buf[IBVB__ERRBUF_SIZE]; /* fmt's arguments may include ibvb_last_error() itself */
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	memcpy(errbuf, buf, sizeof buf);
	return err;
}

int64_t ibvb__mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void ibvb__sleep_ns(int64_t ns)
{
	struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
	nanosleep(&ts, NULL);
}

/* Shared futexes (no FUTEX_PRIVATE_FLAG): the words live in mappings shared between processes. */
void ibvb__futex_wake_all(_Atomic uint32_t *w)
{
	syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

long ibvb__futex_wait(_Atomic uint32_t *w, uint32_t val, int64_t ns)
{
	struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
	return syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, val, ns < 0 ? NULL : &ts, NULL, 0);
}

int ibvb__valid_name(const char *name)
{
	size_t n = strlen(name);
	if (n < 1 || n > IBVB_NAME_MAX || name[0] == '.')
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
		      c == '.' || c == '-'))
			return 0;
	}
	return 1;
}
