/* ibvbridge_internal.h — what the consumer (ibvbridge.c) and the producer (ibvbridge_producer.c) halves of
 * libibvbridge share; not installed. The helpers live in ibvbridge_common.c, ring directories (layout 2.1
 * §B) in ibvbridge_dirs.c. */
#ifndef IBVBRIDGE_INTERNAL_H
#define IBVBRIDGE_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the ring layout is little-endian; big-endian hosts are not supported"
#endif

#define IBVB__ERRBUF_SIZE 512

/* This thread's ibvb_last_error() message. */
void ibvb__set_error(const char *msg);
/* Sets this thread's message from fmt and returns err (a -errno): `return fail(-EINVAL, "...", ...)`. */
__attribute__((format(printf, 2, 3))) int ibvb__fail(int err, const char *fmt, ...);
#define fail ibvb__fail
/* CLOCK_MONOTONIC in ns; sleep ns. */
int64_t ibvb__mono_ns(void);
void ibvb__sleep_ns(int64_t ns);
#define mono_ns ibvb__mono_ns
/* Shared futexes on a word of a shared mapping: wake every waiter; wait while *w == val, up to ns (<0:
 * forever). futex_wait returns the syscall's result (errno set). */
void ibvb__futex_wake_all(_Atomic uint32_t *w);
long ibvb__futex_wait(_Atomic uint32_t *w, uint32_t val, int64_t ns);
/* Spec §1.1: 1-64 characters of [A-Za-z0-9_.-], not starting with '.'. */
int ibvb__valid_name(const char *name);

/* A spin-wait hint. */
static inline void ibvb__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#endif
}
/* One warning line through the handler of ibvb_set_warn_handler (default: "ibvbridge: MSG" on stderr). */
__attribute__((format(printf, 1, 2))) void ibvb__warn(const char *fmt, ...);

/* The caller's own default ring directory (spec 2.1 §B): /run/ibvbridge for euid 0, else
 * $XDG_RUNTIME_DIR/ibvbridge when XDG_RUNTIME_DIR is set and absolute, else /dev/shm/ibvbridge-EUID.
 * 0, or -ENAMETOOLONG. */
int ibvb__own_default_dir(char *buf, size_t cap);
/* The next default (spec 2.2 §1.1): /tmp/ibvbridge-EUID when the own default is /dev/shm/ibvbridge-EUID
 * (not root, no XDG_RUNTIME_DIR); -ENOENT when there is none; -ENAMETOOLONG. */
int ibvb__next_default_dir(char *buf, size_t cap);

/* Opens dir (O_PATH|O_DIRECTORY|O_NOFOLLOW) and decides whether a consumer may connect to sockets in it
 * (spec 2.1 §B): a directory, not writable by group or others, owned by euid or root — or its parent is
 * root's and not writable by group or others. 0 and *fd (O_PATH) and *st when trusted; -ENOENT when it does
 * not exist; -EPERM with why (one line naming dir and the reason) when it is untrusted; other -errno. */
int ibvb__open_trusted_dir(const char *dir, uid_t euid, int *fd, struct stat *st, char *why, size_t whycap);

/* Opens the ring directory path for a producer, creating missing components (0755) one by one from / (or
 * the working directory) with openat/mkdirat, never following a symlink: a component that is a symlink, not
 * a directory, or owned by a uid other than euid or root is refused (-EPERM, one line naming it). 0 and
 * *fd (O_RDONLY|O_DIRECTORY), or -errno with the message set. The caller checks the final directory. */
int ibvb__make_dir_nofollow(const char *path, uid_t euid, int *fd);


#endif
