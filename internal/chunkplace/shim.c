//go:build linux && cgo

#include <dlfcn.h>
#include <stdio.h>

#include "shim.h"

int ibvb_cp_open(const char *path, const char *symbol, ibvb_chunk_place_fn **fn, char *err, size_t errlen)
{
	void *h, *p;
	const char *e;

	dlerror();
	/* RTLD_NOW: a plug-in with an unresolved symbol fails here, not at its first heap. RTLD_LOCAL: its
	 * symbols stay out of the process's global namespace. */
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return -1;
	}
	dlerror();
	p = dlsym(h, symbol);
	if (p == NULL) {
		e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "symbol is NULL");
		dlclose(h);
		return -2;
	}
	*fn = (ibvb_chunk_place_fn *)p;
	return 0;
}

void ibvb_cp_call(ibvb_chunk_place_fn *fn, ibvb_chunk_place_data *d)
{
	d->chunk_id = -1;
	d->heap_index = 0;
	d->heap_offset = 0;
	fn(d, sizeof *d);
}
