// Package rxlooptest provides Queue, a fake rxloop.Queue for the tests of the receive loop and of the
// transports built on it (verbs, transport/ibv, transport/xdp): it stands in for the NIC, so what runs
// above the queue is tested and benchmarked without one.
package rxlooptest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/ibvbridge/ibvbridge/internal/rxloop"
)

// Queue is a fake rxloop.Queue in one of two modes.
//
// Live (NewQueue): the test is the NIC. Deliver writes a frame into the next posted slot and completes it;
// a slot is not written again until the loop reposts it, and reposting a slot that is already posted is an
// error. Slots are filled in the order they were posted, as a receive queue's work requests are. A slot
// posted with RepostScatter receives its frame scattered over the pieces given (a work request with
// several scatter/gather entries) instead of into itself. Wakeups are edge-triggered as ibverbs' are: a completion raises the event only if the queue is
// armed when it arrives, and raising it disarms the queue (one event per Arm), which is strict enough to
// show the lost-wakeup race. Deliver may run in another goroutine than the loop.
//
// Replay (NewReplayQueue): every Poll returns a full batch of fixed frames, round robin, as if the NIC
// received each again the moment it was reposted. It isolates the cost of what runs above the queue: it
// locks and allocates nothing, and is for the loop's goroutine alone.
type Queue struct {
	// BeforeArm, if set, runs inside Arm before the queue is armed: a frame delivered there lands in the
	// window between the loop's last empty poll and its arm.
	BeforeArm func()
	// OnWrap, if set, runs whenever a replay starts another pass over its frames (e.g. to make the next
	// pass carry new heaps).
	OnWrap func()
	// Limit, if positive, ends a replay after Limit completions: Poll then returns none and calls OnEnd.
	Limit int
	OnEnd func()
	// PollErr, ArmErr and WaitErr, if set, are what Poll, Arm and Wait return.
	PollErr, ArmErr, WaitErr error

	// Polls, Arms and Waits count the calls.
	Polls, Arms, Waits atomic.Int64

	slots  [][]byte
	replay bool
	next   int // replay: the next frame
	sent   int // replay: completions returned

	mu       sync.Mutex
	posted   []bool
	pieces   [][][]byte // live: per slot, the pieces RepostScatter gave it (nil: the slot itself)
	free     []uint64   // posted slots, in the order the NIC fills them
	pending  []rxloop.Completion
	armed    bool
	event    chan struct{} // capacity 1: the completion channel's readability
	slotFree chan struct{} // capacity 1: a repost happened
}

// NewQueue returns a live queue of nslots receive slots of slotSize bytes, all posted.
func NewQueue(nslots, slotSize int) *Queue {
	q := &Queue{event: make(chan struct{}, 1), slotFree: make(chan struct{}, 1)}
	for i := range nslots {
		q.slots = append(q.slots, make([]byte, slotSize))
		q.posted = append(q.posted, true)
		q.free = append(q.free, uint64(i))
	}
	q.pieces = make([][][]byte, nslots)
	return q
}

// NewReplayQueue returns a replay queue over frames: slot i is frames[i] itself (not a copy), so a change
// the test makes to it shows in later passes.
func NewReplayQueue(frames [][]byte) *Queue {
	return &Queue{slots: frames, replay: true}
}

// Deliver is the NIC receiving frame (live mode): it writes frame into the next posted slot and completes
// it. It reports false when no slot is posted (an overrun); SlotFreed tells when to try again.
func (q *Queue) Deliver(frame []byte) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.free) == 0 {
		return false
	}
	id := q.free[0]
	q.free = q.free[1:]
	q.posted[id] = false
	pieces := q.pieces[id]
	q.pieces[id] = nil
	if pieces == nil {
		pieces = q.slots[id : id+1]
	}
	n, rest := 0, frame
	for _, p := range pieces {
		c := copy(p, rest)
		n, rest = n+c, rest[c:]
	}
	c := rxloop.Completion{ID: id, Len: uint32(n)}
	if len(rest) > 0 {
		c = rxloop.Completion{ID: id, Status: rxloop.StatusLocalLength} // longer than its buffers: lost
	}
	q.complete(c)
	return true
}

// NextSlot is the slot the next Deliver fills (live mode); ok is false when none is posted.
func (q *Queue) NextSlot() (id uint64, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.free) == 0 {
		return 0, false
	}
	return q.free[0], true
}

