package ibv

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/ibvbridge/ibvbridge/frame"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/verbs"
	"github.com/ibvbridge/ibvbridge/verbs/verbstest"
)

func testHeapSender(t testing.TB, q verbs.SendQueue, cfg verbs.SendConfig, ipCsum bool) *HeapSender {
	t.Helper()
	enc, err := spead.NewEncoder(spead.Flavour64_40, cfg.MaxPacketSize)
	if err != nil {
		t.Fatal(err)
	}
	hs, err := newHeapSender(verbstest.NewSender(t, q, cfg, verbs.SendLoopConfig{}, ipCsum), enc)
	if err != nil {
		t.Fatal(err)
	}
	return hs
}

// TestHeapSenderFrames: heaps sent through the HeapSender come out as valid
// frames, with software IPv4 checksums or the offload flag, to the right
// endpoint.
func TestHeapSenderFrames(t *testing.T) {
	for _, offload := range []bool{false, true} {
		t.Run(fmt.Sprintf("offload=%v", offload), func(t *testing.T) {
			cfg := verbstest.SendConfig()
			q := verbstest.NewSendQueue(t, cfg.Slots(), cfg.FrameSize())
			q.Record = true
			hs := testHeapSender(t, q, cfg, offload)
			payload := make([]byte, 100_000)
			for i := range payload {
				payload[i] = byte(i * 7)
			}
			ctx := context.Background()
			for cnt := uint64(1); cnt <= 3; cnt++ {
				h := spead.Heap{Cnt: cnt, Items: []spead.Item{{ID: 0x1000, Data: payload}}}
				if err := hs.SendHeapTo(ctx, &h, int(cnt%2)); err != nil {
					t.Fatal(err)
				}
			}
			if err := hs.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			parser := frame.Parser{VerifyIPChecksum: !offload}
			var got []byte
			for i, f := range q.Frames {
				u, err := parser.Parse(f)
				if err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
				if (q.Flags[i]&verbs.SendIPChecksum != 0) != offload {
					t.Fatalf("frame %d flags %#x", i, q.Flags[i])
				}
				if offload && (f[24] != 0 || f[25] != 0) {
					t.Fatalf("frame %d: checksum written though offloaded", i)
				}
				var p spead.Packet
				if err := spead.Decode(u.Payload, &p); err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
				ep := cfg.Endpoints[p.HeapCnt%2]
				if u.DstIP != ep.Addr() || u.DstPort != ep.Port() || u.SrcIP != cfg.Interface || u.TTL != verbs.DefaultTTL || !u.DontFragment {
					t.Fatalf("frame %d header %+v", i, u.Header)
				}
				if p.HeapCnt == 2 {
					got = append(got, p.Payload...)
				}
			}
			if !bytes.Equal(got, payload) {
				t.Errorf("heap 2 payload differs (%d bytes)", len(got))
			}
			if st := hs.s.Stats(); st.Packets != uint64(len(q.Frames)) || st.Completions != st.Signaled {
				t.Errorf("stats %+v for %d frames", st, len(q.Frames))
			}
			tot := hs.Totals()
			if tot.Packets != uint64(len(q.Frames)) || tot.Bytes != hs.s.Stats().Bytes || tot.Start != hs.start || tot.Start.IsZero() {
				t.Errorf("totals %+v", tot)
			}
		})
	}
}

// TestHeapSenderSendsToFirstEndpoint: transport.HeapSender's SendHeap is
// endpoint 0.
func TestHeapSenderSendsToFirstEndpoint(t *testing.T) {
	cfg := verbstest.SendConfig()
	q := verbstest.NewSendQueue(t, cfg.Slots(), cfg.FrameSize())
	q.Record = true
	hs := testHeapSender(t, q, cfg, false)
	ctx := context.Background()
	if err := hs.SendHeap(ctx, &spead.Heap{Cnt: 1, Items: []spead.Item{{ID: 0x1000, Data: make([]byte, 5000)}}}); err != nil {
		t.Fatal(err)
	}
	if err := hs.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if len(q.Frames) == 0 {
		t.Fatal("nothing sent")
	}
	for i, f := range q.Frames {
		u, err := frame.Parse(f)
		if err != nil || u.DstIP != cfg.Endpoints[0].Addr() || u.DstPort != cfg.Endpoints[0].Port() {
			t.Fatalf("frame %d: %+v %v", i, u.Header, err)
		}
	}
}

