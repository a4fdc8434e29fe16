package main

import "github.com/ibvbridge/ibvbridge/transport"

// Temporary: adapts today's ibvSource to transport.AreaSource until transport/ibv lands.
type recvSource interface {
	transport.Source
	counters() map[string]uint64
}

func (s *ibvSource) AreaSize() int                           { return s.packetAreaSize() }
func (s *ibvSource) Open(a []byte) (transport.Source, error) { return s.open(a) }
func (s *ibvSource) Counters() map[string]uint64             { return s.counters() }
