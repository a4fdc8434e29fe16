package udp

import (
	"testing"
	"time"
)

// absorbAt is a transport.Absorber that allows at most limit.
type absorbAt struct{ limit time.Duration }

func (absorbAt) Packet([]byte, int64)                      {}
func (a absorbAt) Absorbs(max time.Duration) time.Duration { return min(max, a.limit) }

// noRoom is a plain sink: it sets no bound.
type noRoom struct{}

func (noRoom) Packet([]byte, int64) {}

// A coalesced sleep never outlasts the configured time, nor what a quarter of the socket buffer holds at
// the stream's byte rate; it is skipped while the rate is unknown (the first drain, after an idle spell).
func TestCoalescerBoundedBySocketBufferAndSkippedWhileRateUnknown(t *testing.T) {
	c := newCoalescer(time.Millisecond, 8<<20, noRoom{}, false) // 2 MiB of payload may wait
	t0 := time.Now()
	if d := c.next(t0, 0); d != 0 {
		t.Fatalf("first drain: %v, want 0 (rate unknown)", d)
	}
	// 100 MB/s: 2 MiB takes 21 ms, the configured 1 ms holds.
	if d := c.next(t0.Add(10*time.Millisecond), 1_000_000); d != time.Millisecond {
		t.Fatalf("100 MB/s: %v, want 1ms", d)
	}
	// 4 GB/s (moving average from 100 MB/s: 100 + (4000-100)/4 = 1075 MB/s): 2 MiB in 1.95 ms: 1 ms.
	// Held there, the average converges on 4 GB/s, where 2 MiB takes 524 µs.
	at, bytes := t0.Add(10*time.Millisecond), uint64(1_000_000)
	var d time.Duration
	for range 40 {
		at, bytes = at.Add(time.Millisecond), bytes+4_000_000
		d = c.next(at, bytes)
	}
	if want := time.Duration(float64(2<<20) / 4e9 * float64(time.Second)); d < want-time.Microsecond || d > want+time.Microsecond {
		t.Fatalf("4 GB/s with an 8 MiB buffer: %v, want %v", d, want)
	}
	if d := c.next(at.Add(time.Second), bytes+1); d != 0 {
		t.Fatalf("after 1 s idle: %v, want 0 (the next burst's rate is unknown)", d)
	}
}

// The sink's room bounds the sleep too, and a bound below minCoalesce means no sleep at all.
func TestCoalescerBoundedBySinkRoom(t *testing.T) {
	t0 := time.Now()
	for _, tc := range []struct{ limit, want time.Duration }{
		{300 * time.Microsecond, 300 * time.Microsecond},
		{time.Hour, time.Millisecond},
		{minCoalesce - 1, 0},
	} {
		c := newCoalescer(time.Millisecond, 8<<20, absorbAt{tc.limit}, false)
		c.next(t0, 0)
		if d := c.next(t0.Add(time.Millisecond), 100_000); d != tc.want {
			t.Errorf("sink allows %v: sleep %v, want %v", tc.limit, d, tc.want)
		}
	}
}

// awaitAt is a transport.Awaiter whose heap in assembly completes in left (ok false: none in assembly).
type awaitAt struct {
	left time.Duration
	ok   bool
}

func (awaitAt) Packet([]byte, int64)                  {}
func (a *awaitAt) Awaits(int64) (time.Duration, bool) { return a.left, a.ok }

