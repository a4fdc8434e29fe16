package udp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/internal/testutil"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/transport"
)

func openHeapSender(t *testing.T, dest transport.Endpoint, rate float64) *HeapSender {
	return openHeapSenderGSO(t, dest, rate, false)
}

func openHeapSenderGSO(t *testing.T, dest transport.Endpoint, rate float64, gso bool) *HeapSender {
	t.Helper()
	enc, err := spead.NewEncoder(spead.Flavour64_48, 1472)
	if err != nil {
		t.Fatal(err)
	}
	hs, err := OpenHeapSender(HeapSenderConfig{Encoder: enc, Batch: 8, Rate: rate, GSO: gso,
		SenderConfig: SenderConfig{Dest: netip.AddrPortFrom(dest.Addr, dest.Port)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hs.Close() })
	return hs
}

// TestHeapSenderStream sends a whole stream through SendStream to a socket source, with and without GSO:
// every packet the sender counts arrives as its own datagram of the right size, and the totals add up.
func TestHeapSenderStream(t *testing.T) {
	for _, gso := range []bool{false, true} {
		t.Run(fmt.Sprintf("gso=%v", gso), func(t *testing.T) {
			src := loopback(t, 1, Config{})
			sink := testutil.NewRecordingSink(false)
			stop := run(t, src, sink)
			defer stop()
			hs := openHeapSenderGSO(t, src.LocalEndpoints()[0], 0, gso)
			if hs.GSOActive() != gso {
				t.Fatalf("GSO active %v, asked %v (this kernel has UDP_SEGMENT)", hs.GSOActive(), gso)
			}
			payload := make([]byte, 10000) // 7 packets of 1472 bytes at most, the last one shorter
			h := spead.Heap{Items: []spead.Item{{ID: 0x1000, Data: payload}}}
			sent, err := transport.SendStream(context.Background(), hs, 20, func(cnt uint64) *spead.Heap { h.Cnt = cnt; return &h }, true)
			if err != nil || sent != 20 {
				t.Fatalf("sent %d heaps, err %v", sent, err)
			}
			tot := hs.Totals()
			if tot.Packets != 20*7+1 || tot.Start.IsZero() {
				t.Fatalf("totals %+v: want %d packets", tot, 20*7+1)
			}
			waitCount(t, sink, int(tot.Packets))
			// The source counts a read's bytes after handing its datagrams over: wait for the count too.
			testutil.WaitFor(5*time.Second, func() bool { return src.Stats().Bytes >= tot.Bytes })
			if st := src.Stats(); st.Bytes != tot.Bytes || st.Truncated != 0 {
				t.Errorf("received %d bytes (%d truncated), sender counted %d", st.Bytes, st.Truncated, tot.Bytes)
			}
		})
	}
}

// cutRuns groups consecutive packets of one length into GSO runs; a shorter packet ends a run, and so do
// the segment and byte limits.
func TestHeapSenderGSORuns(t *testing.T) {
	hs := &HeapSender{gso: true}
	mk := func(lens ...int) {
		hs.pkts = hs.pkts[:0]
		for _, n := range lens {
			hs.pkts = append(hs.pkts, make([]byte, n))
		}
	}
	shape := func() string {
		var out []string
		for _, r := range hs.cutRuns() {
			var l []string
			for _, p := range r {
				l = append(l, fmt.Sprint(len(p)))
			}
			out = append(out, strings.Join(l, "+"))
		}
		return strings.Join(out, " ")
	}
	mk(10, 10, 4, 10, 10, 10, 7, 8, 8, 8)
	if got, want := shape(), "10+10+4 10+10+10+7 8+8+8"; got != want {
		t.Errorf("runs %q, want %q", got, want)
	}
	lens := make([]int, 70)
	for i := range lens {
		lens[i] = 100
	}
	mk(lens...)
	if runs := hs.cutRuns(); len(runs) != 2 || len(runs[0]) != MaxGSOSegments {
		t.Errorf("70 equal packets: %d runs, first %d long; want 2, %d", len(runs), len(runs[0]), MaxGSOSegments)
	}
	for i := range lens[:10] {
		lens[i] = 9000
	}
	mk(lens[:10]...)
	if runs := hs.cutRuns(); len(runs[0]) != MaxGSOBytes/9000 {
		t.Errorf("9000-byte packets: runs of %d, want %d (the byte limit)", len(runs[0]), MaxGSOBytes/9000)
	}
}

// TestHeapSenderPacing checks the token bucket's lower bound, which holds however loaded the machine is:
// bytes sent by time t never exceed rate·t plus the one batch that may leave at once.
func TestHeapSenderPacing(t *testing.T) {
	src := loopback(t, 1, Config{})
	sink := testutil.NewRecordingSink(false)
	stop := run(t, src, sink)
	defer stop()
	const rate = 40e6 // bits/s
	hs := openHeapSender(t, src.LocalEndpoints()[0], rate)
	h := spead.Heap{Items: []spead.Item{{ID: 0x1000, Data: make([]byte, 1400)}}}
	start := time.Now()
	if _, err := transport.SendStream(context.Background(), hs, 100, func(cnt uint64) *spead.Heap { h.Cnt = cnt; return &h }, false); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	tot := hs.Totals()
	batchBytes := float64(tot.Bytes) / float64(tot.Packets) * 8 // the sender's batch is 8 packets
	if min := time.Duration((float64(tot.Bytes) - batchBytes) * 8 / rate * float64(time.Second)); elapsed < min {
		t.Errorf("%d bytes in %v at %g b/s: faster than the rate allows (at least %v)", tot.Bytes, elapsed, rate, min)
	}
}

// TestHeapSenderCancelEndsPacingWait: a rate so low that the next batch is due in years still stops at
// once when the context is cancelled (send --rate 1e-12 and Ctrl-C).
func TestHeapSenderCancelEndsPacingWait(t *testing.T) {
	hs := openHeapSender(t, transport.Endpoint{Addr: netip.MustParseAddr("127.0.0.1"), Port: 9}, 1e-3)
	h := spead.Heap{Items: []spead.Item{{ID: 0x1000, Data: make([]byte, 1400)}}}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	var err error
	for cnt := uint64(1); cnt < 100 && err == nil; cnt++ {
		h.Cnt = cnt
		err = hs.SendHeap(ctx, &h)
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("cancel took %v to end the wait", d)
	}
}

// TestHeapSenderStopHeapAfterCancelledFlush: Ctrl-C of a paced send cancels a flush with the batch full;
// the drain then sends that batch and the stream-stop heap, unpaced, and they arrive (the stop heap used to
// index past the batch buffers and panic, or wait centuries for its pacing at a tiny rate).
func TestHeapSenderStopHeapAfterCancelledFlush(t *testing.T) {
	src := loopback(t, 1, Config{})
	sink := testutil.NewRecordingSink(true)
	stop := run(t, src, sink)
	defer stop()
	hs := openHeapSender(t, src.LocalEndpoints()[0], 1e-3) // the second batch is due in hours
	h := spead.Heap{Items: []spead.Item{{ID: 0x1000, Data: make([]byte, 4*1400)}}}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel) // heaps 1-2 left in the first batch; 3-4 wait in the second
	sent, err := transport.SendStream(ctx, hs, 10, func(cnt uint64) *spead.Heap { h.Cnt = cnt; return &h }, true)
	if err != nil {
		t.Fatalf("interrupted stream: %v", err)
	}
	// The first batch left at once; the second, full, waited for its time when the cancel came: it leaves
	// in the drain, and the stop heap after it.
	tot := hs.Totals()
	if sent < 2 || len(hs.pkts) != 0 || tot.Packets != 2*uint64(cap(hs.pkts))+1 {
		t.Fatalf("%d heaps, %d packets sent, %d still queued: want two full batches and the stop heap", sent, tot.Packets, len(hs.pkts))
	}
	waitCount(t, sink, int(tot.Packets))
	pkts := sink.Packets()
	var last spead.Packet
	if err := spead.Decode(pkts[len(pkts)-1], &last); err != nil || !last.IsStreamStop() {
		t.Fatalf("%d packets arrived, the last not the stream stop (%v)", len(pkts), err)
	}
}

