package ring_test

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/internal/ringsim"
	"github.com/ibvbridge/ibvbridge/ring"
)

// replayProducer is the Go producer as the simulation's replay stream plays it: created per scenario,
// consumers admitted without sockets, block publishes tried without waiting.
type replayProducer struct {
	dir     string
	p       *ring.Producer
	s       ringsim.Scenario
	pendEOS bool
}

func (r *replayProducer) Create(s ringsim.Scenario) error {
	r.Close()
	p, err := ring.Create("sim", ring.Config{SlotCount: int(s.Slots), SlotSize: 64, MaxItems: 1, MetaSize: 4096,
		Policy: ring.Policy(s.Policy), HugePages: ring.HugePagesOff, Dir: r.dir, MaxConsumers: s.Rows,
		MaxObservers: 16, InitialPosition: s.P0, NoHeartbeat: true})
	r.p, r.s = p, s
	return err
}

func (r *replayProducer) Attach(group uint32, minor uint16, start uint32) (int, uint32, int, []byte) {
	row, gen, region, st := r.p.AdmitForTest(group, minor, start)
	return row, gen, int(st), region
}

func (r *replayProducer) Gone(row int) { r.p.GoneForTest(row) }

func (r *replayProducer) Publish(eos bool) ringsim.Result {
	if r.s.Policy == ringsim.Block && !r.p.SlotNowForTest() {
		r.pendEOS = eos
		return ringsim.Pending
	}
	if eos {
		if err := r.p.PublishEndOfStream(0, 0); err != nil {
			if errors.Is(err, ring.ErrFull) {
				return ringsim.Full
			}
			panic(err)
		}
		return ringsim.Published
	}
	s, err := r.p.Acquire()
	if errors.Is(err, ring.ErrFull) {
		r.p.Add(ring.CounterDroppedHeaps, 1) // the caller counts what it drops (as recv does)
		return ringsim.Dropped
	}
	if err != nil {
		panic(err)
	}
	if err := r.p.Publish(s, ring.HeapInfo{HeapCnt: 1, Flags: ring.FlagComplete}); err != nil {
		panic(err)
	}
	return ringsim.Published
}

func (r *replayProducer) Retry() ringsim.Result {
	if !r.p.SlotNowForTest() {
		return ringsim.Pending
	}
	return r.Publish(r.pendEOS)
}

func (r *replayProducer) ReadCursors() { r.p.UnreadHeaps() }

func (r *replayProducer) Free() int {
	r.p.Unread()
	return r.p.FreeSlots()
}

func (r *replayProducer) Ctl() []byte { return ring.CtlForTest(r.p) }

func (r *replayProducer) Assign(q uint64) uint64 { return r.p.AssignForTest(q) }

func (r *replayProducer) Close() {
	if r.p != nil {
		r.p.Interrupt()
		r.p.Close()
		r.p = nil
	}
}

// replay plays the replay stream of seeds (stepsPer steps each), passed through corrupt when not nil,
// against the Go producer until maxSteps steps have been played (0: every seed). A difference is err.
func replay(t *testing.T, seeds func(yield func(uint64) bool), stepsPer, maxSteps int, corrupt func(io.Writer) io.Writer) (steps, scenarios, cut int, err error) {
	t.Helper()
	pr, pw := io.Pipe()
	gen := make(chan error, 1)
	go func() {
		var w io.Writer = pw
		if corrupt != nil {
			w = corrupt(pw)
		}
		_, _, err := ringsim.WriteReplay(w, seeds, stepsPer)
		pw.CloseWithError(err)
		gen <- err
	}()
	steps, scenarios, cut, err = ringsim.PlayReplay(pr, &replayProducer{dir: t.TempDir()}, maxSteps)
	pr.Close()
	if gerr := <-gen; gerr != nil && !errors.Is(gerr, io.ErrClosedPipe) {
		t.Fatalf("the model: %v", gerr)
	}
	return steps, scenarios, cut, err
}

// flipNth passes a replay stream through, adding one to the expected value of its nth record of kind.
type flipNth struct {
	w    io.Writer
	kind byte
	n    int
	buf  []byte
}

