package bridge

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
	"github.com/ibvbridge/ibvbridge/transport/udp"
)

// A chunk stream spread over two endpoints (heap k to endpoint k mod 2), received by 1 and 2 threads that
// place into the same open chunks, comes out exact: every chunk in id order, every presence byte 1, every
// heap position holding its heap's pattern, the counters adding up.
func TestThreadsFillOneSetOfChunks(t *testing.T) {
	const (
		endpoints, axis, chunkHeaps, heapSize = 2, 4, 8, 8192
		chunks                                = 16
		heaps                                 = chunks * chunkHeaps * axis
		step                                  = 4096
	)
	for threads := 1; threads <= endpoints; threads++ {
		t.Run(fmt.Sprintf("threads=%d", threads), func(t *testing.T) {
			src := openLoopbackSource(t, endpoints, threads)
			cfg := testConfig(t, src)
			cfg.RingCfg.SlotCount, cfg.RingCfg.SlotSize = 64, 0
			cfg.RingCfg.Chunks = ring.ChunkGeometry{Heaps: chunkHeaps, Axis: axis, HeapSize: heapSize, Step: step,
				TimeItem: 0x1600, AxisItem: 0x4101}
			// Threads read their sockets independently: a window of 8 chunks (256 heaps) absorbs one
			// thread running behind the other.
			cfg.Assembler.MaxHeaps, cfg.Assembler.ChunkWindow = 16, 8
			r, c := openWithConsumer(t, cfg)
			type got struct {
				ids []uint64
				bad int
				err error
			}
			done := make(chan got, 1)
			go func() {
				var g got
				for {
					ch, err := c.NextChunk(10 * time.Second)
					if errors.Is(err, ring.ErrEndOfStream) {
						break
					}
					if err != nil {
						g.err = err
						break
					}
					g.ids = append(g.ids, ch.ID)
					for pos := range uint64(chunkHeaps * axis) {
						cnt := ch.ID*chunkHeaps*axis + pos + 1 // heap k carries time (k-1)/axis, axis (k-1) mod axis
						data := ch.HeapData(uint32(pos/axis), uint32(pos%axis))
						if ch.Present[pos] != 1 || pattern.VerifyPattern(data, cnt) >= 0 {
							g.bad++
						}
					}
					if !c.Valid(ch.Heap) {
						g.err = errors.New("chunk overrun while read")
					}
					c.Release(ch.Heap)
				}
				done <- g
			}()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			res := make(chan Result, 1)
			go func() { rs, _ := r.Run(ctx); res <- rs }()
			local := src.LocalEndpoints()
			senders := make([]*udp.HeapSender, endpoints)
			for i := range senders {
				enc, _ := spead.NewEncoder(spead.Flavour64_40, 8972)
				var err error
				if senders[i], err = udp.OpenHeapSender(udp.HeapSenderConfig{Encoder: enc, Batch: 1, Rate: 0.05e9,
					SenderConfig: udp.SenderConfig{Dest: netip.AddrPortFrom(local[i].Addr, local[i].Port)}}); err != nil {
					t.Fatal(err)
				}
				defer senders[i].Close()
			}
			g, err := pattern.NewHeapGen(spead.Flavour64_40, heapSize, 1, true, false)
			if err != nil {
				t.Fatal(err)
			}
			if err := g.SetChunkItems(pattern.ChunkItems{TimeItem: 0x1600, Step: step, AxisItem: 0x4101, AxisCount: axis}); err != nil {
				t.Fatal(err)
			}
			sendSpread(t, ctx, senders, g, heaps)
			cancel()
			rs := <-res
			gt := <-done
			if gt.err != nil {
				t.Fatal(gt.err)
			}
			if rs.TransportCounters["kernel_drops"] != 0 {
				t.Fatalf("kernel drops: %v", rs.TransportCounters)
			}
			if len(gt.ids) != chunks || gt.bad != 0 {
				t.Fatalf("%d chunks (%v), %d positions absent or wrong; ring %v", len(gt.ids), gt.ids, gt.bad, rs.RingCounters)
			}
			for i, id := range gt.ids {
				if id != uint64(i) {
					t.Fatalf("chunk ids %v: not 0..%d in order", gt.ids, chunks-1)
				}
			}
			for k, v := range map[string]uint64{"chunks": chunks, "incomplete_chunks": 0, "heaps": heaps,
				"too_old_heaps": 0, "rejected_heaps": 0, "duplicate_packets": 0} {
				if rs.RingCounters[k] != v {
					t.Errorf("%s = %d, want %d (%v)", k, rs.RingCounters[k], v, rs.RingCounters)
				}
			}
		})
	}
}
