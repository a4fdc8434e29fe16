package verbs

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/frame"
	"github.com/ibvbridge/ibvbridge/frame/frametest"
	"github.com/ibvbridge/ibvbridge/internal/rxloop"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
)

// nicSendQueue is a send queue whose "NIC" finishes a chain the moment it is
// posted, without allocating: the cost above the device, and nothing else.
type nicSendQueue struct {
	slots [][]byte
	done  []rxloop.Completion // fixed capacity: the signaled chains not yet polled
	wrs   uint64
}

func newNICSendQueue(slots, frameSize int) *nicSendQueue {
	q := &nicSendQueue{done: make([]rxloop.Completion, 0, slots)}
	mem := make([]byte, slots*frameSize)
	for i := range slots {
		q.slots = append(q.slots, mem[i*frameSize:(i+1)*frameSize])
	}
	return q
}

func (q *nicSendQueue) Slot(i uint32) []byte { return q.slots[i] }
func (q *nicSendQueue) Post(wrs []SendWR) error {
	q.wrs += uint64(len(wrs))
	q.done = append(q.done, rxloop.Completion{ID: wrs[len(wrs)-1].ID})
	return nil
}
func (q *nicSendQueue) Poll(out []rxloop.Completion) (int, error) {
	n := copy(out, q.done)
	q.done = q.done[:copy(q.done, q.done[n:])]
	return n, nil
}
func (q *nicSendQueue) Arm() error                 { return nil }
func (q *nicSendQueue) Wait(context.Context) error { return errors.New("nothing to wait for") }

func nicSender(tb testing.TB, cfg SendConfig, ipCsum bool) (*Sender, *nicSendQueue) {
	q := newNICSendQueue(cfg.Slots(), cfg.FrameSize())
	src := frame.Header{SrcMAC: [6]byte{2, 0, 0, 0, 0, 1}, SrcIP: cfg.Interface, SrcPort: 40000}
	macs := make([][6]byte, len(cfg.Endpoints))
	s, err := newSender(q, cfg, SendLoopConfig{}, src, macs, ipCsum)
	if err != nil {
		tb.Fatal(err)
	}
	return s, q
}

func TestSenderZeroAllocs(t *testing.T) {
	cfg := testSendConfig()
	s, q := nicSender(t, cfg, false)
	enc, _ := spead.NewEncoder(spead.Flavour64_40, cfg.MaxPacketSize)
	h := spead.Heap{Cnt: 1, Items: []spead.Item{{ID: 0x1000, Data: make([]byte, 64<<10)}}}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(50, func() {
		h.Cnt++
		if err := s.SendHeap(ctx, enc, &h, 0); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per heap", allocs)
	}
	if q.wrs == 0 {
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
			cfg := testSendConfig()
			cfg.MaxPacketSize = c.pkt
			cfg.BufferSize = 4 << 20
			s, _ := nicSender(b, cfg, c.offload)
			enc, err := spead.NewEncoder(spead.Flavour64_40, c.pkt)
			if err != nil {
				b.Fatal(err)
			}
			h := spead.Heap{Items: []spead.Item{{ID: 0x1000, Data: make([]byte, 1<<20)}}}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				h.Cnt++
				if err := s.SendHeap(ctx, enc, &h, 0); err != nil {
					b.Fatal(err)
				}
			}
			if err := s.Flush(ctx); err != nil {
				b.Fatal(err)
			}
			st := s.Stats()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(st.Packets), "ns/packet")
			b.ReportMetric(float64(st.Bytes)/b.Elapsed().Seconds()/1e9*8, "Gb/s")
		})
	}
}

// captureQueue replays captured frames as receive completions: slot i holds
// frame i. Each pass over the capture adds an offset to every heap cnt, so
// the assembler sees new heaps, not duplicates. After limit frames it
// cancels, and the loop ends.
type captureQueue struct {
	slots  [][]byte
	next   int
	sent   int
	limit  int
	cancel context.CancelFunc
}

func (q *captureQueue) Poll(out []rxloop.Completion) (int, error) {
	n := 0
	for n < len(out) && q.sent < q.limit {
		if q.next == len(q.slots) {
			q.next = 0
			q.bumpCnts()
		}
		out[n] = rxloop.Completion{ID: uint64(q.next), Len: uint32(len(q.slots[q.next]))}
		q.next++
		q.sent++
		n++
	}
	if n == 0 {
		q.cancel()
	}
	return n, nil
}

// bumpCnts adds 1<<20 to every frame's heap cnt (the packet's first item
// pointer, an immediate: the low address bits hold the value).
func (q *captureQueue) bumpCnts() {
	for _, f := range q.slots {
		p := f[frame.HeaderLen+8 : frame.HeaderLen+16]
		v := uint64(p[0])<<56 | uint64(p[1])<<48 | uint64(p[2])<<40 | uint64(p[3])<<32 | uint64(p[4])<<24 | uint64(p[5])<<16 | uint64(p[6])<<8 | uint64(p[7])
		v += 1 << 20
		for i := range 8 {
			p[i] = byte(v >> (56 - 8*i))
		}
	}
}

func (q *captureQueue) Repost([]uint64) error      { return nil }
func (q *captureQueue) Arm() error                 { return nil }
func (q *captureQueue) Wait(context.Context) error { return nil }
func (q *captureQueue) Slot(id uint64) []byte      { return q.slots[id] }

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

// BenchmarkRecvPath is everything above the device on the receive side, per
// packet: RunRecvLoop over a fake queue (poll, deliver, repost), frame.Parse,
// spead.Assembler into a ring (no hugepages, block policy) drained by a
// consumer goroutine: exactly Receiver.Run's callback minus the NIC.
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
			asm, err := spead.NewAssembler(p, spead.AssemblerConfig{})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			q := &captureQueue{slots: frames, limit: b.N, cancel: cancel}
			var r Receiver // only its counters: the callback is Receiver.Run's
			b.ReportAllocs()
			b.ResetTimer()
			err = rxloop.Run(ctx, q, rxloop.Config{BusyPoll: true, Stats: &r.Stats}, func(_ uint64, f []byte) {
				u, err := frame.Parse(f)
				if err != nil {
					r.Dropped.Add(1)
					r.DroppedBy[frame.ReasonOf(err)].Add(1)
					return
				}
				asm.Packet(u.Payload, time.Now().UnixNano())
			})
			b.StopTimer()
			if !errors.Is(err, context.Canceled) {
				b.Fatal(err)
			}
			asm.Flush()
			if err := p.PublishEndOfStream(10 * time.Second); err != nil {
				b.Fatal(err)
			}
			if err := <-drained; err != nil {
				b.Fatal(err)
			}
			if r.Dropped.Load() != 0 || r.Stats.Frames.Load() != uint64(b.N) {
				b.Fatalf("dropped %d, frames %d of %d", r.Dropped.Load(), r.Stats.Frames.Load(), b.N)
			}
			if st := p.Stats(); st.Get(ring.CounterMalformedPackets) != 0 || st.Get(ring.CounterDuplicatePackets) != 0 {
				b.Fatalf("ring counters %v", st.Map())
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/packet")
		})
	}
}
