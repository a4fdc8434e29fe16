package main

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/bench"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

// waitStopped waits until process pid is in the stopped state (it SIGSTOPped itself).
func waitStopped(t *testing.T, p *proc) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/stat")
		if err == nil {
			if f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])); len(f) > 0 && f[0] == "T" {
				return
			}
		}
		if p.exited() {
			t.Fatalf("consume exited before it stopped: %s %s", p.out.String(), p.err.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("consume --stop-first never stopped")
}

// TestConsumeStoppedMidReadCountsOverrunNotVerifyError (layout 2.1 §A, across processes): `consume
// --verify` stopped while it holds a heap it has not read yet; the producer laps it (a fast in-process
// consumer keeps the drop ring moving) and rewrites the slot; resumed, the tool reads rewritten bytes,
// checks validity after the read and counts the heap in overrun_heaps, not verify_errors, then reports the
// overrun (exit 4).
func TestConsumeStoppedMidReadCountsOverrunNotVerifyError(t *testing.T) {
	dir := t.TempDir()
	p, err := ring.Create("stopmid", ring.Config{Dir: dir, HugePages: ring.HugePagesOff, SlotCount: 8, SlotSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	fast, err := ring.Attach("stopmid", ring.AttachOptions{Dir: dir, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Close()
	pb := pattern.Publisher{P: p, Size: 1000, Fill: true}
	if _, err := pb.Publish(1, 0); err != nil {
		t.Fatal(err)
	}
	c := startProc(t, "consume", "--ring", "stopmid", "--dir", dir, "--verify", "--stop-first", "--timeout-ms", "5000")
	waitStopped(t, c)
	for cnt := uint64(1); cnt <= 20; cnt++ {
		if cnt > 1 {
			if _, err := pb.Publish(cnt, 0); err != nil {
				t.Fatalf("heap %d: %v", cnt, err)
			}
		}
		h, err := fast.Next(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := fast.Release(h); err != nil {
			t.Fatal(err)
		}
	}
	if got := p.Stats().Get(ring.CounterConsumerOverruns); got != 1 {
		t.Fatalf("consumer_overruns %d, want 1: the stopped consumer was not lapped", got)
	}
	c.cmd.Process.Signal(syscall.SIGCONT)
	code := c.wait(t, 20*time.Second)
	var res bench.ConsumeResult
	if err := json.Unmarshal([]byte(c.out.String()), &res); err != nil {
		t.Fatalf("consume output %q: %v", c.out.String(), err)
	}
	if code != 4 || res.Result != "overrun" || res.VerifyErrors != 0 || res.OverrunHeaps < 1 {
		t.Fatalf("exit %d, %+v; want exit 4, overrun, verify_errors 0, overrun_heaps >= 1", code, res)
	}
}
