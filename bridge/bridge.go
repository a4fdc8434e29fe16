// Package bridge owns the receive pipeline: a transport.Source feeds the SPEAD heap assembler, which
// writes whole heaps into a ring that C, Python and Go consumers read zero-copy. It owns the order in
// which the pieces open (a kernel-bypass source needs the ring's packet area, so it opens after the ring),
// how a run ends (stream stop, end of input, cancellation, a failing source), how the stream is finished
// in the ring (flush, end-of-stream marker, block policy's wait for the consumer), and the final counters.
// It never exits the process: cancellation comes through a context, the outcome through Result.
package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/assemble"
	"github.com/ibvbridge/ibvbridge/transport"
)

// Outcome is how a run ended; its text is recv's "result" field.
type Outcome string

const (
	OutcomeStreamStop  Outcome = "stream_stop"  // the sender's stream-stop heap arrived
	OutcomeEndOfInput  Outcome = "end_of_input" // the source ended (a pcap file's end)
	OutcomeInterrupted Outcome = "interrupted"  // the context was cancelled
	OutcomeError       Outcome = "error"        // the source failed, or did not stop when told to
)

// sourceStopTimeout bounds the wait for a cancelled source to return: past it the source still owns the
// assembler, so the run ends with OutcomeError and leaves the stream for Close to end.
const sourceStopTimeout = 5 * time.Second

// Config describes one receive pipeline.
type Config struct {
	Ring      string      // ring name
	RingCfg   ring.Config // geometry, policy, hugepages; PacketArea is set from AreaSource
	Assembler assemble.AssemblerConfig
	// Exactly one of Source and AreaSource: a Source that brings its own buffers (sockets, pcap), or a
	// kernel-bypass source that receives into the ring's packet area (AF_XDP, ibverbs).
	Source     transport.Source
	AreaSource transport.AreaSource
	// WaitConsumer, if positive, makes Run wait this long for a consumer to attach before it starts the
	// source (a file replay into a reader), and fail if none does.
	WaitConsumer time.Duration
	// StatsInterval, if positive, logs the ring's and the transport's counters this often.
	StatsInterval time.Duration
	// LossSummary is the least time between two summary lines of losses that go on (default
	// DefaultLossSummary); the first loss of each kind is logged within 200 ms whatever it is.
	LossSummary time.Duration
	// Ready, if set, is called once the source runs (the service is up: sd_notify READY=1).
	Ready func()
	// Tick, if set, is called from the run's loop every 200 ms while it runs (a watchdog ping: it stops
	// when the loop does).
	Tick func(now time.Time)
	Log  *zerolog.Logger // nil: silent
}

// ErrNoConsumer is returned by Run when Config.WaitConsumer passed with no consumer attached.
var ErrNoConsumer = errors.New("no consumer attached")

// Receiver is an open pipeline: the ring exists and the source is open. Run it once, then Close it.
type Receiver struct {
	cfg Config
	p   *ring.Producer
	asm *assemble.Assembler
	src transport.Source
	log *zerolog.Logger
	// losses watches the loss counters (losses.go); streams counts the streams that ended (KeepGoing).
	losses  *lossWatch
	streams atomic.Uint64
}

// Open creates the ring, opens a kernel-bypass source on its packet area and builds the assembler. On
// error everything it opened is closed again, and cfg.Source too: Open owns the source from the call on.
func Open(cfg Config) (_ *Receiver, err error) {
	if (cfg.Source == nil) == (cfg.AreaSource == nil) {
		if cfg.Source != nil {
			cfg.Source.Close()
		}
		return nil, errors.New("bridge: want exactly one of Source and AreaSource")
	}
	r := &Receiver{cfg: cfg, src: cfg.Source, log: cfg.Log}
	if r.log == nil {
		nop := zerolog.Nop()
		r.log = &nop
	}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	rc := cfg.RingCfg
	if cfg.AreaSource != nil {
		rc.PacketArea = cfg.AreaSource.AreaSize()
	}
	if rc.Log == nil {
		rc.Log = cfg.Log
	}
	p, err := ring.Create(cfg.Ring, rc)
	if err != nil {
		if errors.Is(err, ring.ErrInUse) {
			return nil, fmt.Errorf("%w: another recv owns ring %q; pick another --ring name", err, cfg.Ring)
		}
		return nil, err
	}
	r.p = p
	if cfg.AreaSource != nil {
		src, err := cfg.AreaSource.Open(r.p.PacketArea())
		if err != nil {
			return nil, err
		}
		r.src = src
	}
	ac := cfg.Assembler
	if ac.Log == nil {
		ac.Log = cfg.Log
	}
	r.losses = newLossWatch(r.p, r.TransportCounters, r.log, cfg.LossSummary)
	onTrunc := ac.OnTruncated
	ac.OnTruncated = func(need uint64) {
		r.losses.noteTruncated(need)
		if onTrunc != nil {
			onTrunc(need)
		}
	}
	onEnd := ac.OnStreamEnd
	ac.OnStreamEnd = func(stopCnt uint64, err error) {
		n := r.streams.Add(1)
		if err == nil {
			r.log.Info().Uint64("stream", n).Uint64("stop_heap_cnt", stopCnt).Msg("stream ended; receiving the next")
		}
		if onEnd != nil {
			onEnd(stopCnt, err)
		}
	}
	if r.asm, err = assemble.NewAssembler(r.p, ac); err != nil {
		return nil, err
	}
	return r, nil
}

