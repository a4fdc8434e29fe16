package transport

import (
	"context"
	"time"

	"github.com/ibvbridge/ibvbridge/spead"
)

// drainTimeout bounds how long an interrupted stream still takes to send its stop heap and what was
// queued: a receiver then sees the stream end instead of waiting for heaps that never come.
const drainTimeout = time.Second

// SendStream sends heaps 1..n (heap(cnt) builds each; it may reuse one Heap) and then, if stop, a
// stream-stop heap with cnt n+1, and waits until everything has left. A cancelled ctx ends the data heaps
// early; the stop heap and the queue still go out, within drainTimeout. It returns the data heaps sent.
func SendStream(ctx context.Context, hs HeapSender, n uint64, heap func(cnt uint64) *spead.Heap, stop bool) (uint64, error) {
	var sent uint64
	for cnt := uint64(1); cnt <= n && ctx.Err() == nil; cnt++ {
		if err := hs.SendHeap(ctx, heap(cnt)); err != nil {
			if ctx.Err() != nil {
				break // interrupted while pacing or waiting for the NIC: not an error of the stream
			}
			return sent, err
		}
		sent++
	}
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), drainTimeout)
		defer cancel()
	}
	if stop {
		h := spead.StreamStopHeap(n + 1)
		if err := hs.SendHeap(ctx, &h); err != nil {
			return sent, err
		}
	}
	return sent, hs.Flush(ctx)
}
