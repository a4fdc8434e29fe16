package ring

import "time"

// absorbIdle is the longest gap between two Absorbs calls that still measures the stream's rate: a
// longer one spans an idle spell, and the next burst may come at any rate.
const absorbIdle = 100 * time.Millisecond

// Absorbs bounds a coalesced wait: a source that lets the stream pile up in the kernel and then reads it
// in one drain, published as one batch (udp.Config.Coalesce). It returns max, or less when the stream, at
// the rate positions were published lately, would bring more heaps than half the slots free now: a
// batch becomes visible only at its end, so the ring must hold a whole drain's heaps before a consumer
// can release any, and a small ring at a high heap rate needs short waits or it drops heaps. It returns 0
// while the rate is unknown (the first call, and the first after an idle spell): the next burst's rate
// is anyone's guess. With nobody attached under the drop policy the ring makes room by dropping its
// oldest heaps, which nobody reads: max. Hot path only.
func (p *Producer) Absorbs(max time.Duration) time.Duration {
	return p.absorbsAt(time.Now(), max)
}

func (p *Producer) absorbsAt(now time.Time, max time.Duration) time.Duration {
	r, known := p.absorbRate.Observe(now, p.pos, absorbIdle)
	if !known {
		return 0
	}
	room := p.room()
	if room < 0 || r <= 0 {
		return max
	}
	return min(max, time.Duration(float64(room)/2/r*float64(time.Second)))
}

// room is how many positions could take a slot now: the free pool after a reclaim (skipped when the
// server goroutine holds the lock: the pool as it is, which can only understate), within the window
// (spec §14). -1: unbounded (nobody attached, drop policy). Hot path only.
func (p *Producer) room() int {
	if s := p.snap.Load(); (s == nil || len(s.members) == 0) && p.cfg.Policy == PolicyDrop {
		return -1
	}
	if p.mu.TryLock() {
		p.reclaimLocked()
		p.mu.Unlock()
	}
	n := len(p.free)
	if w := int64(p.windowEnd - p.pos - p.inflight); w < int64(n) {
		n = max(0, int(w))
	}
	return n
}
