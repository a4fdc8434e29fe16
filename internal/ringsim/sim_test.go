package ringsim

import (
	"flag"
	"os"
	"strconv"
	"testing"
	"time"
)

var (
	flagSeed  = flag.Uint64("seed", 0, "ringsim: run only this seed (0: the budget's seeds)")
	flagSteps = flag.Int("steps", 0, "ringsim: steps per scenario (0: the budget's)")
)

func TestMain(m *testing.M) {
	flag.Parse()
	SetIgnore(os.Getenv("SIM_IGNORE"))
	NoWrap = os.Getenv("SIM_NO_WRAP") == "1"
	os.Exit(m.Run())
}

// budget is how long TestSim runs: SIM_SECONDS (make sim), else the short budget of make test.
func budget() time.Duration {
	if s, err := strconv.ParseFloat(os.Getenv("SIM_SECONDS"), 64); err == nil && s > 0 {
		return time.Duration(s * float64(time.Second))
	}
	if testing.Short() {
		return 2 * time.Second
	}
	return 15 * time.Second
}

// TestSim plays seeded scenarios against the model alone, every invariant checked after every step.
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
	var total, posSteps uint64
	seeds := 0
	start := time.Now()
	for seed := uint64(1); time.Now().Before(deadline); seed++ {
		m, err := Run(ScenarioFor(seed), steps, MutNone)
		if err != nil {
			t.Fatal(err)
		}
		total += uint64(steps)
		posSteps += m.steps
		seeds++
	}
	el := time.Since(start)
	t.Logf("model: %d scenarios, %d operations (%.0f/s), %d position steps (%.0f/s)", seeds, total, float64(total)/el.Seconds(), posSteps, float64(posSteps)/el.Seconds())
}

// TestLappedRuleAsWorded plays members that skip lapped descriptors as §14.4 words it (read = head −
// slot_count + 1) until a member skips a position of its own that is still queued for it.
func TestLappedRuleAsWorded(t *testing.T) {
	for seed := uint64(1); seed < 3000; seed++ {
		s := ScenarioFor(seed)
		s.LappedSpec = true
		if _, err := Run(s, 2000, MutNone); err != nil {
			t.Logf("found at seed %d: %v", seed, err)
			return
		}
	}
	t.Fatal("no scenario skipped a member's own position")
}
