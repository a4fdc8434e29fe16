package verbs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ibvbridge/ibvbridge/internal/rxloop"
)

// SendFlags are per-work-request send flags, with enum ibv_send_flags' values
// (the layout test checks them against verbs.h).
type SendFlags uint32

const (
	// SendSignaled asks for a completion for this work request (IBV_SEND_SIGNALED).
	SendSignaled SendFlags = 1 << 1
	// SendIPChecksum has the NIC fill in the IPv4 header checksum (IBV_SEND_IP_CSUM).
	SendIPChecksum SendFlags = 1 << 4
)

// SendWR is one frame to transmit. Its layout matches the C shim's
// ibvb_send_wr so a batch is posted straight from Go memory.
type SendWR struct {
	ID    uint64 // work request id: the frame's position in the send sequence
	Slot  uint32 // frame buffer index in the registered area
	Len   uint32 // frame bytes, headers included
	Flags SendFlags
	_     uint32
}

// SendQueue is a send queue as the sender sees it: frame buffers in
// registered memory, a post_send that takes a batch, a completion queue to
// poll and an edge-triggered wakeup. The device sender implements it with a
// raw packet QP; tests use verbstest's fakes.
//
// Send work requests complete in posting order. Only signaled ones produce a
// completion, and a completion with ID p means every frame up to position p
// has left the buffer.
type SendQueue interface {
	// Post posts wrs as one chain (one doorbell).
	Post(wrs []SendWR) error
	// Poll fills out with up to len(out) send completions; it never blocks.
	Poll(out []rxloop.Completion) (int, error)
	// Arm requests one wakeup for the next completion.
	Arm() error
	// Wait blocks until a wakeup requested by Arm fires or ctx is done.
	Wait(ctx context.Context) error
	// Slot returns frame buffer i (registered memory the NIC reads).
	Slot(i uint32) []byte
}

// Clock is the time source of software pacing; tests fake it.
type Clock interface {
	Now() time.Duration // monotonic
	Sleep(ctx context.Context, d time.Duration) error
}

type realClock struct{ base time.Time }

func (c realClock) Now() time.Duration { return time.Since(c.base) }

