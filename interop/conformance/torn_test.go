package conformance_test

import (
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
)

func itoa(i int) string { return strconv.Itoa(i) }

// tornRace overruns a consumer paused mid-heap and lets it finish reading once its slot was reused (spec
// §7.7), with real processes: the consumer tool of consKind (--stop-first: it took heap 1, checked, and
// stopped before reading its bytes) on a drop ring of prodKind's producer; an independent consumer reads
// ahead, so the producer detaches the stopped one as overrun when the ring is full; that one is killed, the
// producer, with nobody attached, cycles every slot three times over and is then stopped (SIGSTOP) so the
// slot holds another heap's bytes while the paused consumer reads them. It returns the paused consumer's
// result.
func tornRace(t *testing.T, prodKind, consKind string, env ...string) result {
	t.Helper()
	const slots = 16
	p := startProducer(t, prodKind, prodOpts{heaps: 1 << 40, heapSize: 65536, slots: slots, policy: "drop", wait: 1, env: env})
	paused := startConsumer(t, consKind, p.sock(), "--stop-first")
	waitStopped(t, paused.pid())
	ahead := startConsumer(t, "go", p.sock())
	p.waitInfo(t, "the paused consumer's overrun", func(i *ring.Info) bool { return i.Counters["consumer_overruns"] >= 1 })
	ahead.cmd.Process.Kill()
	info := p.waitInfo(t, "no consumer attached", func(i *ring.Info) bool { return i.Counters["consumers_attached"] == 0 })
	p.waitInfo(t, "every slot reused", func(i *ring.Info) bool { return i.Head-info.Head >= 3*slots })
	p.cmd.Process.Signal(syscall.SIGSTOP)
	waitStopped(t, p.pid())
	paused.cmd.Process.Signal(syscall.SIGCONT)
	// A consumer that took the reused bytes for its heap's goes on reading a ring frozen under it: the
	// producer's death ends it.
	timer := time.AfterFunc(3*time.Second, func() { p.cmd.Process.Kill() })
	defer timer.Stop()
	return paused.wait(t)
}

// overrunSeen reports whether the paused consumer told its heap invalid: it counted the heap it read as
// overrun (never as verified, never as a verify error) and then stopped with the overrun (exit 4).
func overrunSeen(r result) bool {
	return r.OverrunHeaps == 1 && r.VerifyErrors == 0 && r.Result == "overrun" && r.exitCode == 4
}

// TestPausedConsumerNeverVerifiesAReusedSlot (spec §7.7, with real processes and real overruns): for every
// producer (Go, C, Python) and every consumer tool (Go, C, Python), a consumer paused mid-heap whose slot
// the producer reuses after detaching it reads another heap's bytes, and reports the heap invalid
// (overrun_heaps 1, exit 4), never a verified heap and never a verify error.
func TestPausedConsumerNeverVerifiesAReusedSlot(t *testing.T) {
	for _, prod := range producerKinds {
		for _, cons := range consumerKinds {
			t.Run(prod+"-producer/"+cons+"-consumer", func(t *testing.T) {
				if r := tornRace(t, prod, cons); !overrunSeen(r) {
					t.Errorf("paused consumer: %+v (exit %d, stderr %q): want its heap counted overrun, exit 4",
						r.ConsumeResult, r.exitCode, r.stderr)
				}
			})
		}
	}
}

// TestTornHeapRaceCatchesRowWrittenAfterReuse: the race above fails for each producer built to write a
// detached consumer's row after reusing its slots (mutant row-late): the paused consumer, still
// attached by its row, verifies another heap's bytes as its own (a verify error).
func TestTornHeapRaceCatchesRowWrittenAfterReuse(t *testing.T) {
	t.Parallel() // mostly waiting on processes: beside another test
	for _, prod := range producerKinds {
		t.Run(prod+"-producer", func(t *testing.T) {
			r := tornRace(t, prod, "go", mutantEnv+"=row-late")
			if overrunSeen(r) || r.VerifyErrors == 0 {
				t.Errorf("with the row written after the reuse, the paused consumer reported %+v (exit %d): the race did not catch it",
					r.ConsumeResult, r.exitCode)
			}
		})
	}
}
