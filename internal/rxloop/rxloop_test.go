package rxloop_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/frame"
	"github.com/ibvbridge/ibvbridge/internal/rxloop"
	"github.com/ibvbridge/ibvbridge/internal/rxloop/rxlooptest"
)

func seqFrame(i uint64) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, i)
	return b
}

// TestLoopCatchesCompletionBeforeArm injects a completion between the loop's
// last empty poll and its Arm. It raises no event; only the poll after Arm
// can find it. Without that poll the loop would sleep forever.
func TestLoopCatchesCompletionBeforeArm(t *testing.T) {
	q := rxlooptest.NewQueue(4, 64)
	var once sync.Once
	q.BeforeArm = func() { once.Do(func() { q.Deliver(seqFrame(42)) }) }

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan uint64, 1)
	done := make(chan error, 1)
	go func() {
		done <- rxloop.Run(ctx, q, rxloop.Config{MaxPoll: 3}, func(_ uint64, f []byte) {
			got <- binary.LittleEndian.Uint64(f)
		})
	}()
	select {
	case v := <-got:
		if v != 42 {
			t.Fatalf("frame %d, want 42", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("frame that arrived before Arm was never delivered: lost wakeup")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("loop returned %v, want context.Canceled", err)
	}
}

// TestFakeQueueModelsLostWakeup shows the fake is strict enough for the test
// above to mean something: a naive loop (poll, arm, wait) strands the frame.
func TestFakeQueueModelsLostWakeup(t *testing.T) {
	q := rxlooptest.NewQueue(4, 64)
	q.BeforeArm = func() { q.Deliver(seqFrame(1)) }
	out := make([]rxloop.Completion, 4)
	if n, _ := q.Poll(out); n != 0 {
		t.Fatal("queue not empty")
	}
	q.Arm()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := q.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("naive loop woke up (%v): the fake does not model the race", err)
	}
}

// TestLoopNoLostFrames streams frames through a small ring of slots while the
// loop alternates between polling and sleeping, and checks every frame
// arrives once, in order.
func TestLoopNoLostFrames(t *testing.T) {
	const total = 20000
	q := rxlooptest.NewQueue(8, 64)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var next uint64
	var bad atomic.Int64
	allIn := make(chan struct{})
	var st rxloop.Stats
	done := make(chan error, 1)
	go func() {
		done <- rxloop.Run(ctx, q, rxloop.Config{MaxPoll: 2, Batch: 3, Stats: &st}, func(_ uint64, f []byte) {
			if v := binary.LittleEndian.Uint64(f); v != next {
				bad.Add(1)
			}
			next++
			if next == total {
				close(allIn)
			}
		})
	}()
	for i := uint64(0); i < total; i++ {
		for !q.Deliver(seqFrame(i)) {
			select { // overrun: wait for the loop to repost
			case <-q.SlotFreed():
			case <-time.After(5 * time.Second):
				t.Fatalf("no slot reposted for 5s at frame %d: loop stalled", i)
			}
		}
		if i%97 == 0 {
			time.Sleep(10 * time.Microsecond) // let the loop go idle and sleep
		}
	}
	select {
	case <-allIn:
	case <-time.After(10 * time.Second):
		t.Fatalf("only %d of %d frames delivered: lost wakeup or lost frames", st.Frames.Load(), total)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if bad.Load() != 0 {
		t.Fatalf("%d frames out of order", bad.Load())
	}
	if got := st.Frames.Load(); got != total {
		t.Fatalf("stats: %d frames, want %d", got, total)
	}
	t.Logf("polls=%d arms=%d waits=%d reposts=%d", q.Polls.Load(), q.Arms.Load(), q.Waits.Load(), st.Reposts.Load())
}

// TestLoopIdleBlocks: in wait mode an idle loop must sleep in Wait, not spin.
func TestLoopIdleBlocks(t *testing.T) {
	q := rxlooptest.NewQueue(4, 64)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rxloop.Run(ctx, q, rxloop.Config{MaxPoll: 10}, func(uint64, []byte) {}) }()
	time.Sleep(100 * time.Millisecond)
	polls, waits := q.Polls.Load(), q.Waits.Load()
	cancel()
	<-done
	// One round of polling (stops at the first empty poll), one post-arm
	// poll, then asleep in a single Wait.
	if polls > 3 || waits != 1 {
		t.Fatalf("idle loop made %d polls and %d waits in 100ms; want <= 3 polls, 1 wait", polls, waits)
	}
}

