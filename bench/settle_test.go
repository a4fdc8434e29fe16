package bench

import (
	"os/exec"
	"testing"
	"time"
)

// waitSettled returns only once the process has stopped using CPU: a child that computes for a while and
// then sleeps is asleep when it returns (its CPU time no longer moves).
func TestWaitSettledReturnsOnceTheProcessIdles(t *testing.T) {
	c := exec.Command("sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; exec sleep 30")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	waitSettled(20*time.Second, c.Process.Pid)
	before, err := cpuTime(c.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if before == 0 {
		t.Fatal("the child used no CPU: the test proves nothing")
	}
	time.Sleep(3 * settleQuiet)
	if after, _ := cpuTime(c.Process.Pid); after != before {
		t.Fatalf("child's CPU moved from %v to %v after waitSettled returned: it was still computing", before, after)
	}
}
