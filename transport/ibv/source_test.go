package ibv

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/frame"
	"github.com/ibvbridge/ibvbridge/frame/frametest"
	"github.com/ibvbridge/ibvbridge/internal/rxloop/rxlooptest"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/assemble"
	"github.com/ibvbridge/ibvbridge/verbs"
)

// recordingSink keeps a copy of every payload. (internal/testutil.RecordingSink replaces it.)
type recordingSink struct {
	payloads [][]byte
	onPacket func(n int)
}

func (s *recordingSink) Packet(p []byte, _ int64) {
	s.payloads = append(s.payloads, append([]byte(nil), p...))
	if s.onPacket != nil {
		s.onPacket(len(s.payloads))
	}
}

func testRecvConfig() verbs.RecvConfig {
	c := verbs.DefaultRecvConfig()
	c.Interface = netip.MustParseAddr("192.0.2.2")
	c.Endpoints = []netip.AddrPort{netip.MustParseAddrPort("239.1.2.3:7148")}
	return c
}

// udpFrame is an Ethernet/IPv4/UDP frame to 239.1.2.3:7148 carrying payload.
func udpFrame(t testing.TB, payload []byte) []byte {
	f := make([]byte, frame.HeaderLen+len(payload))
	copy(f[frame.HeaderLen:], payload)
	b := frame.Builder{Header: frame.Header{SrcIP: netip.MustParseAddr("10.0.0.1"), DstIP: netip.MustParseAddr("239.1.2.3"), DstPort: 7148, TTL: 1}}
	if err := b.Build(f, len(payload)); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestReceiverRun: plain IPv4/UDP frames reach the sink as their payloads, the
// rest are counted by reason, and the receiver is released as soon as Run's
// context is done, before anyone calls Close.
func TestReceiverRun(t *testing.T) {
	q := rxlooptest.NewQueue(8, 256)
	vlan := udpFrame(t, []byte("vlan"))
	copy(vlan[12:14], []byte{0x81, 0x00})
	tcp := udpFrame(t, []byte("tcp"))
	tcp[23] = 6 // IPv4 protocol: TCP
	for _, f := range [][]byte{vlan, tcp, udpFrame(t, []byte("one")), udpFrame(t, []byte("two"))} {
		if !q.Deliver(f) {
			t.Fatal("no slot")
		}
	}
	var released atomic.Int32
	r := newReceiver(q, func() error { released.Add(1); return nil }, testRecvConfig())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sink := &recordingSink{onPacket: func(n int) {
		if n == 2 {
			cancel()
		}
	}}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, sink) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	if released.Load() != 1 {
		t.Fatalf("receiver released %d times when Run returned, want 1", released.Load())
	}
	if len(sink.payloads) != 2 || string(sink.payloads[0]) != "one" || string(sink.payloads[1]) != "two" {
		t.Errorf("payloads %q", sink.payloads)
	}
	m := r.Counters()
	if m["frames"] != 4 || m["packets"] != 2 || m["dropped"] != 2 || m["dropped_vlan_tagged"] != 1 || m["dropped_not_udp"] != 1 {
		t.Errorf("counters %v", m)
	}
	if m["reposts"] == 0 || m["polls"] == 0 {
		t.Errorf("loop counters missing: %v", m)
	}
}

func TestReceiverCounters(t *testing.T) {
	var r Receiver
	r.stats.Frames.Add(10)
	r.dropped.Add(3)
	r.droppedBy[frame.ReasonVLAN].Add(2)
	r.droppedBy[frame.ReasonNotUDP].Add(1)
	m := r.Counters()
	if m["frames"] != 10 || m["packets"] != 7 || m["dropped"] != 3 || m["dropped_vlan_tagged"] != 2 || m["dropped_not_udp"] != 1 {
		t.Errorf("%v", m)
	}
	if _, ok := m["dropped_fragmented"]; ok {
		t.Error("zero reasons listed")
	}
}

// TestNewSourceChecksBeforeDevice: configuration errors come first, then the
// library, with nothing opened.
func TestNewSourceChecksBeforeDevice(t *testing.T) {
	bad := testRecvConfig()
	bad.Endpoints = []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:7148")}
	if _, err := NewSource(bad); err == nil || !strings.Contains(err.Error(), "is not an IPv4 multicast address") {
		t.Errorf("unicast endpoint: %v", err)
	}
	t.Setenv(verbs.EnvLibrary, filepath.Join(t.TempDir(), "libibverbs.so.1"))
	_, err := NewSource(testRecvConfig())
	if !errors.Is(err, verbs.ErrLibraryNotFound) && !errors.Is(err, verbs.ErrUnsupported) {
		t.Fatalf("got %v, want ErrLibraryNotFound (or ErrUnsupported without cgo)", err)
	}
	if !strings.HasPrefix(err.Error(), "ibverbs receiver on 192.0.2.2: ") {
		t.Errorf("error %q does not say which receiver", err)
	}
}

