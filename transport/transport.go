// Package transport owns the seams between packet I/O and the rest of ibvbridge: the Source/Sink pair every
// packet source (UDP sockets, pcap replay, AF_XDP, ibverbs) feeds the heap assembler through, the
// HeapSender every sender implements, and the Endpoint a stream arrives at. Data flows one way: a Source
// pushes SPEAD packets into a Sink. The implementations live in the subpackages udp, pcap, xdp and ibv.
package transport

import (
	"context"
	"time"

	"github.com/ibvbridge/ibvbridge/spead"
)

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

// Counted is a Source that counts what it did. Counters may be called from any goroutine while Run runs;
// the names are stable (they appear in recv's JSON result under "transport_counters").
type Counted interface {
	Counters() map[string]uint64
}

// Placer is a Sink that can say where the next packets' payloads belong, so that a source reads each
// payload straight into place (the heap assembler: into its ring slot) instead of into a buffer it is then
// copied from. One goroutine calls it, as any Sink.
type Placer interface {
	Sink
	// Place fills dst with up to len(dst) regions where the next datagrams' payloads are expected, in
	// arrival order, each datagram assumed to start with a hdrLen-byte header. n == 0: no guess.
	Place(dst [][]byte) (hdrLen, n int)
	// Fits reports, changing nothing, whether a datagram read in two pieces — its first len(hdr) bytes in
	// hdr, its other payloadLen bytes at the start of region (one Place returned) — is the packet
	// expected there. A source copies out every datagram of a read that does not fit before it hands
	// any of them over: taking one may move bytes into a region another still occupies.
	Fits(hdr, region []byte, payloadLen int) bool
	// Placed takes a datagram that Fits approved, without copying its payload. (One that does not fit is
	// joined back and taken as Packet would; it reports false then.)
	Placed(hdr, region []byte, payloadLen int, recvNanos int64) bool
}

// Batcher is a Sink that makes what a source hands it between BeginBatch and EndBatch visible at
// EndBatch: the heap assembler then publishes a batch's heaps with one ring-cursor store and one consumer
// wake instead of one per heap. A source brackets each receive batch with them (never around a wait
// with anything handed over: a batch may open with the read that waits for its first datagram); one that
// has no batches never calls them.
type Batcher interface {
	Sink
	BeginBatch()
	EndBatch()
}

// Absorber is a Sink with bounded room (the heap assembler: the ring's free slots). A source that lets
// the stream pile up in the kernel before it reads (udp.Config.Coalesce) asks it how long it may: the
// answer is at most max, less when what arrives meanwhile would not fit, 0 when it cannot tell yet.
type Absorber interface {
	Sink
	Absorbs(max time.Duration) time.Duration
}

// Awaiter is a Sink that can tell how long until what it assembles is complete: the heap in assembly
// (the heap assembler: the heap the latest packet joined, or its chunk), at the rate its bytes arrived so
// far (a chunk: as long as the chunks before it took); ok false when nothing is in assembly or its size is
// unknown. A source that coalesces reads sleeps no longer than that (udp.Config.CoalesceHeaps), so a sleep
// never postpones a heap's completion.
type Awaiter interface {
	Sink
	Awaits(nowNanos int64) (left time.Duration, ok bool)
}

// ThreadCounted is a Source that receives on several threads and counts each one's share (metrics label
// them by thread). Safe from any goroutine.
type ThreadCounted interface {
	ThreadCounters() []map[string]uint64
}

// AreaSource is a kernel-bypass source whose frames land in memory the ring provides: the NIC (ibverbs)
// or the kernel (AF_XDP's UMEM) writes them into the ring's packet area, so no buffer of ours sits between
// the wire and the assembler. A receiver sizes the ring's packet area with AreaSize before it creates the
// ring, then opens the source on that area. The area must outlive the source.
type AreaSource interface {
	AreaSize() int
	Open(area []byte) (Source, error)
}

// HeapSender sends SPEAD heaps: packetizes each heap and puts the packets on the wire, paced to its
// configured rate. It is for one goroutine.
type HeapSender interface {
	// SendHeap packetizes h and queues or sends its packets; h may be reused once it returns.
	SendHeap(ctx context.Context, h *spead.Heap) error
	// Flush sends what is queued and returns once it has left.
	Flush(ctx context.Context) error
	// Totals counts what left since the sender was opened.
	Totals() SendTotals
	Close() error
}

// SendTotals is what a HeapSender sent.
type SendTotals struct {
	Packets uint64
	Bytes   uint64    // UDP payload bytes
	Start   time.Time // when the sender was opened: rates are measured from here
}
