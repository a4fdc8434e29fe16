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
	c := newCoalescer(time.Millisecond, 8<<20, noRoom{}) // 2 MiB of payload may wait
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
		c := newCoalescer(time.Millisecond, 8<<20, absorbAt{tc.limit})
		c.next(t0, 0)
		if d := c.next(t0.Add(time.Millisecond), 100_000); d != tc.want {
			t.Errorf("sink allows %v: sleep %v, want %v", tc.limit, d, tc.want)
		}
	}
}
