package ring_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/ringtest"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

func coalescingPair(t *testing.T, slots int, maxLatency time.Duration) (*ring.Producer, *ring.Consumer) {
	t.Helper()
	return ringtest.Pair(t, "wake", ring.Config{SlotCount: slots, HugePages: ring.HugePagesOff}, ring.AttachOptions{Timeout: time.Second, MaxLatency: maxLatency})
}

// With MaxLatency a moving stream's wakes are coalesced (spec §7.5): every heap arrives in order, and the
// producer is not asked for a wake per heap (the consumer's futex word barely moves). An idle stream
// sleeps until its next heap: a wait still times out on time.
//
// The bound is 50 ms, a hundred of the publisher's 0.5 ms steps: only a stall of the publisher that long
// makes the stream look idle (a wake per heap after it), so a loaded machine's late sleeps do not.
func TestCoalescedWakesWhileActive(t *testing.T) {
	p, c := coalescingPair(t, 64, 50*time.Millisecond)
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
	if w := c.Wakes(); w > 3 {
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

// A coalesced sleep does not hold heaps for its whole latency bound when they pile up: the producer wakes
// the consumer once half the ring waits, and after an idle spell the first heap wakes it at once. Both
// would otherwise take the 30 s bound.
func TestCoalescedWakeOnHalfRingAndAfterIdle(t *testing.T) {
	p, c := coalescingPair(t, 16, 30*time.Second)
	pb := pattern.Publisher{P: p, Size: 64}
	// Make the stream active: a heap found after a wait.
	published := make(chan struct{})
	go func() { time.Sleep(20 * time.Millisecond); pb.Publish(1, 0); close(published) }()
	h, err := c.Next(5 * time.Second)
	<-published
	if err != nil || h.HeapCnt != 1 {
		t.Fatalf("first heap: %v", err)
	}
	c.Release(h)
	// Now asleep asking to be woken at 8 heaps: 7 do not wake it, the 8th does.
	got := make(chan error, 1)
	go func() {
		h, err := c.Next(10 * time.Second)
		if err == nil && h.HeapCnt != 2 {
			err = fmt.Errorf("woke with heap %d, want 2", h.HeapCnt)
		}
		got <- err
	}()
	time.Sleep(20 * time.Millisecond)
	wakes := c.Wakes()
	for cnt := uint64(2); cnt <= 8; cnt++ {
		pb.Publish(cnt, 0)
	}
	select {
	case err := <-got:
		t.Fatalf("woken before half the ring waited (err %v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	pb.Publish(9, 0)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not woken when half the ring waited")
	}
	if c.Wakes() != wakes+1 {
		t.Errorf("wakes %d → %d, want one", wakes, c.Wakes())
	}
	for cnt := uint64(3); cnt <= 9; cnt++ {
		h, err := c.Next(time.Second)
		if err != nil || h.HeapCnt != cnt {
			t.Fatalf("heap %d: %v", cnt, err)
		}
		c.Release(h)
	}
}
