package transport

import (
	"context"
	"testing"
	"time"
)

// TestPacerHoldsTheRate: batches sent through Wait never get ahead of rate·t by more than one batch, and
// an unpaced Pacer never waits.
func TestPacerHoldsTheRate(t *testing.T) {
	const rate = 80e6 // bits/s: 10 MB/s
	const batch = 50_000
	p := NewPacer(rate)
	start := time.Now()
	var sent uint64
	for range 10 {
		if err := p.Wait(context.Background(), sent); err != nil {
			t.Fatal(err)
		}
		sent += batch
	}
	elapsed := time.Since(start)
	if min := time.Duration(float64(sent-batch) * 8 / rate * float64(time.Second)); elapsed < min {
		t.Fatalf("%d bytes in %v at %g b/s: faster than the rate allows (at least %v)", sent, elapsed, rate, min)
	}
	u := NewPacer(0)
	t0 := time.Now()
	for range 1000 {
		if err := u.Wait(context.Background(), 1<<40); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(t0); d > time.Second {
		t.Fatalf("unpaced Pacer waited %v", d)
	}
}

// TestPacerCancel: a wait for bytes due in years ends at once with the context's error.
func TestPacerCancel(t *testing.T) {
	p := NewPacer(1)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	if err := p.Wait(ctx, 1<<40); err != context.Canceled {
		t.Fatalf("Wait = %v, want context.Canceled", err)
	}
}
