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
	return &HeapSender{s: s, enc: enc, start: time.Now()}, nil
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
	if err := hs.enc.Reset(h); err != nil {
		return err
	}
	for hs.enc.More() {
		buf, err := hs.s.Buffer(ctx)
		if err != nil {
			return err
		}
		n, err := hs.enc.Next(buf)
		if err != nil {
			hs.s.Discard()
			return err
		}
		if err := hs.s.CommitTo(ctx, ep, n); err != nil {
			return err
		}
	}
	return nil
}

// Flush implements transport.HeapSender: it posts what is queued and waits until the NIC has sent every
// frame. An interrupted send (ctx already done) still drains what is queued, briefly (transport.DrainContext): the
// frames are built, and the heaps they finish should arrive whole.
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