// TestLoopBusyPollSpins: busy mode never arms or waits.
func TestLoopBusyPollSpins(t *testing.T) {
	q := rxlooptest.NewQueue(4, 64)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := rxloop.Run(ctx, q, rxloop.Config{BusyPoll: true}, func(uint64, []byte) {})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	if q.Arms.Load() != 0 || q.Waits.Load() != 0 || q.Polls.Load() < 100 {
		t.Fatalf("busy loop: arms=%d waits=%d polls=%d", q.Arms.Load(), q.Waits.Load(), q.Polls.Load())
	}
}

// TestLoopBadCompletions: error completions and oversize lengths are counted
// and their slots still go back to the NIC.
func TestLoopBadCompletions(t *testing.T) {
	q := rxlooptest.NewQueue(3, 16)
	q.Complete(rxloop.Completion{ID: 0, Len: 4}, rxloop.Completion{ID: 1, Len: 4, Status: 12}, rxloop.Completion{ID: 2, Len: 17})
	var st rxloop.Stats
	var frames int
	pollOnce := rxloop.PollOnce(q, &st, 8, func(uint64, []byte) { frames++ })
	n, err := pollOnce()
	if err != nil || n != 3 {
		t.Fatal(n, err)
	}
	if frames != 1 || st.Frames.Load() != 1 || st.Errors.Load() != 2 {
		t.Fatalf("frames=%d stats frames=%d errors=%d", frames, st.Frames.Load(), st.Errors.Load())
	}
	for id := range uint64(3) {
		if !q.Posted(id) {
			t.Errorf("slot %d not reposted", id)
		}
	}
}

// TestLoopQueueErrors: queue failures end the loop with context, and the
// messages name the receive loop, not a transport (ibverbs and AF_XDP share it).
func TestLoopQueueErrors(t *testing.T) {
	boom := errors.New("boom")
	for _, c := range []struct {
		set  func(*rxlooptest.Queue)
		want string
	}{
		{func(q *rxlooptest.Queue) { q.PollErr = boom }, "receive loop: poll: boom"},
		{func(q *rxlooptest.Queue) { q.ArmErr = boom }, "receive loop: arm for a wake-up: boom"},
		{func(q *rxlooptest.Queue) { q.WaitErr = boom }, "receive loop: wait: boom"},
	} {
		q := rxlooptest.NewQueue(1, 64)
		c.set(q)
		err := rxloop.Run(context.Background(), q, rxloop.Config{}, func(uint64, []byte) {})
		if !errors.Is(err, boom) || err.Error() != c.want {
			t.Errorf("got %v, want %q", err, c.want)
		}
	}
}

// spinFrames are n frames of 8000 bytes for a replay queue: it always has a
// full batch ready, which isolates the loop's own cost.
func spinFrames(n int) [][]byte {
	frames := make([][]byte, n)
	for i := range frames {
		frames[i] = make([]byte, 8000)
	}
	return frames
}

func TestLoopHotPathAllocatesNothing(t *testing.T) {
	q := rxlooptest.NewReplayQueue(spinFrames(256))
	var sum int
	pollOnce := rxloop.PollOnce(q, new(rxloop.Stats), 64, func(_ uint64, f []byte) { sum += len(f) })
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := pollOnce(); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("pollOnce allocates %.1f times per batch of 64", allocs)
	}
}

