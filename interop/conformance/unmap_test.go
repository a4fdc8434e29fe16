package conformance_test

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
)

// regionMappings counts process pid's mappings of 4096-byte memfds: its consumers' regions (spec §3; the
// control and data memory are larger).
func regionMappings(t *testing.T, pid int) int {
	t.Helper()
	f, err := os.Open("/proc/" + itoa(pid) + "/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	for sc := bufio.NewScanner(f); sc.Scan(); {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || !strings.HasPrefix(fields[5], "/memfd:") {
			continue
		}
		lo, hi, _ := strings.Cut(fields[0], "-")
		a, _ := strconv.ParseUint(lo, 16, 64)
		b, _ := strconv.ParseUint(hi, 16, 64)
		if b-a == ring.RegionSize {
			n++
		}
	}
	return n
}

// unmapChecks is how many attach-and-detach cycles unmappedAtDetach runs.
const unmapChecks = 3

// unmappedAtDetach attaches consumers one at a time to an idle producer of kind (nothing published, no
// wait under way) with its heartbeat slowed to 60 s, and checks by counting the producer's mappings that
// each one's region is mapped while it is attached and unmapped once the producer counts it gone (kill
// -9: the socket's EOF). It reports the cycles whose region was still mapped 500 ms after the detach.
func unmappedAtDetach(t *testing.T, kind string, env ...string) (leftMapped int) {
	t.Helper()
	p := startProducer(t, kind, prodOpts{slots: 16, idle: true, env: append(env, "IBVBRIDGE_TEST_BEAT_MS=60000")})
	p.waitInfo(t, "the first heaps", func(i *ring.Info) bool { return i.Head == 8 })
	for i := 0; i < unmapChecks; i++ {
		base := regionMappings(t, p.pid())
		c := startConsumer(t, "go", p.sock(), "--stop-first")
		waitStopped(t, c.pid())
		if n := regionMappings(t, p.pid()); n != base+1 {
			t.Fatalf("%s producer: %d region mappings with a consumer attached, want %d", kind, n, base+1)
		}
		c.cmd.Process.Kill()
		p.waitInfo(t, "the consumer gone", func(i *ring.Info) bool { return i.Counters["consumers_attached"] == 0 })
		deadline := time.Now().Add(500 * time.Millisecond) // the unmap follows the count under one lock
		for regionMappings(t, p.pid()) != base && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if regionMappings(t, p.pid()) != base {
			leftMapped++
		}
	}
	return leftMapped
}

// TestDetachedRegionUnmappedAtOnce (spec §7.6, 2.1 §C: nothing a connection created outlives it): every
// producer (Go, C, Python) unmaps a consumer's region when the consumer dies, counted in the producer's
// /proc/PID/maps right after the detach, with the heartbeat (whose sweep would hide a missing unmap)
// slowed to 60 s.
func TestDetachedRegionUnmappedAtOnce(t *testing.T) {
	t.Parallel() // mostly waiting on processes: beside another test
	for _, kind := range producerKinds {
		t.Run(kind, func(t *testing.T) {
			if n := unmappedAtDetach(t, kind); n != 0 {
				t.Errorf("%s producer: %d of %d detached consumers' regions still mapped after the detach", kind, n, unmapChecks)
			}
		})
	}
}

// TestUnmapCheckCatchesARegionLeftMapped: the check above fails for the Go, C and Python producers built to leave
// a detached consumer's region to the heartbeat's sweep (mutant no-unmap).
func TestUnmapCheckCatchesARegionLeftMapped(t *testing.T) {
	t.Parallel() // mostly waiting on processes: beside another test
	for _, kind := range []string{"go", "c", "python"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			if n := unmappedAtDetach(t, kind, mutantEnv+"=no-unmap"); n != unmapChecks {
				t.Errorf("%s producer without the unmap at detach: %d of %d regions left mapped: the check did not catch it",
					kind, n, unmapChecks)
			}
		})
	}
}
