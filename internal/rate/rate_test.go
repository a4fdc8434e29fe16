package rate

import (
	"testing"
	"time"
)

// The rate is unknown at first and after an idle gap, the interval's rate at the second observation,
// then a moving average that gives the newest interval a quarter of the weight.
func TestMeterUnknownThenMovingAverageThenForgottenAfterIdle(t *testing.T) {
	var m Meter
	t0 := time.Now()
	if _, known := m.Observe(t0, 0, time.Second); known {
		t.Fatal("first observation: rate known, want unknown")
	}
	if r, known := m.Observe(t0.Add(time.Millisecond), 0, time.Second); !known || r != 0 {
		t.Fatalf("nothing in 1 ms: %v/s (known %v), want a known 0", r, known)
	}
	if r, _ := m.Observe(t0.Add(2*time.Millisecond), 400, time.Second); r != 100_000 {
		t.Fatalf("then 400 in 1 ms: %v/s, want 100000 (a quarter's weight against 0)", r)
	}
	if r, _ := m.Observe(t0.Add(3*time.Millisecond), 900, time.Second); r != 100_000+(500_000-100_000)/4 {
		t.Fatalf("then 500 in 1 ms: %v/s, want 200000", r)
	}
	if _, known := m.Observe(t0.Add(3*time.Second), 1000, time.Second); known {
		t.Fatal("after 3 s without an observation: rate known, want unknown")
	}
	if r, known := m.Observe(t0.Add(3*time.Second+time.Millisecond), 1010, time.Second); !known || r != 10_000 {
		t.Fatalf("10 in 1 ms after the idle spell: %v/s (known %v), want 10000 (the old average forgotten)", r, known)
	}
}
