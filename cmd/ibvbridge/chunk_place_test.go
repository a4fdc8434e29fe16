package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/internal/testutil"
	"github.com/ibvbridge/ibvbridge/ring"
)

// recv --chunk-place with the example plug-in (examples/chunk_place/place.c: timestamp and antenna items,
// the step as its argument) gives a consumer the same chunks as --chunk-by/--chunk-axis on the same
// traffic: the same ids, every byte of every chunk and every presence byte equal, and the same counters.
func TestRecvChunkPlaceMatchesChunkBy(t *testing.T) {
	lib := testutil.ChunkPlaceExample(t)
	byFlags, mFlags := recvChunks(t, "0x4101:4", nil, "--chunk-by", "0x1600:4096", "--chunk-axis", "0x4101:4")
	byPlugin, mPlugin := recvChunks(t, "0x4101:4", nil, "--chunk-axis", "0x4101:4", "--chunk-place", lib+":place",
		"--chunk-place-items", "0x1600,0x4101", "--chunk-place-arg", "4096")
	if len(byFlags) != 10 {
		t.Fatalf("%d chunks by the flags, want 10; recv %v", len(byFlags), mFlags)
	}
	if len(byPlugin) != len(byFlags) {
		t.Fatalf("%d chunks by the plug-in, %d by the flags; recv %v", len(byPlugin), len(byFlags), mPlugin)
	}
	for i, f := range byFlags {
		p := byPlugin[i]
		if f.id != p.id || !bytes.Equal(f.present, p.present) || !bytes.Equal(f.data, p.data) {
			t.Fatalf("chunk %d: id %d by the flags, %d by the plug-in; presence equal %v, bytes equal %v",
				i, f.id, p.id, bytes.Equal(f.present, p.present), bytes.Equal(f.data, p.data))
		}
		if !bytes.Equal(f.present, bytes.Repeat([]byte{1}, 32)) {
			t.Fatalf("chunk %d incomplete (%v): the comparison needs every heap", f.id, f.present)
		}
	}
	for _, k := range []string{"chunks", "incomplete_chunks", "heaps", "too_old_heaps", "rejected_heaps", "duplicate_packets"} {
		if num(mFlags, k) != num(mPlugin, k) {
			t.Errorf("%s: %d by the flags, %d by the plug-in", k, num(mFlags, k), num(mPlugin, k))
		}
	}
}

// Heaps the function rejects are counted in rejected_heaps and written nowhere: with 4 antennas sent and a
// chunk axis of 3, the example rejects antenna 3 (it is not the geometry's check: the position it would
// give, t × 3 + 3, is in range for every t but the last), so 80 of 320 heaps are rejected and the 10
// chunks hold the other 240, complete.
func TestRecvChunkPlaceRejectedHeapsCounted(t *testing.T) {
	lib := testutil.ChunkPlaceExample(t)
	chunks, m := recvChunks(t, "0x4101:4", nil, "--chunk-axis", "0x4101:3", "--chunk-place", lib+":place",
		"--chunk-place-items", "0x1600,0x4101", "--chunk-place-arg", "4096")
	for k, v := range map[string]uint64{"rejected_heaps": 80, "heaps": 240, "chunks": 10, "incomplete_chunks": 0, "too_old_heaps": 0} {
		if got := num(m, k); got != v {
			t.Errorf("recv's final %s = %d, want %d (%v)", k, got, v, m)
		}
	}
	if len(chunks) != 10 {
		t.Fatalf("%d chunks, want 10", len(chunks))
	}
}

// A --chunk-place that cannot be used — a missing library, a missing function, no colon, items or an
// argument without it, or it without --chunk-heaps — is refused in one line, exit status 2, before the ring
// exists.
func TestRecvChunkPlaceBadInputs(t *testing.T) {
	lib := testutil.ChunkPlaceExample(t)
	missing := filepath.Join(t.TempDir(), "missing.so")
	geo := []string{"--chunk-heaps", "8", "--chunk-heap-size", "8K"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(geo, "--chunk-place", missing+":place"), "missing.so: cannot open shared object file"},
		{append(geo, "--chunk-place", lib+":no_such_place"), "undefined symbol: no_such_place"},
		{append(geo, "--chunk-place", lib), "want LIB.so:FUNCTION"},
		{append(geo, "--chunk-by", "0x1600", "--chunk-place-items", "0x1600"), "--chunk-place-items goes with --chunk-place"},
		{append(geo, "--chunk-by", "0x1600", "--chunk-place-arg", "x"), "--chunk-place-arg goes with --chunk-place"},
		{[]string{"--chunk-place", lib + ":place"}, "--chunk-place goes with --chunk-heaps"},
		{append(geo, "--chunk-place", lib+":place", "--chunk-place-items", "0x1600,zz"), "--chunk-place-items"},
	} {
		name := testRing(t, "cpbad")
		_, stderr, code := runCmd(t, 10*time.Second, append([]string{"recv", "--ring", name, "--hugepages", "off"},
			append(tc.args, "127.0.0.1:9")...)...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if code != 2 || len(lines) != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("recv %v: exit %d, stderr %q; want exit 2 and one line with %q", tc.args, code, stderr, tc.want)
		}
		if _, err := os.Stat(filepath.Join(ring.DefaultDir(), ring.SocketName(name))); err == nil {
			t.Errorf("recv %v left its ring behind", tc.args)
		}
	}
}
