package bench

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/internal/testutil"
	"github.com/ibvbridge/ibvbridge/transport"
	"github.com/ibvbridge/ibvbridge/transport/udp"
)

// sendStampedIntoGRO sends sh with sendStamped into a loopback socket with UDP_GRO on and returns the
// datagrams received and how many of them arrived inside a multi-datagram message. On loopback a GSO
// message stays whole up to a GRO socket, so a heap that left in a batch with the next (one sendmmsg of
// same-sized one-packet heaps is one GSO run) arrives coalesced, and one that left alone does not.
func sendStampedIntoGRO(t *testing.T, sh PyShape) (sent, packets, coalesced uint64) {
	t.Helper()
	src, err := udp.Open(udp.Config{Endpoints: []transport.Endpoint{{Addr: netip.MustParseAddr("127.0.0.1")}},
		GRO: true, BufferSize: 32 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, testutil.NewRecordingSink(false)) }()
	defer func() { cancel(); <-done }()
	ep := src.LocalEndpoints()[0]
	st, err := sendStamped(context.Background(), netip.AddrPortFrom(ep.Addr, ep.Port).String(), sh)
	if err != nil {
		t.Fatal(err)
	}
	sent = st.Heaps
	want := sent + 2 // with the descriptor heap and the stream stop, one packet each
	testutil.WaitFor(5*time.Second, func() bool { return src.Stats().Packets >= want })
	got := src.Stats()
	if got.Packets != want || got.Bytes != st.Bytes {
		t.Fatalf("%d of %d datagrams, %d of %d bytes arrived", got.Packets, want, got.Bytes, st.Bytes)
	}
	return sent, got.Packets, got.Coalesced
}

// TestStampedSenderBatchesOnlyWhenBehind: the latency benchmark's sender sends each heap alone while it
// keeps its schedule (a heap is never held back for the next), and in batches once it cannot keep it
// (small heaps at a rate one sendmsg per heap cannot reach), as a NIC's interrupt moderation hands them over.
func TestStampedSenderBatchesOnlyWhenBehind(t *testing.T) {
	// 1 KiB heaps at 40 Gb/s: 4.9 M heaps/s, far past one send per heap.
	sent, packets, coalesced := sendStampedIntoGRO(t, PyShape{HeapSize: 1 << 10, PacketSize: 8972, RateGbps: 40, Seconds: 0.004})
	t.Logf("behind: %d heaps sent, %d of %d datagrams arrived in batches", sent, coalesced, packets)
	if coalesced < packets/2 {
		t.Errorf("behind its schedule, %d of %d datagrams arrived in batches, want most", coalesced, packets)
	}
	// 1 KiB heaps at 0.05 Gb/s: 6.1 k heaps/s, a heap every 164 µs. A sender descheduled past two heaps'
	// times may batch those, so a few may come coalesced on a loaded machine; not one in ten.
	sent, packets, coalesced = sendStampedIntoGRO(t, PyShape{HeapSize: 1 << 10, PacketSize: 8972, RateGbps: 0.05, Seconds: 0.1})
	t.Logf("on schedule: %d heaps sent, %d of %d datagrams arrived in batches", sent, coalesced, packets)
	if coalesced > packets/10 {
		t.Errorf("on its schedule, %d of %d datagrams arrived in batches, want each heap alone", coalesced, packets)
	}
}

// TestStampedSenderInBurstsBatchesOnceLate: the highest-rate search's sender (Bursts) batches a heap as
// soon as it is late, where the default sender batches only once it is a batch of heaps behind.
func TestStampedSenderInBurstsBatchesOnceLate(t *testing.T) {
	const period = 10 * time.Microsecond
	for _, tc := range []struct {
		late         time.Duration
		bursts, want bool
	}{
		{-period, false, true}, {-period, true, true}, // on schedule: alone either way
		{0, false, true}, {0, true, true},
		{period, false, true}, {period, true, false}, // a heap late
		{stampedBatch*period - 1, false, true}, {stampedBatch * period, false, false}, // a batch behind
	} {
		if got := leavesAlone(tc.late, period, tc.bursts); got != tc.want {
			t.Errorf("late %v, bursts %v: leaves alone %v, want %v", tc.late, tc.bursts, got, tc.want)
		}
	}
}
