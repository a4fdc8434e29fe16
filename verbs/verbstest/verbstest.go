// Package verbstest provides fake verbs.SendQueues and a Sender built on one, for the tests of the send
// path above the device (verbs' send loop, transport/ibv's HeapSender), and RecvQueue, a fake
// verbs.SplitQueue for the receive path's direct placement. Other receive-side tests use
// internal/rxloop/rxlooptest.
package verbstest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/ibvbridge/ibvbridge/frame"
	"github.com/ibvbridge/ibvbridge/internal/rxloop"
	"github.com/ibvbridge/ibvbridge/internal/rxloop/rxlooptest"
	"github.com/ibvbridge/ibvbridge/verbs"
)

// RecvQueue is a fake verbs.SplitQueue: rxlooptest's live queue (the test is the NIC and calls Deliver;
// work requests are filled in the order they were posted) whose split work requests scatter each frame
// over the head of its slot, the region and the rest of the slot, as the device does. Its "NIC" checks
// the placement side of the contract and fails the test on a breach:
//   - a region is given to one posted work request at a time (no overlap with a region still awaited);
//   - nothing but the NIC writes an awaited region: when its frame arrives (and at CheckAwaited, Flush
//     and Close) it holds the bytes it held when posted;
//   - header and region fit the slot, and the region is registered (Covers);
//   - nothing is posted after Flush or Close.
type RecvQueue struct {
	*rxlooptest.Queue
	// Covered, if set, is what Covers answers; nil: every region is registered memory.
	Covered func(region []byte) bool
	// SplitPosts and PlainPosts count the work requests PostSplit posted each way; SplitFrames the
	// frames Deliver put into split work requests.
	SplitPosts, PlainPosts, SplitFrames atomic.Int64

	t        testing.TB
	slotSize int
	nslots   int
	mu       sync.Mutex
	awaited  map[uint64]awaited
	ended    bool // flushed or closed
}

type awaited struct{ region, posted []byte }

// NewRecvQueue returns a queue of nslots receive slots of slotSize bytes (the receiver's max size), all
// posted as plain work requests, as the device posts them when it opens.
func NewRecvQueue(t testing.TB, nslots, slotSize int) *RecvQueue {
	return &RecvQueue{Queue: rxlooptest.NewQueue(nslots, slotSize), t: t, slotSize: slotSize, nslots: nslots,
		awaited: map[uint64]awaited{}}
}

// Slots implements verbs.SplitQueue.
func (q *RecvQueue) Slots() int { return q.nslots }

// Covers implements verbs.SplitQueue.
func (q *RecvQueue) Covers(region []byte) bool {
	return len(region) > 0 && (q.Covered == nil || q.Covered(region))
}

// PostSplit implements verbs.SplitQueue.
func (q *RecvQueue) PostSplit(wrs []verbs.SplitWR) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ended {
		q.t.Errorf("%d work requests posted after the flush or close", len(wrs))
		return errors.New("verbstest: post after flush or close")
	}
	for _, w := range wrs {
		if w.Region == nil {
			q.PlainPosts.Add(1)
			if err := q.Queue.Repost([]uint64{w.ID}); err != nil {
				return err
			}
			continue
		}
		if w.HdrLen <= 0 || w.HdrLen+len(w.Region) > q.slotSize || !q.Covers(w.Region) {
			return fmt.Errorf("verbstest: work request %d: header %d + region %d bytes in a %d-byte slot (registered: %v)",
				w.ID, w.HdrLen, len(w.Region), q.slotSize, q.Covers(w.Region))
		}
		for id, a := range q.awaited {
			if overlap(a.region, w.Region) {
				q.t.Errorf("work request %d: its region overlaps the one work request %d still awaits", w.ID, id)
				return errors.New("verbstest: region posted twice")
			}
		}
		slot := q.Slot(w.ID)
		if err := q.Queue.RepostScatter(w.ID, slot[:w.HdrLen], w.Region, slot[w.HdrLen:q.slotSize-len(w.Region)]); err != nil {
			return err
		}
		q.awaited[w.ID] = awaited{region: w.Region, posted: append([]byte(nil), w.Region...)}
		q.SplitPosts.Add(1)
	}
	return nil
}

func overlap(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	al, bl := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return al < bl+uintptr(len(b)) && bl < al+uintptr(len(a))
}

