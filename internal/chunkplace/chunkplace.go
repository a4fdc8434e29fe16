// Package chunkplace owns recv's chunk placement plug-ins (recv --chunk-place LIB.so:FUNCTION): it loads
// a user's C function with the contract of clients/c/ibvbridge_chunk_place.h (spead2's chunk_place) at run
// time with dlopen, and calls it for each heap as the assembler's Placement (assemble.Placement), through a
// C trampoline (shim.c):
// one cgo call per heap, no allocation. The library is trusted code: it runs in recv's process, loaded
// once and never unloaded.
//
// Like verbs, it is cgo confined to one package (shim.c and chunkplace_cgo.go); without cgo, or off Linux,
// Open reports ErrUnsupported.
package chunkplace

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead/assemble"
)

// A Plugin is the assembler's placement on a chunk-mode ring.
var _ assemble.Placement = (*Plugin)(nil)

// Errors Open's errors wrap.
var (
	// ErrLoad: the library could not be loaded (missing, not a shared object, an unresolved symbol).
	ErrLoad = errors.New("chunk placement library not loadable")
	// ErrNoSymbol: the library has no such function.
	ErrNoSymbol = errors.New("chunk placement function not found")
	// ErrUnsupported: this build has no cgo, or is not for Linux.
	ErrUnsupported = fmt.Errorf("chunk placement plug-ins need a linux build with cgo: %w", errors.ErrUnsupported)
)

// Spec is a plug-in and what it is given: LIB.so:FUNCTION, --chunk-place-arg, the items asked for and the
// ring's chunk geometry.
type Spec struct {
	Path, Symbol string
	Arg          string
	HasArg       bool     // Arg given (an empty string is still a string, as opposed to NULL)
	Items        []uint64 // --chunk-place-items, whose values the function gets, in order
	Geometry     ring.ChunkGeometry
}

// ParseSpec splits LIB.so:FUNCTION at its last colon (a path may hold one, a C name cannot) and makes the
// path absolute: it names a file, never a library searched for on the loader's path.
func ParseSpec(s string) (path, symbol string, err error) {
	i := strings.LastIndexByte(s, ':')
	if i <= 0 || i == len(s)-1 {
		return "", "", fmt.Errorf("%q: want LIB.so:FUNCTION, e.g. ./place.so:place", s)
	}
	path, symbol = s[:i], s[i+1:]
	if !validSymbol(symbol) {
		return "", "", fmt.Errorf("%q: %q is not a C function name", s, symbol)
	}
	if path, err = filepath.Abs(path); err != nil {
		return "", "", fmt.Errorf("%q: %w", s, err)
	}
	return path, symbol, nil
}

func validSymbol(s string) bool {
	for i, r := range s {
		if !(r == '_' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || i > 0 && '0' <= r && r <= '9') {
			return false
		}
	}
	return s != ""
}
