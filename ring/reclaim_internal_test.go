package ring

import (
	"testing"
	"time"
)

// reclaimWithin runs reclaimLocked under mu and reports whether it returned within d (a reclaim that walks
// from reclaim to scan the long way round, 2^64 positions, never does; its goroutine is left spinning).
func reclaimWithin(p *Producer, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		p.mu.Lock()
		p.reclaimLocked()
		p.mu.Unlock()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// With nobody attached under drop, a ring whose every position's slot is free and whose window is full
// (a settle freed them while a slot was taken ahead) reclaims up to pos, and scan follows it: reclaim
// never stays ahead of scan. Reclaim then takes no time, even with every slot free (the hot path reclaims
// between taking a slot and writing its descriptor). The loops walking from reclaim to scan stop at
// scan: before, scan stayed behind a reclaim that reached pos, and the next walk from reclaim "to scan"
// went round 2^64 positions under the lock, hanging the producer.
func TestReclaimNeverLeavesReclaimAheadOfScan(t *testing.T) {
	p, err := Create("reclaimscan", Config{Dir: t.TempDir(), HugePages: HugePagesOff, SlotCount: 4, SlotSize: 4096,
		Policy: PolicyDrop})
	if err != nil {
		t.Fatal(err)
	}
	// Closed only when every reclaim returned: a hung one holds the lock Close takes.
	p.mu.Lock()
	// Positions 0 … 5 published and their slots already free (as a settle leaves them), none attached,
	// and a window computed before that: full.
	p.pos, p.committed = 6, 6
	p.head.Store(6)
	p.reclaim, p.scan = 2, 2
	for i := range p.posSlot {
		p.posSlot[i] = noSlot
	}
	p.windowEnd = 6
	p.mu.Unlock()
	if !reclaimWithin(p, 2*time.Second) {
		t.Fatal("reclaim with every position free did not return")
	}
	p.mu.Lock()
	reclaim, scan := p.reclaim, p.scan
	p.mu.Unlock()
	if reclaim != 6 || scan != 6 {
		p.Close()
		t.Fatalf("after reclaiming up to pos 6: reclaim %d, scan %d; want both at 6", reclaim, scan)
	}
	// Reclaim ahead of scan (what the strict comparison left behind) must not send a walk round 2^64.
	p.mu.Lock()
	p.scan = 4
	p.mu.Unlock()
	if !reclaimWithin(p, 2*time.Second) {
		t.Fatal("reclaim with reclaim ahead of scan and every slot free did not return")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}