// TestSourceAreaFitsRing: the packet area AreaSize asks the ring for holds the
// receive buffer's work requests wherever the data file maps it.
func TestSourceAreaFitsRing(t *testing.T) {
	cfg := testRecvConfig()
	s := &Source{cfg: cfg}
	size := s.AreaSize()
	if size != verbs.AreaSize(cfg.MaxSize, cfg.BufferSize) {
		t.Fatalf("AreaSize %d", size)
	}
	p, err := ring.Create("area", ring.Config{Dir: t.TempDir(), SlotCount: 4, SlotSize: 4096, PacketArea: size, HugePages: ring.HugePagesOff})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	l, err := verbs.PlanArea(p.PacketArea(), cfg.MaxSize, cfg.BufferSize)
	if err != nil || l.Slots != cfg.BufferSize/cfg.MaxSize {
		t.Errorf("layout %+v, err %v", l, err)
	}
}

// captureFrames reads a spead2 capture without its stream-stop packets.
func captureFrames(b *testing.B, name string) [][]byte {
	var out [][]byte
	for _, f := range frametest.ReadFrames(b, filepath.Join(frametest.Dir(b), name)) {
		u, err := frame.Parse(f)
		if err != nil {
			b.Fatal(err)
		}
		var p spead.Packet
		if err := spead.Decode(u.Payload, &p); err != nil {
			b.Fatal(err)
		}
		if !p.IsStreamStop() {
			out = append(out, append([]byte(nil), f...))
		}
	}
	return out
}

// bumpCnts adds 1<<20 to every frame's heap cnt (the packet's first item
// pointer, an immediate: the low address bits hold the value), so that a
// replay's next pass carries new heaps, not duplicates.
func bumpCnts(frames [][]byte) {
	for _, f := range frames {
		p := f[frame.HeaderLen+8 : frame.HeaderLen+16]
		v := uint64(p[0])<<56 | uint64(p[1])<<48 | uint64(p[2])<<40 | uint64(p[3])<<32 | uint64(p[4])<<24 | uint64(p[5])<<16 | uint64(p[6])<<8 | uint64(p[7])
		v += 1 << 20
		for i := range 8 {
			p[i] = byte(v >> (56 - 8*i))
		}
	}
}

// BenchmarkRecvPath is everything above the device on the receive side, per
// packet: Receiver.Run over a queue replaying a capture (rxloop's poll,
// deliver, repost; frame.Parse), assemble.Assembler into a ring (no hugepages,
// block policy) drained by a consumer goroutine.
func BenchmarkRecvPath(b *testing.B) {
	for _, name := range []string{"small_4KiB_1pkt.pcap", "large_1MiB_p8972.pcap", "large_1MiB_p1472.pcap"} {
		b.Run(name[:len(name)-5], func(b *testing.B) {
			frames := captureFrames(b, name)
			dir := b.TempDir()
			p, err := ring.Create("bench", ring.Config{Dir: dir, SlotCount: 64, SlotSize: 2 << 20, MaxItems: 8,
				Policy: ring.PolicyBlock, HugePages: ring.HugePagesOff})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			c, err := ring.Attach("bench", ring.AttachOptions{Dir: dir, Timeout: time.Second})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			var heaps atomic.Uint64
			drained := make(chan error, 1)
			go func() {
				for {
					h, err := c.Next(30 * time.Second)
					if err != nil {
						if errors.Is(err, ring.ErrEndOfStream) {
							err = nil
						}
						drained <- err
						return
					}
					heaps.Add(1)
					c.Release(h)
				}
			}()
			asm, err := assemble.NewAssembler(p, assemble.AssemblerConfig{})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			q := rxlooptest.NewReplayQueue(frames)
			q.OnWrap = func() { bumpCnts(frames) }
			q.Limit, q.OnEnd = b.N, cancel
			cfg := testRecvConfig()
			cfg.CompVector = -1 // busy poll
			r := newReceiver(q, func() error { return nil }, cfg)
			b.ReportAllocs()
			b.ResetTimer()
			err = r.Run(ctx, asm)
			b.StopTimer()
			if !errors.Is(err, context.Canceled) {
				b.Fatal(err)
			}
			asm.Flush()
			if err := p.PublishEndOfStream(0, 10*time.Second); err != nil {
				b.Fatal(err)
			}
			if err := <-drained; err != nil {
				b.Fatal(err)
			}
			if m := r.Counters(); m["dropped"] != 0 || m["frames"] != uint64(b.N) {
				b.Fatalf("dropped %d, frames %d of %d", m["dropped"], m["frames"], b.N)
			}
			if st := p.Stats(); st.Get(ring.CounterMalformedPackets) != 0 || st.Get(ring.CounterDuplicatePackets) != 0 {
				b.Fatalf("ring counters %v", st.Map())
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/packet")
		})
	}
}
