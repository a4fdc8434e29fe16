// Package transport defines the one small interface every packet source (UDP sockets, pcap replay, AF_XDP,
// ibverbs) uses to feed the heap assembler. Data flows one way: a Source pushes SPEAD packets into a Sink.
package transport

import "context"

// Sink consumes SPEAD packets: the UDP payloads, without any Ethernet/IP/UDP header. The heap assembler
// implements it. A Sink is not safe for concurrent use: one Source goroutine feeds it.
type Sink interface {
	// Packet hands over one UDP payload received at recvNanos (CLOCK_REALTIME, ns). The slice is only
	// valid during the call: the source reuses its buffer, so the sink copies what it keeps.
	Packet(payload []byte, recvNanos int64)
}

// Source delivers packets to a Sink until ctx is cancelled, the input ends (a pcap file's end), or an
// error occurs. Run returns nil at the input's natural end and ctx.Err() when cancelled.
type Source interface {
	Run(ctx context.Context, sink Sink) error
	// Close releases the source's sockets, maps and programs; it is safe to call more than once.
	Close() error
}
