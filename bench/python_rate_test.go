package bench

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
)

// playSearch runs a rate search against a receiver that loses heaps above limit and a sender that cannot
// go above senderMax, and returns its row.
func playSearch(t *testing.T, o PyRateOptions, limit, senderMax float64) PyRateRow {
	t.Helper()
	s := newRateSearch("r", o)
	for n := 0; ; n++ {
		if n > 100 {
			t.Fatalf("the search does not end: %+v", s.row)
		}
		rate, ok := s.next()
		if !ok {
			return s.row
		}
		if rate > o.Cap || rate <= 0 {
			t.Fatalf("probe at %v heaps/s: outside (0, cap %v]", rate, o.Cap)
		}
		sent := min(rate, senderMax)
		p := PyRateProbe{HeapsPerSec: rate, SentPerSec: sent, Runs: 2, Lossless: 2}
		if sent > limit {
			p.Lossless = 1
		}
		s.record(p)
	}
}

func TestRateSearchEndsWithinFivePercentOfWhereLossBegins(t *testing.T) {
	for _, limit := range []float64{10_000, 23_000, 115_000, 217_000, 999_000} {
		row := playSearch(t, DefaultPyRate, limit, math.Inf(1))
		if row.Highest > limit || row.LowestLossy <= limit {
			t.Errorf("limit %v: highest %v, lowest lossy %v: want highest ≤ limit < lowest lossy", limit, row.Highest, row.LowestLossy)
		}
		if row.LowestLossy/row.Highest > 1.053 {
			t.Errorf("limit %v: highest %v, lowest lossy %v: a gap of more than 5 %% after %d refining probes", limit,
				row.Highest, row.LowestLossy, DefaultPyRate.Refine)
		}
		if len(row.Probes) > 16 {
			t.Errorf("limit %v: %d probes", limit, len(row.Probes))
		}
	}
}

func TestRateSearchSaysWhenNothingOrEverythingWasLossless(t *testing.T) {
	row := playSearch(t, DefaultPyRate, 5_000, math.Inf(1))
	if row.Highest != 0 || row.LowestLossy != DefaultPyRate.From || len(row.Probes) != 1 {
		t.Errorf("a receiver lossy from the first probe: %+v", row)
	}
	row = playSearch(t, DefaultPyRate, math.Inf(1), math.Inf(1))
	if row.Highest != DefaultPyRate.Cap || row.LowestLossy != 0 || row.SenderBehindAt != 0 {
		t.Errorf("a receiver lossless up to the cap: %+v", row)
	}
}

func TestRateSearchStopsWhereTheSenderFallsBehind(t *testing.T) {
	// The receiver would take 300 k heaps/s; the sender cannot pass 140 k. The search must not call a
	// probe the sender did not keep lossless at the asked rate.
	row := playSearch(t, DefaultPyRate, 300_000, 140_000)
	if row.SenderBehindAt <= 140_000 || row.Highest > 140_000 || row.Highest == 0 || row.LowestLossy != 0 {
		t.Errorf("sender-limited search: %+v", row)
	}
}

// A loop whose stream never ends (its stream stop lost with other heaps) is stopped by the harness and
// still reports what it saw, marked interrupted, so the run counts as lossy instead of failing the benchmark.
func TestPyLoopStoppedBeforeItsStreamEndsReportsWhatItSaw(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	pkg, err := FindTool("IBVBRIDGE_PYTHON_CLIENT", "clients/python")
	if err != nil {
		t.Skipf("the Python client: %v", err)
	}
	name := "pyloop-interrupted"
	p, err := ring.Create(name, ring.Config{SlotCount: 64, SlotSize: 4096, MaxItems: 4, Policy: ring.PolicyBlock})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	script := filepath.Join(t.TempDir(), "pyloop.py")
	if err := os.WriteFile(script, []byte(pyLoop), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	loop, err := startPyLoop(ctx, PyOptions{Python: "/usr/bin/python3"}, pkg, func() bool { return p.Consumers() > 0 }, script, "ibvbridge", "heaps", name)
	if err != nil {
		t.Fatal(err)
	}
	defer loop.r.kill()
	for cnt := uint64(1); cnt <= 3; cnt++ {
		s, err := p.Acquire()
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Publish(s, ring.HeapInfo{HeapCnt: cnt}); err != nil {
			t.Fatal(err)
		}
	}
	lr, _, err := loop.result(0)
	if err != nil {
		t.Fatal(err)
	}
	if !lr.Interrupted || lr.Heaps != 3 {
		t.Fatalf("loop result %+v: want 3 heaps seen and interrupted", lr)
	}
	var run PyRun
	run.Lossless = true
	run.noteInterrupted(lr)
	if run.Lossless || !strings.Contains(run.Detail, "stream stop") {
		t.Errorf("run %+v: want lossy, saying why", run)
	}
}
