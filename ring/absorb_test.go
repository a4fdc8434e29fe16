package ring_test

import (
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/ringtest"
)

// A coalesced wait is bounded by the ring's room: the stream, at the rate heaps were published, may bring
// at most half the free slots' worth before the source reads again; nothing while the rate is unknown.
func TestAbsorbsBoundedByHalfTheFreeSlotsAtTheStreamsRate(t *testing.T) {
	cfg := testConfig(t)
	cfg.SlotCount = 64
	p := ringtest.New(t, "absorb", cfg)
	ringtest.Attach(t, "absorb", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second}) // holds every heap
	const max = time.Millisecond
	t0 := time.Now()
	if d := p.AbsorbsAtForTest(t0, max); d != 0 {
		t.Fatalf("first call: %v, want 0 (the rate is unknown)", d)
	}
	for cnt := uint64(1); cnt <= 20; cnt++ {
		publish(t, p, cnt, 64)
	}
	// 20 heaps in 1 ms: 20 000 heaps/s; 44 slots free, half of them fill in 1.1 ms: the max holds.
	if d := p.AbsorbsAtForTest(t0.Add(time.Millisecond), max); d != max {
		t.Fatalf("44 free slots at 20 000 heaps/s: %v, want %v", d, max)
	}
	for cnt := uint64(21); cnt <= 40; cnt++ {
		publish(t, p, cnt, 64)
	}
	// 20 more in the next 1 ms: 24 free, 12 of them fill in 600 µs.
	if d := p.AbsorbsAtForTest(t0.Add(2*time.Millisecond), max); d != 600*time.Microsecond {
		t.Fatalf("24 free slots at 20 000 heaps/s: %v, want 600µs", d)
	}
	// After an idle spell the next burst's rate is unknown: no wait.
	if d := p.AbsorbsAtForTest(t0.Add(time.Second), max); d != 0 {
		t.Fatalf("after 1 s idle: %v, want 0", d)
	}
}

// With nobody attached under the drop policy the ring makes room by dropping its oldest heaps, which
// nobody reads: the wait is not bounded by free slots.
func TestAbsorbsUnboundedWithNobodyAttachedUnderDrop(t *testing.T) {
	cfg := testConfig(t)
	cfg.SlotCount = 64
	p := ringtest.New(t, "absorbfree", cfg)
	const max = time.Millisecond
	t0 := time.Now()
	p.AbsorbsAtForTest(t0, max)
	for cnt := uint64(1); cnt <= 200; cnt++ { // three laps of the ring in 1 ms
		publish(t, p, cnt, 64)
	}
	if d := p.AbsorbsAtForTest(t0.Add(time.Millisecond), max); d != max {
		t.Fatalf("nobody attached, 200 000 heaps/s: %v, want %v", d, max)
	}
}