func (f *flipNth) Write(b []byte) (int, error) {
	f.buf = append(f.buf, b...)
	k := len(f.buf) / ringsim.RecordSize * ringsim.RecordSize
	for i := 0; i < k; i += ringsim.RecordSize {
		if f.buf[i] == f.kind {
			if f.n--; f.n == 0 {
				f.buf[i+8]++ // x: the expected value of an 'O' record
			}
		}
	}
	if _, err := f.w.Write(f.buf[:k]); err != nil {
		return 0, err
	}
	f.buf = append(f.buf[:0], f.buf[k:]...)
	return len(b), nil
}

// TestSimReplayNamesTheStepOfAChangedExpectation: one expected word changed in the stream, and the replay
// of the Go producer stops at it, naming seed and step (the checker checks).
func TestSimReplayNamesTheStepOfAChangedExpectation(t *testing.T) {
	_, _, _, err := replay(t, func(yield func(uint64) bool) { yield(3) }, 3000, 0,
		func(w io.Writer) io.Writer { return &flipNth{w: w, kind: ringsim.RecWord, n: 500} })
	var re *ringsim.ReplayError
	if !errors.As(err, &re) || re.Seed != 3 {
		t.Fatalf("a changed expectation: %v, want a difference in seed 3", err)
	}
	t.Logf("found: %s", strings.SplitN(err.Error(), "\n", 2)[0])
}

// TestSimReplayCatchesTheStaleOldestQueuedMutant: with the Go producer's guard against a member's oldest
// queued position a ring behind head removed (IBVBRIDGE_TEST_MUTANT=stale-oldest-queued), the replay of
// the scenario that found it fails.
func TestSimReplayCatchesTheStaleOldestQueuedMutant(t *testing.T) {
	ring.SetMutantForTest("stale-oldest-queued", true)
	t.Cleanup(func() { ring.SetMutantForTest("stale-oldest-queued", false) })
	_, _, _, err := replay(t, func(yield func(uint64) bool) { yield(169) }, 3000, 0, nil)
	var re *ringsim.ReplayError
	if !errors.As(err, &re) {
		t.Fatalf("the mutant passed the replay: %v", err)
	}
	t.Logf("found: %s", strings.SplitN(err.Error(), "\n", 2)[0])
}

// TestSimReplayFoundDefectsStayFixed replays the scenarios in which the replay found the Go producer
// differing from the model: seed 169, where a group member's oldest queued position, a ring behind head,
// was still trusted (its bookkeeping entry named a newer position) and a block publish waited with room in
// the window.
func TestSimReplayFoundDefectsStayFixed(t *testing.T) {
	steps, _, _, err := replay(t, func(yield func(uint64) bool) { yield(169) }, 3000, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if steps < 2600 {
		t.Fatalf("seed 169: %d steps played, want the 2600 past the defect", steps)
	}
}

// TestSimReplayGoProducer plays the simulation's replay stream against the Go producer: the model plays
// seeded scenarios (every invariant checked after every step) and the producer, in this process, gives
// the model's answer to every call, or the test names the seed and step that differ (replay them in
// lockstep: SIM_TARGETS=go go test ./internal/ringsim -run 'TestSimProducers$' -seed S -steps N).
func TestSimReplayGoProducer(t *testing.T) {
	want := ringsim.ReplaySteps()
	start := time.Now()
	steps, scenarios, cut, err := replay(t, func(yield func(uint64) bool) {
		for s := uint64(1); yield(s); s++ { // until the replay has played enough and closes the pipe
		}
	}, 3000, want, nil)
	if err != nil {
		t.Fatal(err)
	}
	el := time.Since(start)
	t.Logf("Go producer: %d steps of %d scenarios (%d cut short) replayed in %v (%.0f steps/s)", steps, scenarios, cut, el.Round(time.Millisecond), float64(steps)/el.Seconds())
	if steps < want {
		t.Fatalf("%d steps replayed, want %d", steps, want)
	}
}
