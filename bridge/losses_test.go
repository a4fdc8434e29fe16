package bridge

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ibvbridge/ibvbridge/bench"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/transport"
)

// lossySource is a replaySource whose transport counters include kernel_drops, which the test sets.
type lossySource struct {
	replaySource
	kernelDrops atomic.Uint64
}

func (s *lossySource) Run(ctx context.Context, sink transport.Sink) error {
	return s.replaySource.Run(ctx, sink)
}
func (s *lossySource) Counters() map[string]uint64 {
	return map[string]uint64{"packets": s.sent.Load(), "kernel_drops": s.kernelDrops.Load()}
}

// runLogged opens cfg with a JSON log into a buffer and runs it until the returned stop is called.
func runLogged(t *testing.T, cfg Config) (*Receiver, *bench.LockedBuffer, func() Result) {
	t.Helper()
	var buf bench.LockedBuffer
	log := zerolog.New(&buf)
	cfg.Log = &log
	r, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan Result, 1)
	go func() {
		res, err := r.Run(ctx)
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	stopped := false
	stop := func() Result {
		if stopped {
			return Result{}
		}
		stopped = true
		cancel()
		res := <-done
		r.Close()
		return res
	}
	t.Cleanup(func() { stop() })
	return r, &buf, stop
}

// waitLine waits up to d for a log line containing want and returns it and how long it took.
func waitLine(buf *bench.LockedBuffer, want string, d time.Duration) (string, time.Duration) {
	start := time.Now()
	for time.Since(start) < d {
		for _, l := range strings.Split(buf.String(), "\n") {
			if strings.Contains(l, want) {
				return l, time.Since(start)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return "", d
}

// TestLossFirstLineWithinASecond: each kind of loss — a heap dropped for a full ring, a consumer overrun,
// a heap cut to its slot, datagrams the kernel dropped, a chunk heap too old or rejected — is logged within
// 1 s of its first occurrence, naming what to change; while it goes on, a summary line gives the count
// since the last line.
func TestLossFirstLineWithinASecond(t *testing.T) {
	for _, tc := range []struct {
		kind string
		bump func(r *Receiver, src *lossySource, n uint64)
		fix  string // part of the advice
	}{
		{"dropped_heaps", func(r *Receiver, _ *lossySource, n uint64) { r.p.Add(ring.CounterDroppedHeaps, n) },
			fmt.Sprintf("raise --slots (now 64) or speed up the slowest consumer (consumer pid %d, row 0,", os.Getpid())},
		{"consumer_overruns", func(r *Receiver, _ *lossySource, n uint64) { r.p.Add(ring.CounterConsumerOverruns, n) },
			"raise --slots (now 64)"},
		{"truncated_heaps", func(r *Receiver, _ *lossySource, n uint64) {
			r.losses.noteTruncated(100000)
			r.p.Add(ring.CounterTruncatedHeaps, n)
		}, "--slot-size 100000 holds the largest seen (now 16384)"},
		{"kernel_drops", func(_ *Receiver, src *lossySource, n uint64) { src.kernelDrops.Add(n) }, "raise --buffer"},
		{"too_old_heaps", func(r *Receiver, _ *lossySource, n uint64) { r.p.Add(ring.CounterTooOldHeaps, n) }, "raise --chunk-window"},
		{"rejected_heaps", func(r *Receiver, _ *lossySource, n uint64) { r.p.Add(ring.CounterRejectedHeaps, n) }, "--chunk-heap-size"},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			src := &lossySource{replaySource: replaySource{hold: true}}
			cfg := testConfig(t, src)
			cfg.Source = src
			cfg.LossSummary = 300 * time.Millisecond
			r, buf, stop := runLogged(t, cfg)
			c, err := ring.Attach(cfg.Ring, ring.AttachOptions{Dir: r.p.Dir()})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			time.Sleep(50 * time.Millisecond) // the run's loop is up
			tc.bump(r, src, 3)
			line, took := waitLine(buf, "losing data: "+tc.kind, time.Second)
			if line == "" {
				t.Fatalf("no line for %s within 1 s:\n%s", tc.kind, buf.String())
			}
			if !strings.Contains(line, `"count":3`) || !strings.Contains(line, tc.fix) || !strings.Contains(line, `"level":"warn"`) {
				t.Errorf("first line %s: want a warning counting 3 and advising %q", line, tc.fix)
			}
			t.Logf("first line after %v: %s", took.Round(time.Millisecond), line)
			tc.bump(r, src, 5)
			line, _ = waitLine(buf, "still losing data: "+tc.kind, 2*time.Second)
			if !strings.Contains(line, fmt.Sprintf(`"%s":5`, tc.kind)) {
				t.Errorf("summary %q: want the 5 since the first line", line)
			}
			stop()
			if n := strings.Count(buf.String(), "losing data: "+tc.kind); n != 2 {
				t.Errorf("%d lines for %s, want the first and one summary (rate-limited):\n%s", n, tc.kind, buf.String())
			}
		})
	}
}

// TestTruncatedHeapLogsTheSlotSizeNeeded: a real heap longer than its slot, through the assembler, is
// logged within 1 s with the slot size that would have held it.
func TestTruncatedHeapLogsTheSlotSizeNeeded(t *testing.T) {
	src := &lossySource{replaySource: replaySource{packets: encode(t, 2, 40000, false), hold: true}}
	cfg := testConfig(t, src)
	cfg.Source = src
	_, buf, stop := runLogged(t, cfg)
	line, _ := waitLine(buf, "losing data: truncated_heaps", time.Second)
	if !strings.Contains(line, "--slot-size 40000 holds the largest seen (now 16384)") {
		t.Fatalf("line %q: want the 40000 bytes a slot needs:\n%s", line, buf.String())
	}
	if res := stop(); res.RingCounters["truncated_heaps"] != 2 {
		t.Errorf("counters %v", res.RingCounters)
	}
}

// TestHeapModeLossAtAHighHeapRateSuggestsChunkMode: a heap-mode ring that drops heaps while it receives
// more than chunkAdviceRate heaps a second adds chunk mode to the advice; at a low rate it does not.
func TestHeapModeLossAtAHighHeapRateSuggestsChunkMode(t *testing.T) {
	src := &lossySource{replaySource: replaySource{hold: true}}
	cfg := testConfig(t, src)
	cfg.Source = src
	cfg.LossSummary = 300 * time.Millisecond
	r, buf, stop := runLogged(t, cfg)
	defer stop()
	c, err := ring.Attach(cfg.Ring, ring.AttachOptions{Dir: r.p.Dir()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(3 * lossPoll) // polls read the heaps counter: no heaps, no rate
	r.p.Add(ring.CounterDroppedHeaps, 3)
	line, _ := waitLine(buf, "losing data: dropped_heaps", time.Second)
	if line == "" || strings.Contains(line, "chunk mode") {
		t.Fatalf("first line at no heap rate %q: want the loss without the chunk-mode hint", line)
	}
	r.p.Add(ring.CounterHeaps, 1_000_000) // ≥ 1 M heaps/s over one poll
	r.p.Add(ring.CounterDroppedHeaps, 5)
	line, _ = waitLine(buf, "still losing data: dropped_heaps", 2*time.Second)
	if !strings.Contains(line, "chunk mode (--chunk-heaps N)") || !strings.Contains(line, "heaps/s") {
		t.Errorf("summary at a high heap rate %q: want the chunk-mode hint with the rate", line)
	}
}