func TestHeapSenderRejectsBadRates(t *testing.T) {
	enc, _ := spead.NewEncoder(spead.Flavour64_48, 1472)
	for _, r := range []float64{-1, math.NaN(), math.Inf(1)} {
		_, err := OpenHeapSender(HeapSenderConfig{Encoder: enc, Rate: r,
			SenderConfig: SenderConfig{Dest: netip.MustParseAddrPort("127.0.0.1:9")}})
		if err == nil {
			t.Errorf("rate %g accepted", r)
		}
	}
}

// TestGROReceive: a GSO sender's runs reach a GRO socket as multi-datagram messages (on loopback the
// kernel hands the super-packet over whole), and the source cuts them back into exactly the datagrams sent.
func TestGROReceive(t *testing.T) {
	for _, gro := range []bool{false, true} {
		t.Run(fmt.Sprintf("gro=%v", gro), func(t *testing.T) {
			src := loopback(t, 1, Config{GRO: gro})
			sink := testutil.NewRecordingSink(true)
			stop := run(t, src, sink)
			defer stop()
			hs := openHeapSenderGSO(t, src.LocalEndpoints()[0], 0, true)
			payload := make([]byte, 10000)
			for i := range payload {
				payload[i] = byte(i)
			}
			h := spead.Heap{Items: []spead.Item{{ID: 0x1000, Data: payload}}}
			if _, err := transport.SendStream(context.Background(), hs, 30, func(cnt uint64) *spead.Heap { h.Cnt = cnt; return &h }, true); err != nil {
				t.Fatal(err)
			}
			tot := hs.Totals()
			waitCount(t, sink, int(tot.Packets))
			var bytes uint64
			for _, p := range sink.Packets() {
				if len(p) > 1472 {
					t.Fatalf("a %d-byte packet: GRO messages were not cut back into datagrams", len(p))
				}
				bytes += uint64(len(p))
			}
			testutil.WaitFor(5*time.Second, func() bool { return src.Stats().Packets >= tot.Packets }) // counted after the hand-over
			st := src.Stats()
			if bytes != tot.Bytes || st.Packets != tot.Packets {
				t.Errorf("received %d packets, %d bytes; sent %d, %d", st.Packets, bytes, tot.Packets, tot.Bytes)
			}
			if gro && st.Coalesced == 0 || !gro && st.Coalesced != 0 {
				t.Errorf("gro=%v: %d datagrams arrived coalesced", gro, st.Coalesced)
			}
		})
	}
}
