//go:build linux

package xdp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ibvbridge/ibvbridge/frame"
	"github.com/ibvbridge/ibvbridge/internal/testnet"
	"github.com/ibvbridge/ibvbridge/internal/testutil"
)

// jumboPayload is jumbo packet i: 8972 bytes (a 9000-byte IPv4 datagram), its index then a pattern.
func jumboPayload(i int) []byte {
	b := make([]byte, 8972)
	binary.BigEndian.PutUint32(b, uint32(i))
	for j := 4; j < len(b); j++ {
		b[j] = byte(i*31 + j*7 + j>>8)
	}
	return b
}

// TestMultiBufferJumboFrames sends 8972-byte UDP payloads over a veth pair with MTU 9000: with 4096-byte
// UMEM frames each arrives as a chain of three descriptors (XDP_PKT_CONTD), and every payload must reach
// the sink whole and byte-exact, in native and generic XDP.
func TestMultiBufferJumboFrames(t *testing.T) {
	for _, mode := range []string{ModeNative, ModeGeneric} {
		t.Run(mode, func(t *testing.T) {
			p := testutil.VethPair(t, testnet.VethConfig{RecvIf: ifA, SendIf: ifB, RecvAddr: addrA, SendAddr: addrB, MTU: 9000})
			sink := testutil.NewRecordingSink(true)
			s, stop := startSource(t, p, Config{Interface: ifA, Mode: mode, Frames: 1024,
				Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.99.0.1:7148")}}, sink)
			if st := s.Stats(); !st.MultiBuffer {
				t.Fatalf("socket not bound with XDP_USE_SG on a 6.6+ kernel: %+v", st)
			}
			c := dial(t, p.SendNS, "10.99.0.1:7148")
			const n = 300
			for i := range n {
				if _, err := c.Write(jumboPayload(i)); err != nil {
					t.Fatal(err)
				}
				if i%32 == 31 {
					time.Sleep(time.Millisecond) // content, not rate: stay inside the rings
				}
			}
			if !sink.WaitCount(n, 10*time.Second) {
				t.Fatalf("received %d of %d jumbo packets; stats %+v", sink.Count(), n, s.Stats())
			}
			stop()
			for i, got := range sink.Packets() {
				if want := jumboPayload(i); !bytes.Equal(got, want) {
					t.Fatalf("packet %d: %d bytes, differs from the %d sent", i, len(got), len(want))
				}
			}
			st := s.Stats()
			if st.ChainFrames != n || st.Packets != n || st.RxDropped != 0 || st.ChainsDropped != 0 || st.Frames != 3*n {
				t.Fatalf("stats %+v: want %d chains of 3 descriptors, none dropped", st, n)
			}
		})
	}
}

// fakeXSK is an xsk whose rx and fill rings live in Go memory, for take's chain handling.
func fakeXSK(n uint32) (*xsk, *[4]atomic.Uint32) {
	var idx [4]atomic.Uint32 // rx prod, rx cons, fill prod, fill cons
	var flags atomic.Uint32
	x := &xsk{frameSize: 4096, nframes: n,
		rx:   &xskRing{prod: &idx[0], cons: &idx[1], flags: &flags, descs: make([]unix.XDPDesc, n), mask: n - 1},
		fill: &xskRing{prod: &idx[2], cons: &idx[3], flags: &flags, addrs: make([]uint64, n), mask: n - 1}}
	return x, &idx
}

// produce puts a frame of k descriptors on x's rx ring, as the kernel does (frame f's pieces at frames
// f*32+j).
func produce(x *xsk, idx *[4]atomic.Uint32, f, k int) {
	for j := range k {
		d := unix.XDPDesc{Addr: uint64(f*32+j)*4096 + 256, Len: 100}
		if j < k-1 {
			d.Options = unix.XDP_PKT_CONTD
		}
		x.rx.descs[idx[0].Load()&x.rx.mask] = d
		idx[0].Add(1)
	}
}

// TestTakeWholeChains: take hands over whole frames only — a chain cut by the end of the batch stays in
// the ring for the next call — and a chain longer than the batch is given back to the fill ring, counted
// once, with the frames around it intact.
func TestTakeWholeChains(t *testing.T) {
	x, idx := fakeXSK(256)
	produce(x, idx, 0, 3)
	produce(x, idx, 1, 3)
	produce(x, idx, 2, 1)
	out := make([]unix.XDPDesc, 5)
	n, dropped := x.take(out, len(out))
	if n != 3 || dropped != 0 || idx[1].Load() != 3 {
		t.Fatalf("first take: %d descriptors (%d dropped), consumer at %d; want one whole 3-piece frame", n, dropped, idx[1].Load())
	}
	n, _ = x.take(out, len(out))
	if n != 4 || out[2].Options != 0 || out[3].Addr != 2*32*4096+256 {
		t.Fatalf("second take: %d descriptors %+v; want the second chain and the single frame", n, out[:n])
	}
	// A 7-piece chain with a batch of 5: dropped, its frames back in the fill ring, then a 2-piece frame.
	produce(x, idx, 3, 7)
	produce(x, idx, 4, 2)
	fillBefore := idx[2].Load()
	n, dropped = x.take(out, len(out))
	if dropped != 1 || n != 2 || out[0].Addr != 4*32*4096+256 || idx[2].Load()-fillBefore != 7 {
		t.Fatalf("take over a long chain: %d descriptors, %d dropped, %d frames refilled; want 2, 1, 7", n, dropped, idx[2].Load()-fillBefore)
	}
	if got := x.fill.addrs[fillBefore&x.fill.mask]; got != 3*32*4096 {
		t.Fatalf("refilled frame address %#x, want the chain's first frame %#x", got, 3*32*4096)
	}
	// A chain whose end the kernel has not published yet is left alone.
	x.rx.descs[idx[0].Load()&x.rx.mask] = unix.XDPDesc{Addr: 5 * 32 * 4096, Len: 100, Options: unix.XDP_PKT_CONTD}
	idx[0].Add(1)
	if n, _ = x.take(out, len(out)); n != 0 || idx[1].Load() != idx[0].Load()-1 {
		t.Fatalf("took %d descriptors of an unfinished chain", n)
	}
}

// TestTruncatedChainCounted: a chain whose pieces hold fewer bytes than its IPv4 header says is counted as
// truncated and none of it reaches the sink.
func TestTruncatedChainCounted(t *testing.T) {
	const payloadLen = 8972
	b := frame.Builder{Header: frame.Header{SrcIP: addrB, DstIP: addrA, SrcPort: 1, DstPort: 7148, TTL: 64}}
	whole := make([]byte, frame.HeaderLen+payloadLen)
	if err := b.Build(whole, payloadLen); err != nil {
		t.Fatal(err)
	}
	copy(whole[frame.HeaderLen:], jumboPayload(1))
	sink := testutil.NewRecordingSink(true)
	s := &Source{region: make([][]byte, 1), scratch: make([]byte, frame.MaxPayloadLen), q: &queue{}}
	feed := func(pieces ...[]byte) {
		s.chain.n, s.chain.len = 0, 0
		for _, p := range pieces {
			s.chain.frags[s.chain.n] = p
			s.chain.n++
			s.chain.len += len(p)
		}
		s.deliverChain(sink, nil, false)
	}
	feed(whole[:3840], whole[3840:7680]) // the last piece missing
	if sink.Count() != 0 || s.skipped[frame.ReasonTruncated].Load() != 1 {
		t.Fatalf("truncated chain: %d packets delivered, %d counted truncated; want 0 and 1", sink.Count(), s.skipped[frame.ReasonTruncated].Load())
	}
	feed(whole[:3840], whole[3840:7680], whole[7680:])
	if sink.Count() != 1 || !bytes.Equal(sink.Packets()[0], jumboPayload(1)) {
		t.Fatal("whole chain not delivered byte-exact")
	}
}

// TestSocketBusyPollOptions: SO_PREFER_BUSY_POLL and SO_BUSY_POLL are set on the socket (read back with
// getsockopt), SO_BUSY_POLL_BUDGET is accepted, need_wakeup can be turned off, and traffic still arrives;
// a budget the kernel refuses fails Open with ErrBusyPoll naming the option.
func TestSocketBusyPollOptions(t *testing.T) {
	p := newVethPair(t)
	sink := testutil.NewRecordingSink(true)
	eps := []netip.AddrPort{netip.MustParseAddrPort("10.99.0.1:7148")}
	s, stop := startSource(t, p, Config{Interface: ifA, Endpoints: eps, NoNeedWakeup: true,
		SocketBusyPoll: BusyPoll{Prefer: true, Usecs: 25, Budget: 32}}, sink)
	defer stop()
	x := s.socks[0]
	for _, o := range []struct {
		name string
		opt  int
		want int
	}{{"SO_PREFER_BUSY_POLL", unix.SO_PREFER_BUSY_POLL, 1}, {"SO_BUSY_POLL", unix.SO_BUSY_POLL, 25}} {
		if got, err := unix.GetsockoptInt(x.fd, unix.SOL_SOCKET, o.opt); err != nil || got != o.want {
			t.Errorf("%s = %d (%v), want %d", o.name, got, err, o.want)
		}
	}
	if st := s.Stats(); st.NeedWakeup {
		t.Error("bound with XDP_USE_NEED_WAKEUP though NoNeedWakeup was set")
	}
	c := dial(t, p.SendNS, "10.99.0.1:7148")
	for i := range 50 {
		if _, err := c.Write(payload(0, i)); err != nil {
			t.Fatal(err)
		}
	}
	if !sink.WaitCount(50, 5*time.Second) {
		t.Fatalf("busy-polling socket received %d of 50", sink.Count())
	}
	stop()
	s.Close()

	err := testnet.InNetns(p.RecvNS, func() error {
		s, err := Open(Config{Interface: ifA, Endpoints: eps, SocketBusyPoll: BusyPoll{Budget: 1 << 17}}, nil)
		if err == nil {
			s.Close()
		}
		return err
	})
	if !errors.Is(err, ErrBusyPoll) || !strings.Contains(err.Error(), "SO_BUSY_POLL_BUDGET=131072") {
		t.Fatalf("budget 131072: %v, want ErrBusyPoll naming SO_BUSY_POLL_BUDGET", err)
	}
}

// TestNeedWakeupDefault: by default the socket is bound with XDP_USE_NEED_WAKEUP.
func TestNeedWakeupDefault(t *testing.T) {
	p := newVethPair(t)
	s, stop := startSource(t, p, Config{Interface: ifA, Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.99.0.1:7148")}},
		testutil.NewRecordingSink(false))
	defer stop()
	if st := s.Stats(); !st.NeedWakeup {
		t.Fatal("not bound with XDP_USE_NEED_WAKEUP")
	}
}
