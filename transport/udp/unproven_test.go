package udp

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ibvbridge/ibvbridge/internal/testutil"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/assemble"
	"github.com/ibvbridge/ibvbridge/spead/speadtest"
	"github.com/ibvbridge/ibvbridge/transport"
)

// gatedAwaiter is a heap assembler whose first batch waits for open (so the test can queue datagrams
// while the source is inside its read loop) and which always says a heap is in assembly for another
// millisecond, so every drain that empties the socket is followed by a sleep.
type gatedAwaiter struct {
	*assemble.Assembler
	open    chan struct{}
	batches atomic.Uint64
}

func (g *gatedAwaiter) EndBatch() {
	g.Assembler.EndBatch()
	if g.batches.Add(1) == 1 {
		<-g.open
	}
}

func (g *gatedAwaiter) Awaits(int64) (time.Duration, bool) { return time.Millisecond, true }

// Absorbs sets no bound of the ring's: its heap rate is unknown this early, which would forbid a sleep.
func (g *gatedAwaiter) Absorbs(max time.Duration) time.Duration { return max }

var _ interface {
	transport.Placer
	transport.Batcher
	transport.Awaiter
	transport.Absorber
} = (*gatedAwaiter)(nil)

// A read of one GRO message with room for another datagram guesses the socket empty rather than reading
// again to find nothing (a syscall per wake on a stream of bursts). A guess must not be slept on: with
// datagrams queued behind such a message, the coalescing source looks once more before each sleep, and
// never sleeps while its socket holds a datagram.
func TestCoalescedSleepNeverLeavesADatagramInTheSocket(t *testing.T) {
	src := loopback(t, 1, Config{GRO: true, Coalesce: time.Millisecond, CoalesceHeaps: true})
	fd := src.socks[0].fd
	var slept, sleptOnData atomic.Uint64
	coalesceSleep = func(d time.Duration) {
		slept.Add(1)
		if n, err := unix.IoctlGetInt(fd, unix.SIOCINQ); err == nil && n > 0 {
			sleptOnData.Add(1)
		}
		sleepRaw(d)
	}
	t.Cleanup(func() { coalesceSleep = sleepRaw })

	p, err := ring.Create(testutil.UniqueRing(t, "unproven"), ring.Config{Dir: t.TempDir(), SlotCount: 16, SlotSize: 64 << 10,
		HugePages: ring.HugePagesOff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	sink := &gatedAwaiter{Assembler: a, open: make(chan struct{})}
	ep := src.LocalEndpoints()[0]
	s, err := NewSender(SenderConfig{Dest: netip.AddrPortFrom(ep.Addr, ep.Port)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	// A one-packet heap opens the gate's batch; then a heap of 8 packets in 4 GSO messages of 2 datagrams.
	first := speadtest.EncodeAll(t, spead.Flavour64_40, 1500, &spead.Heap{Cnt: 1, Items: []spead.Item{{ID: 0x1000, Data: make([]byte, 100)}}})
	pkts := speadtest.EncodeAll(t, spead.Flavour64_40, 1500, &spead.Heap{Cnt: 2, Items: []spead.Item{{ID: 0x1000, Data: make([]byte, 8*1400)}}})
	if len(pkts) < 8 {
		t.Fatalf("the heap is %d packets, want at least 8", len(pkts))
	}
	stop := run(t, src, sink)
	defer stop()
	if err := s.Send(first); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(5*time.Second, func() bool { return sink.batches.Load() > 0 }) // the source waits in the gate
	var runs [][][]byte
	for i := 0; i < len(pkts); i += 2 {
		runs = append(runs, pkts[i:min(i+2, len(pkts))])
	}
	if err := s.SendRuns(runs); err != nil {
		t.Fatal(err)
	}
	close(sink.open)
	want := uint64(1 + len(pkts))
	testutil.WaitFor(5*time.Second, func() bool { return src.Stats().Packets >= want && slept.Load() > 0 })
	time.Sleep(20 * time.Millisecond) // any sleep still to come comes now
	st := src.Stats()
	t.Logf("%d datagrams, %d in GRO messages, %d placed; %d sleeps", st.Packets, st.Coalesced, st.Placed, slept.Load())
	if st.Packets != want || st.Coalesced == 0 || st.Placed == 0 || slept.Load() == 0 {
		t.Fatalf("%d of %d datagrams, %d coalesced, %d placed: want all, read as GRO messages into place, "+
			"and a sleep after", st.Packets, want, st.Coalesced, st.Placed)
	}
	if n := sleptOnData.Load(); n > 0 {
		t.Errorf("%d of %d coalesced sleeps began with datagrams in the socket", n, slept.Load())
	}
}