// TestHeapSenderRejectsBigEncoder: an encoder whose packets exceed the max
// packet size is refused, before any device is opened.
func TestHeapSenderRejectsBigEncoder(t *testing.T) {
	cfg := verbstest.SendConfig()
	big, err := spead.NewEncoder(spead.Flavour64_40, 8972)
	if err != nil {
		t.Fatal(err)
	}
	const want = "exceed the max packet size 1472"
	if _, err := OpenHeapSender(cfg, big); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("OpenHeapSender: %v", err)
	}
	s := verbstest.NewSender(t, verbstest.NewSendQueue(t, cfg.Slots(), cfg.FrameSize()), cfg, verbs.SendLoopConfig{}, false)
	if _, err := newHeapSender(s, big); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("newHeapSender: %v", err)
	}
}

// TestHeapSenderFlushDrainsAfterCancel: an interrupted send still drains what
// is queued: Flush with a done context waits (briefly) for the NIC anyway.
func TestHeapSenderFlushDrainsAfterCancel(t *testing.T) {
	cfg := verbstest.SendConfig()
	q := verbstest.NewSendQueue(t, cfg.Slots(), cfg.FrameSize())
	q.Auto = false
	q.OnWait = func() { q.Complete(-1) } // the NIC finishes while the sender sleeps
	hs := testHeapSender(t, q, cfg, false)
	ctx, cancel := context.WithCancel(context.Background())
	if err := hs.SendHeap(ctx, &spead.Heap{Cnt: 1, Items: []spead.Item{{ID: 0x1000, Data: make([]byte, 5000)}}}); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := hs.Flush(ctx); err != nil {
		t.Fatalf("Flush after cancel: %v", err)
	}
	if st := hs.s.Stats(); st.Packets == 0 || st.Completions != st.Signaled || q.WRs != int(st.Packets) {
		t.Errorf("not drained: stats %+v, %d work requests posted", st, q.WRs)
	}
}

func TestHeapSenderZeroAllocs(t *testing.T) {
	cfg := verbstest.SendConfig()
	q := verbstest.NewInstantSendQueue(cfg.Slots(), cfg.FrameSize())
	hs := testHeapSender(t, q, cfg, false)
	h := spead.Heap{Cnt: 1, Items: []spead.Item{{ID: 0x1000, Data: make([]byte, 64<<10)}}}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(50, func() {
		h.Cnt++
		if err := hs.SendHeap(ctx, &h); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per heap", allocs)
	}
	if q.WRs == 0 {
		t.Error("nothing posted")
	}
}

// BenchmarkSendPath is everything above the device on the send side, per
// packet: SPEAD encoding straight into the frame buffer, the Ethernet/IPv4/
// UDP headers (software IPv4 checksum, or offloaded), batching, signaling,
// completion reaping. 1 MiB heaps in spead2_send's 8972- and 1472-byte
// packets.
func BenchmarkSendPath(b *testing.B) {
	for _, c := range []struct {
		name    string
		pkt     int
		offload bool
	}{{"p8972", 8972, false}, {"p1472", 1472, false}, {"p1472_csum_offload", 1472, true}} {
		b.Run(c.name, func(b *testing.B) {
			cfg := verbstest.SendConfig()
			cfg.MaxPacketSize = c.pkt
			cfg.BufferSize = 4 << 20
			hs := testHeapSender(b, verbstest.NewInstantSendQueue(cfg.Slots(), cfg.FrameSize()), cfg, c.offload)
			h := spead.Heap{Items: []spead.Item{{ID: 0x1000, Data: make([]byte, 1<<20)}}}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				h.Cnt++
				if err := hs.SendHeap(ctx, &h); err != nil {
					b.Fatal(err)
				}
			}
			if err := hs.Flush(ctx); err != nil {
				b.Fatal(err)
			}
			st := hs.s.Stats()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(st.Packets), "ns/packet")
			b.ReportMetric(float64(st.Bytes)/b.Elapsed().Seconds()/1e9*8, "Gb/s")
		})
	}
}
