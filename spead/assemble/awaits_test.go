package assemble_test

import (
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/assemble"
	"github.com/ibvbridge/ibvbridge/spead/speadtest"
	"github.com/ibvbridge/ibvbridge/transport"
)

var _ transport.Awaiter = (*assemble.Assembler)(nil)

// chunkAssembler is an assembler in chunk mode (a window of two chunks) on a chunk ring of slots slots.
func chunkAssembler(t *testing.T, slots int) *assemble.Assembler {
	t.Helper()
	p, _ := chunkRing(t, slots)
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{ChunkWindow: 2})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// payloadLen is the heap payload a packet carries.
func payloadLen(t *testing.T, b []byte) uint64 {
	t.Helper()
	var pkt spead.Packet
	if err := spead.Decode(b, &pkt); err != nil {
		t.Fatal(err)
	}
	return uint64(len(pkt.Payload))
}

// wantLeft is the time the rest of total bytes takes at the rate have bytes took since first.
func wantLeft(total, have uint64, elapsed int64) time.Duration {
	return time.Duration(float64(elapsed) * float64(total-have) / float64(have))
}

// Awaits tells how long the heap the latest packet joined needs to complete, at the rate its bytes came
// (from its first packet's receive time): nothing before the first packet, an estimate that shrinks as
// the heap fills, and nothing once the last packet completed it.
func TestAwaitsEstimatesTheHeapInAssemblyFromItsOwnRate(t *testing.T) {
	p, _ := testRing(t, ring.Config{SlotCount: 8, SlotSize: 64 << 10})
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Awaits(0); ok {
		t.Fatal("before any packet: a heap in assembly, want none")
	}
	const size = 3000
	packets := encodeHeaps(t, spead.Flavour64_48, testPacketSize, patternHeap(7, size))[0]
	if len(packets) < 4 {
		t.Fatalf("%d packets: want a heap of several", len(packets))
	}
	const first, step = int64(1_000_000), int64(10_000) // a packet every 10 µs
	var have uint64
	var last time.Duration
	for i, b := range packets[:len(packets)-1] {
		a.Packet(b, first+int64(i)*step)
		have += payloadLen(t, b)
		now := first + int64(i+1)*step
		left, ok := a.Awaits(now)
		if !ok {
			t.Fatalf("after packet %d of %d: no heap in assembly", i+1, len(packets))
		}
		if want := wantLeft(size, have, now-first); left != want {
			t.Fatalf("after packet %d (%d of %d bytes, %d ns in): %v left, want %v", i+1, have, size, now-first, left, want)
		}
		if i > 0 && left >= last {
			t.Fatalf("after packet %d: %v left, not less than the %v before", i+1, left, last)
		}
		last = left
	}
	a.Packet(packets[len(packets)-1], first+int64(len(packets))*step)
	if left, ok := a.Awaits(first + int64(len(packets)+1)*step); ok {
		t.Fatalf("after the last packet: %v left of a heap in assembly, want none (it was published)", left)
	}
}

// A heap without a heap length cannot be estimated: Awaits says so rather than guess.
func TestAwaitsNothingForAHeapOfUnknownLength(t *testing.T) {
	p, _ := testRing(t, ring.Config{SlotCount: 8, SlotSize: 64 << 10})
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	packets := encodeHeaps(t, spead.Flavour64_48, testPacketSize, patternHeap(7, 3000))[0]
	var pkt spead.Packet
	b := append([]byte(nil), packets[0]...)
	if err := spead.Decode(b, &pkt); err != nil || !pkt.HasHeapLength {
		t.Fatalf("first packet: %v, heap length %v", err, pkt.HasHeapLength)
	}
	// Rewrite the heap-length pointer (id 0x2) as a padding item (id 0): the heap's length is unknown.
	f := spead.Flavour64_48
	for i := range int(b[7]) {
		off := 8 + 8*i
		ptr := uint64(0)
		for _, c := range b[off : off+8] {
			ptr = ptr<<8 | uint64(c)
		}
		if bits := f.HeapAddressBits(); ptr>>63 == 1 && (ptr>>bits)&(1<<(63-bits)-1) == spead.HeapLengthID {
			ptr = 1 << 63
			for k := range 8 {
				b[off+7-k] = byte(ptr >> (8 * k))
			}
		}
	}
	a.Packet(b, 1000)
	if left, ok := a.Awaits(2000); ok {
		t.Fatalf("a heap without a length: %v left, want no estimate", left)
	}
}

// In chunk mode what a consumer sees next is the chunk: Awaits estimates the rest of the whole chunk, not
// of the heap the latest packet joined.
func TestAwaitsEstimatesTheChunkInChunkMode(t *testing.T) {
	a := chunkAssembler(t, 4)
	total := uint64(ckHeaps * ckAxis * ckHeapSize)
	heap0 := speadtest.EncodeAll(t, spead.Flavour64_40, 1500, ptr(ckHeap(1, 0, 0, ckHeapSize, 0)))
	heap1 := speadtest.EncodeAll(t, spead.Flavour64_40, 1500, ptr(ckHeap(2, 0, 1, ckHeapSize, 0)))
	now := int64(1_000_000)
	for _, b := range heap0 {
		a.Packet(b, now)
		now += 10_000
	}
	a.Packet(heap1[0], now)
	have := ckHeapSize + payloadLen(t, heap1[0])
	left, ok := a.Awaits(now + 10_000)
	if !ok {
		t.Fatal("a chunk in assembly: no estimate")
	}
	if want := wantLeft(total, have, now+10_000-1_000_000); left != want {
		t.Fatalf("%d of the chunk's %d bytes in %d ns: %v left, want %v (the chunk's rest, not the heap's)",
			have, total, now+10_000-1_000_000, left, want)
	}
}