// Deliver is the NIC receiving frame (see rxlooptest.Queue.Deliver), after checking that the region of
// the work request it fills was left alone while awaited.
func (q *RecvQueue) Deliver(frame []byte) bool {
	id, ok := q.NextSlot() // only the test delivers: the head stays until Deliver takes it
	if !ok {
		return false // (the receiver may post one meanwhile: the next try takes it, checked)
	}
	q.mu.Lock()
	if a, ok := q.awaited[id]; ok {
		delete(q.awaited, id)
		q.check(id, a)
		q.SplitFrames.Add(1)
	}
	q.mu.Unlock()
	return q.Queue.Deliver(frame)
}

func (q *RecvQueue) check(id uint64, a awaited) {
	if !bytes.Equal(a.region, a.posted) {
		q.t.Errorf("the region of work request %d was written while awaited (not by the NIC)", id)
	}
}

// CheckAwaited checks the regions still awaited as a frame's arrival would, and returns how many there
// are.
func (q *RecvQueue) CheckAwaited() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	for id, a := range q.awaited {
		q.check(id, a)
	}
	return len(q.awaited)
}

// Flush implements verbs.SplitQueue: every posted work request completes with rxloop.StatusFlushed.
func (q *RecvQueue) Flush() error {
	q.end()
	q.Queue.Flush()
	return nil
}

// Close is the device closing (a receiver's release): from then on nothing awaits a region — the regions
// still awaited are checked first — and nothing may be posted.
func (q *RecvQueue) Close() error {
	q.end()
	return nil
}

func (q *RecvQueue) end() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for id, a := range q.awaited {
		q.check(id, a)
	}
	clear(q.awaited)
	q.ended = true
}

// SendQueue is a fake send queue whose "NIC" checks the sender's side of the contract: a buffer is never
// posted (or handed out) while in flight, each post ends with a signaled work request, and a frame's bytes
// are unchanged from post to completion; breaches fail the test. Completions are produced lazily:
// Complete finishes the oldest signaled chains, and with Auto set every Poll completes everything posted
// so far. It is for one goroutine.
type SendQueue struct {
	// Auto completes everything posted at every Poll (NewSendQueue sets it).
	Auto bool
	// OnWait, if set, runs when the sender sleeps in Wait: the "NIC" finishing meanwhile. Without it,
	// Wait fails (it would block forever).
	OnWait func()
	// Record keeps a copy of every frame posted in Frames.
	Record bool
	Frames [][]byte
	// Flags are every posted work request's flags, in order.
	Flags []verbs.SendFlags
	// WRs, Signaled, Posts, Arms and Waits count work requests, signaled ones, and calls.
	WRs, Signaled, Posts, Arms, Waits int

	t        testing.TB
	slots    [][]byte
	inFlight []bool
	snap     [][]byte // frame bytes at post time
	posted   []verbs.SendWR
	done     []rxloop.Completion
	armed    bool
}

// NewSendQueue returns a queue of slots frame buffers of frameSize bytes that completes everything at
// every Poll (Auto).
func NewSendQueue(t testing.TB, slots, frameSize int) *SendQueue {
	q := &SendQueue{t: t, Auto: true}
	for range slots {
		q.slots = append(q.slots, make([]byte, frameSize))
		q.inFlight = append(q.inFlight, false)
		q.snap = append(q.snap, nil)
	}
	return q
}

// Slot implements verbs.SendQueue.
func (q *SendQueue) Slot(i uint32) []byte {
	if q.inFlight[i] {
		q.t.Errorf("buffer %d handed out while the NIC may read it", i)
	}
	return q.slots[i]
}

// Post implements verbs.SendQueue.
func (q *SendQueue) Post(wrs []verbs.SendWR) error {
	q.Posts++
	for i, w := range wrs {
		if q.inFlight[w.Slot] {
			return fmt.Errorf("buffer %d posted while in flight", w.Slot)
		}
		sig := w.Flags&verbs.SendSignaled != 0
		if sig != (i == len(wrs)-1) {
			q.t.Errorf("post of %d: work request %d signaled=%v", len(wrs), i, sig)
		}
		if sig {
			q.Signaled++
		}
		q.inFlight[w.Slot] = true
		q.snap[w.Slot] = append(q.snap[w.Slot][:0], q.slots[w.Slot][:w.Len]...)
		q.posted = append(q.posted, w)
		q.WRs++
		q.Flags = append(q.Flags, w.Flags)
		if q.Record {
			q.Frames = append(q.Frames, append([]byte(nil), q.slots[w.Slot][:w.Len]...))
		}
	}
	return nil
}

