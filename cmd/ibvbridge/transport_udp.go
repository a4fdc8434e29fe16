package main

// The socket transport of recv and send (--transport udp, the default), in package transport/udp.

import (
	"net/netip"

	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/transport"
	"github.com/ibvbridge/ibvbridge/transport/udp"
)

var udpTransport = transportKind{name: "udp", send: openUDPHeapSender}

// openUDPHeapSender opens send's socket sender to e, paced at its share of --rate.
func openUDPHeapSender(o *sendOptions, e transport.Endpoint, enc *spead.Encoder) (transport.HeapSender, error) {
	return udp.OpenHeapSender(udp.HeapSenderConfig{Encoder: enc, Batch: o.batch, Rate: o.rate * 1e9 / float64(len(o.eps)), GSO: o.gso,
		SenderConfig: udp.SenderConfig{Dest: netip.AddrPortFrom(e.Addr, e.Port), Interface: o.ifAddr, TTL: o.ttl}})
}
