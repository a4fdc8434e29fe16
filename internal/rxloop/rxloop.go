// Package rxloop owns the receive completion loop that the kernel-bypass transports share: the poll /
// deliver / repost cycle and its idle handling (busy polling, or arming a wakeup and sleeping without
// losing a completion that lands in between), written against the small Queue interface. The ibverbs
// receiver (a raw packet QP's CQ and RQ) and the AF_XDP sockets (rx and fill rings) implement Queue; tests
// use rxlooptest's fake. The package is pure Go: AF_XDP builds without cgo.
package rxloop

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
)

// DefaultMaxPoll is how many polls are made before going idle when Config.MaxPoll is unset (spead2's
// max_poll).
const DefaultMaxPoll = 10

// defaultBatch is the completions taken per poll when Config.Batch is unset.
const defaultBatch = 64

// Status is a work completion status (ibverbs' enum ibv_wc_status); 0 is success.
type Status uint32

// Statuses the loop and its fakes name: IBV_WC_SUCCESS, IBV_WC_LOC_LEN_ERR (the frame was longer than the
// work request's buffers) and IBV_WC_WR_FLUSH_ERR (the queue was put in its error state: every posted work
// request completes with it, unfilled).
const (
	StatusSuccess     Status = 0
	StatusLocalLength Status = 1
	StatusFlushed     Status = 5
)

// Completion is one finished receive (or send) work request. Its layout matches the verbs C shim's
// ibvb_completion, so the ibverbs queues poll straight into Go memory; verbs' ABI test checks it.
type Completion struct {
	ID     uint64 // work request id: the slot index
	Len    uint32 // bytes written into the slot
	Status Status
}

// Queue is a receive queue as the loop sees it: completions to poll, slots to give back to the producer
// (the NIC or the kernel), and an edge-triggered wakeup.
type Queue interface {
	// Poll fills out with up to len(out) completions and returns how many. It never blocks.
	Poll(out []Completion) (int, error)
	// Repost gives the slots back to the producer as one batch.
	Repost(ids []uint64) error
	// Arm requests one wakeup for the next completion (ibv_req_notify_cq). Completions that arrived
	// before Arm do not cause a wakeup.
	Arm() error
	// Wait blocks until a wakeup requested by Arm fires or ctx is done.
	Wait(ctx context.Context) error
	// Slot returns the receive buffer of work request id.
	Slot(id uint64) []byte
}

// Config tunes Run.
type Config struct {
	// MaxPoll is how many consecutive polls are made before the loop goes idle (wait mode) or checks for
	// cancellation (busy mode). Default DefaultMaxPoll.
	MaxPoll int
	// BusyPoll spins on the queue instead of sleeping: lowest latency, one core at 100%.
	BusyPoll bool
	// Batch is the completions taken per poll and the repost batch size. Default 64.
	Batch int
	// Stats, if set, is updated once per batch.
	Stats *Stats
	// Batches, if set, brackets the frames of each poll: a sink (the heap assembler) then publishes the
	// heaps they complete together (transport.Batcher).
	Batches interface {
		BeginBatch()
		EndBatch()
	}
}

// Stats counts what the loop did. Fields are atomics so a monitor may read them while the loop runs.
type Stats struct {
	Frames  atomic.Uint64 // completions delivered to the callback
	Errors  atomic.Uint64 // completions with a non-success status or an impossible length (slot reposted)
	Flushed atomic.Uint64 // completions of work requests flushed when the queue was put in its error state
	Polls   atomic.Uint64 // Poll calls
	Empty   atomic.Uint64 // Poll calls that returned nothing
	Arms    atomic.Uint64
	Waits   atomic.Uint64
	Reposts atomic.Uint64 // Repost calls (batches)
}

