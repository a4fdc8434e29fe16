//go:build linux

package xdp

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/rs/zerolog"

	"github.com/ibvbridge/ibvbridge/bench"
	"github.com/ibvbridge/ibvbridge/internal/testnet"
	"github.com/ibvbridge/ibvbridge/internal/testutil"
	"github.com/ibvbridge/ibvbridge/ring"
)

// TestUMEMInRingPacketArea registers the ring's packet area as the UMEM, as recv does, for each place the
// ring's data file can live, and checks frames land inside it.
func TestUMEMInRingPacketArea(t *testing.T) {
	for _, tc := range []struct {
		name string
		huge ring.HugePages
		dir  func(t *testing.T) string
	}{
		{"hugepages", ring.HugePagesRequire, func(t *testing.T) string { return t.TempDir() }},
		{"shm", ring.HugePagesOff, func(t *testing.T) string { return t.TempDir() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newVethPair(t)
			cfg := Config{Interface: ifA, Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.99.0.1:7148")}, Frames: 256}
			name := fmt.Sprintf("ibvb-xdp-test-%d-%s", os.Getpid(), tc.name)
			dir := tc.dir(t)
			prod, err := ring.Create(name, ring.Config{SlotCount: 4, SlotSize: 64 << 10, PacketArea: RequiredUMEM(cfg),
				HugePages: tc.huge, Dir: dir})
			if err != nil {
				if tc.huge == ring.HugePagesRequire {
					t.Skipf("no hugepages for the ring: %v", err)
				}
				t.Fatal(err)
			}
			t.Cleanup(func() {
				prod.Close()
				if err := ring.Remove(dir, name); err != nil {
					t.Errorf("remove ring %s: %v", name, err)
				}
			})
			area := prod.PacketArea()
			var logBuf bench.LockedBuffer
			log := zerolog.New(&logBuf)
			cfg.Log = &log
			var s *Source
			err = testnet.InNetns(p.RecvNS, func() (err error) {
				s, err = Open(cfg, area)
				return err
			})
			skipIfUnsupported(t, err)
			if err != nil {
				t.Fatalf("Open over the ring's packet area (%s, huge %v): %v", prod.SocketPath(), prod.Huge(), err)
			}
			defer s.Close()
			inArea := unsafe.SliceData(s.umem) == unsafe.SliceData(area)
			t.Logf("ring %s (hugepages %v): UMEM in packet area: %v", prod.SocketPath(), prod.Huge(), inArea)
			if !inArea && !strings.Contains(logBuf.String(), "UMEM allocated") {
				t.Fatalf("UMEM not in the packet area and no log line saying so:\n%s", logBuf.String())
			}
			sink := testutil.NewRecordingSink(true)
			done := make(chan error, 1)
			go func() { done <- s.Run(t.Context(), sink) }()
			c := dial(t, p.SendNS, "10.99.0.1:7148")
			for i := range 100 {
				c.Write(payload(0, i))
			}
			if !sink.WaitCount(100, 5*time.Second) {
				t.Fatalf("received %d of 100", sink.Count())
			}
			for i, got := range sink.Packets()[:100] {
				if !bytes.Equal(got, payload(0, i)) {
					t.Fatalf("packet %d differs", i)
				}
			}
			if inArea {
				// The frames really are in the ring's data file.
				want := payload(0, 99)
				if !bytes.Contains(area, want) {
					t.Fatal("last packet not found in the packet area")
				}
			}
			s.Close()
			<-done
		})
	}
}
