package conformance_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
)

// interruptBound is how long an interrupted producer may take to return from its wait and exit; its wait
// slice is made longer (interruptSlice), so only the interrupt's wake can end the wait within the bound.
const (
	interruptBound = 2 * time.Second
	interruptSlice = "10000" // ms
)

// interruptBlocked starts a block producer of kind whose only consumer stopped holding its first heap, waits
// until the producer has been blocked 1.2 s and sleeps on a shared futex (the consumer's release futex,
// spec §7.4), closes the
// producer's standard input (its other thread calls interrupt) and reports whether the producer returned
// from the wait (it prints "interrupted") and exited within interruptBound.
func interruptBlocked(t *testing.T, kind string, env ...string) bool {
	t.Helper()
	const slots = 16
	p := startProducer(t, kind, prodOpts{heaps: 1 << 40, heapSize: 4096, slots: slots, policy: "block", wait: 1,
		interruptOnEOF: true, env: append(env, sliceEnv+"="+interruptSlice)})
	c := startConsumer(t, "go", p.sock(), "--stop-first")
	waitStopped(t, c.pid())
	p.waitInfo(t, "a full ring", func(i *ring.Info) bool { return i.Head >= slots })
	// A blocked producer wakes once within its first second to name whom it waits for (spec §14.6): the
	// sleep after that one is a whole slice.
	blocked := time.Now()
	deadline := blocked.Add(20 * time.Second)
	for time.Since(blocked) < 1200*time.Millisecond || !asleepOnSharedFutex(p.pid()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s producer never slept on a shared futex", kind)
		}
		time.Sleep(2 * time.Millisecond)
	}
	p.stdin.Close()
	if !p.exited(interruptBound) {
		return false
	}
	if out := p.out.String() + p.errb.String(); !strings.Contains(out, "interrupted") {
		t.Fatalf("%s producer exited without being interrupted: %v: %q", kind, p.err, out)
	}
	return true
}

// asleepOnSharedFutex reports whether a thread of process pid is in FUTEX_WAIT on a shared futex (op 0:
// not FUTEX_PRIVATE_FLAG, as a word in shared memory; runtimes' own locks are private).
func asleepOnSharedFutex(pid int) bool {
	tasks, _ := filepath.Glob("/proc/" + itoa(pid) + "/task/*/syscall")
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		fields := strings.Fields(string(b))
		if len(fields) > 2 && fields[0] == "202" && fields[2] == "0x0" { // x86-64 futex(addr, FUTEX_WAIT, …)
			return true
		}
	}
	return false
}

// TestInterruptWakesABlockedProducer (spec §7.4, §7.6): every producer (Go, C, Python), blocked on a
// stopped consumer's release futex, returns from its wait and exits at once when another thread
// interrupts it, with its wait slice made 10 s long: only the interrupt's wake can end the wait in time.
func TestInterruptWakesABlockedProducer(t *testing.T) {
	for _, kind := range producerKinds {
		t.Run(kind, func(t *testing.T) {
			if !interruptBlocked(t, kind) {
				t.Errorf("the interrupted %s producer still waited after %v", kind, interruptBound)
			}
		})
	}
}

// TestInterruptCheckCatchesAMissingWake: the check above fails for each producer built without the
// interrupt's wake (mutant no-wake): it sleeps out its slice.
func TestInterruptCheckCatchesAMissingWake(t *testing.T) {
	t.Parallel() // mostly waiting on processes: beside another test
	for _, kind := range producerKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			if interruptBlocked(t, kind, mutantEnv+"=no-wake") {
				t.Errorf("the %s producer without the interrupt's wake exited within %v: the check did not catch it",
					kind, interruptBound)
			}
		})
	}
}
