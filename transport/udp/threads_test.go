package udp

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/internal/testutil"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/assemble"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
	"github.com/ibvbridge/ibvbridge/transport"
)

// watchedAssembler is a heap assembler seen through its batch and placement hooks: it counts the hooks
// called outside a batch or a batch begun inside another (the threads' lock is then not held per read),
// and how many heaps each batch published (one head store each).
type watchedAssembler struct {
	a *assemble.Assembler
	p *ring.Producer

	inBatch           atomic.Bool
	unguarded         atomic.Uint64
	heapsAtBegin      uint64 // touched only inside a batch, which the source's lock serialises
	publishingBatches atomic.Uint64
	heapsInBatches    atomic.Uint64
}

var _ interface {
	transport.Placer
	transport.Batcher
} = (*watchedAssembler)(nil)

func (w *watchedAssembler) guard() {
	if !w.inBatch.Load() {
		w.unguarded.Add(1)
	}
}

func (w *watchedAssembler) BeginBatch() {
	if w.inBatch.Swap(true) {
		w.unguarded.Add(1)
	}
	w.heapsAtBegin = w.p.Stats().Get(ring.CounterHeaps)
	w.a.BeginBatch()
}

func (w *watchedAssembler) EndBatch() {
	w.a.EndBatch()
	if n := w.p.Stats().Get(ring.CounterHeaps) - w.heapsAtBegin; n > 0 {
		w.publishingBatches.Add(1)
		w.heapsInBatches.Add(n)
	}
	w.inBatch.Store(false)
}

func (w *watchedAssembler) Packet(p []byte, ns int64) { w.guard(); w.a.Packet(p, ns) }

func (w *watchedAssembler) Place(dst [][]byte) (int, int) { w.guard(); return w.a.Place(dst) }

func (w *watchedAssembler) Fits(hdr, region []byte, n int) bool {
	w.guard()
	return w.a.Fits(hdr, region, n)
}

func (w *watchedAssembler) Placed(hdr, region []byte, n int, ns int64) bool {
	w.guard()
	return w.a.Placed(hdr, region, n, ns)
}

// threadsRig is a 2-thread source on two loopback endpoints feeding a watched assembler over a ring a
// consumer drains, checking every heap's pattern.
type threadsRig struct {
	src     *Source
	w       *watchedAssembler
	senders [2]*HeapSender
	gens    [2]*pattern.HeapGen // one per sender: neither a generator nor an encoder is shared

	mu        sync.Mutex
	seen      map[uint64]int
	bad       int
	delivered atomic.Uint64
}

