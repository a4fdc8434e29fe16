package ring_test

import (
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/pattern"
)

// With MaxLatency a moving stream is read in naps: every heap arrives in order, and the producer is not
// asked for a wake per heap (the consumer's futex word barely moves). An idle stream goes back to the
// futex: a wait still times out on time and the next heap is delivered.
func TestNextNapsWhileActive(t *testing.T) {
	dir := t.TempDir()
	p, err := ring.Create("naps", ring.Config{Dir: dir, SlotCount: 64, SlotSize: 4096, HugePages: ring.HugePagesOff})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := ring.Attach("naps", ring.AttachOptions{Dir: dir, Timeout: time.Second, MaxLatency: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = 40
	go func() {
		pb := pattern.Publisher{P: p, Size: 64}
		for cnt := uint64(1); cnt <= n; cnt++ {
			time.Sleep(500 * time.Microsecond)
			pb.Publish(cnt, 0)
		}
	}()
	for cnt := uint64(1); cnt <= n; cnt++ {
		h, err := c.Next(5 * time.Second)
		if err != nil || h.HeapCnt != cnt {
			t.Fatalf("heap %d: %v (cnt %d)", cnt, err, h.HeapCnt)
		}
		c.Release(h)
	}
	if w := c.Wakes(); w > 2 {
		t.Errorf("the producer woke the consumer %d times for %d heaps of a moving stream", w, n)
	}
	start := time.Now()
	if _, err := c.Next(100 * time.Millisecond); err != ring.ErrTimeout {
		t.Fatalf("idle: %v, want ErrTimeout", err)
	}
	if d := time.Since(start); d < 95*time.Millisecond || d > time.Second {
		t.Errorf("idle wait lasted %v, want about 100 ms", d)
	}
}
