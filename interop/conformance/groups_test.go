package conformance_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
)

// rowOf is the consumer-table row of the attached consumer with this pid, nil if none.
func rowOf(info *ring.Info, pid int) *ring.ConsumerInfo {
	for i := range info.Consumers {
		if c := &info.Consumers[i]; c.PID == uint64(pid) && c.Attached() {
			return c
		}
	}
	return nil
}

// checkMembers checks that every member reached the end of the stream with verified heaps in order and
// returns their heaps together.
func checkMembers(t *testing.T, members map[string]*consumer) (heaps uint64) {
	t.Helper()
	for name, c := range members {
		r := c.wait(t)
		t.Logf("member %s (%s): %d heaps, heap_cnt %d … %d, sum %d", name, c.kind, r.Heaps, r.FirstHeapCnt, r.LastHeapCnt, r.HeapCntSum)
		if r.Result != "eos" || r.VerifyErrors != 0 || r.OutOfOrder != 0 {
			t.Errorf("member %s (%s): %+v exit %d stderr %q", name, c.kind, r.ConsumeResult, r.exitCode, r.stderr)
		}
		heaps += r.Heaps
	}
	return heaps
}

// TestGroupMemberKilledWhileTheProducerWaitsOnIt (spec §14.6, §14.7), for every producer: a member (Go)
// that stopped holding its first heap is named by the block producer as the one it waits for (ctl
// blocked_on, as stat shows it), then killed with kill -9. The stream goes on; a new member attached in
// its row inherits nothing: every heap is read by exactly one of the other members (C, Python, and the new
// Go one) or counted in group_lost, what the dead member was assigned, and the independent monitor reads
// every heap.
func TestGroupMemberKilledWhileTheProducerWaitsOnIt(t *testing.T) {
	for _, kind := range producerKinds {
		t.Run(kind, func(t *testing.T) {
			const n = 3000
			p := startProducer(t, kind, prodOpts{heaps: n, heapSize: 4096, slots: 64, policy: "block", wait: 4})
			stalled := startConsumer(t, "go", p.sock(), "--group-name", "g", "--stop-first")
			members := map[string]*consumer{
				"c":      startConsumer(t, "c", p.sock(), "--group-name", "g"),
				"python": startConsumer(t, "python", p.sock(), "--group-name", "g"),
			}
			monitor := startConsumer(t, "go", p.sock())
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("stalled member: stdout %q stderr %q; producer stdout %q stderr %q", stalled.out.String(),
						stalled.errb.String(), p.out.String(), p.errb.String())
				}
			})
			waitStopped(t, stalled.pid())
			info := p.waitInfo(t, "the producer blocked on the stopped member", func(i *ring.Info) bool {
				r := rowOf(i, stalled.pid())
				return r != nil && i.BlockedOn == r.Index+1
			})
			row := rowOf(info, stalled.pid()).Index
			// The monitor stops too, so that the ring stays open, blocked on it, while a new member joins
			// in the dead member's row.
			monitor.cmd.Process.Signal(syscall.SIGSTOP)
			stalled.cmd.Process.Kill()
			p.waitInfo(t, "the killed member's departure", func(i *ring.Info) bool { return rowOf(i, stalled.pid()) == nil })
			members["go (new)"] = startConsumer(t, "go", p.sock(), "--group-name", "g")
			info = p.waitInfo(t, "the new member attached", func(i *ring.Info) bool {
				return rowOf(i, members["go (new)"].pid()) != nil
			})
			if got := rowOf(info, members["go (new)"].pid()).Index; got != row {
				t.Errorf("the new member got row %d, not the dead member's %d: row reuse not exercised", got, row)
			}
			t.Logf("the new member attached in row %d at head %d", row, info.Head)
			monitor.cmd.Process.Signal(syscall.SIGCONT)
			heaps := checkMembers(t, members)
			r := monitor.wait(t)
			if r.Result != "eos" || r.Heaps != n || r.VerifyErrors != 0 {
				t.Errorf("monitor: %+v, want all %d heaps", r.ConsumeResult, n)
			}
			lost := r.Counters["group_lost"]
			if lost == 0 || heaps+lost != n {
				t.Errorf("members read %d heaps, group_lost %d (group_skipped %d): want the dead member's share lost (at least its held heap) and every other heap read once (%d in all)",
					heaps, lost, r.Counters["group_skipped"], n)
			}
			if !p.exited(20*time.Second) || p.exitCode() != 0 {
				t.Errorf("%s producer: exit %v: %s", kind, p.err, p.errb.String())
			}
		})
	}
}

// TestMemberReleasingUnreadIsCountedSkipped (spec §14.7 "released unread"), for every producer: a stranger
// joins the group with a hello of its own and releases every position it is assigned without handing
// it out. Its row's skipped and the counter group_skipped count them; with the other member's heaps they
// make up the stream, and the monitor reads every heap.
func TestMemberReleasingUnreadIsCountedSkipped(t *testing.T) {
	t.Parallel() // mostly waiting on processes: beside another test
	for _, kind := range producerKinds {
		t.Run(kind, func(t *testing.T) {
			const n = 2000
			p := startProducer(t, kind, prodOpts{heaps: n, heapSize: 4096, slots: 64, policy: "block", wait: 4})
			thief, status, msg, err := rawAttach(p.sock(), "g")
			if err != nil || status != 0 {
				t.Fatalf("stranger's hello: status %d %q, %v", status, msg, err)
			}
			// An independent consumer that keeps the end-of-stream marker until the thief's row was read:
			// the block producer stays open meanwhile.
			holder, status, msg, err := rawAttach(p.sock(), "")
			if err != nil || status != 0 {
				thief.close()
				t.Fatalf("holder's hello: status %d %q, %v", status, msg, err)
			}
			done, hold, stop := make(chan struct{}), make(chan struct{}), make(chan struct{})
			holderDone := make(chan struct{})
			go func() { thief.releaseUnread(60*time.Second, hold, stop); close(done) }()
			go func() { holder.releaseUnread(60*time.Second, hold, stop); close(holderDone) }()
			t.Cleanup(func() { // on every path: the loops end before their mappings go
				close(stop)
				<-done
				<-holderDone
				thief.close()
				holder.close()
			})
			member := startConsumer(t, "c", p.sock(), "--group-name", "g")
			monitor := startConsumer(t, "go", p.sock())
			got := member.wait(t)
			r := monitor.wait(t)
			if r.Result != "eos" || r.Heaps != n || r.VerifyErrors != 0 {
				t.Errorf("monitor: %+v, want all %d heaps", r.ConsumeResult, n)
			}
			if got.Result != "eos" || got.VerifyErrors != 0 || got.Heaps == 0 || got.Heaps >= n {
				t.Errorf("member: %+v: want a share of the stream, verified", got.ConsumeResult)
			}
			// The stream is read; the thief holds only the end-of-stream marker, so the producer is open.
			info := p.waitInfo(t, "the stranger's share counted skipped", func(i *ring.Info) bool {
				for _, c := range i.Consumers {
					if c.Index == int(thief.index) {
						return c.Skipped+got.Heaps == n && i.Counters["group_skipped"] == c.Skipped
					}
				}
				return false
			})
			t.Logf("member read %d, stranger skipped %d (group_skipped %d)", got.Heaps, n-got.Heaps, info.Counters["group_skipped"])
			close(hold)
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Error("the stranger never saw the ring closed")
			}
			if !p.exited(20*time.Second) || p.exitCode() != 0 {
				t.Errorf("%s producer: exit %v: %s", kind, p.err, p.errb.String())
			}
		})
	}
}
