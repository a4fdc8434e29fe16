/* ibvbridge_dirs.c — ring directories (docs/ring-layout.md 2.1 §B) for both halves of libibvbridge: the
 * default directory, the trust rule a consumer applies before it connects to a socket, the producer's
 * directory creation that follows no symlink, and the warning channel that names a skipped directory. */
#define _GNU_SOURCE
#include "ibvbridge.h"
#include "ibvbridge_internal.h"

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- warnings ---------------------------------------------------------------------------------- */

static pthread_mutex_t warn_mu = PTHREAD_MUTEX_INITIALIZER;
static ibvb_warn_fn warn_fn;
static void *warn_arg;

void ibvb_set_warn_handler(ibvb_warn_fn fn, void *arg)
{
	pthread_mutex_lock(&warn_mu);
	warn_fn = fn;
	warn_arg = arg;
	pthread_mutex_unlock(&warn_mu);
}

void ibvb__warn(const char *fmt, ...)
{
	char msg[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&warn_mu);
	if (warn_fn)
		warn_fn(msg, warn_arg);
	else
		fprintf(stderr, "ibvbridge: %s\n", msg);
	pthread_mutex_unlock(&warn_mu);
}


/* ---- defaults and the trust rule --------------------------------------------------------------- */

int ibvb__own_default_dir(char *buf, size_t cap)
{
	uid_t euid = geteuid();
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	int n;
	if (euid == 0)
		n = snprintf(buf, cap, "%s", IBVB_RUN_DIR);
	else if (xdg && xdg[0] == '/')
		n = snprintf(buf, cap, "%s/ibvbridge", xdg);
	else
		n = snprintf(buf, cap, "%s%u", IBVB_SHM_DIR_PREFIX, (unsigned)euid);
	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

int ibvb__next_default_dir(char *buf, size_t cap)
{
	uid_t euid = geteuid();
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	if (euid == 0 || (xdg && xdg[0] == '/'))
		return -ENOENT;
	int n = snprintf(buf, cap, "%s%u", IBVB_TMP_DIR_PREFIX, (unsigned)euid);
	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

/* Only root could have made a directory whose parent is root's and not writable by group or others. */
static int parent_is_roots(int fd)
{
	struct stat pst;
	int pfd = openat(fd, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (pfd < 0)
		return 0;
	int ok = fstat(pfd, &pst) == 0 && pst.st_uid == 0 && (pst.st_mode & (S_IWGRP | S_IWOTH)) == 0;
	close(pfd);
	return ok;
}

int ibvb__open_trusted_dir(const char *dir, uid_t euid, int *fdp, struct stat *st, char *why, size_t whycap)
{
	int fd = open(dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		struct stat lst;
		if (e == ENOENT)
			return -ENOENT;
		if ((e == ENOTDIR || e == ELOOP) && lstat(dir, &lst) == 0 && S_ISLNK(lst.st_mode))
			snprintf(why, whycap, "%s: a symbolic link", dir);
		else if (e == ENOTDIR)
			snprintf(why, whycap, "%s: not a directory", dir);
		else
			snprintf(why, whycap, "%s: %s", dir, strerror(e));
		return e == ENOTDIR || e == ELOOP ? -EPERM : -e;
	}
	if (fstat(fd, st) < 0) {
		int e = errno;
		snprintf(why, whycap, "%s: fstat: %s", dir, strerror(e));
		close(fd);
		return -e;
	}
	if (st->st_mode & (S_IWGRP | S_IWOTH))
		snprintf(why, whycap, "%s: writable by group or others (mode %#o)", dir,
			 (unsigned)(st->st_mode & 07777));
	else if (st->st_uid == euid || st->st_uid == 0 || parent_is_roots(fd)) {
		*fdp = fd;
		return 0;
	} else
		snprintf(why, whycap, "%s: owned by uid %u, not %u or root", dir, (unsigned)st->st_uid, (unsigned)euid);
	close(fd);
	return -EPERM;
}

/* ---- the producer's directory ------------------------------------------------------------------ */

/* Opens (creating it if missing) component comp of path below dfd without following a symlink; checks its
 * owner. prefix: path up to and including comp, for messages. */
static int step_into(int dfd, const char *comp, const char *prefix, uid_t euid)
{
	int fd = openat(dfd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT) {
		if (mkdirat(dfd, comp, 0755) < 0 && errno != EEXIST)
			return fail(-errno, "ring directory %s: mkdir: %s", prefix, strerror(errno));
		fd = openat(dfd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	}
	if (fd < 0) {
		int e = errno;
		struct stat lst;
		if (fstatat(dfd, comp, &lst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lst.st_mode))
			return fail(-EPERM, "unsafe ring directory: %s is a symbolic link (owned by uid %u)", prefix,
					(unsigned)lst.st_uid);
		if (e == ENOTDIR)
			return fail(-EPERM, "unsafe ring directory: %s is not a directory", prefix);
		return fail(-e, "ring directory %s: open: %s", prefix, strerror(e));
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		return fail(-e, "ring directory %s: fstat: %s", prefix, strerror(e));
	}
	if (st.st_uid != euid && st.st_uid != 0) {
		close(fd);
		return fail(-EPERM, "unsafe ring directory: %s is owned by uid %u, not %u or root", prefix,
				(unsigned)st.st_uid, (unsigned)euid);
	}
	return fd;
}

int ibvb__make_dir_nofollow(const char *path, uid_t euid, int *fdp)
{
	char buf[PATH_MAX], prefix[PATH_MAX];
	if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
		return fail(-ENAMETOOLONG, "ring directory %s: path too long", path);
	int dfd = open(path[0] == '/' ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return fail(-errno, "ring directory %s: open: %s", path, strerror(errno));
	size_t plen = 0;
	prefix[0] = 0;
	char *save = NULL;
	for (char *comp = strtok_r(buf, "/", &save); comp; comp = strtok_r(NULL, "/", &save)) {
		plen += (size_t)snprintf(prefix + plen, sizeof prefix - plen, "%s%s",
					 plen || path[0] == '/' ? "/" : "", comp);
		if (!strcmp(comp, "."))
			continue;
		if (!strcmp(comp, "..")) {
			close(dfd);
			return fail(-EINVAL, "ring directory %s: '..' components are not allowed", path);
		}
		int fd = step_into(dfd, comp, prefix, euid);
		close(dfd);
		if (fd < 0)
			return fd;
		dfd = fd;
	}
	int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int e = errno;
	close(dfd);
	if (fd < 0)
		return fail(-e, "ring directory %s: open: %s", path, strerror(e));
	*fdp = fd;
	return 0;
}