// BenchmarkRecvLoop measures the loop per frame against a queue that always
// has a full batch: poll, deliver, repost bookkeeping, without the device.
func BenchmarkRecvLoop(b *testing.B) {
	q := rxlooptest.NewReplayQueue(spinFrames(2048))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := 0
	b.ReportAllocs()
	b.ResetTimer()
	_ = rxloop.Run(ctx, q, rxloop.Config{BusyPoll: true}, func(_ uint64, f []byte) {
		n++
		if n == b.N {
			cancel()
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/frame")
}

// BenchmarkRecvLoopUDP adds the Ethernet/IPv4/UDP parse the transports do.
func BenchmarkRecvLoopUDP(b *testing.B) {
	frames := spinFrames(2048)
	b2 := frame.Builder{Header: frame.Header{SrcIP: netip.MustParseAddr("10.0.0.1"), DstIP: netip.MustParseAddr("239.1.2.3"), DstPort: 7148, TTL: 1}}
	if err := b2.Build(frames[0], len(frames[0])-frame.HeaderLen); err != nil {
		b.Fatal(err)
	}
	for _, s := range frames[1:] {
		copy(s, frames[0])
	}
	q := rxlooptest.NewReplayQueue(frames)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n, bytes := 0, 0
	b.ReportAllocs()
	b.ResetTimer()
	_ = rxloop.Run(ctx, q, rxloop.Config{BusyPoll: true}, func(_ uint64, f []byte) {
		u, err := frame.Parse(f)
		if err == nil {
			bytes += len(u.Payload)
		}
		n++
		if n == b.N {
			cancel()
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/frame")
}

// TestFakeQueueScatter: a slot posted with pieces receives its frame over them, in order, and in the
// order the slots were posted; a frame longer than the pieces is lost with a length error; Flush completes
// what is posted, in order, unwritten.
func TestFakeQueueScatter(t *testing.T) {
	q := rxlooptest.NewQueue(3, 8)
	out := make([]rxloop.Completion, 8)
	n, _ := q.Poll(out)
	for _, id := range []uint64{0, 1, 2} { // take every slot back, then post them in another order
		q.Complete(rxloop.Completion{ID: id})
	}
	if n, _ = q.Poll(out); n != 3 {
		t.Fatalf("%d completions", n)
	}
	a, b := make([]byte, 3), make([]byte, 4)
	if err := q.RepostScatter(2, a, b); err != nil {
		t.Fatal(err)
	}
	if err := q.Repost([]uint64{0}); err != nil {
		t.Fatal(err)
	}
	if err := q.RepostScatter(1, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	if err := q.RepostScatter(1, a); err == nil {
		t.Fatal("slot posted twice")
	}
	if id, ok := q.NextSlot(); !ok || id != 2 {
		t.Fatalf("next slot %d %v, want 2: slots fill in posting order", id, ok)
	}
	q.Deliver([]byte("abcdef"))
	if string(a) != "abc" || string(b[:3]) != "def" || b[3] != 0 {
		t.Fatalf("pieces %q %q", a, b)
	}
	q.Deliver([]byte("plain"))
	if string(q.Slot(0)[:5]) != "plain" {
		t.Fatalf("slot 0 %q", q.Slot(0))
	}
	q.Deliver([]byte("too long"))
	if n, _ = q.Poll(out); n != 3 {
		t.Fatalf("%d completions", n)
	}
	want := []rxloop.Completion{{ID: 2, Len: 6}, {ID: 0, Len: 5}, {ID: 1, Status: rxloop.StatusLocalLength}}
	for i, c := range out[:n] {
		if c != want[i] {
			t.Errorf("completion %d: %+v, want %+v", i, c, want[i])
		}
	}
	if err := q.Repost([]uint64{1, 0}); err != nil {
		t.Fatal(err)
	}
	q.Flush()
	if n, _ = q.Poll(out); n != 2 || out[0] != (rxloop.Completion{ID: 1, Status: rxloop.StatusFlushed}) || out[1].ID != 0 {
		t.Fatalf("flush: %+v", out[:n])
	}
	if _, ok := q.NextSlot(); ok {
		t.Fatal("a slot is still posted after the flush")
	}
}

// batchRecorder checks that frames arrive only inside a BeginBatch / EndBatch bracket.
type batchRecorder struct {
	open, outside, begun, ended int
}

func (b *batchRecorder) BeginBatch() { b.open++; b.begun++ }
func (b *batchRecorder) EndBatch()   { b.open--; b.ended++ }

// TestLoopBracketsEachPoll: with Config.Batches every frame is delivered between the BeginBatch and the
// EndBatch of its poll, and no bracket is left open or opened for an empty poll.
func TestLoopBracketsEachPoll(t *testing.T) {
	const total = 500
	var frames [][]byte
	for i := uint64(0); i < total; i++ {
		frames = append(frames, seqFrame(i))
	}
	q := rxlooptest.NewReplayQueue(frames)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := &batchRecorder{}
	var st rxloop.Stats
	n := 0
	err := rxloop.Run(ctx, q, rxloop.Config{Batch: 16, BusyPoll: true, Stats: &st, Batches: b}, func(_ uint64, f []byte) {
		if b.open != 1 {
			b.outside++
		}
		if n++; n == total {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if b.outside != 0 || b.open != 0 || b.begun != b.ended || uint64(b.begun) != st.Reposts.Load() {
		t.Fatalf("%d frames outside a bracket, %d open, %d begun, %d ended, %d polls with frames", b.outside, b.open,
			b.begun, b.ended, st.Reposts.Load())
	}
}
