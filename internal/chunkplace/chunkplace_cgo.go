//go:build linux && cgo

package chunkplace

/*
#cgo CFLAGS: -O2 -Wall -I${SRCDIR}/../../clients/c
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"slices"
	"unsafe"
)

// Plugin is a loaded placement function with the C memory it is called with (never Go memory: the
// call passes no Go pointer, so cgo has nothing to check). One goroutine at a time may call Place.
type Plugin struct {
	fn    *C.ibvb_chunk_place_fn
	data  *C.ibvb_chunk_place_data
	items []uint64 // the C array data.items points to
	ids   []uint64 // the Spec's Items
	arg   *C.char
}

// Open loads spec's library and function and prepares the call's data. The errors wrap ErrLoad or
// ErrNoSymbol and say what dlopen or dlsym said.
func Open(spec Spec) (*Plugin, error) {
	cpath, csym := C.CString(spec.Path), C.CString(spec.Symbol)
	defer C.free(unsafe.Pointer(cpath))
	defer C.free(unsafe.Pointer(csym))
	var buf [512]C.char
	var fn *C.ibvb_chunk_place_fn
	switch C.ibvb_cp_open(cpath, csym, &fn, &buf[0], C.size_t(len(buf))) {
	case 0:
	case -1:
		return nil, fmt.Errorf("%w: %s", ErrLoad, C.GoString(&buf[0]))
	default:
		return nil, fmt.Errorf("%w: %s", ErrNoSymbol, C.GoString(&buf[0]))
	}
	p := &Plugin{fn: fn, data: (*C.ibvb_chunk_place_data)(C.calloc(1, C.sizeof_ibvb_chunk_place_data))}
	if p.data == nil {
		return nil, fmt.Errorf("chunk placement: out of memory")
	}
	d := p.data
	p.ids = slices.Clone(spec.Items)
	if n := len(spec.Items); n > 0 {
		arr := (*uint64)(C.calloc(C.size_t(n), 8))
		if arr == nil {
			p.Close()
			return nil, fmt.Errorf("chunk placement: out of memory")
		}
		p.items = unsafe.Slice(arr, n)
		d.items, d.n_items = (*C.uint64_t)(unsafe.Pointer(arr)), C.size_t(n)
	}
	if spec.HasArg {
		p.arg = C.CString(spec.Arg)
		d.user_data = p.arg
	}
	g := spec.Geometry
	d.heaps_per_chunk, d.chunk_axis, d.chunk_heap_size = C.uint32_t(g.Heaps), C.uint32_t(g.Axis), C.uint64_t(g.HeapSize)
	return p, nil
}

// Items are the Spec's Items, whose values Place gets (assemble.Placement).
func (p *Plugin) Items() []uint64 { return p.ids }

// Place calls the function for one heap (assemble.Placement). items must hold as many values as the
// Spec's Items.
func (p *Plugin) Place(cnt, size uint64, items []uint64) (chunk, pos, off uint64, ok bool) {
	d := p.data
	d.heap_cnt, d.heap_size = C.uint64_t(cnt), C.uint64_t(size)
	copy(p.items, items)
	C.ibvb_cp_call(p.fn, d)
	if d.chunk_id < 0 {
		return 0, 0, 0, false
	}
	return uint64(d.chunk_id), uint64(d.heap_index), uint64(d.heap_offset), true
}

// Close frees the call's data; the library stays loaded (a plug-in is loaded once for the process).
func (p *Plugin) Close() {
	if p.items != nil {
		C.free(unsafe.Pointer(unsafe.SliceData(p.items)))
		p.items = nil
	}
	C.free(unsafe.Pointer(p.arg))
	C.free(unsafe.Pointer(p.data))
	p.arg, p.data = nil, nil
}
