package verbs

import (
	"net/netip"

	"context"
	"encoding/binary"
	"errors"
	"github.com/ibvbridge/ibvbridge/frame"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeQueue models a CQ + RQ + completion channel faithfully enough to show
// the lost-wakeup race: a completion raises an event only if the queue is
// armed when it arrives, and raising it disarms the queue (edge-triggered,
// one event per ibv_req_notify_cq).
type fakeQueue struct {
	mu       sync.Mutex
	slots    [][]byte
	posted   []bool
	free     []uint64 // posted slots, FIFO
	pending  []Completion
	armed    bool
	event    chan struct{} // capacity 1: the channel fd's readability
	slotFree chan struct{} // producer backpressure

	beforeArm func() // test hook: runs inside Arm, before arming

	polls, arms, waits atomic.Int64
}

func newFakeQueue(nslots, slotSize int) *fakeQueue {
	q := &fakeQueue{
		event:    make(chan struct{}, 1),
		slotFree: make(chan struct{}, 1),
	}
	for i := range nslots {
		q.slots = append(q.slots, make([]byte, slotSize))
		q.posted = append(q.posted, true)
		q.free = append(q.free, uint64(i))
	}
	return q
}

// deliver is the "NIC": it writes frame into the next posted slot and
// completes it. It reports false when no slot is posted (an overrun).
func (q *fakeQueue) deliver(frame []byte) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.free) == 0 {
		return false
	}
	id := q.free[0]
	q.free = q.free[1:]
	q.posted[id] = false
	n := copy(q.slots[id], frame)
	q.pending = append(q.pending, Completion{ID: id, Len: uint32(n)})
	if q.armed {
		q.armed = false
		select {
		case q.event <- struct{}{}:
		default:
		}
	}
	return true
}

func (q *fakeQueue) Poll(out []Completion) (int, error) {
	q.polls.Add(1)
	q.mu.Lock()
	defer q.mu.Unlock()
	n := copy(out, q.pending)
	q.pending = q.pending[n:]
	return n, nil
}

func (q *fakeQueue) Repost(ids []uint64) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, id := range ids {
		if q.posted[id] {
			return errors.New("slot reposted twice")
		}
		q.posted[id] = true
		q.free = append(q.free, id)
	}
	select {
	case q.slotFree <- struct{}{}:
	default:
	}
	return nil
}

func (q *fakeQueue) Arm() error {
	q.arms.Add(1)
	if q.beforeArm != nil {
		q.beforeArm()
	}
	q.mu.Lock()
	q.armed = true
	q.mu.Unlock()
	return nil
}

func (q *fakeQueue) Wait(ctx context.Context) error {
	q.waits.Add(1)
	select {
	case <-q.event:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (q *fakeQueue) Slot(id uint64) []byte { return q.slots[id] }

func seqFrame(i uint64) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, i)
	return b
}

