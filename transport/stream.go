package transport

import (
	"context"
	"time"

	"github.com/ibvbridge/ibvbridge/spead"
)

// drainTimeout bounds how long an interrupted stream still takes to send its stop heap and what was
// queued: a receiver then sees the stream end instead of waiting for heaps that never come.
const drainTimeout = time.Second

// DrainContext is ctx while it is live; once it is done, a context with ctx's values that lasts
// drainTimeout: an interrupted sender still drains what it has queued, briefly (the frames are built, and
// the heaps they finish should arrive whole). Call the cancel func when done.
func DrainContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Err() == nil {
		return ctx, func() {}
	}
	return context.WithTimeout(context.WithoutCancel(ctx), drainTimeout)
}

// spreadStopGrace is how long a stream spread over several destinations waits, once every lane has
// flushed, before its stop heap: a receiver reading the destinations on several threads takes the last
// packets of each before the stop heap, arriving on one of them, ends the stream. 20 ms was too short for a
// receive thread descheduled on a loaded 2-core host (TestSendSpreadThreads saw packets after the stop).
const spreadStopGrace = 100 * time.Millisecond

// drainingKey marks the context of an interrupted stream's drain (Draining).
type drainingKey struct{}

// Draining reports whether ctx is the drain of an interrupted stream: what was queued and the stop heap
// go out without pacing (at a rate of 1e-12 b/s the next batch is due in centuries; the user asked to
// stop, and a queue of one batch is a burst the receiver takes).
func Draining(ctx context.Context) bool { return ctx.Value(drainingKey{}) != nil }

// SendStream sends heaps 1..n (heap(cnt) builds each; it may reuse one Heap) and then, if stop, a
// stream-stop heap with cnt n+1, and waits until everything has left. A cancelled ctx ends the data heaps
// early; the stop heap and the queue still go out, within drainTimeout. It returns the data heaps sent.
func SendStream(ctx context.Context, hs HeapSender, n uint64, heap func(cnt uint64) *spead.Heap, stop bool) (uint64, error) {
	return SendSpread(ctx, []Lane{{Dests: []int{0}, Senders: []HeapSender{hs}, Heap: heap}}, 1, n, stop)
}

// Lane is one sending goroutine of a spread stream (SendSpread): the destinations it serves, a sender
// for each, and its own heap builder (a builder may reuse one Heap, so lanes do not share one).
type Lane struct {
	Dests   []int        // indexes of the destinations this lane serves
	Senders []HeapSender // Senders[i] sends to destination Dests[i], paced at its share of the rate
	Heap    func(cnt uint64) *spead.Heap
}

// SendSpread sends heaps 1..n spread over numDests destinations as spead2_send spreads a stream over
// several: heap cnt k goes to destination (k−1) mod numDests, sent by the lane that serves it, the lanes
// running at once (each destination is served by exactly one lane). Once every lane has sent and flushed
// its share (and, with several destinations, spreadStopGrace later), a stream-stop heap (cnt n+1), if
// stop, goes to destination 0. A cancelled ctx ends the data
// heaps early; the stop heap still goes out within drainTimeout. It returns the data heaps sent.
func SendSpread(ctx context.Context, lanes []Lane, numDests int, n uint64, stop bool) (uint64, error) {
	type result struct {
		sent uint64
		err  error
	}
	results := make(chan result, len(lanes))
	var stopSender HeapSender
	for _, l := range lanes {
		byDest := make(map[int]HeapSender, len(l.Dests))
		for i, d := range l.Dests {
			byDest[d] = l.Senders[i]
			if d == 0 {
				stopSender = l.Senders[i]
			}
		}
		go func() {
			var r result
			for cnt := uint64(1); cnt <= n && ctx.Err() == nil && r.err == nil; cnt++ {
				hs, mine := byDest[int((cnt-1)%uint64(numDests))]
				if !mine {
					continue
				}
				if err := hs.SendHeap(ctx, l.Heap(cnt)); err != nil {
					if ctx.Err() == nil {
						r.err = err
					}
					break
				}
				r.sent++
			}
			for _, hs := range l.Senders {
				if err := hs.Flush(ctx); err != nil && r.err == nil && ctx.Err() == nil {
					r.err = err
				}
			}
			results <- r
		}()
	}
	var sent uint64
	var firstErr error
	for range lanes {
		r := <-results
		sent += r.sent
		if r.err != nil && firstErr == nil {
			firstErr = r.err
		}
	}
	if firstErr != nil {
		return sent, firstErr
	}
	if !stop || stopSender == nil {
		return sent, nil
	}
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithValue(context.Background(), drainingKey{}, true), drainTimeout)
		defer cancel()
		for _, l := range lanes { // what each lane left queued goes out first, unpaced
			for _, hs := range l.Senders {
				if err := hs.Flush(ctx); err != nil {
					return sent, err
				}
			}
		}
	}
	if numDests > 1 {
		select {
		case <-time.After(spreadStopGrace):
		case <-ctx.Done():
		}
	}
	h := spead.StreamStopHeap(n + 1)
	if err := stopSender.SendHeap(ctx, &h); err != nil {
		return sent, err
	}
	return sent, stopSender.Flush(ctx)
}
