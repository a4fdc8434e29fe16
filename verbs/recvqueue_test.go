package verbs_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ibvbridge/ibvbridge/internal/rxloop"
	"github.com/ibvbridge/ibvbridge/verbs"
	"github.com/ibvbridge/ibvbridge/verbs/verbstest"
)

// errorsTB records what a fake reports instead of failing the test, to show its checks can fail.
type errorsTB struct {
	testing.TB
	errs []string
}

func (e *errorsTB) Errorf(format string, args ...any) {
	e.errs = append(e.errs, fmt.Sprintf(format, args...))
}

// TestRecvQueueSplit: a split work request scatters a frame as the device does — head of the slot, the
// region, then the rest of the slot after the head — and frames fill work requests in posting order.
func TestRecvQueueSplit(t *testing.T) {
	q := verbstest.NewRecvQueue(t, 2, 16)
	out := make([]rxloop.Completion, 4)
	q.Deliver([]byte("aa"))
	q.Deliver([]byte("bb"))
	if n, _ := q.Poll(out); n != 2 {
		t.Fatal(n)
	}
	ring := make([]byte, 8)
	if err := q.PostSplit([]verbs.SplitWR{{ID: 1, HdrLen: 3, Region: ring[2:6]}, {ID: 0}}); err != nil {
		t.Fatal(err)
	}
	q.Deliver([]byte("HDRpayloadXYZ")) // 3 + 4 in the region + 6 more
	q.Deliver([]byte("plain"))
	n, _ := q.Poll(out)
	if n != 2 || out[0] != (rxloop.Completion{ID: 1, Len: 13}) || out[1] != (rxloop.Completion{ID: 0, Len: 5}) {
		t.Fatalf("completions %+v", out[:n])
	}
	if s := string(q.Slot(1)[:9]); s != "HDRoadXYZ" {
		t.Errorf("slot 1 %q: want the header, then what did not fit the region", s)
	}
	if string(ring) != "\x00\x00payl\x00\x00" || string(q.Slot(0)[:5]) != "plain" {
		t.Errorf("ring %q slot 0 %q", ring, q.Slot(0))
	}
	if q.SplitPosts.Load() != 1 || q.PlainPosts.Load() != 1 || q.SplitFrames.Load() != 1 {
		t.Errorf("posts %d split %d plain, %d split frames", q.SplitPosts.Load(), q.PlainPosts.Load(), q.SplitFrames.Load())
	}
	if err := q.PostSplit([]verbs.SplitWR{{ID: 0, HdrLen: 10, Region: ring[:7]}}); err == nil {
		t.Error("a header and region larger than the slot were posted")
	}
}

// TestRecvQueueContract: the fake fails the test when a region is posted twice, written while awaited,
// or when anything is posted after a flush.
func TestRecvQueueContract(t *testing.T) {
	e := &errorsTB{TB: t}
	q := verbstest.NewRecvQueue(e, 3, 16)
	out := make([]rxloop.Completion, 4)
	for range 3 {
		q.Deliver([]byte("x"))
	}
	q.Poll(out)
	ring := make([]byte, 8)
	if err := q.PostSplit([]verbs.SplitWR{{ID: 0, HdrLen: 2, Region: ring[0:4]}}); err != nil {
		t.Fatal(err)
	}
	if err := q.PostSplit([]verbs.SplitWR{{ID: 1, HdrLen: 2, Region: ring[3:6]}}); err == nil || len(e.errs) != 1 ||
		!strings.Contains(e.errs[0], "overlaps the one work request 0 still awaits") {
		t.Fatalf("overlapping region: %v %q", err, e.errs)
	}
	if err := q.PostSplit([]verbs.SplitWR{{ID: 1, HdrLen: 2, Region: ring[4:8]}}); err != nil {
		t.Fatal(err)
	}
	ring[1] = 'w' // the host writes an awaited region
	q.Deliver([]byte("hhPAYL"))
	if len(e.errs) != 2 || !strings.Contains(e.errs[1], "region of work request 0 was written while awaited") {
		t.Fatalf("write into an awaited region: %q", e.errs)
	}
	ring[5] = 'w'
	if n := q.CheckAwaited(); n != 1 || len(e.errs) != 3 || !strings.Contains(e.errs[2], "work request 1") {
		t.Fatalf("CheckAwaited: %d, %q", n, e.errs)
	}
	if err := q.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _ := q.Poll(out); n != 2 || out[1] != (rxloop.Completion{ID: 1, Status: rxloop.StatusFlushed}) {
		t.Fatalf("after the flush: %+v", out[:n])
	}
	if err := q.PostSplit([]verbs.SplitWR{{ID: 2}}); err == nil || !strings.Contains(e.errs[len(e.errs)-1], "after the flush") {
		t.Fatalf("post after flush: %v %q", err, e.errs)
	}
}
