package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
	"github.com/ibvbridge/ibvbridge/transport"
)

// replaySource feeds pre-encoded packets to the sink, one every gap, then ends the input (or blocks until
// cancelled, with hold). It counts what it delivered, read from another goroutine while it runs.
type replaySource struct {
	packets [][]byte
	gap     time.Duration
	hold    bool  // after the packets, wait for cancellation instead of ending the input
	fail    error // returned after the packets
	sent    atomic.Uint64
	closed  atomic.Int32
}

func (s *replaySource) Run(ctx context.Context, sink transport.Sink) error {
	for _, p := range s.packets {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		sink.Packet(p, time.Now().UnixNano())
		s.sent.Add(1)
		if s.gap > 0 {
			time.Sleep(s.gap)
		}
	}
	if s.fail != nil {
		return s.fail
	}
	if s.hold {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (s *replaySource) Close() error { s.closed.Add(1); return nil }
func (s *replaySource) Counters() map[string]uint64 {
	return map[string]uint64{"packets": s.sent.Load()}
}

// encode packetizes heaps 1..n of size bytes (and a stream stop after them if stop).
func encode(t *testing.T, n int, size int, stop bool) [][]byte {
	t.Helper()
	enc, err := spead.NewEncoder(spead.Flavour64_48, 1472)
	if err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, size)
	var out [][]byte
	send := func(h *spead.Heap) {
		if err := enc.Reset(h); err != nil {
			t.Fatal(err)
		}
		for {
			buf := make([]byte, 1472)
			m, err := enc.Next(buf)
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, buf[:m])
		}
	}
	for cnt := 1; cnt <= n; cnt++ {
		for i := range payload {
			payload[i] = byte(cnt + i)
		}
		send(&spead.Heap{Cnt: uint64(cnt), Items: []spead.Item{{ID: 0x1000, Data: payload}}})
	}
	if stop {
		h := spead.StreamStopHeap(uint64(n + 1))
		send(&h)
	}
	return out
}

var ringSeq atomic.Int64

func testConfig(t *testing.T, src transport.Source) Config {
	name := fmt.Sprintf("bridge-%d-%d", os.Getpid(), ringSeq.Add(1))
	t.Cleanup(func() { ring.Remove("", name) })
	return Config{Ring: name, Source: src,
		RingCfg: ring.Config{SlotCount: 64, SlotSize: 16 << 10, MaxItems: 8, HugePages: ring.HugePagesOff}}
}

func openRun(t *testing.T, cfg Config, ctx context.Context) (Result, error) {
	t.Helper()
	r, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	return r.Run(ctx)
}

