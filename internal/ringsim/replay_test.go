package ringsim

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// replayStepsPer is how many steps each replayed scenario has: long ones reach states the lockstep run's
// 300 never does (the defects the replay found were past step 2500).
const replayStepsPer = 3000

// replayProc plays the replay stream against a replayer program (argv, env added), on every core: each
// worker writes the scenarios of its own seeds to a replayer process of its own until the steps played
// reach want between them. It fails the test at the first difference a replayer reports.
func replayProc(t *testing.T, name string, argv, env []string, noWrap bool, want int) {
	t.Helper()
	if noWrap {
		wrap := NoWrap
		NoWrap = true
		t.Cleanup(func() { NoWrap = wrap })
	}
	workers := runtime.GOMAXPROCS(0)
	per := (want + workers - 1) / workers
	var steps, scenarios, cut atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, sc, c, err := replayOne(argv, env, uint64(1+w), uint64(workers), per)
			steps.Add(int64(s))
			scenarios.Add(int64(sc))
			cut.Add(int64(c))
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	el := time.Since(start)
	t.Logf("%s producer: %d steps of %d scenarios (%d cut short) replayed in %v by %d replayers (%.0f steps/s)",
		name, steps.Load(), scenarios.Load(), cut.Load(), el.Round(time.Millisecond), workers, float64(steps.Load())/el.Seconds())
	if int(steps.Load()) < want {
		t.Fatalf("%d steps replayed, want %d", steps.Load(), want)
	}
}

// replayOne writes the scenarios of seeds first, first+stride, … to one replayer process until their steps
// reach want, and reads its verdict.
func replayOne(argv, env []string, first, stride uint64, want int) (steps, scenarios, cut int, err error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(cmd.Environ(), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return 0, 0, 0, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, 0, 0, fmt.Errorf("start %s: %w", argv[0], err)
	}
	verdict := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		line := ""
		for sc.Scan() {
			if line == "" {
				line = sc.Text()
			}
		}
		verdict <- line
	}()
	written := 0
	seeds := func(yield func(uint64) bool) {
		for s := first; written < want && yield(s); s += stride {
			written += replayStepsPer
		}
	}
	_, _, gerr := WriteReplay(in, seeds, replayStepsPer)
	in.Close()
	line := <-verdict
	werr := cmd.Wait()
	if gerr != nil && !errors.Is(gerr, syscall.EPIPE) {
		return 0, 0, 0, fmt.Errorf("the model: %w", gerr)
	}
	if n, _ := fmt.Sscanf(line, "ok %d %d %d", &steps, &scenarios, &cut); n == 3 && werr == nil {
		return steps, scenarios, cut, nil
	}
	return 0, 0, 0, fmt.Errorf("%s: %s (%v); replay the seed in lockstep: SIM_TARGETS=<target> go test ./internal/ringsim -run 'TestSimProducers$' -seed S -steps N",
		argv[len(argv)-1], strings.TrimSpace(line), werr)
}

// TestSimReplayCProducer plays the replay stream against the C producer (clients/c/build/sim_replay), in
// its own process: every call of the harness answered as the model answers it, or the test names the
// seed and step that differ.
func TestSimReplayCProducer(t *testing.T) {
	bin := "../../clients/c/build/sim_replay"
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("IBVBRIDGE_REQUIRE_CLIENTS") == "1" {
			t.Fatalf("%v (make -C clients/c builds it)", err)
		}
		t.Skipf("the C replayer is not built (make -C clients/c): %v", err)
	}
	replayProc(t, "C", []string{bin}, nil, true, ReplaySteps())
}

// TestSimReplayPythonProducer plays the replay stream against the Python producer
// (clients/python/tests/sim_replay.py) in its own process.
func TestSimReplayPythonProducer(t *testing.T) {
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skipf("no %s: %v", py, err)
	}
	want := ReplaySteps()
	if v, err := strconv.Atoi(os.Getenv("SIM_REPLAY_PY_STEPS")); err == nil && v > 0 {
		want = v
	}
	replayProc(t, "Python", []string{py, "../../clients/python/tests/sim_replay.py"},
		[]string{"PYTHONPATH=../../clients/python"}, false, want)
}
