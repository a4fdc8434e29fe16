package bench

import (
	"bytes"
	"strings"
	"testing"
)

// spead2_recv's totals (its output at the end of a 1430-heap stream) decide whether it lost anything.
func TestSpead2CountersDecideLossless(t *testing.T) {
	out := "Received 1430 heaps\nheaps: 1430\nincomplete_heaps_evicted: 0\nincomplete_heaps_flushed: 0\npackets: 168741\nbatches: 1925\n"
	sh := PeerShape{HeapSize: 1 << 20, PacketSize: 8972, RateGbps: 6, Heaps: 1430}
	if ok, detail := spead2Lossless([]byte(out), sh, SendResult{}); !ok || !strings.Contains(detail, "heaps 1430") {
		t.Errorf("every heap received: lossless %v (%s)", ok, detail)
	}
	for _, lossy := range []string{
		strings.Replace(out, "heaps: 1430", "heaps: 1429", 1),
		strings.Replace(out, "incomplete_heaps_evicted: 0", "incomplete_heaps_evicted: 2", 1),
		strings.Replace(out, "incomplete_heaps_flushed: 0", "incomplete_heaps_flushed: 1", 1),
		"Received 1430 heaps\n", // no counters: nothing proves the stream whole
	} {
		if ok, detail := spead2Lossless([]byte(lossy), sh, SendResult{}); ok {
			t.Errorf("lossless from %q (%s)", lossy, detail)
		}
	}
}

func TestSpead2SendSummaryParsed(t *testing.T) {
	sr, err := spead2Sender{}.Parse([]byte("Sent 1506224976 bytes in 2.01428 seconds, 5.98219 Gb/s\n"))
	if err != nil || sr.Bytes != 1506224976 || sr.Seconds != 2.01428 || sr.Gbps != 5.98219 {
		t.Errorf("parsed %+v, %v", sr, err)
	}
	if _, err := (spead2Sender{}).Parse([]byte("terminate called after throwing an instance of ...")); err == nil {
		t.Error("a failed spead2_send parsed")
	}
}

// The table puts each receiver's CPU beside the ratios to every reference: recv over spead2_recv, and with
// its consumer's CPU added.
func TestPrintPeerShowsRatiosWithAndWithoutTheConsumer(t *testing.T) {
	res := []PeerResult{{Shape: DefaultPeerShapes[0], Rows: []PeerRow{
		{Receiver: "recv, 64 slots", Kind: "recv", CPU: 0.25, ConsCPU: 0.05, Lossless: true},
		{Receiver: "spead2 4.4.1", Kind: "spead2", CPU: 0.5, Lossless: true},
		{Receiver: "floor", Kind: "floor", CPU: 0.1, Lossless: true},
	}}}
	var b bytes.Buffer
	PrintPeer(&b, res, 5)
	out := b.String()
	for _, want := range []string{"1 MiB heaps, 8972 B packets, 6 Gb/s, 1430 heaps: median of 5 runs",
		"0.50× (0.60×)", "2.50× (3.00×)", "0.300"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}