// Bounded by heaps, a sleep ends at awaitShare of the time the heap in assembly needs, so it never
// outlasts the heap's last datagram; none is taken while no heap is in assembly, nor when the rest of
// the heap is due within minCoalesce, nor when the sink cannot tell. Unbounded, the heap is not asked.
func TestCoalescerBoundedByHeapInAssembly(t *testing.T) {
	t0 := time.Now()
	for _, tc := range []struct {
		name  string
		sink  *awaitAt
		heaps bool
		want  time.Duration
	}{
		{"heap due in 400µs", &awaitAt{400 * time.Microsecond, true}, true, 300 * time.Microsecond},
		{"heap due in 4ms", &awaitAt{4 * time.Millisecond, true}, true, time.Millisecond},
		{"heap due within minCoalesce", &awaitAt{minCoalesce, true}, true, 0},
		{"no heap in assembly", &awaitAt{time.Second, false}, true, 0},
		{"fixed: heap not asked", &awaitAt{100 * time.Microsecond, true}, false, time.Millisecond},
	} {
		c := newCoalescer(time.Millisecond, 8<<20, tc.sink, tc.heaps)
		c.next(t0, 0)
		if d := c.next(t0.Add(time.Millisecond), 100_000); d != tc.want {
			t.Errorf("%s: sleep %v, want %v", tc.name, d, tc.want)
		}
	}
	c := newCoalescer(time.Millisecond, 8<<20, noRoom{}, true)
	c.next(t0, 0)
	if d := c.next(t0.Add(time.Millisecond), 100_000); d != 0 {
		t.Errorf("bounded by heaps, a sink that cannot tell: sleep %v, want 0", d)
	}
}

// A heap-bounded sleep is shortened by how late sleeps have been ending (the wake's own latency), so it
// still ends before the heap is due; a fixed sleep, the explicit trade, is not. One very late sleep (a
// descheduled thread) counts for at most maxOvershoot.
func TestCoalescerShortensHeapBoundedSleepsByTheirOvershoot(t *testing.T) {
	t0 := time.Now()
	bounded := newCoalescer(time.Millisecond, 8<<20, &awaitAt{400 * time.Microsecond, true}, true)
	fixed := newCoalescer(time.Millisecond, 8<<20, noRoom{}, false)
	for _, c := range []*coalescer{bounded, fixed} {
		c.next(t0, 0)
		for range 100 {
			c.slept(200*time.Microsecond, 240*time.Microsecond) // every sleep ends 40 µs late
		}
	}
	d := bounded.next(t0.Add(time.Millisecond), 100_000)
	if want := 300*time.Microsecond - 40*time.Microsecond; d < want-time.Microsecond || d > want+time.Microsecond {
		t.Errorf("heap due in 400µs, sleeps 40µs late: sleep %v, want %v", d, want)
	}
	if d := fixed.next(t0.Add(time.Millisecond), 100_000); d != time.Millisecond {
		t.Errorf("fixed 1ms, sleeps 40µs late: sleep %v, want 1ms", d)
	}
	c := newCoalescer(time.Millisecond, 8<<20, &awaitAt{4 * time.Millisecond, true}, true)
	c.next(t0, 0)
	for range 100 {
		c.slept(100*time.Microsecond, time.Second)
	}
	if c.over < maxOvershoot-time.Microsecond || c.over > maxOvershoot {
		t.Errorf("sleeps a second late: learnt overshoot %v, want the bound %v", c.over, maxOvershoot)
	}
	// The heap is due in 4 ms: ¾ of it less the bounded overshoot is 2.5 ms, so the configured 1 ms holds.
	if d := c.next(t0.Add(time.Millisecond), 100_000); d != time.Millisecond {
		t.Errorf("heap due in 4ms, overshoot %v: sleep %v, want 1ms", maxOvershoot, d)
	}
}

// --coalesce takes heap (the default), a duration up to 1ms, or 0.
func TestCoalescingFlag(t *testing.T) {
	c := DefaultCoalescing
	if c.String() != "heap" || !c.Heaps || c.Max != DefaultCoalesce {
		t.Fatalf("default %+v (%s), want heap-bounded up to %v", c, c.String(), DefaultCoalesce)
	}
	if err := c.Set("500us"); err != nil || c.Heaps || c.Max != 500*time.Microsecond {
		t.Fatalf("500us: %+v, %v", c, err)
	}
	if err := c.Set("heap"); err != nil || c != DefaultCoalescing {
		t.Fatalf("heap: %+v, %v", c, err)
	}
	for _, bad := range []string{"2ms", "-1us", "heaps please"} {
		if err := c.Set(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