// A stream of one-packet heaps in chunk mode: every packet completes its heap, yet the chunk stays in
// assembly until its last position arrives. Awaits estimates the chunk's rest after each heap, and nothing
// once the chunk is complete and published.
func TestAwaitsEstimatesTheChunkOfOnePacketHeaps(t *testing.T) {
	a := chunkAssembler(t, 4)
	total := uint64(ckHeaps * ckAxis * ckHeapSize)
	first, now, have := int64(1_000_000), int64(1_000_000), uint64(0)
	cnt := uint64(1)
	for tm := uint64(0); tm < ckHeaps; tm++ {
		for ax := uint64(0); ax < ckAxis; ax++ {
			pkts := speadtest.EncodeAll(t, spead.Flavour64_40, 9000, ptr(ckHeap(cnt, tm, ax, ckHeapSize, 0)))
			if len(pkts) != 1 {
				t.Fatalf("heap %d: %d packets, want 1", cnt, len(pkts))
			}
			a.Packet(pkts[0], now)
			have += ckHeapSize
			cnt++
			left, ok := a.Awaits(now + 10_000)
			if have == total {
				if ok {
					t.Fatalf("the chunk is complete: %v left, want no estimate", left)
				}
				return
			}
			if !ok {
				t.Fatalf("after heap %d of one packet, %d of the chunk's %d bytes: no estimate", cnt-1, have, total)
			}
			if want := wantLeft(total, have, now+10_000-first); left != want {
				t.Fatalf("%d of the chunk's %d bytes in %d ns: %v left, want %v", have, total, now+10_000-first, left, want)
			}
			now += 10_000
		}
	}
	t.Fatal("the chunk never completed")
}

// feedChunk feeds heaps from..to-1 of chunk k (time-major), one packet each, the first at start and each
// next gap later, and returns the receive time of the last; cnt is the next heap cnt.
func feedChunk(t *testing.T, a *assemble.Assembler, k uint64, from, to int, cnt *uint64, start, gap int64) int64 {
	t.Helper()
	now := start
	for i := from; i < to; i++ {
		tm, ax := k*ckHeaps+uint64(i)/ckAxis, uint64(i)%ckAxis
		pkts := speadtest.EncodeAll(t, spead.Flavour64_40, 9000, ptr(ckHeap(*cnt, tm, ax, ckHeapSize, 0)))
		if len(pkts) != 1 {
			t.Fatalf("heap %d: %d packets, want 1", *cnt, len(pkts))
		}
		now = start + int64(i-from)*gap
		a.Packet(pkts[0], now)
		*cnt++
	}
	return now
}

// A chunk's own rate says little (its first heaps, read together after a sleep, look instantaneous):
// Awaits tells a chunk by how long the chunk before it took from its first heap, and by its own rate only
// once that span has passed.
func TestAwaitsTellsAChunkByTheSpanOfTheChunkBefore(t *testing.T) {
	a := chunkAssembler(t, 4)
	const positions = ckHeaps * ckAxis
	total := uint64(positions * ckHeapSize)
	cnt := uint64(1)
	last := feedChunk(t, a, 0, 0, positions, &cnt, 1_000_000, 10_000) // a span of 11 heaps' gaps: 110 µs
	first := last + 10_000
	feedChunk(t, a, 1, 0, 1, &cnt, first, 0)
	for _, at := range []int64{0, 30_000} {
		if left, ok := a.Awaits(first + at); !ok || left != time.Duration(110_000-at) {
			t.Fatalf("%d ns into a chunk of one heap: %v left (ok %v), want %v: the span of the chunk before, from its first heap",
				at, left, ok, time.Duration(110_000-at))
		}
	}
	// Half its heaps, the last of them past the span: its own rate.
	now := feedChunk(t, a, 1, 1, positions/2, &cnt, first+50_000, 20_000)
	if left, ok := a.Awaits(now); !ok || now-first <= 110_000 || left != wantLeft(total, total/2, now-first) {
		t.Fatalf("half the chunk in %d ns: %v left (ok %v), want %v: past the span, its own rate",
			now-first, left, ok, wantLeft(total, total/2, now-first))
	}
}

// The span follows the chunks completed, a quarter of the way to each, and falls at once to a chunk that
// took less than half of it: a stream twice as fast is not slept past for more than one chunk.
func TestAwaitsSpanFollowsTheChunksAndFallsAtOnceWhenTheyHalve(t *testing.T) {
	a := chunkAssembler(t, 8)
	const positions = ckHeaps * ckAxis
	cnt := uint64(1)
	first := int64(1_000_000)
	feedChunk(t, a, 0, 0, 1, &cnt, first, 0)
	for k, c := range []struct {
		gap  int64         // between the chunk's heaps: it takes 11 gaps
		want time.Duration // the span learnt once it completed
	}{
		{10_000, 110 * time.Microsecond},
		{8_000, 104_500},                // 88 µs: a quarter of the way
		{4_000, 44 * time.Microsecond},  // less than half: at once
		{20_000, 88 * time.Microsecond}, // 220 µs: a quarter of the way
	} {
		last := feedChunk(t, a, uint64(k), 1, positions, &cnt, first+c.gap, c.gap)
		first = last + 1_000
		feedChunk(t, a, uint64(k+1), 0, 1, &cnt, first, 0) // the next chunk's first heap
		if left, ok := a.Awaits(first); !ok || left != c.want {
			t.Fatalf("after chunk %d (heaps %v apart): %v left (ok %v), want %v", k, time.Duration(c.gap), left, ok, c.want)
		}
	}
}
