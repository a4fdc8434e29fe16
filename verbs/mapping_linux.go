//go:build linux

package verbs

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"unsafe"
)

// mappingAround returns the writable memory mapping that holds b, as the receiver registers it for
// placement: the /proc/self/maps entry holding b's first byte, joined with its neighbours that map the
// same file at contiguous offsets (the ring's data memory is one mapping of one memfd, which the kernel
// may list in pieces). b must lie inside it.
func mappingAround(b []byte) (lo, hi uintptr, err error) {
	if len(b) == 0 {
		return 0, 0, fmt.Errorf("ibverbs: empty packet area")
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0, 0, fmt.Errorf("ibverbs: find the packet area's mapping: %w", err)
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return findMapping(maps, start, start+uintptr(len(b)))
}

// vma is one line of /proc/self/maps.
type vma struct {
	lo, hi   uintptr
	writable bool
	offset   uint64
	dev      string
	inode    uint64
}

func parseMaps(maps []byte) []vma {
	var out []vma
	for _, line := range bytes.Split(maps, []byte("\n")) {
		f := bytes.Fields(line)
		if len(f) < 5 {
			continue
		}
		r := bytes.SplitN(f[0], []byte("-"), 2)
		if len(r) != 2 {
			continue
		}
		lo, err1 := strconv.ParseUint(string(r[0]), 16, 64)
		hi, err2 := strconv.ParseUint(string(r[1]), 16, 64)
		off, err3 := strconv.ParseUint(string(f[2]), 16, 64)
		ino, err4 := strconv.ParseUint(string(f[4]), 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
			continue
		}
		out = append(out, vma{lo: uintptr(lo), hi: uintptr(hi), writable: len(f[1]) > 1 && f[1][1] == 'w',
			offset: off, dev: string(f[3]), inode: ino})
	}
	return out
}

// findMapping is mappingAround on the text of /proc/self/maps, for [lo, hi).
func findMapping(maps []byte, lo, hi uintptr) (uintptr, uintptr, error) {
	vs := parseMaps(maps)
	i := 0
	for i < len(vs) && !(vs[i].lo <= lo && lo < vs[i].hi) {
		i++
	}
	if i == len(vs) || !vs[i].writable {
		return 0, 0, fmt.Errorf("ibverbs: no writable mapping holds the packet area at %#x", lo)
	}
	// Neighbours continue a file mapping when they map the same file, writable, at the next offsets.
	continues := func(a, b vma) bool {
		return a.hi == b.lo && a.inode != 0 && a.inode == b.inode && a.dev == b.dev && b.writable &&
			a.offset+uint64(a.hi-a.lo) == b.offset
	}
	first, last := i, i
	for first > 0 && continues(vs[first-1], vs[first]) {
		first--
	}
	for last+1 < len(vs) && continues(vs[last], vs[last+1]) {
		last++
	}
	if hi > vs[last].hi {
		return 0, 0, fmt.Errorf("ibverbs: the packet area [%#x, %#x) runs past its mapping [%#x, %#x)",
			lo, hi, vs[first].lo, vs[last].hi)
	}
	return vs[first].lo, vs[last].hi, nil
}