// TestLoopCatchesCompletionBeforeArm injects a completion between the loop's
// last empty poll and its Arm. It raises no event; only the poll after Arm
// can find it. Without that poll the loop would sleep forever.
func TestLoopCatchesCompletionBeforeArm(t *testing.T) {
	q := newFakeQueue(4, 64)
	var once sync.Once
	q.beforeArm = func() { once.Do(func() { q.deliver(seqFrame(42)) }) }

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan uint64, 1)
	done := make(chan error, 1)
	go func() {
		done <- RunRecvLoop(ctx, q, LoopConfig{MaxPoll: 3}, func(_ uint64, f []byte) {
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
	q := newFakeQueue(4, 64)
	q.beforeArm = func() { q.deliver(seqFrame(1)) }
	out := make([]Completion, 4)
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
	q := newFakeQueue(8, 64)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var next uint64
	var bad atomic.Int64
	allIn := make(chan struct{})
	var st LoopStats
	done := make(chan error, 1)
	go func() {
		done <- RunRecvLoop(ctx, q, LoopConfig{MaxPoll: 2, Batch: 3, Stats: &st}, func(_ uint64, f []byte) {
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
		for !q.deliver(seqFrame(i)) {
			select { // overrun: wait for the loop to repost
			case <-q.slotFree:
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
	t.Logf("polls=%d arms=%d waits=%d reposts=%d", q.polls.Load(), q.arms.Load(), q.waits.Load(), st.Reposts.Load())
}

// TestLoopIdleBlocks: in wait mode an idle loop must sleep in Wait, not spin.
func TestLoopIdleBlocks(t *testing.T) {
	q := newFakeQueue(4, 64)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- RunRecvLoop(ctx, q, LoopConfig{MaxPoll: 10}, func(uint64, []byte) {}) }()
	time.Sleep(100 * time.Millisecond)
	polls, waits := q.polls.Load(), q.waits.Load()
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
	q := newFakeQueue(4, 64)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := RunRecvLoop(ctx, q, LoopConfig{BusyPoll: true}, func(uint64, []byte) {})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	if q.arms.Load() != 0 || q.waits.Load() != 0 || q.polls.Load() < 100 {
		t.Fatalf("busy loop: arms=%d waits=%d polls=%d", q.arms.Load(), q.waits.Load(), q.polls.Load())
	}
}

// TestLoopBadCompletions: error completions and oversize lengths are counted
// and their slots still go back to the NIC.
func TestLoopBadCompletions(t *testing.T) {
	q := newFakeQueue(3, 16)
	q.mu.Lock()
	q.free = nil
	q.posted = []bool{false, false, false}
	q.pending = []Completion{{ID: 0, Len: 4}, {ID: 1, Len: 4, Status: 12}, {ID: 2, Len: 17}}
	q.mu.Unlock()
	var st LoopStats
	var frames int
	l := recvLoop{q: q, st: &st, frame: func(uint64, []byte) { frames++ }, wc: make([]Completion, 8), ids: make([]uint64, 8)}
	n, err := l.pollOnce()
	if err != nil || n != 3 {
		t.Fatal(n, err)
	}
	if frames != 1 || st.Frames.Load() != 1 || st.Errors.Load() != 2 {
		t.Fatalf("frames=%d stats frames=%d errors=%d", frames, st.Frames.Load(), st.Errors.Load())
	}
	for id, p := range q.posted {
		if !p {
			t.Errorf("slot %d not reposted", id)
		}
	}
}

// TestLoopQueueErrors: queue failures end the loop with context.
func TestLoopQueueErrors(t *testing.T) {
	boom := errors.New("boom")
	err := RunRecvLoop(context.Background(), errQueue{poll: boom}, LoopConfig{}, func(uint64, []byte) {})
	if !errors.Is(err, boom) || err.Error() != "receive loop: poll: boom" {
		t.Fatalf("poll: %v", err)
	}
	err = RunRecvLoop(context.Background(), errQueue{arm: boom}, LoopConfig{}, func(uint64, []byte) {})
	if !errors.Is(err, boom) || err.Error() != "receive loop: arm for a wake-up: boom" {
		t.Fatalf("arm: %v", err)
	}
	err = RunRecvLoop(context.Background(), errQueue{wait: boom}, LoopConfig{}, func(uint64, []byte) {})
	if !errors.Is(err, boom) || err.Error() != "receive loop: wait: boom" {
		t.Fatalf("wait: %v", err)
	}
}

type errQueue struct{ poll, arm, wait error }

func (e errQueue) Poll([]Completion) (int, error) { return 0, e.poll }
func (e errQueue) Repost([]uint64) error          { return nil }
func (e errQueue) Arm() error                     { return e.arm }
func (e errQueue) Wait(context.Context) error     { return e.wait }
func (e errQueue) Slot(uint64) []byte             { return nil }

// spinQueue always has a full batch ready: it isolates the loop's own cost.
type spinQueue struct {
	slots [][]byte
	next  uint64
}

func newSpinQueue(n int) *spinQueue {
	q := &spinQueue{}
	for range n {
		q.slots = append(q.slots, make([]byte, 9200))
	}
	return q
}

func (q *spinQueue) Poll(out []Completion) (int, error) {
	for i := range out {
		out[i] = Completion{ID: q.next, Len: 8000}
		q.next = (q.next + 1) % uint64(len(q.slots))
	}
	return len(out), nil
}
func (q *spinQueue) Repost([]uint64) error      { return nil }
func (q *spinQueue) Arm() error                 { return nil }
func (q *spinQueue) Wait(context.Context) error { return nil }
func (q *spinQueue) Slot(id uint64) []byte      { return q.slots[id] }

func TestLoopHotPathAllocatesNothing(t *testing.T) {
	q := newSpinQueue(256)
	var sum int
	l := recvLoop{q: q, st: new(LoopStats), frame: func(_ uint64, f []byte) { sum += len(f) },
		wc: make([]Completion, 64), ids: make([]uint64, 64)}
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := l.pollOnce(); err != nil {
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
	q := newSpinQueue(2048)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := 0
	b.ReportAllocs()
	b.ResetTimer()
	_ = RunRecvLoop(ctx, q, LoopConfig{BusyPoll: true}, func(_ uint64, f []byte) {
		n++
		if n == b.N {
			cancel()
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/frame")
}

// BenchmarkRecvLoopUDP adds the Ethernet/IPv4/UDP parse Receiver.Run does.
func BenchmarkRecvLoopUDP(b *testing.B) {
	q := newSpinQueue(2048)
	f := make([]byte, 8000)
	b2 := frame.Builder{Header: frame.Header{SrcIP: netip.MustParseAddr("10.0.0.1"), DstIP: netip.MustParseAddr("239.1.2.3"), DstPort: 7148, TTL: 1}}
	if err := b2.Build(f, len(f)-frame.HeaderLen); err != nil {
		b.Fatal(err)
	}
	for _, s := range q.slots {
		copy(s, f)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n, bytes := 0, 0
	b.ReportAllocs()
	b.ResetTimer()
	_ = RunRecvLoop(ctx, q, LoopConfig{BusyPoll: true}, func(_ uint64, f []byte) {
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
