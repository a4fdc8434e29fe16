package interop_test

import (
	"slices"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

// TestGroupOfPythonAndCMembersReadsEveryHeapOnce (spec §14, across languages): two Python and two C
// consumer-group members (`--group-name`) and one independent C monitor on a Go producer's ring. Every heap
// is read by exactly one member (their heap counts and heap_cnt sums add up to the stream's), each member
// gets a share and verifies its bytes, and the monitor reads every heap.
func TestGroupOfPythonAndCMembersReadsEveryHeapOnce(t *testing.T) {
	needCAndPython(t)
	p := newRing(t, "group", ring.Config{Policy: ring.PolicyBlock, MaxConsumers: 8})
	members := []string{"python", "python", "c", "c"}
	var waits []func() result
	for _, kind := range members {
		waits = append(waits, startConsumer(t, kind, p.SocketPath(), "--group-name", "work"))
	}
	monitor := startConsumer(t, "c", p.SocketPath())
	waitProducerConsumers(t, p, 5)
	const n = 3000
	for cnt := uint64(1); cnt <= n; cnt++ {
		pb := pattern.Publisher{P: p, Size: sizeOf(cnt, 8192), Fill: true}
		if _, err := pb.Publish(cnt, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.PublishEndOfStream(0, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	const cntSum = n * (n + 1) / 2
	if heaps, sum := membersRead(t, members, waits); heaps != n || sum != cntSum {
		t.Errorf("the members read %d heaps (heap_cnt sum %d), want each of %d once (sum %d)", heaps, sum, n, cntSum)
	}
	if r := monitor(); r.Result != "eos" || r.Heaps != n || r.HeapCntSum != cntSum || r.VerifyErrors != 0 {
		t.Errorf("monitor: %+v, want all %d heaps (heap_cnt sum %d)", r, n, cntSum)
	}
	if lost := p.Stats().Get(ring.CounterGroupLost); lost != 0 {
		t.Errorf("group_lost %d, want 0", lost)
	}
}

// needCAndPython skips a test that needs the C and Python consumers when one is absent.
func needCAndPython(t *testing.T) {
	t.Helper()
	if kinds := consumers(t); !slices.Contains(kinds, "c") || !slices.Contains(kinds, "python") {
		t.Skipf("needs the C and Python consumers (have %v)", kinds)
	}
}

// membersRead waits for each group member's result: each must reach the end of the stream having read a
// share of verified heaps in order. It returns their heaps and heap_cnt sum together.
func membersRead(t *testing.T, members []string, waits []func() result) (heaps, sum uint64) {
	t.Helper()
	for i, wait := range waits {
		r := wait()
		t.Logf("member %d (%s): %d heaps", i, members[i], r.Heaps)
		if r.Result != "eos" || r.Heaps == 0 || r.VerifyErrors != 0 || r.OutOfOrder != 0 {
			t.Errorf("member %d (%s): %+v", i, members[i], r)
		}
		heaps += r.Heaps
		sum += r.HeapCntSum
	}
	return heaps, sum
}
