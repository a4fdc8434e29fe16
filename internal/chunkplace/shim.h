/* chunkplace shim: loads a chunk placement plug-in (dlopen, dlsym) and calls it, so the Go side makes one
 * cgo call per heap and never holds a C function pointer's call itself. */
#ifndef IBVB_CHUNKPLACE_SHIM_H
#define IBVB_CHUNKPLACE_SHIM_H

#include <stddef.h>

#include "ibvbridge_chunk_place.h"

/* ibvb_cp_open dlopen()s path (RTLD_NOW | RTLD_LOCAL) and resolves symbol into *fn. It returns 0, -1 when
 * the library cannot be loaded or -2 when the symbol is missing, with dlerror()'s text in err. The library
 * stays loaded for the process's life. */
int ibvb_cp_open(const char *path, const char *symbol, ibvb_chunk_place_fn **fn, char *err, size_t errlen);

/* ibvb_cp_call presets the outputs of d (chunk_id -1: rejected) and calls fn on it. */
void ibvb_cp_call(ibvb_chunk_place_fn *fn, ibvb_chunk_place_data *d);

#endif
