package main

import (
	"context"

	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/transport"
	"github.com/ibvbridge/ibvbridge/verbs"
)

// Temporary: adapts today's ibvSource to transport.AreaSource until transport/ibv lands.
type recvSource interface {
	transport.Source
	counters() map[string]uint64
}

func (s *ibvSource) AreaSize() int                           { return s.packetAreaSize() }
func (s *ibvSource) Open(a []byte) (transport.Source, error) { return s.open(a) }
func (s *ibvSource) Counters() map[string]uint64             { return s.counters() }

type ibvHeapSenderAdapter struct{ h *ibvHeapSender }

func newIBVHeapSenderTmp(cfg verbs.SendConfig, enc *spead.Encoder) (transport.HeapSender, error) {
	h, err := newIBVHeapSender(context.Background(), cfg, enc)
	if err != nil {
		return nil, err
	}
	return ibvHeapSenderAdapter{h}, nil
}
func (a ibvHeapSenderAdapter) SendHeap(ctx context.Context, h *spead.Heap) error {
	return a.h.s.SendHeap(ctx, a.h.enc, h, 0)
}
func (a ibvHeapSenderAdapter) Flush(ctx context.Context) error { return a.h.s.Flush(ctx) }
func (a ibvHeapSenderAdapter) Totals() transport.SendTotals {
	p, b, s := a.h.totals()
	return transport.SendTotals{Packets: p, Bytes: b, Start: s}
}
func (a ibvHeapSenderAdapter) Close() error { return a.h.close() }
