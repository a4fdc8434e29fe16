package ringsim

import (
	"errors"
	"testing"
	"time"
)

// TestMutationsCaught: each deliberate defect built into the model (Mutations) is caught by the
// simulation's checks — its corpus scenarios and seeded ones — within the short budget.
func TestMutationsCaught(t *testing.T) {
	for _, mut := range Mutations {
		t.Run(string(mut), func(t *testing.T) {
			start := time.Now()
			for _, c := range Corpus() {
				if _, err := Run(c.S, len(c.S.Ops), mut); err != nil {
					t.Logf("caught by corpus %s in %v: %v", c.Name, time.Since(start), firstLine(err))
					return
				}
			}
			for seed := uint64(1); time.Since(start) < 20*time.Second; seed++ {
				if _, err := Run(ScenarioFor(seed), 2000, mut); err != nil {
					t.Logf("caught by seed %d in %v: %v", seed, time.Since(start), firstLine(err))
					return
				}
			}
			t.Fatalf("mutation %s was not caught in %v", mut, time.Since(start))
		})
	}
}

func firstLine(err error) string {
	var f *Failure
	if errors.As(err, &f) {
		return f.Target + ": " + f.Msg
	}
	return err.Error()
}
