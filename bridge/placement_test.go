package bridge

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring/pattern"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/transport"
	"github.com/ibvbridge/ibvbridge/transport/udp"
)

// Direct placement under disorder: datagrams of interleaved heaps, shuffled within a window and some sent
// twice, arrive at a GRO socket whose payloads the source reads straight into the slots Place guesses.
// Every heap must come out complete with every byte of its pattern, whatever was guessed wrong; the
// in-order stretches must be taken in place, and every duplicate counted.
func TestPlacementUnderDisorder(t *testing.T) {
	const heaps, size = 120, 30000
	src, err := udp.Open(udp.Config{Endpoints: []transport.Endpoint{{Addr: netip.MustParseAddr("127.0.0.1")}}, GRO: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, src)
	cfg.RingCfg.SlotCount, cfg.RingCfg.SlotSize = 256, 32<<10
	cfg.Assembler.MaxHeaps = 8
	r, c := openWithConsumer(t, cfg)
	// Packetize, then disorder: swap neighbours within a window of 4, and repeat every 37th packet.
	enc, _ := spead.NewEncoder(spead.Flavour64_40, 1472)
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
			b := make([]byte, 1472)
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
	var wire [][]byte
	dups := 0
	for i, p := range pkts {
		wire = append(wire, p)
		if i%37 == 36 {
			wire = append(wire, p)
			dups++
		}
	}
	waitDrained := drainInBackground(c)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan Result, 1)
	go func() { res, _ := r.Run(ctx); done <- res }()
	s, err := udp.NewSender(udp.SenderConfig{Dest: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), src.LocalEndpoints()[0].Port)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := 0; i < len(wire); i += 8 {
		if err := s.Send(wire[i:min(i+8, len(wire))]); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Microsecond) // stay within the socket buffer
	}
	time.Sleep(300 * time.Millisecond)
	cancel()
	res := <-done
	seen, bad, err := waitDrained()
	if err != nil {
		t.Fatal(err)
	}
	for cnt := uint64(1); cnt <= heaps; cnt++ {
		if seen[cnt] != 1 {
			t.Fatalf("heap %d delivered %d times; ring %v transport %v", cnt, seen[cnt], res.RingCounters, res.TransportCounters)
		}
	}
	if bad != 0 {
		t.Errorf("%d heaps incomplete or with a broken pattern", bad)
	}
	tc := res.TransportCounters
	if tc["placed"] == 0 || tc["kernel_drops"] != 0 || res.RingCounters["duplicate_packets"] != uint64(dups) {
		t.Errorf("transport %v, duplicates %d (sent %d)", tc, res.RingCounters["duplicate_packets"], dups)
	}
	t.Logf("%d datagrams: placed %d, placement misses %d", len(wire), tc["placed"], tc["placement_misses"])
}
