//go:build linux

package verbs

import (
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestMappingAroundMemfd: the mapping found for a piece of a memfd mapping is the whole mapping, even
// after madvise has split it into several /proc/self/maps entries (ibv_reg_mr's MADV_DONTFORK does).
func TestMappingAroundMemfd(t *testing.T) {
	fd, err := unix.MemfdCreate("ibvb-mapping-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Skip("memfd_create:", err)
	}
	defer unix.Close(fd)
	const page, pages = 4096, 4
	if err := unix.Ftruncate(fd, page*pages); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, page*pages, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	if err := unix.Madvise(mem[page:2*page], unix.MADV_DONTFORK); err != nil {
		t.Fatal(err)
	}
	lo, hi, err := mappingAround(mem[2*page+10 : 3*page])
	if err != nil {
		t.Fatal(err)
	}
	base := uintptr(unsafe.Pointer(&mem[0]))
	if lo != base || hi != base+page*pages {
		t.Fatalf("mapping [%#x, %#x), want [%#x, %#x)", lo, hi, base, base+page*pages)
	}
}

func TestFindMapping(t *testing.T) {
	maps := strings.Join([]string{
		"1000-2000 rw-p 00000000 00:00 0 ",
		"2000-3000 rw-s 00000000 00:01 77 /memfd:ring (deleted)",
		"3000-5000 rw-s 00001000 00:01 77 /memfd:ring (deleted)",
		"5000-6000 rw-s 00003000 00:01 77 /memfd:ring (deleted)",
		"6000-7000 rw-s 00005000 00:01 77 /memfd:ring (deleted)", // skips an offset: another mapping
		"7000-8000 r--s 00000000 00:01 78 /memfd:other (deleted)",
	}, "\n")
	for _, c := range []struct {
		lo, hi, wantLo, wantHi uintptr
		err                    string
	}{
		{0x3100, 0x3200, 0x2000, 0x6000, ""},
		{0x2000, 0x6000, 0x2000, 0x6000, ""},
		{0x1800, 0x1900, 0x1000, 0x2000, ""}, // anonymous: that entry alone
		{0x5800, 0x6800, 0, 0, "runs past its mapping"},
		{0x7100, 0x7200, 0, 0, "no writable mapping"},
		{0x9000, 0x9100, 0, 0, "no writable mapping"},
	} {
		lo, hi, err := findMapping([]byte(maps), c.lo, c.hi)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("[%#x, %#x): %v, want %q", c.lo, c.hi, err, c.err)
			}
			continue
		}
		if err != nil || lo != c.wantLo || hi != c.wantHi {
			t.Errorf("[%#x, %#x): [%#x, %#x) %v, want [%#x, %#x)", c.lo, c.hi, lo, hi, err, c.wantLo, c.wantHi)
		}
	}
}
