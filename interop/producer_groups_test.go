package interop_test

import (
	"bytes"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
)

// groupProducer starts the produce tool of kind (c, python) publishing heaps pattern heaps (heap_cnt 1..heaps)
// under block into ring "g" of a fresh directory once want consumers attached; it returns the ring's socket
// and a wait for the tool's exit.
func groupProducer(t *testing.T, kind string, heaps, want int) (sock string, wait func()) {
	t.Helper()
	dir := t.TempDir()
	p := producerCmd(t, kind, dir, "g", "--heaps", strconv.Itoa(heaps), "--heap-size", "3000", "--slots", "64",
		"--policy", "block", "--wait-consumers", strconv.Itoa(want), "--pattern", "--hugepages", "off")
	var perr bytes.Buffer
	p.Stderr = &perr
	waitP := startProcess(t, p)
	return filepath.Join(dir, "g.v2.sock"), func() {
		t.Helper()
		if err := waitP(); err != nil {
			t.Fatalf("%s producer: %v: %s", kind, err, perr.String())
		}
	}
}

// startMembers starts a verifying consumer of each kind as a member of group "work".
func startMembers(t *testing.T, sock string, kinds []string) (waits []func() result) {
	t.Helper()
	for _, kind := range kinds {
		waits = append(waits, startConsumer(t, kind, sock, member(kind)...))
	}
	return waits
}

// member is the arguments of a consumer tool joining group "work"; the C one waits for the ring to appear.
func member(kind string, extra ...string) []string {
	args := append([]string{"--group-name", "work"}, extra...)
	if kind == "c" {
		args = append(args, "--wait")
	}
	return args
}

// TestGroupOnCAndPythonProducersReadsEveryHeapOnce (spec §14 on the C and Python producers): two Python,
// two C and one Go member of one group and an independent C monitor on a ring made by ibvb-produce and by
// `python -m ibvbridge.produce`. Every heap is read by exactly one member (heap counts and heap_cnt sums add
// up to the stream's), each member gets a share and verifies its bytes, the monitor reads every heap and
// nothing is counted lost.
func TestGroupOnCAndPythonProducersReadsEveryHeapOnce(t *testing.T) {
	needCAndPython(t)
	for _, prod := range []string{"c", "python"} {
		t.Run(prod, func(t *testing.T) {
			const n = 3000
			sock, waitProducer := groupProducer(t, prod, n, 6)
			members := []string{"python", "python", "c", "c", "go"}
			waits := startMembers(t, sock, members)
			monitor := startConsumer(t, "c", sock, "--wait")
			const cntSum = n * (n + 1) / 2
			if heaps, sum := membersRead(t, members, waits); heaps != n || sum != cntSum {
				t.Errorf("the members read %d heaps (heap_cnt sum %d), want each of %d once (sum %d)", heaps, sum, n, cntSum)
			}
			r := monitor()
			if r.Result != "eos" || r.Heaps != n || r.HeapCntSum != cntSum || r.VerifyErrors != 0 {
				t.Errorf("monitor: %+v, want all %d heaps (heap_cnt sum %d)", r, n, cntSum)
			}
			if lost, ok := r.Counters["group_lost"]; !ok || lost != 0 {
				t.Errorf("group_lost %d (reported: %v), want 0", lost, ok)
			}
			waitProducer()
		})
	}
}

// TestGroupMemberKilledOnCAndPythonProducers (spec §14): a C member that holds its heaps (it sleeps 5 s per
// heap) is killed once the C or Python producer has assigned it some; what it held is counted in
// group_lost, the block ring moves on, and the other members (Python, C, Go) read every other heap exactly
// once.
func TestGroupMemberKilledOnCAndPythonProducers(t *testing.T) {
	needCAndPython(t)
	for _, prod := range []string{"c", "python"} {
		t.Run(prod, func(t *testing.T) {
			const n = 2000
			sock, waitProducer := groupProducer(t, prod, n, 5)
			slow := consumerCmd(t, "c", sock, true, member("c", "--hold", "4", "--sleep-us", "5000000")...)
			waitSlow := startProcess(t, slow)
			members := []string{"python", "c", "go"}
			waits := startMembers(t, sock, members)
			monitor := startConsumer(t, "c", sock, "--wait")
			deadline := time.Now().Add(20 * time.Second)
			for !slowAssigned(sock, slow.Process.Pid) {
				if time.Now().After(deadline) {
					t.Fatal("the slow member was never assigned a heap")
				}
				time.Sleep(5 * time.Millisecond)
			}
			slow.Process.Kill()
			waitSlow()
			heaps, _ := membersRead(t, members, waits)
			r := monitor()
			if r.Result != "eos" || r.Heaps != n || r.VerifyErrors != 0 {
				t.Errorf("monitor: %+v, want all %d heaps", r, n)
			}
			lost := r.Counters["group_lost"]
			if lost == 0 || heaps+lost != n {
				t.Errorf("members read %d heaps, group_lost %d: want at least one lost and the rest (%d) read once",
					heaps, lost, n)
			}
			waitProducer()
		})
	}
}

// slowAssigned reports whether the ring's member with this pid has been assigned a position (stat's view).
func slowAssigned(sock string, pid int) bool {
	info, err := ring.Inspect(sock, "")
	if err != nil {
		return false
	}
	for _, c := range info.Consumers {
		if c.PID == uint64(pid) && c.GroupID != 0 && c.Assigned > 0 {
			return true
		}
	}
	return false
}