func (c realClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// DefaultMaxBurst is the most bytes software pacing lets go at once (spead2's
// default burst size).
const DefaultMaxBurst = 65536

// maxPacingLag is how far behind its schedule a paced sender may fall before
// the schedule restarts: catching up at line rate would burst.
const maxPacingLag = 2 * time.Millisecond

// SendLoopConfig tunes the send loop.
type SendLoopConfig struct {
	// Slots is the number of frame buffers (and send work requests).
	Slots int
	// Batch is the frames per post_send; the last of every post is signaled,
	// so at full speed one work request in Batch raises a completion.
	// Default: spead2's, min(Slots/4, 256 KiB of frames), at least 1.
	Batch int
	// FrameSize is the largest frame, headers included (for the default Batch
	// and the burst limit).
	FrameSize int
	// MaxPoll is how many empty polls are made before sleeping (or, busy
	// polling, before checking for cancellation).
	MaxPoll int
	// BusyPoll spins on the CQ when waiting for free buffers.
	BusyPoll bool
	// Flags are added to every work request (SendIPChecksum).
	Flags SendFlags
	// Rate paces in software, in bytes per second of what Commit counts
	// (UDP payload); 0: unpaced. Leave it 0 when the hardware paces.
	Rate float64
	// MaxBurst is the most bytes posted at once under software pacing.
	MaxBurst int
	// Clock is the pacing clock; nil is the real one.
	Clock Clock
}

// SendStats counts what the send loop did. It is plain data: read it from
// the sending goroutine, or after it is done.
type SendStats struct {
	Packets     uint64 // frames posted
	Bytes       uint64 // payload bytes posted
	FrameBytes  uint64 // frame bytes posted (headers included)
	Posts       uint64 // post_send calls
	Signaled    uint64 // signaled work requests
	Completions uint64 // completions reaped
	Polls       uint64
	Empty       uint64 // polls that found nothing
	Arms        uint64
	Waits       uint64
	Stalls      uint64 // times a frame buffer had to be waited for
	PaceSleeps  uint64
	PaceSleep   time.Duration // total time slept by software pacing
}

// Map is the counters by name, for the CLI.
func (s *SendStats) Map() map[string]uint64 {
	return map[string]uint64{
		"packets": s.Packets, "bytes": s.Bytes, "frame_bytes": s.FrameBytes, "posts": s.Posts,
		"signaled": s.Signaled, "completions": s.Completions, "polls": s.Polls, "empty_polls": s.Empty,
		"arms": s.Arms, "waits": s.Waits, "stalls": s.Stalls, "pace_sleeps": s.PaceSleeps,
		"pace_sleep_us": uint64(s.PaceSleep / time.Microsecond),
	}
}

// ErrSendFailed wraps a send completion with an error status. The QP is in
// the error state after one, so the sender is unusable.
var ErrSendFailed = errors.New("ibverbs: send failed")

// SendBatch is spead2's target batch: a quarter of the buffers, at most 256
// KiB of frames, at least one.
func SendBatch(slots, frameSize int) int {
	return max(1, min(slots/4, 262144/max(1, frameSize)))
}

// sendLoop owns the frame buffers of a SendQueue. Positions count frames
// from 0: position p uses buffer p % slots. The window
//
//	[head, posted)  posted, not known to be complete: the NIC may be reading
//	[posted, tail)  built, waiting in the current batch
//	[tail, head+slots) free
//
// and a buffer is handed out only from the free part, so no buffer is written
// while the NIC may still read it.
type sendLoop struct {
	q        SendQueue
	cfg      SendLoopConfig
	slots    uint64
	batch    int
	head     uint64
	posted   uint64
	tail     uint64
	acquired bool
	pending  []SendWR
	wc       []rxloop.Completion
	clock    Clock
	paceNs   float64 // ns per byte; 0: unpaced
	paceT0   time.Duration
	paced    float64 // bytes accounted by the pacer
	pendingB int     // payload bytes in pending
	stats    SendStats
}

func newSendLoop(q SendQueue, cfg SendLoopConfig) (*sendLoop, error) {
	if cfg.Slots <= 0 {
		return nil, fmt.Errorf("ibverbs: send loop with %d buffers", cfg.Slots)
	}
	if cfg.Rate < 0 || math.IsNaN(cfg.Rate) || math.IsInf(cfg.Rate, 0) {
		return nil, fmt.Errorf("ibverbs: send rate %g bytes/s", cfg.Rate)
	}
	if cfg.MaxPoll <= 0 {
		cfg.MaxPoll = DefaultMaxPoll
	}
	if cfg.MaxBurst <= 0 {
		cfg.MaxBurst = DefaultMaxBurst
	}
	batch := cfg.Batch
	if batch <= 0 {
		batch = SendBatch(cfg.Slots, cfg.FrameSize)
	}
	if cfg.Rate > 0 && cfg.FrameSize > 0 {
		// Software pacing releases a post at a time: keep each within a burst.
		batch = min(batch, max(1, cfg.MaxBurst/cfg.FrameSize))
	}
	batch = min(batch, cfg.Slots)
	l := &sendLoop{
		q:       q,
		cfg:     cfg,
		slots:   uint64(cfg.Slots),
		batch:   batch,
		pending: make([]SendWR, 0, batch),
		wc:      make([]rxloop.Completion, max(16, min(cfg.Slots, 256))),
		clock:   cfg.Clock,
	}
	if l.clock == nil {
		l.clock = realClock{base: time.Now()}
	}
	if cfg.Rate > 0 {
		l.paceNs = 1e9 / cfg.Rate
		l.paceT0 = l.clock.Now()
	}
	return l, nil
}

// inFlight is the number of buffers not free.
func (l *sendLoop) inFlight() uint64 { return l.tail - l.head }

// next returns the buffer for the next frame, waiting for the NIC to finish
// with one if all are in use. The frame is sent by commit.
func (l *sendLoop) next(ctx context.Context) (uint32, []byte, error) {
	if l.acquired {
		return 0, nil, errors.New("ibverbs: previous send buffer not committed")
	}
	if l.inFlight() == l.slots {
		l.stats.Stalls++
		// The oldest buffers may be waiting in the batch: send them, with a
		// signal, or no completion could ever free one.
		if err := l.post(ctx); err != nil {
			return 0, nil, err
		}
		if err := l.reap(ctx, l.tail-l.slots+1); err != nil {
			return 0, nil, err
		}
	}
	slot := uint32(l.tail % l.slots)
	l.acquired = true
	return slot, l.q.Slot(slot), nil
}

// commit queues the frame in the buffer next returned: frameLen bytes on the
// wire, payload of them counted as payload. A full batch is posted.
func (l *sendLoop) commit(ctx context.Context, frameLen, payload int) error {
	if !l.acquired {
		return errors.New("ibverbs: commit without a send buffer")
	}
	l.acquired = false
	l.pending = append(l.pending, SendWR{ID: l.tail, Slot: uint32(l.tail % l.slots), Len: uint32(frameLen), Flags: l.cfg.Flags})
	l.tail++
	l.pendingB += payload
	l.stats.Packets++
	l.stats.Bytes += uint64(payload)
	l.stats.FrameBytes += uint64(frameLen)
	if len(l.pending) == l.batch {
		return l.post(ctx)
	}
	return nil
}

// post sends the pending batch, its last work request signaled, after
// software pacing has let its bytes go.
func (l *sendLoop) post(ctx context.Context) error {
	n := len(l.pending)
	if n == 0 {
		return nil
	}
	if l.paceNs > 0 {
		if err := l.pace(ctx); err != nil {
			return err
		}
	}
	l.pending[n-1].Flags |= SendSignaled
	if err := l.q.Post(l.pending); err != nil {
		return fmt.Errorf("ibverbs: post %d frames: %w", n, err)
	}
	l.stats.Posts++
	l.stats.Signaled++
	l.posted = l.tail
	l.pending = l.pending[:0]
	l.pendingB = 0
	return nil
}

// pace sleeps until the bytes already sent have had their time at the rate
// (a token bucket), then accounts the pending batch.
func (l *sendLoop) pace(ctx context.Context) error {
	due := l.paceT0 + time.Duration(l.paced*l.paceNs)
	now := l.clock.Now()
	if d := due - now; d > 0 {
		l.stats.PaceSleeps++
		l.stats.PaceSleep += d
		if err := l.clock.Sleep(ctx, d); err != nil {
			return err
		}
	} else if -d > maxPacingLag {
		// Fell behind (descheduled): restart the schedule rather than burst.
		l.paceT0 += -d - maxPacingLag
	}
	l.paced += float64(l.pendingB)
	return nil
}

// reap polls completions until head reaches want (all frames before want are
// done), sleeping on the completion channel or busy polling between tries.
func (l *sendLoop) reap(ctx context.Context, want uint64) error {
	for l.head < want {
		got := false
		for range l.cfg.MaxPoll {
			n, err := l.pollOnce()
			if err != nil {
				return err
			}
			if n > 0 {
				got = true
				break
			}
		}
		if got {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if l.cfg.BusyPoll {
			continue
		}
		l.stats.Arms++
		if err := l.q.Arm(); err != nil {
			return fmt.Errorf("ibverbs: arm send completion queue: %w", err)
		}
		// A completion between the last empty poll and the arm raised no
		// event: look once more before sleeping (see rxloop.Run).
		n, err := l.pollOnce()
		if err != nil {
			return err
		}
		if n > 0 {
			continue
		}
		l.stats.Waits++
		if err := l.q.Wait(ctx); err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
				return ctxErr
			}
			return fmt.Errorf("ibverbs: wait for send completion: %w", err)
		}
	}
	return nil
}

func (l *sendLoop) pollOnce() (int, error) {
	n, err := l.q.Poll(l.wc)
	l.stats.Polls++
	if err != nil {
		return 0, fmt.Errorf("ibverbs: poll send completion queue: %w", err)
	}
	if n == 0 {
		l.stats.Empty++
		return 0, nil
	}
	for i := range l.wc[:n] {
		c := &l.wc[i]
		if c.Status != rxloop.StatusSuccess {
			return 0, fmt.Errorf("%w: frame %d: %s", ErrSendFailed, c.ID, StatusString(c.Status))
		}
		if c.ID < l.head || c.ID >= l.posted {
			return 0, fmt.Errorf("ibverbs: send completion for frame %d outside the posted window [%d, %d)", c.ID, l.head, l.posted)
		}
		l.head = c.ID + 1
	}
	l.stats.Completions += uint64(n)
	return n, nil
}

// flush posts the pending batch and waits until the NIC is done with every
// frame.
func (l *sendLoop) flush(ctx context.Context) error {
	if err := l.post(ctx); err != nil {
		return err
	}
	return l.reap(ctx, l.posted)
}
