package ibv

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ibvbridge/ibvbridge/frame"
	"github.com/ibvbridge/ibvbridge/internal/rxloop"
	"github.com/ibvbridge/ibvbridge/transport"
	"github.com/ibvbridge/ibvbridge/verbs"
)

// Source is the ibverbs receive transport before it has a packet area: a checked configuration.
type Source struct {
	cfg verbs.RecvConfig
}

// NewSource checks cfg, then that libibverbs loads, lists devices and has one behind cfg.Interface, all
// without opening anything. The errors wrap verbs' (ErrLibraryNotFound, ErrNoDevices, ErrNoRDMADevice).
func NewSource(cfg verbs.RecvConfig) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, _, _, err := verbs.CheckInterface(cfg.Interface); err != nil {
		return nil, fmt.Errorf("ibverbs receiver on %s: %w", cfg.Interface, err)
	}
	return &Source{cfg: cfg}, nil
}

// AreaSize is the ring packet area the receive buffer needs: BufferSize/MaxSize slots of MaxSize bytes,
// each aligned, wherever the area starts.
func (s *Source) AreaSize() int { return verbs.AreaSize(s.cfg.MaxSize, s.cfg.BufferSize) }

// Open opens the receiver on area, the ring's packet area (not Go memory: the NIC writes into it until
// the returned Receiver is closed). It returns a *Receiver.
func (s *Source) Open(area []byte) (transport.Source, error) {
	r, err := verbs.OpenReceiver(s.cfg, area)
	if err != nil {
		return nil, err
	}
	return newReceiver(r, r.Close, s.cfg), nil
}

// Receiver is an opened Source: it receives until its context is done, handing each UDP payload to the
// sink. Frames that are not plain IPv4/UDP (VLAN tags, IP options, fragments, non-UDP) are counted and
// skipped, as spead2 does.
type Receiver struct {
	q         rxloop.Queue
	split     verbs.SplitQueue // with RecvConfig.Place: q, able to place payloads
	release   func() error
	loop      rxloop.Config
	stats     rxloop.Stats
	dropped   atomic.Uint64
	droppedBy [frame.NumReasons]atomic.Uint64

	placed, misses, holds atomic.Uint64
}

// newReceiver runs q (the device receiver, or a fake in tests); release frees it. With cfg.Place and a q
// that can split work requests, payloads are placed when the sink is a transport.Placer.
func newReceiver(q rxloop.Queue, release func() error, cfg verbs.RecvConfig) *Receiver {
	r := &Receiver{q: q, release: release}
	if sq, ok := q.(verbs.SplitQueue); ok && cfg.Place {
		r.split = sq
	}
	r.loop = rxloop.Config{MaxPoll: cfg.MaxPoll, BusyPoll: cfg.BusyPoll(), Stats: &r.stats}
	return r
}

// Run implements transport.Source. It releases the receiver as soon as ctx is done: the NIC must stop
// writing into the ring's packet area (and, placing, into ring slots) before the ring is unmapped.
func (r *Receiver) Run(ctx context.Context, sink transport.Sink) error {
	loop := r.loop
	if b, ok := sink.(transport.Batcher); ok {
		loop.Batches = b // each poll's heaps reach consumers together
	}
	if pl, ok := sink.(transport.Placer); ok && r.split != nil {
		s := newPlacing(r, r.split, pl)
		err := rxloop.Run(ctx, s, loop, s.frame)
		r.release()
		s.replay() // what was held back: the NIC writes no more, so nothing awaits a region now
		return err
	}
	defer r.release()
	return rxloop.Run(ctx, r.q, loop, func(_ uint64, f []byte) {
		if udp, ok := r.parse(f); ok {
			sink.Packet(udp.Payload, time.Now().UnixNano())
		}
	})
}

// parse parses a received frame; a frame that is not plain IPv4/UDP is counted, by reason, and skipped.
func (r *Receiver) parse(f []byte) (frame.UDP, bool) {
	udp, err := frame.Parse(f)
	if err != nil {
		r.dropped.Add(1)
		r.droppedBy[frame.ReasonOf(err)].Add(1)
		return udp, false
	}
	return udp, true
}

// Close releases the receiver (flows, QP, CQs, memory registration, device); safe to call twice.
func (r *Receiver) Close() error { return r.release() }

// Counters implements transport.Counted: the loop's counters (frames, completion_errs, polls, ...), the
// frames dropped in total and per reason ("dropped_vlan_tagged", ...; only reasons seen), the packets
// handed to the sink, and placement's (as udp names them): "placed", payloads the NIC wrote straight into
// their slot; "placement_misses", payloads written into a guessed region that was wrong, then copied out;
// "placement_holds", times packets had to be held back until no region awaited a frame.
func (r *Receiver) Counters() map[string]uint64 {
	st := &r.stats
	frames, dropped := st.Frames.Load(), r.dropped.Load()
	m := map[string]uint64{
		"frames":           frames,
		"packets":          frames - min(frames, dropped),
		"dropped":          dropped,
		"completion_errs":  st.Errors.Load(),
		"flushed":          st.Flushed.Load(),
		"polls":            st.Polls.Load(),
		"empty_polls":      st.Empty.Load(),
		"arms":             st.Arms.Load(),
		"waits":            st.Waits.Load(),
		"reposts":          st.Reposts.Load(),
		"placed":           r.placed.Load(),
		"placement_misses": r.misses.Load(),
		"placement_holds":  r.holds.Load(),
	}
	for i := range r.droppedBy {
		if n := r.droppedBy[i].Load(); n > 0 {
			m["dropped_"+strings.ReplaceAll(frame.Reason(i).String(), " ", "_")] = n
		}
	}
	return m
}

var (
	_ transport.AreaSource = (*Source)(nil)
	_ transport.Source     = (*Receiver)(nil)
	_ transport.Counted    = (*Receiver)(nil)
)
