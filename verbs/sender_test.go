package verbs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/frame"
	"github.com/ibvbridge/ibvbridge/internal/rxloop"
	"github.com/ibvbridge/ibvbridge/spead"
)

// fakeSendQueue is a send queue whose "NIC" checks the sender's side of the
// contract: a buffer is never posted (or written) while in flight, each post
// ends with a signaled work request, and a frame's bytes are unchanged from
// post to completion. Completions are produced lazily: complete() finishes
// the oldest signaled chains, and with auto set every Poll completes
// everything posted so far.
type fakeSendQueue struct {
	t        testing.TB
	slots    [][]byte
	inFlight []bool
	snap     [][]byte // frame bytes at post time
	posted   []SendWR // in order, not yet completed
	done     []rxloop.Completion
	auto     bool
	armed    bool
	onWait   func() // the "NIC" finishing while the sender sleeps

	wrs, signaled, posts, arms, waits int
	frames                            [][]byte // every frame posted (when record)
	record                            bool
	flags                             []SendFlags
}

func newFakeSendQueue(t testing.TB, slots, frameSize int) *fakeSendQueue {
	q := &fakeSendQueue{t: t, auto: true}
	for range slots {
		q.slots = append(q.slots, make([]byte, frameSize))
		q.inFlight = append(q.inFlight, false)
		q.snap = append(q.snap, nil)
	}
	return q
}

func (q *fakeSendQueue) Slot(i uint32) []byte {
	if q.inFlight[i] {
		q.t.Errorf("buffer %d handed out while the NIC may read it", i)
	}
	return q.slots[i]
}

func (q *fakeSendQueue) Post(wrs []SendWR) error {
	q.posts++
	for i, w := range wrs {
		if q.inFlight[w.Slot] {
			return fmt.Errorf("buffer %d posted while in flight", w.Slot)
		}
		sig := w.Flags&SendSignaled != 0
		if sig != (i == len(wrs)-1) {
			q.t.Errorf("post of %d: work request %d signaled=%v", len(wrs), i, sig)
		}
		if sig {
			q.signaled++
		}
		q.inFlight[w.Slot] = true
		q.snap[w.Slot] = append(q.snap[w.Slot][:0], q.slots[w.Slot][:w.Len]...)
		q.posted = append(q.posted, w)
		q.wrs++
		q.flags = append(q.flags, w.Flags)
		if q.record {
			q.frames = append(q.frames, append([]byte(nil), q.slots[w.Slot][:w.Len]...))
		}
	}
	return nil
}

// complete finishes posted work requests up to and including the n-th
// signaled one (all if n < 0).
func (q *fakeSendQueue) complete(n int) {
	for len(q.posted) > 0 && n != 0 {
		w := q.posted[0]
		q.posted = q.posted[1:]
		if !bytes.Equal(q.snap[w.Slot], q.slots[w.Slot][:w.Len]) {
			q.t.Errorf("frame %d (buffer %d) changed while in flight", w.ID, w.Slot)
		}
		q.inFlight[w.Slot] = false
		if w.Flags&SendSignaled != 0 {
			q.done = append(q.done, rxloop.Completion{ID: w.ID})
			n--
		}
	}
}

func (q *fakeSendQueue) Poll(out []rxloop.Completion) (int, error) {
	if q.auto {
		q.complete(-1)
	}
	n := copy(out, q.done)
	q.done = q.done[n:]
	return n, nil
}

func (q *fakeSendQueue) Arm() error { q.arms++; q.armed = true; return nil }

func (q *fakeSendQueue) Wait(ctx context.Context) error {
	q.waits++
	if !q.armed {
		return errors.New("wait without arm")
	}
	q.armed = false
	if q.onWait == nil {
		return errors.New("wait would block forever")
	}
	q.onWait()
	return nil
}

type fakeClock struct {
	now    time.Duration
	slept  time.Duration
	sleeps int
}

func (c *fakeClock) Now() time.Duration { return c.now }
func (c *fakeClock) Sleep(_ context.Context, d time.Duration) error {
	c.now += d
	c.slept += d
	c.sleeps++
	return nil
}

func testSendConfig() SendConfig {
	c := DefaultSendConfig()
	c.Interface = netip.MustParseAddr("192.0.2.2")
	c.Endpoints = []netip.AddrPort{netip.MustParseAddrPort("239.1.2.3:7148"), netip.MustParseAddrPort("192.0.2.9:7149")}
	return c
}