// Run polls q and hands every successfully received frame to frame (valid only during the call: its slot
// is reposted right after) until ctx is done or the queue fails. It returns ctx.Err() on cancellation.
//
// Idle behaviour, the part that is easy to get wrong:
//   - busy mode polls again at once; it only checks ctx between rounds;
//   - wait mode arms the queue, then polls once more before sleeping. Wakeups are edge-triggered: a
//     completion that lands after the last empty poll but before the arm raises no event, and sleeping
//     then would strand it (and, with every slot full, deadlock the receiver). Polling after arming
//     catches it; anything later raises the event.
//
// The steady state allocates nothing.
func Run(ctx context.Context, q Queue, cfg Config, frame func(id uint64, frame []byte)) error {
	maxPoll := cfg.MaxPoll
	if maxPoll <= 0 {
		maxPoll = DefaultMaxPoll
	}
	l := newLoop(q, cfg.Stats, cfg.Batch, frame)
	l.batches = cfg.Batches
	done := ctx.Done()
	for {
		for range maxPoll {
			n, err := l.pollOnce()
			if err != nil {
				return err
			}
			if n == 0 {
				break
			}
		}
		select {
		case <-done:
			return ctx.Err()
		default:
		}
		if cfg.BusyPoll {
			continue
		}
		l.st.Arms.Add(1)
		if err := q.Arm(); err != nil {
			return fmt.Errorf("receive loop: arm for a wake-up: %w", err)
		}
		n, err := l.pollOnce()
		if err != nil {
			return err
		}
		if n > 0 {
			// Work arrived in the window; the queue stays armed, so at worst the next Wait returns at
			// once for a spurious (already drained) event.
			continue
		}
		l.st.Waits.Add(1)
		if err := q.Wait(ctx); err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
				return ctxErr
			}
			return fmt.Errorf("receive loop: wait: %w", err)
		}
	}
}

type loop struct {
	q       Queue
	st      *Stats
	frame   func(uint64, []byte)
	wc      []Completion
	ids     []uint64
	batches interface {
		BeginBatch()
		EndBatch()
	}
}

func newLoop(q Queue, st *Stats, batch int, frame func(uint64, []byte)) *loop {
	if batch <= 0 {
		batch = defaultBatch
	}
	if st == nil {
		st = new(Stats)
	}
	return &loop{q: q, st: st, frame: frame, wc: make([]Completion, batch), ids: make([]uint64, batch)}
}

// pollOnce polls one batch, delivers it and reposts its slots.
func (l *loop) pollOnce() (int, error) {
	n, err := l.q.Poll(l.wc)
	l.st.Polls.Add(1)
	if err != nil {
		return 0, fmt.Errorf("receive loop: poll: %w", err)
	}
	if n == 0 {
		l.st.Empty.Add(1)
		return 0, nil
	}
	var bad, flushed uint64
	if l.batches != nil {
		l.batches.BeginBatch()
	}
	for i := range l.wc[:n] {
		c := &l.wc[i]
		l.ids[i] = c.ID
		if c.Status == StatusFlushed {
			flushed++ // the receiver flushed the queue on purpose (a held stream stop): not an error
			continue
		}
		if c.Status != StatusSuccess {
			bad++
			continue
		}
		buf := l.q.Slot(c.ID)
		if int(c.Len) > len(buf) {
			bad++
			continue
		}
		l.frame(c.ID, buf[:c.Len])
	}
	if l.batches != nil {
		l.batches.EndBatch()
	}
	// Slots go back only after the callback is done with them, in one batch: posting is a doorbell
	// write (or a ring update), so batching matters.
	if err := l.q.Repost(l.ids[:n]); err != nil {
		return 0, fmt.Errorf("receive loop: repost %d slots: %w", n, err)
	}
	l.st.Reposts.Add(1)
	l.st.Frames.Add(uint64(n) - bad - flushed)
	if bad > 0 {
		l.st.Errors.Add(bad)
	}
	if flushed > 0 {
		l.st.Flushed.Add(flushed)
	}
	return n, nil
}
