package ringsim

import (
	"runtime"
	"testing"
)

// TestCorpusModel: every known-defect scenario passes against the model.
func TestCorpusModel(t *testing.T) {
	for _, c := range Corpus() {
		if _, err := Run(c.S, len(c.S.Ops), MutNone); err != nil {
			t.Errorf("%s (%s): %v", c.Name, c.Why, err)
		}
	}
}

// TestCorpusProducers: every known-defect scenario passes against the real producers (SIM_TARGETS);
// each fails against a 2.1 producer.
func TestCorpusProducers(t *testing.T) {
	for _, name := range targetNames() {
		t.Run(name, func(t *testing.T) {
			applyKnown(t, name)
			for _, c := range Corpus() {
				t.Run(c.Name, func(t *testing.T) {
					if _, err := Run(c.S, len(c.S.Ops), MutNone, realTarget(t, name, c.S)); err != nil {
						t.Errorf("%s: %v", c.Why, err)
					}
				})
			}
		})
	}
}

// TestCorpusIdleChurnRetainsNothing: members attaching and leaving on an idle Go ring (nothing
// published, no reclaim) leave nothing behind in the producer's memory (spec §14.7: settled at detach).
func TestCorpusIdleChurnRetainsNothing(t *testing.T) {
	s := Scenario{Slots: 8, Rows: 2, Policy: Drop}
	d, err := NewGoDriver(t.TempDir(), s)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Shutdown()
	churn := func(n int) {
		for range n {
			row, gen, _, st, err := d.Attach(corpusGroup, 2, 1, false)
			if err != nil || st != StatusOK {
				t.Fatalf("attach: status %d, %v", st, err)
			}
			if err := d.Close(row, gen); err != nil {
				t.Fatal(err)
			}
		}
	}
	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	churn(200) // warm up: the driver's and the producer's steady state
	before := heap()
	const n = 4000
	churn(n)
	grew := int64(heap()) - int64(before)
	t.Logf("heap grew %d bytes over %d idle member attach/detach cycles", grew, n)
	if grew > 64*n { // a retained departed member costs more than 64 bytes each
		t.Fatalf("heap grew %d bytes over %d idle member attach/detach cycles: departed members are retained", grew, n)
	}
}