// Producer is the ring the pipeline writes.
func (r *Receiver) Producer() *ring.Producer { return r.p }

// Close closes the source and the ring (which ends the stream for consumers if Run did not); safe to call
// more than once and from another goroutine as a last resort (a second signal).
func (r *Receiver) Close() error {
	var errs []error
	if r.src != nil {
		errs = append(errs, r.src.Close())
	}
	if r.p != nil {
		errs = append(errs, r.p.Close())
	}
	return errors.Join(errs...)
}

// Result is the outcome and final counters of a run. Its JSON is recv's last line under --log-format
// json: the ring's counters at the top level (the spec's names), the transport's under
// "transport_counters".
type Result struct {
	Ring              string            `json:"ring"`
	Transport         string            `json:"transport"`
	Outcome           Outcome           `json:"result"`
	Seconds           float64           `json:"seconds"`
	TransportCounters map[string]uint64 `json:"transport_counters"`
	MalformedBy       map[string]uint64 `json:"malformed_by_reason,omitempty"`
	PacketsAfterStop  uint64            `json:"packets_after_stop"`
	// ChunkRebases: chunk mode's window re-based to a time index that jumped back (spec §13.4).
	ChunkRebases uint64            `json:"chunk_rebases"`
	Streams      uint64            `json:"streams"` // streams that ended with a stop while the ring went on (KeepGoing)
	RingCounters map[string]uint64 `json:"-"`
	// Err is why the run ended in OutcomeError; nil otherwise.
	Err error `json:"-"`
}

// Run waits for a consumer if asked, then receives until the stream stops, the input ends, ctx is
// cancelled or the source fails; it finishes the stream in the ring and, under the block policy, keeps
// the ring open until the consumer has read it (or ctx is cancelled). The counters are final when it
// returns. The error is for a run that could not start (no consumer within WaitConsumer); a run that
// started, even one cancelled before its first packet, reports through Result.
func (r *Receiver) Run(ctx context.Context) (Result, error) {
	res := Result{Ring: r.cfg.Ring}
	if r.cfg.WaitConsumer > 0 {
		// Cancelled while waiting: receive below sees ctx done at once and ends the stream as interrupted.
		if err := r.waitConsumerAttached(ctx); err != nil && ctx.Err() == nil {
			return res, err
		}
	}
	r.receive(ctx, &res)
	if m := r.MalformedByReason(); len(m) > 0 {
		res.MalformedBy = m
	}
	if r.p.Policy() == ring.PolicyBlock && res.Outcome != OutcomeInterrupted && res.Outcome != OutcomeError {
		r.waitDrained(ctx) // block policy: closing now would take unread heaps with it
	}
	res.PacketsAfterStop = r.asm.PacketsAfterStop()
	res.ChunkRebases = r.asm.ChunkRebases()
	res.Streams = r.streams.Load()
	res.RingCounters = r.p.Stats().Map()
	res.TransportCounters = r.TransportCounters()
	return res, nil
}

func (r *Receiver) waitConsumerAttached(ctx context.Context) error {
	t := time.NewTimer(r.cfg.WaitConsumer)
	defer t.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for r.p.Consumers() == 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return fmt.Errorf("%w to ring %q within %v (--wait-consumer)", ErrNoConsumer, r.cfg.Ring, r.cfg.WaitConsumer)
		case <-tick.C:
		}
	}
	r.log.Info().Msg("consumer attached")
	return nil
}

