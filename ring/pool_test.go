package ring_test

import (
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/ringtest"
)

// The pool is a LIFO: of the slots a consumer releases together, the one released last is filled next.
func TestMostRecentlyReleasedSlotIsReusedFirst(t *testing.T) {
	cfg := testConfig(t) // 8 slots
	p := ringtest.New(t, "lifo", cfg)
	c := ringtest.Attach(t, "lifo", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	for cnt := uint64(1); cnt <= 8; cnt++ { // every slot published: the pool is empty
		publish(t, p, cnt, 64)
	}
	var last ring.Heap
	for range 3 {
		h, err := c.Next(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		last = h
	}
	c.Release(last) // releases heaps 1, 2 and 3; heap 3's slot last
	s, err := p.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	if s.Index != last.Slot {
		t.Fatalf("acquired slot %d, want %d (heap 3's, the slot released last)", s.Index, last.Slot)
	}
	p.Discard(s)
	if ahead := p.TryAcquire(); ahead == nil || ahead.Index != last.Slot {
		t.Fatalf("slot taken ahead %+v, want slot %d (the one just discarded)", ahead, last.Slot)
	}
}

// A consumer that keeps up keeps the producer within a few slots whatever the ring's size: the working
// set the kernel copies into stays in cache.
func TestKeptUpConsumerKeepsWorkingSetSmallInLargeRing(t *testing.T) {
	cfg := testConfig(t)
	cfg.SlotCount = 1024
	p := ringtest.New(t, "hot", cfg)
	c := ringtest.Attach(t, "hot", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	used := map[uint32]bool{}
	for cnt := uint64(1); cnt <= 4096; cnt++ {
		publish(t, p, cnt, 64)
		h, err := c.Next(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		checkHeap(t, h, cnt, 64)
		used[h.Slot] = true
		c.Release(h)
	}
	// The consumer stores its cursor every 64 releases (a 1024-slot ring's release batch, spec §7.4) and
	// the producer looks for released slots every 64 takes (4 KiB slots: 256 KiB): at most 64 + 64 + 1
	// in use.
	if len(used) > 129 {
		t.Fatalf("4096 heaps used %d of 1024 slots, want at most 129", len(used))
	}
}
