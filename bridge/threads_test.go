package bridge

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
	"github.com/ibvbridge/ibvbridge/transport"
	"github.com/ibvbridge/ibvbridge/transport/udp"
)

// openLoopbackSource opens a UDP source on endpoints loopback ports, received by threads threads.
func openLoopbackSource(t *testing.T, endpoints, threads int) *udp.Source {
	t.Helper()
	var eps []transport.Endpoint
	for range endpoints {
		eps = append(eps, transport.Endpoint{Addr: netip.MustParseAddr("127.0.0.1")})
	}
	src, err := udp.Open(udp.Config{Endpoints: eps, Threads: threads, GRO: true})
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// sendSpread sends heaps 1..heaps of g, heap k to senders[k mod len(senders)], flushes them and gives
// the last datagrams time to reach the sockets.
func sendSpread(t *testing.T, ctx context.Context, senders []*udp.HeapSender, g *pattern.HeapGen, heaps uint64) {
	t.Helper()
	for cnt := uint64(1); cnt <= heaps; cnt++ {
		if err := senders[cnt%uint64(len(senders))].SendHeap(ctx, g.Heap(cnt)); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range senders {
		if err := s.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond) // the last datagrams reach the sockets
}

// A stream spread over four endpoints (heap k to endpoint k mod 4, as spead2_send's substreams) received
// with 1..4 threads comes out whole: every heap exactly once, every byte of its pattern intact.
func TestThreadsSpreadStream(t *testing.T) {
	const endpoints, heaps, size = 4, 400, 20000
	for threads := 1; threads <= endpoints; threads++ {
		t.Run(fmt.Sprintf("threads=%d", threads), func(t *testing.T) {
			src := openLoopbackSource(t, endpoints, threads)
			cfg := testConfig(t, src)
			cfg.RingCfg.SlotCount, cfg.RingCfg.SlotSize = 512, 32<<10
			cfg.Assembler.MaxHeaps = 16 // heaps of four substreams are in flight at once
			r, c := openWithConsumer(t, cfg)
			waitDrained := drainInBackground(c)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan Result, 1)
			go func() { res, _ := r.Run(ctx); done <- res }()
			local := src.LocalEndpoints()
			enc, _ := spead.NewEncoder(spead.Flavour64_40, 8972)
			senders := make([]*udp.HeapSender, endpoints)
			var err error
			for i := range senders {
				if senders[i], err = udp.OpenHeapSender(udp.HeapSenderConfig{Encoder: enc, GSO: true, Rate: 0.4e9,
					SenderConfig: udp.SenderConfig{Dest: netip.AddrPortFrom(local[i].Addr, local[i].Port)}}); err != nil {
					t.Fatal(err)
				}
				defer senders[i].Close()
			}
			g, err := pattern.NewHeapGen(spead.Flavour64_40, size, 1, true, false)
			if err != nil {
				t.Fatal(err)
			}
			sendSpread(t, ctx, senders, g, heaps)
			cancel()
			res := <-done
			if res.Outcome != OutcomeInterrupted || res.TransportCounters["kernel_drops"] != 0 {
				t.Fatalf("outcome %s, transport %v", res.Outcome, res.TransportCounters)
			}
			bad := everyHeapOnce(t, waitDrained, heaps, res)
			if bad != 0 {
				t.Errorf("%d heaps incomplete or with a broken pattern", bad)
			}
			// Each thread's share is counted (metrics label them), and the shares add up.
			per := r.ThreadCounters()
			if threads == 1 && per != nil || threads > 1 && len(per) != threads {
				t.Fatalf("%d threads: %d per-thread counter sets", threads, len(per))
			}
			var sum uint64
			for _, m := range per {
				sum += m["packets"]
			}
			if threads > 1 && sum != res.TransportCounters["packets"] {
				t.Errorf("per-thread packets add up to %d, the source counted %d", sum, res.TransportCounters["packets"])
			}
		})
	}
}
