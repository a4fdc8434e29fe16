package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/bench"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

// TestConsumeGroupNameSharesStreamMemberKilled (spec §14, across processes): four `consume --group-name`
// processes and one independent `consume` monitor on one ring (block policy). The monitor verifies every
// heap; the members verify theirs, and their heap counts and heap-counter sums, with group_lost, account
// for the whole stream; a member killed mid-stream loses what it held (counted), the others go on.
func TestConsumeGroupNameSharesStreamMemberKilled(t *testing.T) {
	dir := t.TempDir()
	p, err := ring.Create("grp", ring.Config{Dir: dir, HugePages: ring.HugePagesOff, SlotCount: 64, SlotSize: 4096, Policy: ring.PolicyBlock})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var procs []*proc
	for i := range 4 {
		args := []string{"consume", "--ring", "grp", "--dir", dir, "--verify", "--timeout-ms", "20000", "--group-name", "work"}
		if i == 0 {
			args = append(args, "--sleep-us", "2000") // slow: killed while it holds a heap
		}
		procs = append(procs, startProc(t, args...))
	}
	monitor := startProc(t, "consume", "--ring", "grp", "--dir", dir, "--verify", "--timeout-ms", "20000")
	deadline := time.Now().Add(20 * time.Second)
	for p.Consumers() < 5 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if p.Consumers() != 5 {
		t.Fatalf("%d consumers attached, want 5", p.Consumers())
	}
	const total = 4000
	pb := pattern.Publisher{P: p, Size: 1000, Fill: true}
	for cnt := uint64(1); cnt <= total; cnt++ {
		if cnt == 1000 {
			procs[0].cmd.Process.Signal(syscall.SIGKILL)
		}
		if _, err := pb.Publish(cnt, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.PublishEndOfStream(0, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	result := func(c *proc) bench.ConsumeResult {
		if code := c.wait(t, 30*time.Second); code != 0 {
			t.Fatalf("%v exited %d: %s %s", c.cmd.Args[1:], code, c.out.String(), c.err.String())
		}
		var r bench.ConsumeResult
		if err := json.Unmarshal(c.out.Bytes(), &r); err != nil {
			t.Fatalf("%v: %v: %s", c.cmd.Args[1:], err, c.out.String())
		}
		if r.VerifyErrors != 0 || r.OutOfOrder != 0 {
			t.Fatalf("%v: %+v", c.cmd.Args[1:], r)
		}
		return r
	}
	mon := result(monitor)
	if mon.Heaps != total || mon.HeapCntSum != total*(total+1)/2 {
		t.Fatalf("monitor read %d heaps (cnt sum %d), want all %d", mon.Heaps, mon.HeapCntSum, total)
	}
	procs[0].wait(t, 10*time.Second)
	var heaps uint64
	for _, c := range procs[1:] {
		r := result(c)
		if r.Heaps == 0 {
			t.Errorf("%v got no heap", c.cmd.Args[1:])
		}
		heaps += r.Heaps
	}
	lost := p.Stats().Get(ring.CounterGroupLost)
	t.Logf("survivors %d heaps, group_lost %d, the killed member's share %d", heaps, lost, total-heaps-lost)
	if lost == 0 || heaps+lost > total || heaps < total/2 {
		t.Fatalf("survivors read %d heaps, group_lost %d, of %d: want the killed member's held heap counted lost and the rest read", heaps, lost, total)
	}
}

// TestStatShowsMembersQueuedAndBlockedOn (spec §14.6, §14.8): stat shows a member's read, queued and
// skipped, and the row a block producer waits for.
func TestStatShowsMembersQueuedAndBlockedOn(t *testing.T) {
	binary(t) // built before anything waits on it
	dir := t.TempDir()
	p, err := ring.Create("statgrp", ring.Config{Dir: dir, HugePages: ring.HugePagesOff, SlotCount: 8, SlotSize: 4096, Policy: ring.PolicyBlock})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	m, err := ring.Attach("statgrp", ring.AttachOptions{Dir: dir, Group: "work"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	pb := pattern.Publisher{P: p, Size: 64, Fill: true}
	done := make(chan error, 1)
	go func() {
		var err error
		for cnt := uint64(1); cnt <= 9 && err == nil; cnt++ { // the 9th waits for the member
			_, err = pb.Publish(cnt, 0)
		}
		done <- err
	}()
	var out string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		out, _, _ = runCmd(t, 10*time.Second, "stat", "--dir", dir, "statgrp")
		if strings.Contains(out, "blocked on") || time.Now().After(deadline) {
			break
		}
	}
	want := fmt.Sprintf("row %d (pid %d, group %#08x)", m.Index(), os.Getpid(), ring.GroupID("work"))
	if !strings.Contains(out, want) || !strings.Contains(out, "queued 8, skipped 0") {
		t.Fatalf("stat output lacks %q and the member's 8 queued heaps:\n%s", want, out)
	}
	p.Interrupt()
	<-done
}
