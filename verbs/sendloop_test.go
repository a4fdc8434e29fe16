package verbs_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/frame"
	"github.com/ibvbridge/ibvbridge/internal/rxloop"
	"github.com/ibvbridge/ibvbridge/verbs"
	"github.com/ibvbridge/ibvbridge/verbs/verbstest"
)

type fakeClock struct {
	now    time.Duration
	slept  time.Duration
	sleeps int
}

func (c *fakeClock) Now() time.Duration { return c.now }
func (c *fakeClock) Sleep(_ context.Context, d time.Duration) error {
	c.now += d
	c.slept += d
	c.sleeps++
	return nil
}

func TestSendLoopSignalsOncePerBatch(t *testing.T) {
	q := verbstest.NewSendQueue(t, 64, 128)
	l, err := verbs.NewSendLoop(q, verbs.SendLoopConfig{Slots: 64, Batch: 16})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const n = 1000
	for i := range n {
		_, buf, err := l.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		buf[0] = byte(i)
		if err := l.Commit(ctx, 100, 58); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	wantSignaled := (n + 15) / 16 // 62 full batches and the flushed 8
	if q.WRs != n || q.Signaled != wantSignaled || q.Posts != wantSignaled {
		t.Errorf("%d WRs, %d signaled, %d posts; want %d, %d, %d", q.WRs, q.Signaled, q.Posts, n, wantSignaled, wantSignaled)
	}
	st := l.Stats()
	if st.Packets != n || st.Bytes != n*58 || st.FrameBytes != n*100 || st.Signaled != uint64(wantSignaled) {
		t.Errorf("stats %+v", st)
	}
	if head, posted, tail := l.Window(); head != n || posted != n || tail != n {
		t.Errorf("head %d posted %d tail %d after flush", head, posted, tail)
	}
}

// TestSendLoopReusesOnlyCompletedBuffers: the NIC completes one signaled
// chain per poll at most, so the sender keeps running out of buffers; the
// fake fails the test if a buffer in flight is handed out or changed.
func TestSendLoopReusesOnlyCompletedBuffers(t *testing.T) {
	for _, busy := range []bool{false, true} {
		t.Run(fmt.Sprintf("busy=%v", busy), func(t *testing.T) {
			q := verbstest.NewSendQueue(t, 8, 64)
			q.Auto = false
			polls := 0
			l, err := verbs.NewSendLoop(&slowPoller{q, &polls}, verbs.SendLoopConfig{Slots: 8, Batch: 3, MaxPoll: 2, BusyPoll: busy})
			if err != nil {
				t.Fatal(err)
			}
			q.OnWait = func() { q.Complete(1) }
			ctx := context.Background()
			for i := range 200 {
				_, buf, err := l.Next(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for j := range buf {
					buf[j] = byte(i)
				}
				if err := l.Commit(ctx, 64, 64); err != nil {
					t.Fatal(err)
				}
			}
			if err := l.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if l.Stats().Stalls == 0 {
				t.Error("the sender never waited for a buffer")
			}
			if !busy && (q.Waits == 0 || q.Arms < q.Waits) {
				t.Errorf("arms %d waits %d", q.Arms, q.Waits)
			}
			if busy && q.Waits != 0 {
				t.Errorf("busy poll slept %d times", q.Waits)
			}
		})
	}
}

// slowPoller completes one signaled chain every fifth poll.
type slowPoller struct {
	*verbstest.SendQueue
	polls *int
}

func (s *slowPoller) Poll(out []rxloop.Completion) (int, error) {
	*s.polls++
	if *s.polls%5 == 0 {
		s.Complete(1)
	}
	return s.SendQueue.Poll(out)
}

func TestSendLoopFailedCompletion(t *testing.T) {
	q := verbstest.NewSendQueue(t, 4, 64)
	l, _ := verbs.NewSendLoop(&failingQueue{q}, verbs.SendLoopConfig{Slots: 4, Batch: 2})
	ctx := context.Background()
	var err error
	for range 10 {
		if _, _, err = l.Next(ctx); err != nil {
			break
		}
		if err = l.Commit(ctx, 64, 64); err != nil {
			break
		}
	}
	if !errors.Is(err, verbs.ErrSendFailed) {
		t.Fatalf("got %v, want ErrSendFailed", err)
	}
}

type failingQueue struct{ *verbstest.SendQueue }

func (f *failingQueue) Poll(out []rxloop.Completion) (int, error) {
	n, err := f.SendQueue.Poll(out)
	for i := range out[:n] {
		out[i].Status = 5 // IBV_WC_WR_FLUSH_ERR
	}
	return n, err
}

func TestSendLoopCancelWhileWaiting(t *testing.T) {
	q := verbstest.NewSendQueue(t, 2, 64)
	q.Auto = false
	ctx, cancel := context.WithCancel(context.Background())
	q.OnWait = cancel
	l, _ := verbs.NewSendLoop(&ctxWaitQueue{q}, verbs.SendLoopConfig{Slots: 2, Batch: 1})
	var err error
	for range 3 {
		if _, _, err = l.Next(ctx); err != nil {
			break
		}
		if err = l.Commit(ctx, 64, 64); err != nil {
			break
		}
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

type ctxWaitQueue struct{ *verbstest.SendQueue }

func (c *ctxWaitQueue) Wait(ctx context.Context) error {
	c.OnWait()
	return ctx.Err()
}

// TestSendPacingMath: at 1 MB/s, 1000 packets of 1000 payload bytes take one
// second, less the last post (pacing waits for the bytes before a post).
func TestSendPacingMath(t *testing.T) {
	clk := &fakeClock{}
	q := verbstest.NewSendQueue(t, 64, 1042)
	l, err := verbs.NewSendLoop(q, verbs.SendLoopConfig{Slots: 64, FrameSize: 1042, Rate: 1e6, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	batch := l.Batch()
	if want := min(verbs.SendBatch(64, 1042), verbs.DefaultMaxBurst/1042); batch != want {
		t.Errorf("paced batch %d, want %d (one burst)", batch, want)
	}
	ctx := context.Background()
	for range 1000 {
		if _, _, err := l.Next(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Commit(ctx, 1042, 1000); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	last := 1000 % batch
	if last == 0 {
		last = batch
	}
	want := time.Duration(float64(1000-last) * 1000 / 1e6 * float64(time.Second))
	if d := clk.slept - want; d < -time.Microsecond || d > time.Microsecond {
		t.Errorf("slept %v, want %v", clk.slept, want)
	}
	if l.Stats().PaceSleep != clk.slept {
		t.Errorf("stats say %v slept", l.Stats().PaceSleep)
	}

	// A sender that fell far behind restarts its schedule instead of
	// bursting to catch up: after a 1 s stall it is again paced.
	clk.now += time.Second
	before := clk.slept
	for range 2 * batch {
		l.Next(ctx)
		l.Commit(ctx, 1042, 1000)
	}
	l.Flush(ctx)
	if clk.slept-before < time.Duration(batch)*time.Millisecond-verbs.MaxPacingLag {
		t.Errorf("after a stall slept only %v for %d packets", clk.slept-before, 2*batch)
	}
}

func TestSendConfig(t *testing.T) {
	c := verbstest.SendConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.FrameSize() != 1514 || c.Slots() != 512*1024/1514 {
		t.Errorf("frame %d slots %d", c.FrameSize(), c.Slots())
	}
	bad := map[string]func(*verbs.SendConfig){
		"interface address is not set": func(c *verbs.SendConfig) { c.Interface = netip.Addr{} },
		"not an IPv4 address":          func(c *verbs.SendConfig) { c.Endpoints[0] = netip.MustParseAddrPort("[ff02::1]:7148") },
		"no port":                      func(c *verbs.SendConfig) { c.Endpoints[0] = netip.MustParseAddrPort("239.1.1.1:0") },
		"no endpoints":                 func(c *verbs.SendConfig) { c.Endpoints = nil },
		"ttl":                          func(c *verbs.SendConfig) { c.TTL = 256 },
		"max packet size":              func(c *verbs.SendConfig) { c.MaxPacketSize = 10 },
		"buffer size":                  func(c *verbs.SendConfig) { c.BufferSize = 0 },
		"max_poll":                     func(c *verbs.SendConfig) { c.MaxPoll = 0 },
		"rate":                         func(c *verbs.SendConfig) { c.Rate = -1 },
	}
	for want, mod := range bad {
		c := verbstest.SendConfig()
		mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", want, err)
		}
	}
	// Environment, as RecvConfig: flag > IBVBRIDGE_ > SPEAD2_.
	env := map[string]string{verbs.EnvInterface: "192.0.2.5", verbs.EnvSpead2Interface: "192.0.2.6", verbs.EnvSpead2CompVector: "-1"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	c = verbstest.SendConfig()
	if err := c.ApplyEnv(lookup, verbs.FlagsSet{}); err != nil || c.Interface.String() != "192.0.2.5" || c.CompVector != -1 {
		t.Errorf("env: %v %v %d", err, c.Interface, c.CompVector)
	}
	c = verbstest.SendConfig()
	if err := c.ApplyEnv(lookup, verbs.FlagsSet{Interface: true, CompVector: true}); err != nil || c.Interface.String() != "192.0.2.2" || c.CompVector != 0 {
		t.Errorf("flags: %v %v %d", err, c.Interface, c.CompVector)
	}
}

// TestSenderRejects: the frame-level API refuses what would corrupt a frame
// or the buffer accounting.
func TestSenderRejects(t *testing.T) {
	cfg := verbstest.SendConfig()
	s := verbstest.NewSender(t, verbstest.NewSendQueue(t, cfg.Slots(), cfg.FrameSize()), cfg, verbs.SendLoopConfig{}, false)
	ctx := context.Background()
	if _, err := s.Buffer(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.CommitTo(ctx, 5, 10); err == nil {
		t.Error("endpoint index out of range accepted")
	}
	if err := s.Commit(ctx, cfg.MaxPacketSize+1); err == nil {
		t.Error("oversized packet accepted")
	}
	if _, err := s.Buffer(ctx); err == nil {
		t.Error("second Buffer without Commit accepted")
	}
	s.Discard()
	if _, err := s.Buffer(ctx); err != nil {
		t.Errorf("Buffer after Discard: %v", err)
	}
	if _, err := verbs.NewSender(verbstest.NewSendQueue(t, 1, 64), cfg, verbs.SendLoopConfig{}, frame.Header{}, nil, false); err == nil {
		t.Error("sender without destination MACs accepted")
	}
}
