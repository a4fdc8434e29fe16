package ringsim

import (
	"flag"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var (
	flagSeed  = flag.Uint64("seed", 0, "ringsim: run only this seed (0: the budget's seeds)")
	flagSteps = flag.Int("steps", 0, "ringsim: steps per scenario (0: the budget's)")
)

func TestMain(m *testing.M) {
	if os.Getenv("RINGSIM_HELLO") != "" {
		helloChild()
	}
	flag.Parse()
	SetIgnore(os.Getenv("SIM_IGNORE"))
	NoWrap = os.Getenv("SIM_NO_WRAP") == "1"
	os.Exit(m.Run())
}

// budget is how long TestSim runs: SIM_SECONDS (make sim), else the short budget of make test (20 s;
// 2 s with -short). TestSimProducers runs half of it.
func budget() time.Duration {
	if s, err := strconv.ParseFloat(os.Getenv("SIM_SECONDS"), 64); err == nil && s > 0 {
		return time.Duration(s * float64(time.Second))
	}
	if testing.Short() {
		return 2 * time.Second
	}
	return 20 * time.Second
}

// TestSim plays seeded scenarios against the model alone, on every core (seeds interleaved), every
// invariant checked after every step. -seed N replays one scenario.
func TestSim(t *testing.T) {
	steps := 2000
	if *flagSteps > 0 {
		steps = *flagSteps
	}
	if *flagSeed != 0 {
		if _, err := Run(ScenarioFor(*flagSeed), steps, MutNone); err != nil {
			t.Fatal(err)
		}
		return
	}
	deadline := time.Now().Add(budget())
	workers := runtime.GOMAXPROCS(0)
	var ops, posSteps, seeds atomic.Uint64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seed := uint64(1 + w); time.Now().Before(deadline) && failed.Load() == nil; seed += uint64(workers) {
				m, err := Run(ScenarioFor(seed), steps, MutNone)
				if err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				ops.Add(uint64(steps))
				posSteps.Add(m.steps)
				seeds.Add(1)
			}
		}()
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		t.Fatal(*err)
	}
	el := time.Since(start).Seconds()
	t.Logf("model: %d scenarios, %d operations (%.0f/s), %d position steps (%.0f/s), %d workers, %.1f s",
		seeds.Load(), ops.Load(), float64(ops.Load())/el, posSteps.Load(), float64(posSteps.Load())/el, workers, el)
}

// TestLappedRuleAsFirstWorded: members that skip lapped descriptors as §14.4 first worded it (read =
// head − slot_count + 1) skip a position of their own still queued for them, which the ledger catches;
// the rule §14.4 has now, and the simulation's members use (read = head − slot_count), never does (TestSim).
func TestLappedRuleAsFirstWorded(t *testing.T) {
	for seed := uint64(1); seed < 3000; seed++ {
		s := ScenarioFor(seed)
		s.LappedSpec = true
		if _, err := Run(s, 2000, MutNone); err != nil {
			t.Logf("found at seed %d: %v", seed, firstLine(err))
			return
		}
	}
	t.Fatal("no scenario skipped a member's own position")
}