// receive runs the source into the assembler, then finishes the stream in the ring. Only the source
// goroutine touches the assembler while the source runs; the rest happens after it has returned.
func (r *Receiver) receive(ctx context.Context, res *Result) {
	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srcDone := make(chan error, 1)
	start := time.Now()
	go func() { srcDone <- r.src.Run(runCtx, r.asm) }()
	lossTick := time.NewTicker(lossPoll)
	defer lossTick.Stop()
	defer func() { r.losses.poll(time.Now()) }() // losses of the last moments still speak up
	if r.cfg.Ready != nil {
		r.cfg.Ready()
	}
	var tick <-chan time.Time
	if r.cfg.StatsInterval > 0 {
		t := time.NewTicker(r.cfg.StatsInterval)
		defer t.Stop()
		tick = t.C
	}
	var runErr error
wait:
	for {
		select {
		case <-r.asm.Done():
			res.Outcome = OutcomeStreamStop
			cancel()
			runErr = <-srcDone
			break wait
		case runErr = <-srcDone:
			res.Outcome = OutcomeEndOfInput
			break wait
		case <-ctx.Done():
			res.Outcome = OutcomeInterrupted
			cancel()
			if r.p.Policy() == ring.PolicyBlock {
				r.p.Interrupt() // a heap waiting for a slot gives up, so the source returns
			}
			select {
			case runErr = <-srcDone:
			case <-time.After(sourceStopTimeout):
				// The source still owns the assembler: leave the stream as it is; Close ends it.
				res.Outcome, res.Seconds = OutcomeError, time.Since(start).Seconds()
				res.Err = fmt.Errorf("the source did not stop within %v", sourceStopTimeout)
				r.log.Error().Err(res.Err).Msg("stopping")
				return
			}
			break wait
		case <-tick:
			r.logStats()
		case now := <-lossTick.C:
			r.losses.poll(now)
			if r.cfg.Tick != nil {
				r.cfg.Tick(now)
			}
		}
	}
	res.Seconds = time.Since(start).Seconds()
	if runErr != nil && !errors.Is(runErr, context.Canceled) {
		r.log.Error().Err(runErr).Msg("receive failed")
		res.Outcome, res.Err = OutcomeError, runErr
	}
	select {
	case <-r.asm.Done():
		if res.Outcome != OutcomeError {
			res.Outcome = OutcomeStreamStop // the stop packet raced a cancellation or the end of the file
		}
	default:
		// The input ended without a stream stop: publish what is live and tell consumers the stream is over.
		r.asm.Flush()
		timeout := time.Second
		if r.p.Policy() == ring.PolicyBlock && res.Outcome == OutcomeEndOfInput {
			timeout = time.Minute // a replay waits for its consumer to make room, as it did all along
		}
		if err := r.p.PublishEndOfStream(0, timeout); err != nil {
			r.log.Warn().Err(err).Msg("no slot for the end-of-stream marker; closing the ring ends the stream")
		}
	}
}

// waitDrained keeps the ring open until every attached consumer has released every heap (the
// end-of-stream marker included), until they have all detached, or until ctx is cancelled. With no
// consumer attached there is nobody to wait for: the unread heaps are reported and the run ends.
func (r *Receiver) waitDrained(ctx context.Context) {
	if r.p.Consumers() == 0 {
		if n := r.p.UnreadHeaps(); n > 0 { // not Backlog: a consumer that read everything and left leaves 0
			r.log.Warn().Uint64("unread_heaps", n).Str("reason", "no consumer attached").Msg("closing the ring with heaps no consumer read")
		}
		return
	}
	if r.p.Unread() == 0 {
		return
	}
	r.log.Info().Uint64("unread_heaps", r.p.Unread()).Int("consumers", r.p.Consumers()).
		Msg("input done; waiting for the consumers to read the ring (Ctrl-C to stop)")
	if err := r.p.WaitDrained(ctx.Done()); err != nil {
		if n := r.p.UnreadHeaps(); n > 0 { // the last consumer may have read everything before it left
			r.log.Warn().Uint64("unread_heaps", n).Str("reason", err.Error()).Msg("closing the ring with heaps no consumer read")
		}
	}
}

// MalformedByReason returns the packets the decoder or assembler rejected, by reason name (non-zero
// only). Safe from any goroutine.
func (r *Receiver) MalformedByReason() map[string]uint64 {
	m := map[string]uint64{}
	for i, n := range r.asm.MalformedByReason() {
		if n > 0 {
			m[spead.Reason(i).String()] = n
		}
	}
	return m
}

// ThreadCounters returns each receive thread's counters when the source has several (nil otherwise). Safe
// from any goroutine.
func (r *Receiver) ThreadCounters() []map[string]uint64 {
	if c, ok := r.src.(transport.ThreadCounted); ok {
		if t := c.ThreadCounters(); len(t) > 1 {
			return t
		}
	}
	return nil
}

// TransportCounters returns the source's counters (empty for a source that keeps none). Safe from any
// goroutine.
func (r *Receiver) TransportCounters() map[string]uint64 {
	if c, ok := r.src.(transport.Counted); ok {
		return c.Counters()
	}
	return map[string]uint64{}
}

func (r *Receiver) logStats() {
	st := r.p.Stats()
	ev := r.log.Info()
	for _, c := range ring.Counters() {
		if c != ring.CounterEndOfStream {
			ev = ev.Uint64(c.String(), st.Get(c))
		}
	}
	ev.Interface("transport", r.TransportCounters()).Msg("stats")
}

// MarshalJSON puts the ring's counters at the top level beside the run's own fields.
func (r Result) MarshalJSON() ([]byte, error) {
	type plain Result
	b, err := json.Marshal(plain(r))
	if err != nil {
		return nil, err
	}
	m := map[string]any{}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	for k, v := range r.RingCounters {
		m[k] = v
	}
	return json.Marshal(m)
}