func TestStreamStopAndCounters(t *testing.T) {
	src := &replaySource{packets: encode(t, 20, 3000, true)}
	res, err := openRun(t, testConfig(t, src), context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != OutcomeStreamStop || res.Err != nil {
		t.Errorf("outcome %s (%v), want stream_stop", res.Outcome, res.Err)
	}
	if res.RingCounters["heaps"] != 20 || res.RingCounters["packets"] != uint64(len(src.packets)) {
		t.Errorf("ring counters %v: want 20 heaps, %d packets (the stop's too)", res.RingCounters, len(src.packets))
	}
	if res.TransportCounters["packets"] != uint64(len(src.packets)) {
		t.Errorf("transport counters %v, want %d packets", res.TransportCounters, len(src.packets))
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil || m["result"] != "stream_stop" || m["heaps"] != 20.0 || m["transport_counters"] == nil {
		t.Errorf("JSON %s: want result, ring counters at the top level and transport_counters", b)
	}
}

// TestStatsWhileReceiving is recv --stats-interval: the logger reads the ring's and the transport's
// counters every millisecond while the source writes them. Under -race it catches unsynchronised state in
// Go memory (the pipeline, the source's counters). The ring's own counters live in mmap'd shared memory,
// which the race detector does not track: for those the guarantee is ring.Producer.Add's atomic store.
func TestStatsWhileReceiving(t *testing.T) {
	src := &replaySource{packets: encode(t, 200, 64, true), gap: 50 * time.Microsecond}
	cfg := testConfig(t, src)
	cfg.StatsInterval = time.Millisecond
	cfg.RingCfg.SlotCount = 256 // no consumer: every heap must fit
	res, err := openRun(t, cfg, context.Background())
	if err != nil || res.Outcome != OutcomeStreamStop || res.RingCounters["heaps"] != 200 {
		t.Fatalf("outcome %s, heaps %d, err %v", res.Outcome, res.RingCounters["heaps"], err)
	}
}

func TestEndOfInputPublishesEndOfStream(t *testing.T) {
	src := &replaySource{packets: encode(t, 3, 100, false)}
	cfg := testConfig(t, src)
	r, c := openWithConsumer(t, cfg)
	res, err := r.Run(context.Background())
	if err != nil || res.Outcome != OutcomeEndOfInput {
		t.Fatalf("outcome %s, err %v; want end_of_input", res.Outcome, err)
	}
	for i := 0; ; i++ {
		h, err := c.Next(time.Second)
		if errors.Is(err, ring.ErrEndOfStream) {
			if i != 3 {
				t.Errorf("end of stream after %d heaps, want 3", i)
			}
			break
		}
		if err != nil {
			t.Fatalf("heap %d: %v", i, err)
		}
		c.Release(h)
	}
}

func TestCancelInterrupts(t *testing.T) {
	src := &replaySource{packets: encode(t, 2, 100, false), hold: true}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	res, err := openRun(t, testConfig(t, src), ctx)
	if err != nil || res.Outcome != OutcomeInterrupted {
		t.Fatalf("outcome %s, err %v; want interrupted", res.Outcome, err)
	}
	if res.RingCounters["heaps"] != 2 {
		t.Errorf("heaps %d, want the 2 flushed at the stop", res.RingCounters["heaps"])
	}
}

func TestSourceErrorIsReported(t *testing.T) {
	boom := errors.New("boom")
	src := &replaySource{packets: encode(t, 1, 100, false), fail: boom}
	res, err := openRun(t, testConfig(t, src), context.Background())
	if err != nil || res.Outcome != OutcomeError || !errors.Is(res.Err, boom) {
		t.Fatalf("outcome %s, Err %v, err %v; want error wrapping boom", res.Outcome, res.Err, err)
	}
}

func TestWaitConsumer(t *testing.T) {
	src := &replaySource{packets: encode(t, 1, 100, true)}
	cfg := testConfig(t, src)
	cfg.WaitConsumer = 100 * time.Millisecond
	start := time.Now()
	_, err := openRun(t, cfg, context.Background())
	if !errors.Is(err, ErrNoConsumer) {
		t.Fatalf("err %v, want ErrNoConsumer", err)
	}
	if src.sent.Load() != 0 {
		t.Errorf("the source ran (%d packets) with no consumer", src.sent.Load())
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("gave up after %v, before --wait-consumer's 100 ms", d)
	}
}

// areaSource is a kernel-bypass source in miniature: it asks for a packet area and checks it got one.
type areaSource struct {
	size int
	got  []byte
	src  *replaySource
	err  error
}

func (a *areaSource) AreaSize() int { return a.size }
func (a *areaSource) Open(area []byte) (transport.Source, error) {
	a.got = area
	if a.err != nil {
		return nil, a.err
	}
	return a.src, nil
}

func TestAreaSourceOpensOnThePacketArea(t *testing.T) {
	as := &areaSource{size: 1 << 20, src: &replaySource{packets: encode(t, 1, 100, true)}}
	cfg := testConfig(t, nil)
	cfg.Source, cfg.AreaSource = nil, as
	res, err := openRun(t, cfg, context.Background())
	if err != nil || res.Outcome != OutcomeStreamStop {
		t.Fatalf("outcome %s, err %v", res.Outcome, err)
	}
	if len(as.got) < as.size {
		t.Errorf("packet area %d bytes, want at least %d", len(as.got), as.size)
	}
}

func TestOpenFailureLeavesNothing(t *testing.T) {
	boom := errors.New("no such device")
	cfg := testConfig(t, nil)
	cfg.Source, cfg.AreaSource = nil, &areaSource{size: 4096, err: boom}
	if _, err := Open(cfg); !errors.Is(err, boom) {
		t.Fatalf("err %v, want the source's", err)
	}
	if _, err := os.Stat(filepath.Join(ring.DefaultDir(), ring.SocketName(cfg.Ring))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed Open left the ring's control file: %v", err)
	}
	src := &replaySource{}
	cfg = testConfig(t, src)
	cfg.RingCfg.SlotCount = 3 // not a power of two
	if _, err := Open(cfg); !errors.Is(err, ring.ErrBadConfig) {
		t.Fatalf("err %v, want ring.ErrBadConfig", err)
	}
	if src.closed.Load() == 0 {
		t.Error("a failed Open did not close the source it was given")
	}
}

// drainInBackground reads ring c to its end of stream on its own goroutine, counting each heap cnt and
// the heaps that are not complete or fail the pattern; wait returns them once the stream has ended.
// drainInBackground reads c until the end of the stream, counting each heap cnt and the heaps that are
// incomplete or fail the pattern check; then it closes c, handing the end-of-stream marker back (a block
// recv waits for it). after, if given, runs after the i-th heap is released (a lagging consumer).
func drainInBackground(c *ring.Consumer, after ...func(i int)) (wait func() (seen map[uint64]int, bad int, err error)) {
	seen, bad := map[uint64]int{}, 0
	done := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			h, err := c.Next(10 * time.Second)
			if errors.Is(err, ring.ErrEndOfStream) {
				done <- c.Close()
				return
			}
			if err != nil {
				done <- err
				return
			}
			seen[h.HeapCnt]++
			if h.Flags&ring.FlagComplete == 0 || !pattern.Verify(&h) {
				bad++
			}
			c.Release(h)
			for _, f := range after {
				f(i)
			}
		}
	}()
	return func() (map[uint64]int, int, error) { err := <-done; return seen, bad, err }
}

// everyHeapOnce waits for a drainInBackground and fails the test unless each of heaps 1..n was delivered
// exactly once and nothing else was; it returns how many were incomplete or broken.
func everyHeapOnce(t testing.TB, wait func() (map[uint64]int, int, error), n uint64, res Result) (bad int) {
	t.Helper()
	seen, bad, err := wait()
	if err != nil {
		t.Fatal(err)
	}
	for cnt := uint64(1); cnt <= n; cnt++ {
		if seen[cnt] != 1 {
			t.Fatalf("heap %d delivered %d times; ring %v transport %v", cnt, seen[cnt], res.RingCounters, res.TransportCounters)
		}
	}
	if uint64(len(seen)) != n {
		t.Fatalf("%d distinct heaps delivered, want %d", len(seen), n)
	}
	return bad
}

// openWithConsumer opens the pipeline and attaches a consumer to its ring, both closed when the test ends.
func openWithConsumer(t *testing.T, cfg Config) (*Receiver, *ring.Consumer) {
	t.Helper()
	r, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	c, err := ring.Attach(cfg.Ring, ring.AttachOptions{Dir: cfg.RingCfg.Dir, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return r, c
}
