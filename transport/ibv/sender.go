package ibv

import (
	"context"
	"fmt"
	"time"

	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/transport"
	"github.com/ibvbridge/ibvbridge/verbs"
)

// HeapSender is the ibverbs send transport: it packetizes SPEAD heaps straight into a verbs.Sender's
// registered frame buffers, which are posted in batches. It is for one goroutine.
type HeapSender struct {
	s     *verbs.Sender
	q     laneQueue
	enc   *spead.Encoder
	start time.Time
}

// OpenHeapSender opens the device sender for cfg (verbs.OpenSender) and packetizes with enc, whose
// packets must fit cfg.MaxPacketSize (checked before any device is touched).
func OpenHeapSender(cfg verbs.SendConfig, enc *spead.Encoder) (*HeapSender, error) {
	if err := checkEncoder(enc, cfg.MaxPacketSize); err != nil {
		return nil, err
	}
	s, err := verbs.OpenSender(cfg)
	if err != nil {
		return nil, err
	}
	return newHeapSender(s, enc)
}

// newHeapSender packetizes with enc into s (the device's, or one over a fake queue in tests).
func newHeapSender(s *verbs.Sender, enc *spead.Encoder) (*HeapSender, error) {
	if err := checkEncoder(enc, s.MaxPacketSize()); err != nil {
		return nil, err
	}
	return &HeapSender{s: s, q: laneQueue{s: s}, enc: enc, start: time.Now()}, nil
}

func checkEncoder(enc *spead.Encoder, maxPacketSize int) error {
	if enc.MaxPacketSize() > maxPacketSize {
		return fmt.Errorf("ibverbs: encoder packets of %d bytes exceed the max packet size %d", enc.MaxPacketSize(), maxPacketSize)
	}
	return nil
}

// SendHeap implements transport.HeapSender: it sends h to the first endpoint.
func (hs *HeapSender) SendHeap(ctx context.Context, h *spead.Heap) error {
	return hs.SendHeapTo(ctx, h, 0)
}

// SendHeapTo packetizes h into frame buffers for endpoint ep (an index into SendConfig.Endpoints) and
// queues them. Frames are posted in batches: Flush sends the rest.
func (hs *HeapSender) SendHeapTo(ctx context.Context, h *spead.Heap, ep int) error {
	hs.q.ep = ep
	return transport.Packetize(ctx, hs.enc, h, &hs.q)
}

// laneQueue is the device sender as a transport.FrameQueue whose frames go to one endpoint.
type laneQueue struct {
	s  *verbs.Sender
	ep int
}

func (q *laneQueue) Buffer(ctx context.Context) ([]byte, error) { return q.s.Buffer(ctx) }
func (q *laneQueue) Commit(ctx context.Context, n int) error    { return q.s.CommitTo(ctx, q.ep, n) }
func (q *laneQueue) Discard()                                   { q.s.Discard() }

// Flush implements transport.HeapSender: it posts what is queued and waits until the NIC has sent every
// frame. An interrupted send (ctx already done) still drains what is queued, briefly
// (transport.DrainContext): the frames are built, and the heaps they finish should arrive whole.
func (hs *HeapSender) Flush(ctx context.Context) error {
	ctx, cancel := transport.DrainContext(ctx)
	defer cancel()
	return hs.s.Flush(ctx)
}

// Totals implements transport.HeapSender.
func (hs *HeapSender) Totals() transport.SendTotals {
	st := hs.s.Stats()
	return transport.SendTotals{Packets: st.Packets, Bytes: st.Bytes, Start: hs.start}
}

// Close releases the device sender. Flush first to send what is queued.
func (hs *HeapSender) Close() error { return hs.s.Close() }

var _ transport.HeapSender = (*HeapSender)(nil)
