package main

// The socket transport of recv and send (--transport udp, the default), in package transport/udp.

import (
	"net/netip"

	"github.com/ibvbridge/ibvbridge/bridge"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/transport"
	"github.com/ibvbridge/ibvbridge/transport/udp"
)

var udpTransport = transportKind{name: "udp", send: openUDPHeapSender, recvCheck: checkUDPRecv, recv: openUDPRecv}

// checkUDPRecv checks recv's socket options: endpoints, --threads and --cpus.
func checkUDPRecv(o *recvOptions) error {
	if o.pcapFile != "" {
		return usageError("--pcap replays a file: it does not go with --transport udp")
	}
	if len(o.eps) == 0 {
		return usageError("no endpoints: give host:port or port (or --pcap FILE)")
	}
	var err error
	if o.cpuList, err = parseCPUs(o.cpus); err != nil {
		return err
	}
	if o.threads < 1 || o.threads > len(o.eps) {
		return usageError("--threads %d: want 1..%d (a thread owns whole endpoints; give more endpoints for more threads)", o.threads, len(o.eps))
	}
	return nil
}

// openUDPRecv opens recv's sockets.
func openUDPRecv(o *recvOptions, cfg *bridge.Config) (err error) {
	cfg.Source, err = udp.Open(udp.Config{Endpoints: o.eps, Interface: o.ifAddr, BufferSize: o.buffer,
		MaxPacketSize: o.maxPacket, GRO: o.gro, Threads: o.threads, CPUs: o.cpuList, Coalesce: o.coalesce.Max, CoalesceHeaps: o.coalesce.Heaps, Log: cfg.Log})
	return err
}

// openUDPHeapSender opens send's socket sender to e, paced at its share of --rate.
func openUDPHeapSender(o *sendOptions, e transport.Endpoint, enc *spead.Encoder) (transport.HeapSender, error) {
	return udp.OpenHeapSender(udp.HeapSenderConfig{Encoder: enc, Batch: o.batch, Rate: o.rate * 1e9 / float64(len(o.eps)), GSO: o.gso,
		SenderConfig: udp.SenderConfig{Dest: netip.AddrPortFrom(e.Addr, e.Port), Interface: o.ifAddr, TTL: o.ttl}})
}
