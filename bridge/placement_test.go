package bridge

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
	"github.com/ibvbridge/ibvbridge/transport"
	"github.com/ibvbridge/ibvbridge/transport/udp"
)

// Direct placement under disorder: datagrams of interleaved heaps, shuffled within a window and some sent
// twice, arrive at a GRO socket whose payloads the source reads straight into the slots Place guesses.
// Every heap must come out complete with every byte of its pattern, whatever was guessed wrong; the
// in-order stretches must be taken in place, and every duplicate counted.
func TestPlacementUnderDisorder(t *testing.T) {
	runDisordered(t, 0, 120, 30000, 1472, func(s *udp.Sender, wire [][]byte) {
		for i := 0; i < len(wire); i += 8 {
			if err := s.Send(wire[i:min(i+8, len(wire))]); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Microsecond) // stay within the socket buffer
		}
	})
}

// runDisordered receives heaps 1..heaps of size bytes, packetized into packetSize-byte datagrams and
// disordered (disorderedPackets), on a GRO socket into a ring with a consumer, send putting them on the
// wire; it checks every heap came out once and whole, every duplicate was counted and some datagrams
// were placed. coalesce is the source's Coalesce.
func runDisordered(t *testing.T, coalesce time.Duration, heaps uint64, size, packetSize int, send func(s *udp.Sender, wire [][]byte)) {
	src, err := udp.Open(udp.Config{Endpoints: []transport.Endpoint{{Addr: netip.MustParseAddr("127.0.0.1")}}, GRO: true,
		Coalesce: coalesce})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, src)
	cfg.RingCfg.SlotCount, cfg.RingCfg.SlotSize = 256, (size+4096+4095)&^4095
	cfg.Assembler.MaxHeaps = 8
	r, c := openWithConsumer(t, cfg)
	wire, dups := disorderedPackets(t, heaps, size, packetSize)
	waitDrained := drainInBackground(c)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan Result, 1)
	go func() { res, _ := r.Run(ctx); done <- res }()
	s, err := udp.NewSender(udp.SenderConfig{Dest: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), src.LocalEndpoints()[0].Port)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	send(s, wire)
	time.Sleep(300 * time.Millisecond)
	cancel()
	res := <-done
	if bad := everyHeapOnce(t, waitDrained, heaps, res); bad != 0 {
		t.Errorf("%d heaps incomplete or with a broken pattern", bad)
	}
	tc := res.TransportCounters
	if tc["placed"] == 0 || tc["kernel_drops"] != 0 || tc["packets"] != uint64(len(wire)) ||
		res.RingCounters["duplicate_packets"] != uint64(dups) {
		t.Errorf("transport %v, duplicates %d (sent %d datagrams, %d twice)", tc, res.RingCounters["duplicate_packets"],
			len(wire), dups)
	}
	t.Logf("%d datagrams: %d reads, placed %d, placement misses %d", len(wire), tc["batches"], tc["placed"],
		tc["placement_misses"])
}