func newThreadsRig(t *testing.T, heapSize int) *threadsRig {
	r := &threadsRig{seen: map[uint64]int{}}
	r.src = loopback(t, 2, Config{Threads: 2, GRO: true})
	dir := t.TempDir()
	name := testutil.UniqueRing(t, "threads")
	p, err := ring.Create(name, ring.Config{Dir: dir, SlotCount: 256, SlotSize: 16 << 10, Policy: ring.PolicyBlock,
		HugePages: ring.HugePagesOff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	c, err := ring.Attach(name, ring.AttachOptions{Dir: dir, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{MaxHeaps: 8})
	if err != nil {
		t.Fatal(err)
	}
	r.w = &watchedAssembler{a: a, p: p}
	for i, ep := range r.src.LocalEndpoints() {
		enc, err := spead.NewEncoder(spead.Flavour64_40, 8972)
		if err != nil {
			t.Fatal(err)
		}
		if r.gens[i], err = pattern.NewHeapGen(spead.Flavour64_40, heapSize, 1, true, false); err != nil {
			t.Fatal(err)
		}
		if r.senders[i], err = OpenHeapSender(HeapSenderConfig{Encoder: enc, GSO: true, Rate: 0.5e9,
			SenderConfig: SenderConfig{Dest: netip.AddrPortFrom(ep.Addr, ep.Port)}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.senders[i].Close() })
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go r.consume(c, stop, done)
	t.Cleanup(func() { close(stop); <-done })
	return r
}

func (r *threadsRig) consume(c *ring.Consumer, stop, done chan struct{}) {
	defer close(done)
	for {
		select {
		case <-stop:
			return
		default:
		}
		h, err := c.Next(20 * time.Millisecond)
		if err != nil {
			continue
		}
		r.mu.Lock()
		r.seen[h.HeapCnt]++
		if h.Flags != ring.FlagComplete || !pattern.Verify(&h) {
			r.bad++
		}
		r.mu.Unlock()
		c.Release(h)
		r.delivered.Add(1)
	}
}

// send sends heaps first..last (inclusive) through endpoint ep's sender.
func (r *threadsRig) send(t *testing.T, ep int, first, last uint64) {
	ctx := context.Background()
	for cnt := first; cnt <= last; cnt++ {
		if err := r.senders[ep].SendHeap(ctx, r.gens[ep].Heap(cnt)); err != nil {
			t.Error(err)
			return
		}
	}
	if err := r.senders[ep].Flush(ctx); err != nil {
		t.Error(err)
	}
}

// waitDelivered waits until the consumer has read n heaps.
func (r *threadsRig) waitDelivered(t *testing.T, n uint64) {
	if !testutil.WaitFor(10*time.Second, func() bool { return r.delivered.Load() >= n }) {
		t.Fatalf("%d heaps delivered, want %d (source %+v)", r.delivered.Load(), n, r.src.Stats())
	}
}

// With --threads 2 the receive threads keep what one has: each thread hands a read over as one batch of
// the assembler (several heaps published per head store) and reads payloads straight into place, each
// thread counting its placed packets; the hooks are never called outside a batch nor a batch begun
// inside another. Bursts alternate between the endpoints (so each thread's reads follow its own heaps),
// then both send at once; every heap arrives once, whole, its bytes intact.
func TestTwoThreadsBatchAndPlace(t *testing.T) {
	const burst, bursts, size = 200, 6, 8000 // one-packet heaps: a read spans many
	r := newThreadsRig(t, size)
	stop := run(t, r.src, r.w)
	defer stop()
	cnt := uint64(1)
	for b := range bursts {
		r.send(t, b%2, cnt, cnt+burst-1)
		cnt += burst
		r.waitDelivered(t, cnt-1)
	}
	var wg sync.WaitGroup
	for ep := range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); r.send(t, ep, cnt+uint64(ep)*burst, cnt+uint64(ep+1)*burst-1) }()
	}
	wg.Wait()
	total := cnt - 1 + 2*burst
	r.waitDelivered(t, total)
	st := r.src.Stats()
	r.mu.Lock()
	defer r.mu.Unlock()
	if uint64(len(r.seen)) != total || r.bad != 0 || st.KernelDrops != 0 {
		t.Fatalf("%d distinct heaps of %d, %d bad, %d kernel drops", len(r.seen), total, r.bad, st.KernelDrops)
	}
	for c, n := range r.seen {
		if n != 1 {
			t.Fatalf("heap %d delivered %d times", c, n)
		}
	}
	if n := r.w.unguarded.Load(); n != 0 {
		t.Errorf("%d hook calls outside a batch or batches begun inside another", n)
	}
	stores := r.w.publishingBatches.Load()
	if r.w.heapsInBatches.Load() != total || stores*2 > total {
		t.Errorf("%d of %d heaps published inside batches, by %d head stores: want all, at least 2 per store on average",
			r.w.heapsInBatches.Load(), total, stores)
	}
	per := r.src.ThreadCounters()
	if len(per) != 2 || per[0]["placed"] == 0 || per[1]["placed"] == 0 || per[0]["placed"]+per[1]["placed"] != st.Placed {
		t.Errorf("placed per thread %v, source %d", per, st.Placed)
	}
	t.Logf("%d heaps by %d head stores; placed per thread %d, %d of %d packets, %d misses", total,
		stores, per[0]["placed"], per[1]["placed"], st.Packets, st.PlacementMisses)
}
