package verbs

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
)

// Status is a work completion status (enum ibv_wc_status); 0 is success.
type Status uint32

// StatusSuccess is IBV_WC_SUCCESS.
const StatusSuccess Status = 0

// Completion is one finished receive work request. Its layout matches the C
// shim's ibvb_completion so the device queue polls straight into Go memory.
type Completion struct {
	ID     uint64 // work request id: the slot index
	Len    uint32 // bytes written into the slot
	Status Status
}

// Queue is a receive queue as the loop sees it: a completion queue to poll, a
// receive queue to repost to, and an edge-triggered wakeup. Receiver is the
// device implementation; tests use a fake.
type Queue interface {
	// Poll fills out with up to len(out) completions and returns how many.
	// It never blocks.
	Poll(out []Completion) (int, error)
	// Repost gives the slots back to the NIC as one batch.
	Repost(ids []uint64) error
	// Arm requests one wakeup for the next completion (ibv_req_notify_cq).
	// Completions that arrived before Arm do not cause a wakeup.
	Arm() error
	// Wait blocks until a wakeup requested by Arm fires or ctx is done.
	Wait(ctx context.Context) error
	// Slot returns the receive buffer of work request id.
	Slot(id uint64) []byte
}

// LoopConfig tunes RunRecvLoop.
type LoopConfig struct {
	// MaxPoll is how many consecutive polls are made before the loop goes
	// idle (wait mode) or checks for cancellation (busy mode). spead2: 10.
	MaxPoll int
	// BusyPoll spins on the CQ instead of sleeping: lowest latency, one core
	// at 100%. Only when asked for (CompVector < 0).
	BusyPoll bool
	// Batch is the completions taken per poll and the repost batch size.
	// Defaults to 64.
	Batch int
	// Stats, if set, is updated once per batch.
	Stats *LoopStats
}

// LoopStats counts what the loop did. Fields are atomics so a monitor may read
// them while the loop runs.
type LoopStats struct {
	Frames  atomic.Uint64 // completions delivered to the callback
	Errors  atomic.Uint64 // completions with a non-success status (slot reposted)
	Polls   atomic.Uint64 // Poll calls
	Empty   atomic.Uint64 // Poll calls that returned nothing
	Arms    atomic.Uint64
	Waits   atomic.Uint64
	Reposts atomic.Uint64 // Repost calls (batches)
}

// RunRecvLoop polls q and hands every successfully received frame to frame
// (valid only during the call: its slot is reposted right after) until ctx is
// done or the queue fails. It returns ctx.Err() on cancellation.
//
// Idle behaviour, the part that is easy to get wrong:
//   - busy mode polls again at once; it only checks ctx between rounds;
//   - wait mode arms the CQ, then polls once more before sleeping. Completion
//     events are edge-triggered: a packet that lands after the last empty poll
//     but before the arm raises no event, and sleeping then would strand it
//     (and, with every slot full, deadlock the receiver). Polling after arming
//     catches it; anything later raises the event.
//
// The steady state allocates nothing.
func RunRecvLoop(ctx context.Context, q Queue, cfg LoopConfig, frame func(id uint64, frame []byte)) error {
	maxPoll := cfg.MaxPoll
	if maxPoll <= 0 {
		maxPoll = DefaultMaxPoll
	}
	batch := cfg.Batch
	if batch <= 0 {
		batch = 64
	}
	st := cfg.Stats
	if st == nil {
		st = new(LoopStats)
	}
	l := recvLoop{
		q:     q,
		st:    st,
		frame: frame,
		wc:    make([]Completion, batch),
		ids:   make([]uint64, batch),
	}
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
		st.Arms.Add(1)
		if err := q.Arm(); err != nil {
			return fmt.Errorf("receive loop: arm for a wake-up: %w", err)
		}
		n, err := l.pollOnce()
		if err != nil {
			return err
		}
		if n > 0 {
			// Work arrived in the window; the CQ stays armed, so at worst the
			// next Wait returns at once for a spurious (already drained) event.
			continue
		}
		st.Waits.Add(1)
		if err := q.Wait(ctx); err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
				return ctxErr
			}
			return fmt.Errorf("receive loop: wait: %w", err)
		}
	}
}

type recvLoop struct {
	q     Queue
	st    *LoopStats
	frame func(uint64, []byte)
	wc    []Completion
	ids   []uint64
}

// pollOnce polls one batch, delivers it and reposts its slots.
func (l *recvLoop) pollOnce() (int, error) {
	n, err := l.q.Poll(l.wc)
	l.st.Polls.Add(1)
	if err != nil {
		return 0, fmt.Errorf("receive loop: poll: %w", err)
	}
	if n == 0 {
		l.st.Empty.Add(1)
		return 0, nil
	}
	var bad uint64
	for i := range l.wc[:n] {
		c := &l.wc[i]
		l.ids[i] = c.ID
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
	// Slots go back only after the callback is done with them, in one
	// post_recv chain: posting is a doorbell write, so batching matters.
	if err := l.q.Repost(l.ids[:n]); err != nil {
		return 0, fmt.Errorf("receive loop: repost %d slots: %w", n, err)
	}
	l.st.Reposts.Add(1)
	l.st.Frames.Add(uint64(n) - bad)
	if bad > 0 {
		l.st.Errors.Add(bad)
	}
	return n, nil
}
