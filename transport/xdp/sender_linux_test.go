//go:build linux

package xdp

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/internal/testnet"
	"github.com/ibvbridge/ibvbridge/internal/testutil"
)

// TestSenderJumboChains sends 8972-byte payloads with a Sender (AF_XDP TX) over a veth pair with MTU 9000
// into an AF_XDP Source: each frame leaves as a chain of three descriptors (XDP_USE_SG) and arrives
// byte-exact; a payload the MTU cannot carry is refused at open with ErrFrameTooLarge.
func TestSenderJumboChains(t *testing.T) {
	p := testutil.VethPair(t, testnet.VethConfig{RecvIf: ifA, SendIf: ifB, RecvAddr: addrA, SendAddr: addrB, MTU: 9000})
	sink := testutil.NewRecordingSink(true)
	src, stop := startSource(t, p, Config{Interface: ifA, Frames: 1024,
		Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.99.0.1:7148")}}, sink)
	defer stop()
	var mac [6]byte
	must(t, p.RecvNS, func() error {
		ifi, err := net.InterfaceByName(ifA)
		if err == nil {
			copy(mac[:], ifi.HardwareAddr)
		}
		return err
	})
	cfg := SendConfig{Interface: ifB, Dest: netip.MustParseAddrPort("10.99.0.1:7148"), DstMAC: mac, MaxPayload: 8972, Batch: 16}
	var s *Sender
	must(t, p.SendNS, func() (err error) {
		s, err = OpenSender(cfg)
		return err
	})
	defer s.Close()
	const n = 200
	ctx := context.Background()
	for i := range n {
		buf, err := s.Buffer(ctx)
		if err != nil {
			t.Fatal(err)
		}
		copy(buf, jumboPayload(i))
		if err := s.Commit(ctx, 8972); err != nil {
			t.Fatal(err)
		}
		if i%32 == 31 {
			time.Sleep(time.Millisecond) // content, not rate: stay inside the receiver's rings
		}
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// One kick per batch of 16 (XDP_MAX_TX_SKB_BUDGET lets copy mode take all 48 descriptors at once;
	// without it a batch needs two): the sender batches, it does not kick per packet.
	if st := s.Stats(); !st.MultiBuffer || st.Packets != n || st.Descs != 3*n || st.Bytes != n*8972 || st.Kicks > 2*n/16+2 {
		t.Fatalf("sender stats %+v: want %d packets as chains of 3 descriptors, about one kick per 16", st, n)
	}
	if !sink.WaitCount(n, 10*time.Second) {
		t.Fatalf("received %d of %d; source stats %+v", sink.Count(), n, src.Stats())
	}
	for i, got := range sink.Packets() {
		if !bytes.Equal(got, jumboPayload(i)) {
			t.Fatalf("packet %d differs from the one sent", i)
		}
	}
	cfg.MaxPayload = 9000
	err := testnet.InNetns(p.SendNS, func() error {
		s, err := OpenSender(cfg)
		if err == nil {
			s.Close()
		}
		return err
	})
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("9000-byte payloads over MTU 9000: %v, want ErrFrameTooLarge", err)
	}
}