func testSender(t testing.TB, cfg SendConfig, lc SendLoopConfig, ipCsum bool) (*Sender, *fakeSendQueue) {
	t.Helper()
	q := newFakeSendQueue(t, cfg.Slots(), cfg.FrameSize())
	src := frame.Header{SrcMAC: [6]byte{2, 0, 0, 0, 0, 1}, SrcIP: cfg.Interface, SrcPort: 40000}
	macs := make([][6]byte, len(cfg.Endpoints))
	for i, ep := range cfg.Endpoints {
		if m, ok := frame.MulticastMAC(ep.Addr()); ok {
			macs[i] = m
		} else {
			macs[i] = [6]byte{2, 0, 0, 0, 0, 9}
		}
	}
	s, err := newSender(q, cfg, lc, src, macs, ipCsum)
	if err != nil {
		t.Fatal(err)
	}
	return s, q
}

func TestSendLoopSignalsOncePerBatch(t *testing.T) {
	q := newFakeSendQueue(t, 64, 128)
	l, err := newSendLoop(q, SendLoopConfig{Slots: 64, Batch: 16})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const n = 1000
	for i := range n {
		_, buf, err := l.next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		buf[0] = byte(i)
		if err := l.commit(ctx, 100, 58); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.flush(ctx); err != nil {
		t.Fatal(err)
	}
	wantSignaled := (n + 15) / 16 // 62 full batches and the flushed 8
	if q.wrs != n || q.signaled != wantSignaled || q.posts != wantSignaled {
		t.Errorf("%d WRs, %d signaled, %d posts; want %d, %d, %d", q.wrs, q.signaled, q.posts, n, wantSignaled, wantSignaled)
	}
	st := l.stats
	if st.Packets != n || st.Bytes != n*58 || st.FrameBytes != n*100 || st.Signaled != uint64(wantSignaled) {
		t.Errorf("stats %+v", st)
	}
	if l.head != n || l.posted != n || l.tail != n {
		t.Errorf("head %d posted %d tail %d after flush", l.head, l.posted, l.tail)
	}
}

// TestSendLoopReusesOnlyCompletedBuffers: the NIC completes one signaled
// chain per poll at most, so the sender keeps running out of buffers; the
// fake fails the test if a buffer in flight is handed out or changed.
func TestSendLoopReusesOnlyCompletedBuffers(t *testing.T) {
	for _, busy := range []bool{false, true} {
		t.Run(fmt.Sprintf("busy=%v", busy), func(t *testing.T) {
			q := newFakeSendQueue(t, 8, 64)
			q.auto = false
			polls := 0
			l, err := newSendLoop(&slowPoller{q, &polls}, SendLoopConfig{Slots: 8, Batch: 3, MaxPoll: 2, BusyPoll: busy})
			if err != nil {
				t.Fatal(err)
			}
			q.onWait = func() { q.complete(1) }
			ctx := context.Background()
			for i := range 200 {
				_, buf, err := l.next(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for j := range buf {
					buf[j] = byte(i)
				}
				if err := l.commit(ctx, 64, 64); err != nil {
					t.Fatal(err)
				}
			}
			if err := l.flush(ctx); err != nil {
				t.Fatal(err)
			}
			if l.stats.Stalls == 0 {
				t.Error("the sender never waited for a buffer")
			}
			if !busy && (q.waits == 0 || q.arms < q.waits) {
				t.Errorf("arms %d waits %d", q.arms, q.waits)
			}
			if busy && q.waits != 0 {
				t.Errorf("busy poll slept %d times", q.waits)
			}
		})
	}
}

// slowPoller completes one signaled chain every fifth poll.
type slowPoller struct {
	*fakeSendQueue
	polls *int
}

func (s *slowPoller) Poll(out []rxloop.Completion) (int, error) {
	*s.polls++
	if *s.polls%5 == 0 {
		s.complete(1)
	}
	return s.fakeSendQueue.Poll(out)
}

func TestSendLoopFailedCompletion(t *testing.T) {
	q := newFakeSendQueue(t, 4, 64)
	l, _ := newSendLoop(&failingQueue{q}, SendLoopConfig{Slots: 4, Batch: 2})
	ctx := context.Background()
	var err error
	for range 10 {
		if _, _, err = l.next(ctx); err != nil {
			break
		}
		if err = l.commit(ctx, 64, 64); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrSendFailed) {
		t.Fatalf("got %v, want ErrSendFailed", err)
	}
}

type failingQueue struct{ *fakeSendQueue }

func (f *failingQueue) Poll(out []rxloop.Completion) (int, error) {
	n, err := f.fakeSendQueue.Poll(out)
	for i := range out[:n] {
		out[i].Status = 5 // IBV_WC_WR_FLUSH_ERR
	}
	return n, err
}

func TestSendLoopCancelWhileWaiting(t *testing.T) {
	q := newFakeSendQueue(t, 2, 64)
	q.auto = false
	ctx, cancel := context.WithCancel(context.Background())
	q.onWait = cancel
	l, _ := newSendLoop(&ctxWaitQueue{q}, SendLoopConfig{Slots: 2, Batch: 1})
	var err error
	for range 3 {
		if _, _, err = l.next(ctx); err != nil {
			break
		}
		if err = l.commit(ctx, 64, 64); err != nil {
			break
		}
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

type ctxWaitQueue struct{ *fakeSendQueue }

func (c *ctxWaitQueue) Wait(ctx context.Context) error {
	c.onWait()
	return ctx.Err()
}

// TestSendPacingMath: at 1 MB/s, 1000 packets of 1000 payload bytes take one
// second, less the last post (pacing waits for the bytes before a post).
func TestSendPacingMath(t *testing.T) {
	clk := &fakeClock{}
	q := newFakeSendQueue(t, 64, 1042)
	l, err := newSendLoop(q, SendLoopConfig{Slots: 64, FrameSize: 1042, Rate: 1e6, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if want := min(SendBatch(64, 1042), DefaultMaxBurst/1042); l.batch != want {
		t.Errorf("paced batch %d, want %d (one burst)", l.batch, want)
	}
	ctx := context.Background()
	for range 1000 {
		if _, _, err := l.next(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.commit(ctx, 1042, 1000); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.flush(ctx); err != nil {
		t.Fatal(err)
	}
	last := 1000 % l.batch
	if last == 0 {
		last = l.batch
	}
	want := time.Duration(float64(1000-last) * 1000 / 1e6 * float64(time.Second))
	if d := clk.slept - want; d < -time.Microsecond || d > time.Microsecond {
		t.Errorf("slept %v, want %v", clk.slept, want)
	}
	if l.stats.PaceSleep != clk.slept {
		t.Errorf("stats say %v slept", l.stats.PaceSleep)
	}

	// A sender that fell far behind restarts its schedule instead of
	// bursting to catch up: after a 1 s stall it is again paced.
	clk.now += time.Second
	before := clk.slept
	for range 2 * l.batch {
		l.next(ctx)
		l.commit(ctx, 1042, 1000)
	}
	l.flush(ctx)
	if clk.slept-before < time.Duration(l.batch)*time.Millisecond-maxPacingLag {
		t.Errorf("after a stall slept only %v for %d packets", clk.slept-before, 2*l.batch)
	}
}

func TestHWRateKbps(t *testing.T) {
	caps := HWRate{MinKbps: 1000, MaxKbps: 100_000_000, RawPacket: true}
	// 10 Gb/s of payload in 8972-byte packets: frames carry 42 more bytes each.
	k, ok, _ := hwRateKbps(1.25e9, 8972, caps)
	if want := uint32(10_000_000 * 9014 / 8972); !ok || k < want-1 || k > want+1 {
		t.Errorf("kbps %d ok %v, want %d", k, ok, want)
	}
	if _, ok, why := hwRateKbps(10, 8972, caps); ok || !strings.Contains(why, "range") {
		t.Errorf("below min: %v %q", ok, why)
	}
	if _, ok, why := hwRateKbps(1.25e9, 8972, HWRate{MaxKbps: 1 << 30}); ok || !strings.Contains(why, "raw packet") {
		t.Errorf("no raw packet pacing: %v %q", ok, why)
	}
	if _, ok, _ := hwRateKbps(0, 8972, caps); ok {
		t.Error("rate 0 paced")
	}
}

func TestSendConfig(t *testing.T) {
	c := testSendConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.FrameSize() != 1514 || c.Slots() != 512*1024/1514 {
		t.Errorf("frame %d slots %d", c.FrameSize(), c.Slots())
	}
	bad := map[string]func(*SendConfig){
		"interface address is not set": func(c *SendConfig) { c.Interface = netip.Addr{} },
		"not an IPv4 address":          func(c *SendConfig) { c.Endpoints[0] = netip.MustParseAddrPort("[ff02::1]:7148") },
		"no port":                      func(c *SendConfig) { c.Endpoints[0] = netip.MustParseAddrPort("239.1.1.1:0") },
		"no endpoints":                 func(c *SendConfig) { c.Endpoints = nil },
		"ttl":                          func(c *SendConfig) { c.TTL = 256 },
		"max packet size":              func(c *SendConfig) { c.MaxPacketSize = 10 },
		"buffer size":                  func(c *SendConfig) { c.BufferSize = 0 },
		"max_poll":                     func(c *SendConfig) { c.MaxPoll = 0 },
		"rate":                         func(c *SendConfig) { c.Rate = -1 },
	}
	for want, mod := range bad {
		c := testSendConfig()
		mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", want, err)
		}
	}
	// Environment, as RecvConfig: flag > IBVBRIDGE_ > SPEAD2_.
	env := map[string]string{EnvInterface: "192.0.2.5", EnvSpead2Interface: "192.0.2.6", EnvSpead2CompVector: "-1"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	c = testSendConfig()
	if err := c.ApplyEnv(lookup, FlagsSet{}); err != nil || c.Interface.String() != "192.0.2.5" || c.CompVector != -1 {
		t.Errorf("env: %v %v %d", err, c.Interface, c.CompVector)
	}
	c = testSendConfig()
	if err := c.ApplyEnv(lookup, FlagsSet{Interface: true, CompVector: true}); err != nil || c.Interface.String() != "192.0.2.2" || c.CompVector != 0 {
		t.Errorf("flags: %v %v %d", err, c.Interface, c.CompVector)
	}
}

func TestLookupARP(t *testing.T) {
	table := `IP address       HW type     Flags       HW address            Mask     Device
192.0.2.1        0x1         0x2         52:54:00:12:34:56     *        eth0
192.0.2.7        0x1         0x0         00:00:00:00:00:00     *        eth0
192.0.2.8        0x1         0x2         52:54:00:aa:bb:cc     *        eth1
`
	mac, err := lookupARP(strings.NewReader(table), netip.MustParseAddr("192.0.2.1"), "eth0")
	if err != nil || mac != [6]byte{0x52, 0x54, 0, 0x12, 0x34, 0x56} {
		t.Errorf("complete entry: %x %v", mac, err)
	}
	for _, c := range []struct{ ip, dev string }{{"192.0.2.7", "eth0"}, {"192.0.2.8", "eth0"}, {"192.0.2.99", "eth0"}} {
		if _, err := lookupARP(strings.NewReader(table), netip.MustParseAddr(c.ip), c.dev); !errors.Is(err, ErrNoNeighbour) {
			t.Errorf("%s on %s: %v", c.ip, c.dev, err)
		}
	}
	if m, err := DestinationMAC(netip.MustParseAddr("239.1.2.3"), "eth0", "/nonexistent"); err != nil || m != [6]byte{1, 0, 0x5e, 1, 2, 3} {
		t.Errorf("multicast: %x %v", m, err)
	}
	_, err = DestinationMAC(netip.MustParseAddr("192.0.2.99"), "eth0", "/proc/net/arp")
	if err == nil || !strings.Contains(err.Error(), "does not resolve addresses") {
		t.Errorf("unresolved unicast: %v", err)
	}
}

// TestSenderFrames: heaps sent through the Sender come out as valid frames,
// with software IPv4 checksums or the offload flag, to the right endpoint.
func TestSenderFrames(t *testing.T) {
	for _, offload := range []bool{false, true} {
		t.Run(fmt.Sprintf("offload=%v", offload), func(t *testing.T) {
			cfg := testSendConfig()
			s, q := testSender(t, cfg, SendLoopConfig{}, offload)
			q.record = true
			enc, err := spead.NewEncoder(spead.Flavour64_40, cfg.MaxPacketSize)
			if err != nil {
				t.Fatal(err)
			}
			payload := make([]byte, 100_000)
			for i := range payload {
				payload[i] = byte(i * 7)
			}
			ctx := context.Background()
			for cnt := uint64(1); cnt <= 3; cnt++ {
				h := spead.Heap{Cnt: cnt, Items: []spead.Item{{ID: 0x1000, Data: payload}}}
				if err := s.SendHeap(ctx, enc, &h, int(cnt%2)); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			parser := frame.Parser{VerifyIPChecksum: !offload}
			var got []byte
			for i, f := range q.frames {
				u, err := parser.Parse(f)
				if err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
				if (q.flags[i]&SendIPChecksum != 0) != offload {
					t.Fatalf("frame %d flags %#x", i, q.flags[i])
				}
				if offload && (f[24] != 0 || f[25] != 0) {
					t.Fatalf("frame %d: checksum written though offloaded", i)
				}
				var p spead.Packet
				if err := spead.Decode(u.Payload, &p); err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
				ep := cfg.Endpoints[p.HeapCnt%2]
				if u.DstIP != ep.Addr() || u.DstPort != ep.Port() || u.SrcIP != cfg.Interface || u.TTL != DefaultTTL || !u.DontFragment {
					t.Fatalf("frame %d header %+v", i, u.Header)
				}
				if p.HeapCnt == 2 {
					got = append(got, p.Payload...)
				}
			}
			if !bytes.Equal(got, payload) {
				t.Errorf("heap 2 payload differs (%d bytes)", len(got))
			}
			if st := s.Stats(); st.Packets != uint64(len(q.frames)) || st.Completions != st.Signaled {
				t.Errorf("stats %+v for %d frames", st, len(q.frames))
			}
		})
	}
}

func TestSenderRejects(t *testing.T) {
	cfg := testSendConfig()
	s, _ := testSender(t, cfg, SendLoopConfig{}, false)
	ctx := context.Background()
	big, _ := spead.NewEncoder(spead.Flavour64_40, 8972)
	if err := s.SendHeap(ctx, big, &spead.Heap{Cnt: 1}, 0); err == nil {
		t.Error("encoder with bigger packets accepted")
	}
	if _, err := s.Buffer(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.CommitTo(ctx, 5, 10); err == nil {
		t.Error("endpoint index out of range accepted")
	}
	if err := s.Commit(ctx, cfg.MaxPacketSize+1); err == nil {
		t.Error("oversized packet accepted")
	}
	if _, err := s.Buffer(ctx); err == nil {
		t.Error("second Buffer without Commit accepted")
	}
}

func TestAreaSizeFitsAnyAlignment(t *testing.T) {
	for _, c := range []struct{ maxSize, buffer int }{{9200, 16 << 20}, {1500, 1 << 20}, {64, 64}, {9200, 100}, {8000, 1 << 30}} {
		size := AreaSize(c.maxSize, c.buffer)
		for base := uintptr(0); base < 2*SlotAlign; base++ {
			l, err := PlanRegion(0x10000+base, size, c.maxSize, c.buffer)
			if err != nil {
				t.Fatalf("%+v base %d: %v", c, base, err)
			}
			if l.Slots != max(1, c.buffer/c.maxSize) || l.Span() > size {
				t.Fatalf("%+v base %d: %+v in %d bytes", c, base, l, size)
			}
		}
		// Not wasteful: less than one more slot's worth.
		if size-max(1, c.buffer/c.maxSize)*alignUp(c.maxSize, SlotAlign) >= SlotAlign {
			t.Errorf("%+v: %d bytes", c, size)
		}
	}
	if AreaSize(0, 1) != 0 || AreaSize(1, 0) != 0 {
		t.Error("bad sizes not 0")
	}
}

func TestReceiverCounters(t *testing.T) {
	var r Receiver
	r.Stats.Frames.Add(10)
	r.Dropped.Add(3)
	r.DroppedBy[frame.ReasonVLAN].Add(2)
	r.DroppedBy[frame.ReasonNotUDP].Add(1)
	m := r.Counters()
	if m["frames"] != 10 || m["packets"] != 7 || m["dropped"] != 3 || m["dropped_vlan_tagged"] != 2 || m["dropped_not_udp"] != 1 {
		t.Errorf("%v", m)
	}
	if _, ok := m["dropped_fragmented"]; ok {
		t.Error("zero reasons listed")
	}
}
