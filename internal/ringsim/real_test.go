package ringsim

import (
	"os"
	"strings"
	"testing"
	"time"
)

// realTargets makes the drivers SIM_TARGETS names (default: go) for scenario s, shut down with the test.
func realTargets(t *testing.T, s Scenario) []Target {
	t.Helper()
	names := os.Getenv("SIM_TARGETS")
	if names == "" {
		names = "go"
	}
	var ts []Target
	for _, n := range strings.Split(names, ",") {
		var tg Target
		var err error
		switch n {
		case "go":
			tg, err = NewGoDriver(t.TempDir(), s)
		case "py":
			tg, err = NewProcDriver("py", []string{"/usr/bin/python3", "../../clients/python/tests/sim_driver.py"},
				[]string{"PYTHONPATH=../../clients/python"}, t.TempDir(), s)
		case "model", "":
			continue
		default:
			t.Fatalf("SIM_TARGETS: unknown target %q (go, c, py)", n)
		}
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, tg)
	}
	for _, tg := range ts {
		t.Cleanup(tg.Shutdown)
	}
	return ts
}

// TestSimProducers plays seeded scenarios against the real producers (SIM_TARGETS) and the model in
// lockstep: every outcome compared, every invariant checked on each, after every step.
func TestSimProducers(t *testing.T) {
	steps := 300
	if *flagSteps > 0 {
		steps = *flagSteps
	}
	if *flagSeed != 0 {
		s := ScenarioFor(*flagSeed)
		if _, err := Run(s, steps, MutNone, realTargets(t, s)...); err != nil {
			t.Fatal(err)
		}
		return
	}
	deadline := time.Now().Add(budget() / 2)
	start := time.Now()
	n := 0
	for seed := uint64(1); time.Now().Before(deadline); seed++ {
		s := ScenarioFor(seed)
		ok := t.Run("", func(t *testing.T) {
			if _, err := Run(s, steps, MutNone, realTargets(t, s)...); err != nil {
				t.Fatal(err)
			}
		})
		n += steps
		if !ok {
			break
		}
	}
	t.Logf("%d operations against %s in %v (%.0f/s)", n, os.Getenv("SIM_TARGETS"), time.Since(start), float64(n)/time.Since(start).Seconds())
}