// Complete finishes posted work requests up to and including the n-th signaled one (all if n < 0).
func (q *SendQueue) Complete(n int) {
	for len(q.posted) > 0 && n != 0 {
		w := q.posted[0]
		q.posted = q.posted[1:]
		if !bytes.Equal(q.snap[w.Slot], q.slots[w.Slot][:w.Len]) {
			q.t.Errorf("frame %d (buffer %d) changed while in flight", w.ID, w.Slot)
		}
		q.inFlight[w.Slot] = false
		if w.Flags&verbs.SendSignaled != 0 {
			q.done = append(q.done, rxloop.Completion{ID: w.ID})
			n--
		}
	}
}

// Poll implements verbs.SendQueue.
func (q *SendQueue) Poll(out []rxloop.Completion) (int, error) {
	if q.Auto {
		q.Complete(-1)
	}
	n := copy(out, q.done)
	q.done = q.done[n:]
	return n, nil
}

// Arm implements verbs.SendQueue.
func (q *SendQueue) Arm() error { q.Arms++; q.armed = true; return nil }

// Wait implements verbs.SendQueue: it runs OnWait, once armed.
func (q *SendQueue) Wait(context.Context) error {
	q.Waits++
	if !q.armed {
		return errors.New("wait without arm")
	}
	q.armed = false
	if q.OnWait == nil {
		return errors.New("wait would block forever")
	}
	q.OnWait()
	return nil
}

// InstantSendQueue is a send queue whose "NIC" finishes a chain the moment it is posted, without
// allocating: with it, a benchmark measures the cost above the device and nothing else.
type InstantSendQueue struct {
	// WRs counts the work requests posted.
	WRs uint64

	slots [][]byte
	done  []rxloop.Completion // fixed capacity: the signaled chains not yet polled
}

// NewInstantSendQueue returns a queue of slots frame buffers of frameSize bytes.
func NewInstantSendQueue(slots, frameSize int) *InstantSendQueue {
	q := &InstantSendQueue{done: make([]rxloop.Completion, 0, slots)}
	mem := make([]byte, slots*frameSize)
	for i := range slots {
		q.slots = append(q.slots, mem[i*frameSize:(i+1)*frameSize])
	}
	return q
}

// Slot implements verbs.SendQueue.
func (q *InstantSendQueue) Slot(i uint32) []byte { return q.slots[i] }

// Post implements verbs.SendQueue.
func (q *InstantSendQueue) Post(wrs []verbs.SendWR) error {
	q.WRs += uint64(len(wrs))
	q.done = append(q.done, rxloop.Completion{ID: wrs[len(wrs)-1].ID})
	return nil
}

// Poll implements verbs.SendQueue.
func (q *InstantSendQueue) Poll(out []rxloop.Completion) (int, error) {
	n := copy(out, q.done)
	q.done = q.done[:copy(q.done, q.done[n:])]
	return n, nil
}

// Arm implements verbs.SendQueue.
func (q *InstantSendQueue) Arm() error { return nil }

// Wait implements verbs.SendQueue. A chain is done once posted: there is never anything to wait for.
func (q *InstantSendQueue) Wait(context.Context) error { return errors.New("nothing to wait for") }

// SendConfig is a valid send configuration: interface 192.0.2.2, endpoints 239.1.2.3:7148 (multicast)
// and 192.0.2.9:7149 (unicast), spead2's defaults otherwise.
func SendConfig() verbs.SendConfig {
	c := verbs.DefaultSendConfig()
	c.Interface = netip.MustParseAddr("192.0.2.2")
	c.Endpoints = []netip.AddrPort{netip.MustParseAddrPort("239.1.2.3:7148"), netip.MustParseAddrPort("192.0.2.9:7149")}
	return c
}

// NewSender builds a verbs.Sender for cfg over q, sending from 02:00:00:00:00:01, cfg.Interface, port
// 40000, to each multicast endpoint's group MAC and to 02:00:00:00:00:09 for unicast ones.
func NewSender(tb testing.TB, q verbs.SendQueue, cfg verbs.SendConfig, lc verbs.SendLoopConfig, ipCsum bool) *verbs.Sender {
	tb.Helper()
	src := frame.Header{SrcMAC: [6]byte{2, 0, 0, 0, 0, 1}, SrcIP: cfg.Interface, SrcPort: 40000}
	macs := make([][6]byte, len(cfg.Endpoints))
	for i, ep := range cfg.Endpoints {
		if m, ok := frame.MulticastMAC(ep.Addr()); ok {
			macs[i] = m
		} else {
			macs[i] = [6]byte{2, 0, 0, 0, 0, 9}
		}
	}
	s, err := verbs.NewSender(q, cfg, lc, src, macs, ipCsum)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

var (
	_ verbs.SendQueue  = (*SendQueue)(nil)
	_ verbs.SendQueue  = (*InstantSendQueue)(nil)
	_ verbs.SplitQueue = (*RecvQueue)(nil)
)
