package ring_test

import (
	"errors"
	"io"
	"os"
	"strconv"
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

// replaySteps is how many simulation steps TestSimReplayGoProducer plays: SIM_REPLAY_STEPS, else 10⁷ (2×10⁵
// with -short).
func replaySteps(t *testing.T) int {
	if v, err := strconv.Atoi(os.Getenv("SIM_REPLAY_STEPS")); err == nil && v > 0 {
		return v
	}
	if testing.Short() {
		return 200_000
	}
	return 10_000_000
}

// replay plays the replay stream of seeds (stepsPer steps each) against the Go producer until maxSteps
// steps have been played (0: every seed).
func replay(t *testing.T, seeds func(yield func(uint64) bool), stepsPer, maxSteps int) (steps, scenarios, cut int) {
	t.Helper()
	pr, pw := io.Pipe()
	gen := make(chan error, 1)
	go func() {
		_, _, err := ringsim.WriteReplay(pw, seeds, stepsPer)
		pw.CloseWithError(err)
		gen <- err
	}()
	steps, scenarios, cut, err := ringsim.PlayReplay(pr, &replayProducer{dir: t.TempDir()}, maxSteps)
	pr.Close()
	if gerr := <-gen; gerr != nil && !errors.Is(gerr, io.ErrClosedPipe) {
		t.Fatalf("the model: %v", gerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	return steps, scenarios, cut
}

// TestSimReplayFoundDefectsStayFixed replays the scenarios in which the replay found the Go producer
// differing from the model: seed 169, where a group member's oldest queued position, a ring behind head,
// was still trusted (its bookkeeping entry named a newer position) and a block publish waited with room in
// the window.
func TestSimReplayFoundDefectsStayFixed(t *testing.T) {
	steps, _, _ := replay(t, func(yield func(uint64) bool) { yield(169) }, 3000, 0)
	if steps < 2600 {
		t.Fatalf("seed 169: %d steps played, want the 2600 past the defect", steps)
	}
}

// TestSimReplayGoProducer plays the simulation's replay stream against the Go producer: the model plays
// seeded scenarios (every invariant checked after every step) and the producer, in this process, gives
// the model's answer to every call, or the test names the seed and step that differ (replay them in
// lockstep: SIM_TARGETS=go go test ./internal/ringsim -run 'TestSimProducers$' -seed S -steps N).
func TestSimReplayGoProducer(t *testing.T) {
	want := replaySteps(t)
	start := time.Now()
	steps, scenarios, cut := replay(t, func(yield func(uint64) bool) {
		for s := uint64(1); yield(s); s++ { // until the replay has played enough and closes the pipe
		}
	}, 3000, want)
	el := time.Since(start)
	t.Logf("Go producer: %d steps of %d scenarios (%d cut short) replayed in %v (%.0f steps/s)", steps, scenarios, cut, el.Round(time.Millisecond), float64(steps)/el.Seconds())
	if steps < want {
		t.Fatalf("%d steps replayed, want %d", steps, want)
	}
}
