package ibv

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
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
	"github.com/ibvbridge/ibvbridge/verbs"
	"github.com/ibvbridge/ibvbridge/verbs/verbstest"
)

// placeRig is a placing receiver over verbstest's fake split queue (the test is the NIC), feeding a real
// assembler and ring, drained by a consumer that checks every heap byte for byte.
type placeRig struct {
	t        *testing.T
	q        *verbstest.RecvQueue
	r        *Receiver
	p        *ring.Producer
	asm      *assemble.Assembler
	cancel   context.CancelFunc
	done     chan error
	drained  chan struct{}
	released atomic.Bool
	stop     atomic.Bool // the test is over: the consumer stops waiting
	sent     int         // frames delivered

	mu         sync.Mutex
	seen       map[uint64]int // heaps consumed, by cnt
	complete   map[uint64]bool
	badPattern []uint64 // complete heaps whose bytes are wrong
}

// newPlaceRig opens the rig with nslots receive work requests taken batch at a time (0: rxloop's
// default); wrap, if set, stands between the receiver and the assembler.
func newPlaceRig(t *testing.T, nslots, batch int, acfg assemble.AssemblerConfig, wrap func(transport.Placer) transport.Placer) *placeRig {
	t.Helper()
	dir := t.TempDir()
	name := testutil.UniqueRing(t, "place")
	p, err := ring.Create(name, ring.Config{Dir: dir, SlotCount: 32, SlotSize: 1 << 20, MaxItems: 8,
		Policy: ring.PolicyBlock, HugePages: ring.HugePagesOff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	c, err := ring.Attach(name, ring.AttachOptions{Dir: dir, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	asm, err := assemble.NewAssembler(p, acfg)
	if err != nil {
		t.Fatal(err)
	}
	g := &placeRig{t: t, q: verbstest.NewRecvQueue(t, nslots, verbs.DefaultMaxSize), p: p, asm: asm,
		done: make(chan error, 1), drained: make(chan struct{}), seen: map[uint64]int{}, complete: map[uint64]bool{}}
	go g.consume(c)
	t.Cleanup(func() { g.stop.Store(true); <-g.drained }) // runs first: the consumer is done before it closes
	cfg := testRecvConfig()
	cfg.Place = true
	g.r = newReceiver(g.q, func() error { g.released.Store(true); return g.q.Close() }, cfg)
	g.r.loop.Batch = batch
	var sink transport.Placer = asm
	if wrap != nil {
		sink = wrap(asm)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.cancel = cancel
	t.Cleanup(cancel)
	go func() { g.done <- g.r.Run(ctx, sink) }()
	return g
}

func (g *placeRig) consume(c *ring.Consumer) {
	defer close(g.drained)
	for {
		h, err := c.Next(50 * time.Millisecond)
		if errors.Is(err, ring.ErrTimeout) && !g.stop.Load() {
			continue
		}
		if err != nil {
			if !errors.Is(err, ring.ErrEndOfStream) && !g.stop.Load() {
				g.t.Errorf("consumer: %v", err)
			}
			return
		}
		g.mu.Lock()
		g.seen[h.HeapCnt]++
		if h.Flags&ring.FlagComplete != 0 {
			g.complete[h.HeapCnt] = true
			if !pattern.Verify(&h) {
				g.badPattern = append(g.badPattern, h.HeapCnt)
			}
		}
		g.mu.Unlock()
		c.Release(h)
	}
}

// deliver is the NIC receiving frames, waiting for the receiver to post work requests when none is.
func (g *placeRig) deliver(frames ...[]byte) {
	g.t.Helper()
	for _, f := range frames {
		for !g.q.Deliver(f) {
			select {
			case <-g.q.SlotFreed():
			case <-time.After(10 * time.Second):
				g.t.Fatalf("no work request posted for 10 s after %d frames: counters %v", g.sent, g.r.Counters())
			}
		}
		g.sent++
	}
}

// settle waits until the receiver has taken every frame delivered (or flushed).
func (g *placeRig) settle() {
	g.t.Helper()
	st := &g.r.stats
	if !testutil.WaitFor(10*time.Second, func() bool { return int(st.Frames.Load()+st.Errors.Load()) >= g.sent }) {
		g.t.Fatalf("%d of %d frames taken: counters %v", st.Frames.Load()+st.Errors.Load(), g.sent, g.r.Counters())
	}
}

// finish waits for the stream stop to end the assembler (or, with cancel, cancels), for Run to return,
// and for the consumer to read the end of the stream.
func (g *placeRig) finish(cancel bool) {
	g.t.Helper()
	if !cancel {
		select {
		case <-g.asm.Done():
		case <-time.After(10 * time.Second):
			g.t.Fatalf("the stream stop did not end the stream: counters %v", g.r.Counters())
		}
	}
	g.cancel()
	select {
	case err := <-g.done:
		if !errors.Is(err, context.Canceled) {
			g.t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		g.t.Fatal("Run did not return")
	}
	if cancel {
		g.asm.Flush()
		if err := g.p.PublishEndOfStream(0, 10*time.Second); err != nil {
			g.t.Fatal(err)
		}
	}
	select {
	case <-g.drained:
	case <-time.After(30 * time.Second):
		g.t.Fatal("the consumer did not see the end of the stream")
	}
	g.q.CheckAwaited()
}

// heapFrames packetizes heaps cnts of heapSize patterned bytes into Ethernet frames of UDP payloads of
// at most pktSize bytes, one slice of frames per heap.
func heapFrames(t *testing.T, heapSize, pktSize int, cnts ...uint64) [][][]byte {
	t.Helper()
	gen, err := pattern.NewHeapGen(spead.Flavour64_48, heapSize, 1, true, false)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := spead.NewEncoder(spead.Flavour64_48, pktSize)
	if err != nil {
		t.Fatal(err)
	}
	var out [][][]byte
	for _, cnt := range cnts {
		if err := enc.Reset(gen.Heap(cnt)); err != nil {
			t.Fatal(err)
		}
		out = append(out, encodeFrames(t, enc))
	}
	return out
}

func encodeFrames(t *testing.T, enc *spead.Encoder) [][]byte {
	var frames [][]byte
	buf := make([]byte, enc.MaxPacketSize())
	for {
		n, err := enc.Next(buf)
		if errors.Is(err, io.EOF) {
			return frames
		}
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, udpFrame(t, buf[:n]))
	}
}

// stopFrame is the frame of a stream stop heap.
func stopFrame(t *testing.T, cnt uint64) []byte {
	enc, err := spead.NewEncoder(spead.Flavour64_48, 1500)
	if err != nil {
		t.Fatal(err)
	}
	h := spead.StreamStopHeap(cnt)
	if err := enc.Reset(&h); err != nil {
		t.Fatal(err)
	}
	return encodeFrames(t, enc)[0]
}

// checkHeaps checks that every heap of want was consumed once, and that those in whole came out complete
// and byte for byte right.
func (g *placeRig) checkHeaps(want []uint64, whole func(cnt uint64) bool) {
	g.t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, cnt := range want {
		if g.seen[cnt] != 1 {
			g.t.Errorf("heap %d consumed %d times", cnt, g.seen[cnt])
		}
		if whole(cnt) && !g.complete[cnt] {
			g.t.Errorf("heap %d is not complete", cnt)
		}
		if !whole(cnt) && g.complete[cnt] {
			g.t.Errorf("heap %d lost packets but came out complete", cnt)
		}
	}
	if len(g.badPattern) > 0 {
		g.t.Errorf("heaps %v: wrong bytes", g.badPattern)
	}
	if len(g.seen) != len(want) {
		g.t.Errorf("%d heaps consumed, want %d", len(g.seen), len(want))
	}
}

func cnts(n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(i + 1)
	}
	return out
}

func all(uint64) bool { return true }

// inOrder streams heaps 1 MiB heaps in 8972-byte packets, in order, then a stop, through nslots work
// requests taken batch at a time, checks that every heap came out whole and byte for byte right with no
// miss, no hold, and every frame of a split work request taken in place, and returns the packets sent
// and the placed count.
func inOrder(t *testing.T, nslots, batch, heaps int) (total int, placed uint64) {
	g := newPlaceRig(t, nslots, batch, assemble.AssemblerConfig{}, nil)
	for _, frames := range heapFrames(t, 1<<20, 8972, cnts(heaps)...) {
		g.deliver(frames...)
		total += len(frames)
	}
	g.deliver(stopFrame(t, uint64(heaps+1)))
	g.finish(false)
	g.checkHeaps(cnts(heaps), all)
	m := g.r.Counters()
	if m["placed"] != uint64(g.q.SplitFrames.Load()) || m["placement_misses"] != 0 || m["placement_holds"] != 0 {
		t.Errorf("%d packets: placed %d, %d frames into split work requests, misses %d, holds %d",
			total, m["placed"], g.q.SplitFrames.Load(), m["placement_misses"], m["placement_holds"])
	}
	if st := g.p.Stats(); st.Get(ring.CounterPackets) != uint64(total+1) || st.Get(ring.CounterMalformedPackets) != 0 { // + the stop
		t.Errorf("ring counters %v", st.Map())
	}
	t.Logf("%d packets: %d placed, %d copied", total, m["placed"], uint64(total)-m["placed"])
	return total, m["placed"]
}

// TestPlaceInOrderHeaps: in-order 1 MiB heaps through a 4-deep receive queue taken one completion at a
// time. Each work request posted once Place can tell where its packet belongs receives that packet,
// payload straight into its slot (no copy); only the packets whose work requests were posted before
// their heap's slot was known — the first one, the second of the first heap (its guess was sized on the
// first packet, whose longer header leaves a shorter payload; later heaps' second packets are guessed as
// the previous heap's middle packets were) and the four posted behind them — take the copy.
func TestPlaceInOrderHeaps(t *testing.T) {
	const nslots, heaps = 4, 8
	total, placed := inOrder(t, nslots, 1, heaps)
	if want := total - heaps*(1+nslots) - 1; placed != uint64(want) {
		t.Errorf("%d packets in %d heaps: placed %d, want %d", total, heaps, placed, want)
	}
}

// TestPlaceInOrderBatches: the same stream through a 16-deep queue taken in batches as they come: at most
// the packets of three queue lengths per heap (the queue posted before the heap's slot was known, and up
// to two batches before a packet showed it) are copied.
func TestPlaceInOrderBatches(t *testing.T) {
	const nslots, heaps = 16, 8
	total, placed := inOrder(t, nslots, 0, heaps)
	if least := total - heaps*(3*nslots+2); placed < uint64(least) {
		t.Errorf("%d packets in %d heaps: placed %d, want at least %d", total, heaps, placed, least)
	}
}

// TestPlaceDisorder: heaps interleaved two at a time, neighbours swapped, packets repeated and lost.
// Misses are counted and held back where taking them could write into a region still awaited (the fake
// NIC fails the test if anything but it writes one); every heap that lost nothing comes out whole and
// right, every one that did comes out incomplete, and every repeat is counted as a duplicate.
func TestPlaceDisorder(t *testing.T) {
	const heaps = 40
	g := newPlaceRig(t, 8, 0, assemble.AssemblerConfig{Incomplete: true}, nil)
	perHeap := heapFrames(t, 256<<10, 8972, cnts(heaps)...)
	rng := rand.New(rand.NewPCG(3, 4))
	lossy := map[uint64]bool{}
	var wire [][]byte
	for i := 0; i < heaps; i++ {
		frames := perHeap[i]
		if i%5 == 3 && i+1 < heaps { // interleave this heap with the next
			a, b := frames, perHeap[i+1]
			frames = nil
			for j := 0; j < max(len(a), len(b)); j++ {
				if j < len(a) {
					frames = append(frames, a[j])
				}
				if j < len(b) {
					frames = append(frames, b[j])
				}
			}
			i++
		}
		wire = append(wire, frames...)
	}
	dups := 0
	var out [][]byte
	for i := 0; i < len(wire); i++ {
		f := wire[i]
		switch r := rng.IntN(40); {
		case r < 3 && i+1 < len(wire):
			out = append(out, wire[i+1], f)
			i++
		case r == 3:
			out = append(out, f, f)
			dups++
		case r == 4 && i > 0:
			lossy[heapCntOf(t, f)] = true // lost
		default:
			out = append(out, f)
		}
	}
	g.deliver(out...)
	g.deliver(stopFrame(t, heaps+1))
	g.finish(false)
	g.checkHeaps(cnts(heaps), func(cnt uint64) bool { return !lossy[cnt] })
	m := g.r.Counters()
	if m["placed"] == 0 || m["placement_misses"] == 0 || m["placement_holds"] == 0 {
		t.Errorf("counters %v: want placements, misses and holds", m)
	}
	if st := g.p.Stats(); st.Get(ring.CounterDuplicatePackets) != uint64(dups) {
		t.Errorf("%d duplicates counted, %d sent", st.Get(ring.CounterDuplicatePackets), dups)
	}
	t.Logf("%d frames, %d lost heaps, %d repeats: %v", len(out), len(lossy), dups, m)
}

func heapCntOf(t *testing.T, f []byte) uint64 {
	var p spead.Packet
	if err := spead.Decode(f[42:], &p); err != nil {
		t.Fatal(err)
	}
	return p.HeapCnt
}

// TestPlaceStopFlushes: a heap loses its last two packets, so the stream stop arrives in a work request
// that awaits another offset of the heap, while the next one still awaits the last. The stop must not
// publish the heap while a work request points into it: the receiver flushes the queue (the stream is
// over), and the stop then ends the stream.
func TestPlaceStopFlushes(t *testing.T) {
	g := newPlaceRig(t, 8, 1, assemble.AssemblerConfig{Incomplete: true}, nil)
	frames := heapFrames(t, 256<<10, 8972, 1)[0]
	g.deliver(frames[:len(frames)-2]...)
	g.deliver(stopFrame(t, 2))
	g.finish(false)
	g.checkHeaps([]uint64{1}, func(uint64) bool { return false })
	m := g.r.Counters()
	if m["placement_holds"] != 1 || m["placement_misses"] != 1 || m["flushed"] == 0 || m["completion_errs"] != 0 || m["placed"] == 0 {
		t.Errorf("counters %v: want one miss (the stop), one hold, flushed work requests (not errors), placements", m)
	}
	if st := g.p.Stats(); st.Get(ring.CounterPackets) != uint64(len(frames)-2+1) { // + the stop
		t.Errorf("ring counters %v: want %d packets", st.Map(), len(frames)-1)
	}
}

// afterRelease counts the packets the sink takes once the receiver is released.
type afterRelease struct {
	transport.Placer
	released *atomic.Bool
	late     int
}

func (a *afterRelease) Packet(p []byte, nanos int64) {
	if a.released.Load() {
		a.late++
	}
	a.Placer.Packet(p, nanos)
}

// TestPlaceCancelReleasesFirst: a heap loses one of its last packets, which leaves the packets after it
// held while a work request awaits the heap's last region, and no more frames come. Cancelling hands them
// over only once the receiver is released (the NIC can no longer write), and none is lost.
func TestPlaceCancelReleasesFirst(t *testing.T) {
	var sink *afterRelease
	var g *placeRig
	g = newPlaceRig(t, 8, 1, assemble.AssemblerConfig{Incomplete: true}, func(p transport.Placer) transport.Placer {
		sink = &afterRelease{Placer: p}
		return sink
	})
	sink.released = &g.released
	frames := heapFrames(t, 256<<10, 8972, 1)[0]
	lost := len(frames) - 3
	g.deliver(frames[:lost]...)
	g.deliver(frames[lost+1:]...)
	g.settle()
	m := g.r.Counters()
	if m["placement_holds"] != 1 || g.q.CheckAwaited() == 0 {
		t.Fatalf("counters %v, %d regions awaited: want packets held while regions are awaited", m, g.q.CheckAwaited())
	}
	held := uint64(len(frames)-1) - g.p.Stats().Get(ring.CounterPackets)
	g.finish(true)
	if sink.late == 0 || uint64(sink.late) != held {
		t.Errorf("%d packets taken after the release, %d were held", sink.late, held)
	}
	if st := g.p.Stats(); st.Get(ring.CounterPackets) != uint64(len(frames)-1) {
		t.Errorf("ring counters %v: want %d packets", st.Map(), len(frames)-1)
	}
	g.checkHeaps([]uint64{1}, func(uint64) bool { return false })
}

// TestPlaceNeedsPlacer: with placement configured but a sink that cannot place, work requests stay
// plain and every packet arrives.
func TestPlaceNeedsPlacer(t *testing.T) {
	q := verbstest.NewRecvQueue(t, 4, verbs.DefaultMaxSize)
	cfg := testRecvConfig()
	cfg.Place = true
	r := newReceiver(q, func() error { return nil }, cfg)
	sink := testutil.NewRecordingSink(false)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, sink) }()
	frames := heapFrames(t, 64<<10, 8972, 1, 2)
	n := 0
	for _, hf := range frames {
		for _, f := range hf {
			for !q.Deliver(f) {
				<-q.SlotFreed()
			}
			n++
		}
	}
	if !sink.WaitCount(n, 10*time.Second) {
		t.Fatalf("%d of %d packets", sink.Count(), n)
	}
	cancel()
	<-done
	if q.SplitPosts.Load() != 0 || r.Counters()["placed"] != 0 {
		t.Errorf("split posts %d, counters %v", q.SplitPosts.Load(), r.Counters())
	}
}
