package bench

import (
	"errors"
	"math"
	"testing"
)

// A model receiver that loses heaps above a capacity: the search must find a rate within 5 % below it,
// never report a lossy run as the maximum, and stay within its run budget.
func TestSearchLosslessFindsTheCapacity(t *testing.T) {
	const capacity, unpaced = 3.0, 10.0 // Gb/s
	runs := 0
	model := func(heaps uint64, rate float64) (UDPRun, error) {
		runs++
		sent := rate
		if rate == 0 {
			sent = unpaced
		}
		r := UDPRun{RateGbps: rate, SentGbps: sent, HeapsSent: heaps, Packets: heaps, Seconds: 1}
		r.HeapsCons = heaps
		if sent > capacity {
			r.HeapsCons = uint64(float64(heaps) * capacity / sent)
		}
		r.Lossless = r.HeapsCons == heaps
		return r, nil
	}
	o := UDPOptions{PacketSize: 8972, BytesPerRun: 64 << 20, Runs: 12, Label: "test"}
	res, err := searchLossless(o, 1<<20, model, Env{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.LosslessSeen || res.MaxGbps > capacity || res.MaxGbps < 0.9*capacity {
		t.Errorf("max lossless %.3f Gb/s, want just under %.1f", res.MaxGbps, capacity)
	}
	if runs > o.Runs || len(res.Runs) != runs {
		t.Errorf("%d runs made, %d recorded, budget %d", runs, len(res.Runs), o.Runs)
	}
	if math.Abs(res.UnpacedLoss-(1-capacity/unpaced)) > 0.01 || res.UnpacedGbps != unpaced {
		t.Errorf("unpaced %.2f Gb/s, loss %.3f", res.UnpacedGbps, res.UnpacedLoss)
	}
	// A receiver that keeps up unpaced needs one run.
	runs = 0
	o.Runs = 7
	res, _ = searchLossless(o, 1<<20, func(h uint64, r float64) (UDPRun, error) {
		runs++
		return UDPRun{SentGbps: 1, HeapsSent: h, HeapsCons: h, Lossless: true, Seconds: 1}, nil
	}, Env{})
	if runs != 1 || res.MaxGbps != 1 {
		t.Errorf("%d runs, max %.1f: want 1 run at the unpaced rate", runs, res.MaxGbps)
	}
	// A failing run is an error, not a result.
	boom := errors.New("recv died")
	if _, err := searchLossless(o, 1<<20, func(uint64, float64) (UDPRun, error) { return UDPRun{}, boom }, Env{}); !errors.Is(err, boom) {
		t.Errorf("err %v, want the run's", err)
	}
}

func TestMedianRing(t *testing.T) {
	runs := []RingResult{
		{HeapsPerS: 3, MemcpyRatio: 0.9, ChecksumOK: true},
		{HeapsPerS: 1, MemcpyRatio: 0.7, ChecksumOK: true, HeapsLost: 2},
		{HeapsPerS: 2, MemcpyRatio: 0.8, ChecksumOK: false},
	}
	m := MedianRing(runs)
	if m.HeapsPerS != 2 || m.MemcpyRatio != 0.8 || m.Runs != 3 {
		t.Errorf("medians %+v", m)
	}
	if m.ChecksumOK || m.HeapsLost != 2 {
		t.Errorf("a bad run's checksum or losses were hidden: %+v", m)
	}
}

func TestOptionsRefused(t *testing.T) {
	for _, o := range []UDPOptions{
		{HeapSizes: []int{8192}, PacketSize: 1, BytesPerRun: 1 << 20, Runs: 1},
		{HeapSizes: []int{8192}, PacketSize: 1472, BytesPerRun: 1 << 20, Runs: 0},
		{PacketSize: 1472, BytesPerRun: 1 << 20, Runs: 1},
		{HeapSizes: []int{8192}, PacketSize: 1472, BytesPerRun: 1 << 20, Runs: 1, ChunkAxis: 4}, // no ChunkHeaps
		{HeapSizes: []int{8192}, PacketSize: 1472, BytesPerRun: 1 << 20, Runs: 1, ChunkHeaps: 8, ChunkAxis: -1},
	} {
		if err := o.check(); !errors.Is(err, ErrBadOption) {
			t.Errorf("%+v: %v, want ErrBadOption", o, err)
		}
	}
	if _, err := ConsumerCommand(Env{}, "fortran", "r", 0); !errors.Is(err, ErrBadOption) {
		t.Errorf("unknown consumer kind: %v", err)
	}
	o := RingOptions{HeapSize: 64, Repeat: -1}
	if err := o.setDefaults(); !errors.Is(err, ErrBadOption) {
		t.Errorf("repeat -1: %v", err)
	}
}
