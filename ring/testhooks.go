package ring

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Test hooks of the producer, read only in a test binary (testing.Testing): never in recv. The
// conformance suite (interop/conformance) sets them in the Go producer process it starts:
//   - IBVBRIDGE_TEST_MUTANT, a comma-separated list of guards to break, to prove the suite catches each:
//     row-late (a detached consumer's row is not written before its slots are reused), no-wake (Interrupt
//     does not wake a producer asleep on a release futex), no-unmap (a detached consumer's region is not
//     unmapped at the detach, only by the heartbeat's sweep), stale-oldest-queued (a group member's oldest
//     queued position a ring behind head is trusted: the simulation's replay must find it);
//   - IBVBRIDGE_TEST_WAIT_SLICE_MS, the longest futex sleep of a blocked producer (spec §7.4: 250 ms), so
//     that a missing wake shows as a long wait instead of one slice;
//   - IBVBRIDGE_TEST_BEAT_MS, the heartbeat's period (100 ms), whose sweep would otherwise hide a region
//     left mapped at a detach.
var (
	testMutants   = map[string]bool{}
	testWaitSlice = maxWaitSlice
	testBeat      = 100 * time.Millisecond
)

func init() {
	if !testing.Testing() {
		return
	}
	for _, m := range strings.Split(os.Getenv("IBVBRIDGE_TEST_MUTANT"), ",") {
		testMutants[m] = m != ""
	}
	if ms, err := strconv.Atoi(os.Getenv("IBVBRIDGE_TEST_WAIT_SLICE_MS")); err == nil && ms > 0 {
		testWaitSlice = time.Duration(ms) * time.Millisecond
	}
	if ms, err := strconv.Atoi(os.Getenv("IBVBRIDGE_TEST_BEAT_MS")); err == nil && ms > 0 {
		testBeat = time.Duration(ms) * time.Millisecond
	}
}