// disorderedPackets packetizes heaps 1..heaps of the test pattern (two items each) into packets of at most
// packetSize bytes, then disorders them: neighbours swapped within windows of 4, every 37th packet sent
// twice (dups counts them).
func disorderedPackets(t *testing.T, heaps uint64, size, packetSize int) (wire [][]byte, dups int) {
	t.Helper()
	enc, _ := spead.NewEncoder(spead.Flavour64_40, packetSize)
	g, err := pattern.NewHeapGen(spead.Flavour64_40, size, 2, true, false)
	if err != nil {
		t.Fatal(err)
	}
	var pkts [][]byte
	for cnt := uint64(1); cnt <= heaps; cnt++ {
		if err := enc.Reset(g.Heap(cnt)); err != nil {
			t.Fatal(err)
		}
		for {
			b := make([]byte, packetSize)
			n, err := enc.Next(b)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			pkts = append(pkts, b[:n])
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i+4 <= len(pkts); i += 4 {
		if rng.IntN(3) == 0 {
			j, k := i+rng.IntN(4), i+rng.IntN(4)
			pkts[j], pkts[k] = pkts[k], pkts[j]
		}
	}
	for i, p := range pkts {
		wire = append(wire, p)
		if i%37 == 36 {
			wire = append(wire, p)
			dups++
		}
	}
	return wire, dups
}

// The placed read takes several messages a call, and GRO messages hold several datagrams: messages cut
// short (runs of 1 to 7 datagrams, as a sender's batch ends make them), disorder and duplicates make
// guesses wrong. Every heap must still come out whole with every byte of its pattern, every duplicate
// counted, the in-order stretches placed; with the reads coalesced (recv's default) too.
func TestPlacementOfGROMessagesUnderDisorder(t *testing.T) {
	for _, coalesce := range []time.Duration{0, udp.DefaultCoalesce} {
		t.Run("coalesce-"+coalesce.String(), func(t *testing.T) { placeGROMessagesUnderDisorder(t, coalesce) })
	}
}

func placeGROMessagesUnderDisorder(t *testing.T, coalesce time.Duration) {
	const packetSize = 8972
	runDisordered(t, coalesce, 60, 200000, packetSize, func(s *udp.Sender, wire [][]byte) {
		if err := s.EnableGSO(packetSize); err != nil {
			t.Skipf("no UDP GSO here: %v", err)
		}
		runLengths := []int{7, 7, 3, 7, 1, 7, 5, 7, 7, 2}
		var runs [][][]byte
		for i, k := 0, 0; i < len(wire); k++ {
			// A run is datagrams of its first one's length but its last, which may be shorter.
			end := i + 1
			for end < len(wire) && end-i < runLengths[k%len(runLengths)] && len(wire[end]) <= len(wire[i]) &&
				len(wire[end-1]) == len(wire[i]) {
				end++
			}
			runs = append(runs, wire[i:end])
			i = end
		}
		for i := 0; i < len(runs); i += 16 { // several messages queue up between reads
			if err := s.SendRuns(runs[i:min(i+16, len(runs))]); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Millisecond) // stay within the socket buffer
		}
	})
}

// Heaps of one packet each (8 KiB in 8972-byte datagrams) arriving in order are read straight into the
// slots the assembler takes ahead for the heaps it expects next: nearly every payload is placed, none is
// misplaced, every heap is whole. With a block ring of 16 slots and a consumer that lags, the slots taken
// ahead go back whenever a heap needs one, so nothing stalls and nothing is lost.
func TestPlacementOfOnePacketHeaps(t *testing.T) {
	for _, tc := range []struct {
		name  string
		slots int
		block bool
		lag   bool
	}{{"in-order", 1024, false, false}, {"small-block-ring-lagging-consumer", 16, true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			const heaps, size = 3000, 8192
			src, err := udp.Open(udp.Config{Endpoints: []transport.Endpoint{{Addr: netip.MustParseAddr("127.0.0.1")}}, GRO: true})
			if err != nil {
				t.Fatal(err)
			}
			cfg := testConfig(t, src)
			cfg.RingCfg.SlotCount, cfg.RingCfg.SlotSize = tc.slots, 16<<10
			if tc.block {
				cfg.RingCfg.Policy = ring.PolicyBlock
			}
			r, c := openWithConsumer(t, cfg)
			var lag []func(int)
			if tc.lag {
				lag = append(lag, func(i int) {
					if i%100 == 99 {
						time.Sleep(2 * time.Millisecond) // the ring fills; the producer waits
					}
				})
			}
			waitDrained := drainInBackground(c, lag...)
			done := make(chan Result, 1)
			go func() { res, _ := r.Run(context.Background()); done <- res }()
			enc, _ := spead.NewEncoder(spead.Flavour64_40, 8972)
			hs, err := udp.OpenHeapSender(udp.HeapSenderConfig{Encoder: enc, GSO: true, Rate: 0.3e9,
				SenderConfig: udp.SenderConfig{Dest: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), src.LocalEndpoints()[0].Port)}})
			if err != nil {
				t.Fatal(err)
			}
			defer hs.Close()
			g, err := pattern.NewHeapGen(spead.Flavour64_40, size, 1, true, false)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := transport.SendStream(context.Background(), hs, heaps, g.Heap, true); err != nil {
				t.Fatal(err)
			}
			var res Result
			select {
			case res = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("the stream did not end")
			}
			bad := everyHeapOnce(t, waitDrained, heaps, res)
			tc2 := res.TransportCounters
			if bad != 0 || res.Outcome != OutcomeStreamStop || tc2["kernel_drops"] != 0 {
				t.Fatalf("%d bad heaps, outcome %s, transport %v", bad, res.Outcome, tc2)
			}
			if !tc.lag && (tc2["placed"] < heaps*9/10 || tc2["placement_misses"] > 10) {
				t.Errorf("placed %d of %d packets, %d misplaced", tc2["placed"], tc2["packets"], tc2["placement_misses"])
			}
			t.Logf("placed %d of %d packets, %d misplaced", tc2["placed"], tc2["packets"], tc2["placement_misses"])
		})
	}
}
