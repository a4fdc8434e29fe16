//go:build linux

package xdp

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/internal/testnet"
	"github.com/ibvbridge/ibvbridge/internal/testutil"
	"github.com/ibvbridge/ibvbridge/transport"
	"github.com/ibvbridge/ibvbridge/transport/udp"
)

// BenchmarkReceive blasts 1024-byte datagrams (sendmmsg, 64 a call) across the veth pair into a Source and
// reports the receive rate and the loss. Both ends share the machine's cores, so the sender's rate bounds
// the result; it measures the transport's overhead, not a NIC's.
//
//	go test -run '^$' -bench Receive -benchtime 2000000x ./transport/xdp
func BenchmarkReceive(b *testing.B) {
	for _, mode := range []string{ModeNative, ModeGeneric, "kernel-udp"} {
		b.Run(mode, func(b *testing.B) {
			p := newVethPair(b)
			var s interface {
				Run(context.Context, transport.Sink) error
				Close() error
			}
			var xs *Source
			err := testnet.InNetns(p.RecvNS, func() (err error) {
				if mode == "kernel-udp" { // the udp transport, for comparison
					s, err = udp.Open(udp.Config{Endpoints: []transport.Endpoint{{Addr: addrA, Port: 7148}}})
					return err
				}
				xs, err = Open(Config{Interface: ifA, Mode: mode, Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.99.0.1:7148")}}, nil)
				s = xs
				return err
			})
			skipIfUnsupported(b, err)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			sink := testutil.NewRecordingSink(false)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go s.Run(ctx, sink)
			var snd *udp.Sender
			must(b, p.SendNS, func() (err error) {
				snd, err = udp.NewSender(udp.SenderConfig{Dest: netip.MustParseAddrPort("10.99.0.1:7148")})
				return err
			})
			defer snd.Close()
			batch := make([][]byte, 64)
			for i := range batch {
				batch[i] = make([]byte, 1024)
			}
			snd.Send(batch[:1]) // ARP
			time.Sleep(100 * time.Millisecond)
			base := uint64(sink.Count())
			b.SetBytes(1024)
			b.ResetTimer()
			start := time.Now()
			for sent := 0; sent < b.N; sent += len(batch) {
				if err := snd.Send(batch[:min(len(batch), b.N-sent)]); err != nil {
					b.Fatal(err)
				}
			}
			sendDone := time.Since(start)
			last, lastChange := uint64(sink.Count()), time.Now()
			for uint64(b.N) > last-base && time.Since(lastChange) < 50*time.Millisecond {
				time.Sleep(time.Millisecond)
				if n := uint64(sink.Count()); n != last {
					last, lastChange = n, time.Now()
				}
			}
			elapsed := lastChange.Sub(start)
			b.StopTimer()
			got := last - base
			b.ReportMetric(float64(got)/elapsed.Seconds(), "rx_pkt/s")
			b.ReportMetric(float64(b.N)/sendDone.Seconds(), "tx_pkt/s")
			b.ReportMetric(100*float64(uint64(b.N)-got)/float64(b.N), "loss_%")
			if xs == nil {
				return
			}
			st := xs.Stats()
			b.Logf("N=%d received %d; kernel: rx_dropped %d rx_ring_full %d fill_empty %d; redirected %d",
				b.N, got, st.RxDropped, st.RxRingFull, st.RxFillRingEmpty, st.Redirected)
		})
	}
}
