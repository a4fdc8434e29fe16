package transport

import (
	"context"
	"time"
)

// maxPaceDelay caps one pacing wait's arithmetic (not its interruptibility: a cancelled context ends any
// wait).
const maxPaceDelay = 24 * time.Hour

// maxPaceLag is how far behind its budget a paced sender may be before it gives the time up.
const maxPaceLag = 2 * time.Millisecond

// Pacer is a senders' token bucket on bytes: before each batch, Wait sleeps until the bytes already sent
// have had their time at the rate. It sleeps rather than spins (on a small host the receiver and its
// consumer need the cores); the budget makes up for a sleep's overshoot with a burst of at most one
// batch. A sender that fell behind (descheduled) does not catch up at full speed: that burst would
// overflow the receiver's buffers, so past maxPaceLag the budget restarts from now. Every HeapSender
// paces with it (udp, xdp).
type Pacer struct {
	bps   float64 // bits per second; 0: unpaced
	start time.Time
	timer *time.Timer
}

// NewPacer paces at bitsPerSecond (0: Wait never waits).
func NewPacer(bitsPerSecond float64) *Pacer { return &Pacer{bps: bitsPerSecond, start: time.Now()} }

// Wait sleeps until sent bytes (counted since NewPacer) are due, or ctx is done (its error). The drain of
// an interrupted stream (Draining) is not paced.
func (p *Pacer) Wait(ctx context.Context, sent uint64) error {
	if p.bps <= 0 || Draining(ctx) {
		return ctx.Err()
	}
	// In float seconds first: at a tiny rate the due time overflows a Duration.
	dueSecs := min(float64(sent)*8/p.bps, maxPaceDelay.Seconds())
	d := time.Duration(dueSecs*1e9) - time.Since(p.start)
	if d <= 0 {
		if -d > maxPaceLag {
			p.start = p.start.Add(-d - maxPaceLag)
		}
		return ctx.Err()
	}
	if p.timer == nil {
		p.timer = time.NewTimer(d)
	} else {
		p.timer.Reset(d)
	}
	select {
	case <-p.timer.C:
		return nil
	case <-ctx.Done():
		p.timer.Stop()
		return ctx.Err()
	}
}