// Flush completes every posted slot, in posting order, with StatusFlushed and no bytes written, as a
// receive queue put in its error state does (live mode).
func (q *Queue) Flush() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, id := range q.free {
		q.posted[id] = false
		q.pieces[id] = nil
		q.complete(rxloop.Completion{ID: id, Status: rxloop.StatusFlushed})
	}
	q.free = q.free[:0]
}

// Complete queues completions as given (live mode), for the cases Deliver cannot make: error statuses,
// lengths beyond the slot. Their slots are taken from the posted ones, as the NIC would have.
func (q *Queue) Complete(cs ...rxloop.Completion) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, c := range cs {
		q.posted[c.ID] = false
		q.pieces[c.ID] = nil
		for i, id := range q.free {
			if id == c.ID {
				q.free = append(q.free[:i], q.free[i+1:]...)
				break
			}
		}
		q.complete(c)
	}
}

func (q *Queue) complete(c rxloop.Completion) {
	q.pending = append(q.pending, c)
	if q.armed {
		q.armed = false
		select {
		case q.event <- struct{}{}:
		default:
		}
	}
}

// SlotFreed is signalled (coalesced) whenever the loop reposts slots (live mode).
func (q *Queue) SlotFreed() <-chan struct{} { return q.slotFree }

// Posted reports whether slot id is posted, i.e. the loop gave it back (live mode).
func (q *Queue) Posted(id uint64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.posted[id]
}

// Poll implements rxloop.Queue.
func (q *Queue) Poll(out []rxloop.Completion) (int, error) {
	q.Polls.Add(1)
	if q.PollErr != nil {
		return 0, q.PollErr
	}
	if q.replay {
		return q.replayPoll(out), nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	n := copy(out, q.pending)
	q.pending = q.pending[n:]
	return n, nil
}

func (q *Queue) replayPoll(out []rxloop.Completion) int {
	n := 0
	for n < len(out) && (q.Limit <= 0 || q.sent < q.Limit) {
		if q.next == len(q.slots) {
			if n > 0 {
				// The frames of this batch are delivered after Poll returns: a pass ends its batch, so
				// OnWrap (which may rewrite the frames) runs only once every frame of the pass is out.
				break
			}
			q.next = 0
			if q.OnWrap != nil {
				q.OnWrap()
			}
		}
		out[n] = rxloop.Completion{ID: uint64(q.next), Len: uint32(len(q.slots[q.next]))}
		q.next++
		q.sent++
		n++
	}
	if n == 0 && q.OnEnd != nil {
		q.OnEnd()
	}
	return n
}

// Repost implements rxloop.Queue.
func (q *Queue) Repost(ids []uint64) error {
	if q.replay {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, id := range ids {
		if err := q.postLocked(id, nil); err != nil {
			return err
		}
	}
	return nil
}

// RepostScatter posts slot id like Repost, except that the frame it receives is written over pieces, in
// order, each filled before the next; a frame longer than all of them completes with
// StatusLocalLength. The pieces must stay valid until the slot completes.
func (q *Queue) RepostScatter(id uint64, pieces ...[]byte) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.postLocked(id, pieces)
}

func (q *Queue) postLocked(id uint64, pieces [][]byte) error {
	if q.posted[id] {
		return errors.New("rxlooptest: slot reposted twice")
	}
	q.posted[id] = true
	q.pieces[id] = pieces
	q.free = append(q.free, id)
	select {
	case q.slotFree <- struct{}{}:
	default:
	}
	return nil
}

// Arm implements rxloop.Queue.
func (q *Queue) Arm() error {
	q.Arms.Add(1)
	if q.ArmErr != nil {
		return q.ArmErr
	}
	if q.BeforeArm != nil {
		q.BeforeArm()
	}
	if q.replay {
		return nil
	}
	q.mu.Lock()
	q.armed = true
	q.mu.Unlock()
	return nil
}

// Wait implements rxloop.Queue. A replay queue always has work: Wait returns at once.
func (q *Queue) Wait(ctx context.Context) error {
	q.Waits.Add(1)
	if q.WaitErr != nil {
		return q.WaitErr
	}
	if q.replay {
		return nil
	}
	select {
	case <-q.event:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Slot implements rxloop.Queue.
func (q *Queue) Slot(id uint64) []byte { return q.slots[id] }

var _ rxloop.Queue = (*Queue)(nil)
