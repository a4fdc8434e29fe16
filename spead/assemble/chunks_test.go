package assemble_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/assemble"
	"github.com/ibvbridge/ibvbridge/spead/speadtest"
)

// The chunk geometry of these tests: 4 time positions × 3 axis positions of 3000 bytes (3 packets of
// 1500 at most each), the time item stepping by 100.
const (
	ckHeaps, ckAxis, ckHeapSize, ckStep = 4, 3, 3000, 100
	ckTimeItem, ckAxisItem, ckDataItem  = 0x1600, 0x4101, 0x3000
)

var ckGeometry = ring.ChunkGeometry{Heaps: ckHeaps, Axis: ckAxis, HeapSize: ckHeapSize, Step: ckStep,
	TimeItem: ckTimeItem, AxisItem: ckAxisItem}

// ckByte is byte i of heap position (t, a)'s payload; version tells a rival copy's bytes apart.
func ckByte(t, a uint64, i int, version byte) byte {
	return byte(uint64(i)*7+t*13+a*31) ^ version
}

// ckHeap is the heap for time index t, axis a: its time item t × step, axis item a, payload of size bytes.
func ckHeap(cnt, t, a uint64, size int, version byte) spead.Heap {
	data := make([]byte, size)
	for i := range data {
		data[i] = ckByte(t, a, i, version)
	}
	return spead.Heap{Cnt: cnt, Items: []spead.Item{
		{ID: ckTimeItem, Immediate: true, Value: t * ckStep},
		{ID: ckAxisItem, Immediate: true, Value: a},
		{ID: ckDataItem, Data: data},
	}}
}

// ckStream is a stream that exercises every placement rule, and what the chunks must hold after it.
type ckStream struct {
	packets  [][]byte
	present  map[[2]uint64]bool // (t, a) positions that must be present, with version-0 bytes
	touched  map[[2]uint64]bool // positions some bytes may have reached (incomplete heaps)
	chunks   uint64
	tooOld   uint64
	rejected uint64
	dupPkts  uint64
	// Chunk ids of rival heaps sent for chunk k at the end of block k (too old if chunk k was full, so
	// published, by then); rivals for chunk k+1, not full yet, are duplicates whatever follows.
	rivals []uint64
}

// newCkStream builds chunks 0..nChunks-1: each block k sends the heaps of chunk k shuffled, after one
// heap of chunk k+1 that moves the window to [k, k+1] (retiring chunk k-1), with some of chunk k+1's heaps
// shuffled in; positions left out are gaps; one heap per block loses its middle packet (incomplete); late
// heaps for chunk k-1 are too old; a resent complete heap and a rival heap for a filled position are
// duplicates; a heap with axis 3, one without its time item and one longer than a position are rejected.
func newCkStream(t testing.TB, nChunks int, seed uint64) *ckStream {
	rng := rand.New(rand.NewPCG(seed, 1))
	s := &ckStream{present: map[[2]uint64]bool{}, touched: map[[2]uint64]bool{}, chunks: uint64(nChunks)}
	cnt := uint64(1)
	enc := func(h spead.Heap) [][]byte { return speadtest.EncodeAll(t, spead.Flavour64_40, 1500, &h) }
	sent := map[[2]uint64]bool{}
	heapOf := func(tt, a uint64) [][]byte {
		cnt++
		return enc(ckHeap(cnt, tt, a, ckHeapSize, 0))
	}
	for k := uint64(0); k < uint64(nChunks); k++ {
		var heaps [][][]byte
		var keys [][2]uint64
		for tt := k * ckHeaps; tt < (k+1)*ckHeaps; tt++ {
			for a := uint64(0); a < ckAxis; a++ {
				key := [2]uint64{tt, a}
				if sent[key] {
					continue // sent early, in the block before
				}
				if rng.IntN(8) == 0 {
					continue // a gap
				}
				heaps, keys = append(heaps, heapOf(tt, a)), append(keys, key)
				sent[key] = true
			}
		}
		// A few of chunk k+1's heaps early, shuffled in with chunk k's.
		var early [][]byte
		if k+1 < uint64(nChunks) {
			for n := 0; n < 3; n++ {
				key := [2]uint64{(k+1)*ckHeaps + uint64(rng.IntN(ckHeaps)), uint64(rng.IntN(ckAxis))}
				if sent[key] {
					continue
				}
				hp := heapOf(key[0], key[1])
				if early == nil {
					early = hp // the first moves the window
				} else {
					heaps, keys = append(heaps, hp), append(keys, key)
				}
				sent[key] = true
				s.present[key] = true
			}
		}
		order := rng.Perm(len(heaps))
		var block [][]byte
		if k > 0 { // (the stream's first heap sets the window: chunk 0's come first)
			block = append(block, early...)
		}
		for n, i := range order {
			hp, key := heaps[i], keys[i]
			if n == 1 { // incomplete: its middle packet lost
				block = append(block, hp[0], hp[2])
				s.touched[key] = true
				delete(s.present, key)
				continue
			}
			block = append(block, hp...)
			s.present[key] = true
		}
		if k == 0 {
			block = append(block, early...)
		}
		if k > 0 && k+1 < uint64(nChunks) {
			// A late heap for chunk k-1, now behind the window: counted, never written.
			block = append(block, enc(ckHeap(cnt+1000000, (k-1)*ckHeaps, 0, ckHeapSize, 0x55))...)
			s.tooOld++
		}
		if len(order) > 2 {
			// A complete heap resent (3 packets) and a rival for the same position (3 packets).
			key := keys[order[2]]
			dup := heaps[order[2]]
			block = append(block, dup...)
			block = append(block, enc(ckHeap(cnt+2000000+k, key[0], key[1], ckHeapSize, 0xAA))...)
			s.dupPkts += 3 // the resent heap: a copy of one published whole
			if key[0]/ckHeaps == k {
				s.rivals = append(s.rivals, k)
			} else {
				s.dupPkts += 3
			}
		}
		s.packets = append(s.packets, block...)
	}
	// Rejected: the axis out of range, the time item missing, a heap longer than a position.
	s.packets = append(s.packets, enc(ckHeap(9000001, 0, ckAxis, ckHeapSize, 0))...)
	s.packets = append(s.packets, enc(spead.Heap{Cnt: 9000002, Items: []spead.Item{{ID: ckAxisItem, Immediate: true, Value: 0}, {ID: ckDataItem, Data: make([]byte, 100)}}})...)
	s.packets = append(s.packets, enc(ckHeap(9000003, uint64(nChunks-1)*ckHeaps, 0, ckHeapSize+1, 0))...)
	s.rejected = 3
	return s
}

// check reads every chunk and compares every byte of every position and every presence byte.
func (s *ckStream) check(t *testing.T, c *ring.Consumer, st ring.Stats) {
	t.Helper()
	var incomplete uint64
	complete := map[uint64]bool{}
	for id := uint64(0); id < s.chunks; id++ {
		ch, err := c.NextChunk(time.Second)
		if err != nil {
			t.Fatalf("chunk %d: %v", id, err)
		}
		if ch.ID != id {
			t.Fatalf("chunk %d published where %d was due: chunks not in id order", ch.ID, id)
		}
		all := true
		for pos := range uint64(ckHeaps * ckAxis) {
			tt, a := id*ckHeaps+pos/ckAxis, pos%ckAxis
			key := [2]uint64{tt, a}
			got := ch.HeapData(uint32(pos/ckAxis), uint32(a))
			want := byte(0)
			if s.present[key] {
				want = 1
			} else {
				all = false
			}
			if ch.Present[pos] != want {
				t.Errorf("chunk %d position (%d, %d): presence %d, want %d", id, tt, a, ch.Present[pos], want)
			}
			switch {
			case s.present[key]:
				for i, b := range got {
					if b != ckByte(tt, a, i, 0) {
						t.Fatalf("chunk %d position (%d, %d) byte %d = %#x, want %#x", id, tt, a, i, b, ckByte(tt, a, i, 0))
					}
				}
			case !s.touched[key]:
				if !bytes.Equal(got, make([]byte, ckHeapSize)) {
					t.Fatalf("chunk %d position (%d, %d): no heap was placed there, yet bytes were written", id, tt, a)
				}
			}
		}
		if !all {
			incomplete++
		}
		complete[id] = all
		wantFlags := ring.FlagChunk | ring.FlagComplete
		if !all {
			wantFlags = ring.FlagChunk | ring.FlagIncomplete
		}
		if ch.Flags != wantFlags || ch.Heap.HeapSize != ckHeaps*ckAxis*ckHeapSize || ch.HeapSize != ckHeapSize {
			t.Errorf("chunk %d: flags %#x (want %#x), heap_size %d, position size %d", id, ch.Flags, wantFlags, ch.Heap.HeapSize, ch.HeapSize)
		}
		c.Release(ch.Heap)
	}
	if _, err := c.Next(time.Second); err != ring.ErrEndOfStream {
		t.Fatalf("after the last chunk: %v, want the end of the stream", err)
	}
	tooOld, dupPkts := s.tooOld, s.dupPkts
	for _, id := range s.rivals {
		if complete[id] {
			tooOld++ // its chunk was full and published as soon as its last heap arrived
		} else {
			dupPkts += 3
		}
	}
	expectCounters(t, st, map[ring.Counter]uint64{
		ring.CounterChunks: s.chunks, ring.CounterIncompleteChunks: incomplete,
		ring.CounterTooOldHeaps: tooOld, ring.CounterRejectedHeaps: s.rejected,
		ring.CounterDuplicatePackets: dupPkts, ring.CounterHeaps: uint64(len(s.present)),
	})
}

func chunkRing(t testing.TB, slots int) (*ring.Producer, *ring.Consumer) {
	return testRing(t, ring.Config{SlotCount: slots, Chunks: ckGeometry})
}

// Placement is exact: heaps shuffled within the window, with gaps, an incomplete heap per chunk, late
// heaps, duplicates (a resent heap and a rival for a filled position) and rejected heaps, fed packet by
// packet (copied) and through the placing path (read straight into place): every byte of every chunk and
// every presence bit is what the stream put there, chunks come in id order, and every counter adds up.
func TestChunkPlacementExact(t *testing.T) {
	for _, placing := range []bool{false, true} {
		for seed := uint64(1); seed <= 4; seed++ {
			t.Run(fmt.Sprintf("placing=%v/seed=%d", placing, seed), func(t *testing.T) {
				s := newCkStream(t, 12, seed)
				p, c := chunkRing(t, 32) // more slots than chunks: no slot is reused, so untouched bytes stay 0
				a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{ChunkWindow: 2})
				if err != nil {
					t.Fatal(err)
				}
				if placing {
					if placingFeed(t, a, s.packets, 4) == 0 {
						t.Fatal("nothing was placed in place")
					}
				} else {
					for i, b := range s.packets {
						a.Packet(b, int64(1000+i))
					}
				}
				a.Packet(speadtest.EncodeAll(t, spead.Flavour64_40, 1500, ptr(spead.StreamStopHeap(99999999)))[0], 0)
				s.check(t, c, p.Stats())
			})
		}
	}
}

func ptr[T any](v T) *T { return &v }

// A heap far ahead moves the window past every open chunk at once: they are published in order, the
// chunks skipped over (no heap) are not published, and a heap for a skipped chunk within a window of the
// new one is then too old.
func TestChunkWindowJump(t *testing.T) {
	p, c := chunkRing(t, 16)
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{ChunkWindow: 3})
	if err != nil {
		t.Fatal(err)
	}
	feed := func(cnt, tt uint64) {
		h := ckHeap(cnt, tt, 0, ckHeapSize, 0)
		for _, b := range speadtest.EncodeAll(t, spead.Flavour64_40, 1500, &h) {
			a.Packet(b, 1)
		}
	}
	feed(1, 0)           // chunk 0
	feed(2, ckHeaps)     // chunk 1
	feed(3, 100*ckHeaps) // chunk 100: chunks 0 and 1 published
	feed(4, 96*ckHeaps)  // chunk 96: too old (2 chunks behind the window [98, 100], within its reach)
	a.Flush()
	for _, want := range []uint64{0, 1, 100} {
		ch, err := c.NextChunk(time.Second)
		if err != nil || ch.ID != want || ch.Present[0] != 1 || ch.Flags&ring.FlagIncomplete == 0 {
			t.Fatalf("chunk %+v, %v; want id %d with position 0 present", ch.ID, err, want)
		}
		c.Release(ch.Heap)
	}
	expectCounters(t, p.Stats(), map[ring.Counter]uint64{ring.CounterChunks: 3, ring.CounterTooOldHeaps: 1})
	if a.ChunkRebases() != 0 {
		t.Fatalf("%d re-bases for a heap within the window's reach", a.ChunkRebases())
	}
}

// TestChunkWildTimeIndexRebasesInsteadOfStarvingTheStream (spec §13.4): one heap in 800 carries the time
// index 2^48−1. It moves the window far ahead; the next heap, more than a window behind, re-bases it
// (counted) instead of being too old, and so does every later one: the stream loses nothing (before, 756
// of the 800 heaps were too old).
func TestChunkWildTimeIndexRebasesInsteadOfStarvingTheStream(t *testing.T) {
	p, c := testRing(t, ring.Config{SlotCount: 16, Chunks: ckGeometry, Policy: ring.PolicyBlock})
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{ChunkWindow: 2})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan int)
	go func() { // read and release every chunk, so the ring never fills
		n := 0
		for {
			ch, err := c.NextChunk(5 * time.Second)
			if err != nil {
				done <- n
				return
			}
			n++
			c.Release(ch.Heap)
		}
	}()
	for i := uint64(0); i < 800; i++ {
		h := ckHeap(i+1, i, 0, 100, 0)
		if i == 400 {
			h.Items[0].Value = 1<<48 - 1 // the largest time item a 48-bit flavour carries
		}
		for _, b := range speadtest.EncodeAll(t, spead.Flavour64_48, 1500, &h) {
			a.Packet(b, 1)
		}
	}
	a.Packet(speadtest.EncodeAll(t, spead.Flavour64_48, 1500, ptr(spead.StreamStopHeap(99999999)))[0], 0)
	chunks := <-done
	st := p.Stats()
	if st.Get(ring.CounterTooOldHeaps) != 0 || st.Get(ring.CounterHeaps) != 800 || a.ChunkRebases() != 1 {
		t.Fatalf("too old %d, heaps placed %d, re-bases %d: want 0, 800, 1", st.Get(ring.CounterTooOldHeaps), st.Get(ring.CounterHeaps), a.ChunkRebases())
	}
	if chunks != 201 { // 200 chunks of 4 time positions, and the wild heap's own
		t.Fatalf("%d chunks read, want 201", chunks)
	}
}

// TestChunkEmptyHeapNotPresentOverStaleBytes (spec §13.4): a heap with no payload has no bytes for its
// position. In a slot an earlier chunk filled, it is not marked present over that chunk's bytes: it is
// rejected (rejected_heaps).
func TestChunkEmptyHeapNotPresentOverStaleBytes(t *testing.T) {
	p, c := chunkRing(t, 1) // one slot: the second chunk reuses the first's
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{ChunkWindow: 1})
	if err != nil {
		t.Fatal(err)
	}
	feed := func(cnt, tt uint64, size int) {
		h := ckHeap(cnt, tt, 0, size, 0)
		if size == 0 {
			h.Items = h.Items[:2] // the time and axis items: the encoder pads the payload to one byte
		}
		for _, b := range speadtest.EncodeAll(t, spead.Flavour64_40, 1500, &h) {
			if size == 0 { // a heap of length 0, as a sender that does not pad sends it
				setImmediate(b, 0x2, 0)
				setImmediate(b, 0x4, 0)
				b = b[:len(b)-1]
			}
			a.Packet(b, 1)
		}
	}
	feed(1, 0, ckHeapSize) // chunk 0, position (0, 0): 3000 bytes
	a.Flush()              // chunk 0 published
	ch, err := c.NextChunk(time.Second)
	if err != nil || ch.ID != 0 || ch.Present[0] != 1 {
		t.Fatalf("chunk 0: %v, present %v", err, ch.Present)
	}
	c.Release(ch.Heap)
	feed(2, ckHeaps, 0) // chunk 1 takes the slot, with chunk 0's bytes in position (0, 0)
	a.Flush()
	ch, err = c.NextChunk(time.Second)
	if err != nil || ch.ID != 1 {
		t.Fatalf("chunk 1: %v, id %d", err, ch.ID)
	}
	if ch.Present[0] != 0 || p.Stats().Get(ring.CounterRejectedHeaps) == 0 {
		t.Fatalf("an empty heap marked present over chunk 0's bytes (present %d, rejected %d)", ch.Present[0], p.Stats().Get(ring.CounterRejectedHeaps))
	}
}

// Placing a chunk stream's heaps allocates nothing per heap, and most packets are read straight into
// their positions: one-packet heaps one position after the other (reads of 4), and a 3-packet heap's two
// packets after its first (reads of 1: the first, with more item pointers, is copied; the next are
// expected as the previous heap's were).
func TestChunkPlacementAllocatesNothing(t *testing.T) {
	for _, tc := range []struct {
		name          string
		size, per     int
		packets, want int // packets per heap; packets per heap at least placed, in quarters
	}{{"1packet", 1000, 4, 1, 3}, {"3packets", ckHeapSize, 1, 3, 7}} {
		t.Run(tc.name, func(t *testing.T) {
			p, c := chunkRing(t, 8)
			a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{})
			if err != nil {
				t.Fatal(err)
			}
			feeder := newPlacingFeeder(t, a, tc.per)
			placed, runs := 0, 0
			s := newPositionStream(t, tc.size)
			if len(s.packets) != tc.packets {
				t.Fatalf("%d packets", len(s.packets))
			}
			heap := func() {
				runs++
				placed += feeder.feed(s.next())
				releaseChunks(c)
			}
			for range 30 {
				heap()
			}
			placed, runs = 0, 0
			if allocs := testing.AllocsPerRun(500, heap); allocs != 0 {
				t.Fatalf("%v allocations per heap", allocs)
			}
			// (A read that reaches into a chunk not open yet is copied from there on.)
			t.Logf("%d packets of %d heaps placed", placed, runs)
			if 4*placed < tc.want*runs {
				t.Errorf("%d packets of %d heaps placed, want at least %d/4 a heap", placed, runs, tc.want)
			}
			if p.Stats().Get(ring.CounterChunks) < 40 || p.Stats().Get(ring.CounterIncompleteChunks) != 0 {
				t.Fatalf("counters %v", p.Stats().Map())
			}
		})
	}
}

// positionStream is one heap's packets, rewritten for one position after the other (heap cnt, time and
// axis items), allocating nothing.
type positionStream struct {
	packets [][]byte
	pos     uint64
}

func newPositionStream(t testing.TB, size int) *positionStream {
	h := ckHeap(1, 0, 0, size, 0)
	return &positionStream{packets: speadtest.EncodeAll(t, spead.Flavour64_40, 1500, &h)}
}

// next is the next position's heap.
func (s *positionStream) next() [][]byte {
	for _, b := range s.packets {
		setHeapCnt(b, s.pos+1)
	}
	setImmediate(s.packets[0], ckTimeItem, (s.pos/ckAxis)*ckStep)
	setImmediate(s.packets[0], ckAxisItem, s.pos%ckAxis)
	s.pos++
	return s.packets
}

// releaseChunks releases every chunk published so far.
func releaseChunks(c *ring.Consumer) {
	for {
		ch, ok, err := c.TryNext()
		if err != nil {
			panic(err)
		}
		if !ok {
			return
		}
		c.Release(ch)
	}
}

// setImmediate rewrites the value of the immediate item id in a packet's pointers (flavour 64-40).
func setImmediate(packet []byte, id, value uint64) {
	n := int(binary.BigEndian.Uint16(packet[6:8]))
	for i := range n {
		off := 8 + 8*i
		if raw := binary.BigEndian.Uint64(packet[off:]); raw>>40&(1<<23-1) == id {
			binary.BigEndian.PutUint64(packet[off:], speadtest.Imm40(id, value))
			return
		}
	}
	panic("no such immediate item")
}

// FuzzChunkPlacement: any sequence of heaps — any time and axis index (axis 3 is out of range), packets
// lost, repeated, heaps for one position with another cnt, fed by Packet or through the placing path —
// never panics, publishes chunks in increasing id order, and every presence byte 1 has exactly its heap's
// bytes (every heap for a position carries the same bytes, so a duplicate that overwrote one would show
// only if it wrote outside its own position or into a present one: both are caught, as other positions'
// bytes are checked too).
//
// Input: a configuration byte (bit 0 placing, bits 1–2 chunk window - 1), then 3 bytes per heap: time
// index, axis (low 2 bits) and packets to send (bits 2–4: a mask over the heap's 3 packets, 0 = all), and
// bit 0 of the third byte choosing one of two cnts for the position (a rival heap). A cnt never names two
// positions: SPEAD identifies a heap by its cnt, so packets of one cnt with other items are that heap's.
func FuzzChunkPlacement(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0, 1, 2, 0, 2, 3, 1, 0, 4})
	f.Add([]byte{1, 0, 0, 1, 0, 1, 2, 9, 0, 3, 0, 0, 1, 0, 0x0c, 5})
	f.Add([]byte{2, 5, 0, 1, 0, 1, 2, 1, 3, 3, 40, 0, 4, 1, 0, 5})
	f.Add([]byte{5, 3, 2, 1, 2, 2, 2, 1, 2, 3, 0, 1, 4, 8, 3, 5, 9, 0x13, 6})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 4 {
			return
		}
		placing, window := data[0]&1 != 0, int(data[0]>>1&3)+1
		var packets [][]byte
		for in := data[1:]; len(in) >= 3; in = in[3:] {
			tt, a, mask := uint64(in[0]), uint64(in[1]&3), in[1]>>2&7
			cnt := (tt*4+a)*2 + uint64(in[2]&1) + 1
			h := ckHeap(cnt, tt, a, ckHeapSize, 0)
			for i, p := range speadtest.EncodeAll(t, spead.Flavour64_40, 1500, &h) {
				if mask == 0 || mask&(1<<i) != 0 {
					packets = append(packets, p)
				}
			}
		}
		p, c := chunkRing(t, 16)
		a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{ChunkWindow: window})
		if err != nil {
			t.Fatal(err)
		}
		if placing {
			placingFeed(t, a, packets, 4)
		} else {
			for _, b := range packets {
				a.Packet(b, 1)
			}
		}
		eachChunkInOrder(t, a, p, c, func(ch ring.Chunk) {
			for pos := range uint64(ckHeaps * ckAxis) {
				if ch.Present[pos] == 0 {
					continue
				}
				tt, ax := ch.ID*ckHeaps+pos/ckAxis, pos%ckAxis
				for i, b := range ch.HeapData(uint32(pos/ckAxis), uint32(ax)) {
					if b != ckByte(tt, ax, i, 0) {
						t.Fatalf("chunk %d position (%d, %d) present but byte %d wrong", ch.ID, tt, ax, i)
					}
				}
			}
		})
	})
}

// With the drop policy and a consumer that reads nothing, a chunk that finds no free slot drops its heaps,
// each counted in dropped_heaps, and writes nothing; the chunks that had slots are published whole.
func TestChunkWithoutSlotDropsItsHeapsCounted(t *testing.T) {
	p, c := testRing(t, ring.Config{SlotCount: 2, Chunks: ckGeometry, Policy: ring.PolicyDrop})
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{ChunkWindow: 1})
	if err != nil {
		t.Fatal(err)
	}
	cnt := uint64(0)
	for tt := uint64(0); tt < 3*ckHeaps; tt++ { // chunks 0, 1 and 2, every position
		for ax := uint64(0); ax < ckAxis; ax++ {
			cnt++
			h := ckHeap(cnt, tt, ax, ckHeapSize, 0)
			for _, b := range speadtest.EncodeAll(t, spead.Flavour64_40, 1500, &h) {
				a.Packet(b, 1)
			}
		}
	}
	expectCounters(t, p.Stats(), map[ring.Counter]uint64{ring.CounterChunks: 2, ring.CounterIncompleteChunks: 0,
		ring.CounterDroppedHeaps: ckHeaps * ckAxis, ring.CounterHeaps: 2 * ckHeaps * ckAxis})
	for id := uint64(0); id < 2; id++ {
		ch, err := c.NextChunk(time.Second)
		if err != nil || ch.ID != id || ch.Flags&ring.FlagComplete == 0 {
			t.Fatalf("chunk %d: %+v, %v", id, ch.ID, err)
		}
	}
}

// Without an axis item, a heap's null items (id 0, as senders pad with) are not taken for an axis index:
// the heap is placed by its time item alone.
func TestChunkWithoutAxisIgnoresNullItems(t *testing.T) {
	g := ckGeometry
	g.Axis, g.AxisItem = 1, 0
	p, c := testRing(t, ring.Config{SlotCount: 4, Chunks: g})
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for tt := uint64(0); tt < ckHeaps; tt++ {
		h := spead.Heap{Cnt: tt + 1, Items: []spead.Item{{ID: ckTimeItem, Immediate: true, Value: tt * ckStep},
			{ID: spead.NullID, Immediate: true, Value: 7}, {ID: ckDataItem, Data: make([]byte, 100)}}}
		for _, b := range speadtest.EncodeAll(t, spead.Flavour64_40, 1500, &h) {
			a.Packet(b, 1)
		}
	}
	ch, err := c.NextChunk(time.Second)
	if err != nil || ch.ID != 0 || ch.Flags&ring.FlagComplete == 0 {
		t.Fatalf("chunk %d flags %#x, %v; counters %v", ch.ID, ch.Flags, err, p.Stats().Map())
	}
}

// The heap cnt (item 0x1) can be the time item, as spead2 users often place by it: heap cnt k goes to
// position k mod heaps of chunk k / heaps.
func TestChunkPlacedByHeapCnt(t *testing.T) {
	g := ring.ChunkGeometry{Heaps: 4, Axis: 1, HeapSize: 100, Step: 1, TimeItem: spead.HeapCntID}
	p, c := testRing(t, ring.Config{SlotCount: 4, Chunks: g})
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for cnt := uint64(8); cnt < 16; cnt++ { // chunks 2 and 3
		h := spead.Heap{Cnt: cnt, Items: []spead.Item{{ID: ckDataItem, Data: bytes.Repeat([]byte{byte(cnt)}, 100)}}}
		for _, b := range speadtest.EncodeAll(t, spead.Flavour64_40, 1500, &h) {
			a.Packet(b, 1)
		}
	}
	for id := uint64(2); id <= 3; id++ {
		ch, err := c.NextChunk(time.Second)
		if err != nil || ch.ID != id || ch.Flags&ring.FlagComplete == 0 {
			t.Fatalf("chunk %d flags %#x, %v; want chunk %d complete", ch.ID, ch.Flags, err, id)
		}
		for pos := range uint32(4) {
			if d := ch.HeapData(pos, 0); d[0] != byte(id*4+uint64(pos)) || d[99] != d[0] {
				t.Fatalf("chunk %d position %d holds heap %d's bytes", id, pos, d[0])
			}
		}
		c.Release(ch.Heap)
	}
}

// Heaps of several packets handed over by Packet (a source that does not place) allocate nothing per
// heap either, window moves and chunk publications included.
func TestChunkCopiedPathAllocatesNothing(t *testing.T) {
	p, c := chunkRing(t, 8)
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	s := newPositionStream(t, ckHeapSize) // 3 packets
	heap := func() {
		for _, b := range s.next() {
			a.Packet(b, 1)
		}
		releaseChunks(c)
	}
	for range 30 {
		heap()
	}
	if allocs := testing.AllocsPerRun(500, heap); allocs != 0 {
		t.Fatalf("%v allocations per heap", allocs)
	}
	if st := p.Stats(); st.Get(ring.CounterChunks) < 40 || st.Get(ring.CounterIncompleteChunks) != 0 || st.Get(ring.CounterHeaps) < 500 {
		t.Fatalf("counters %v", st.Map())
	}
}

// eachChunkInOrder ends the stream fed to a (Flush, then the end-of-stream marker) and hands every chunk
// consumer c reads to check, in order, asserting that chunk ids only increase; each is released after check.
func eachChunkInOrder(t *testing.T, a *assemble.Assembler, p *ring.Producer, c *ring.Consumer, check func(ring.Chunk)) {
	t.Helper()
	a.Flush()
	if err := p.PublishEndOfStream(0, time.Second); err != nil {
		t.Fatal(err)
	}
	var last int64 = -1
	backs := uint64(0)
	for {
		ch, err := c.NextChunk(time.Second)
		if err == ring.ErrEndOfStream {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if int64(ch.ID) <= last { // in id order, but for a re-base to a time index far behind (§13.4)
			if backs++; backs > a.ChunkRebases() {
				t.Fatalf("chunk %d after %d (%d re-bases)", ch.ID, last, a.ChunkRebases())
			}
		}
		last = int64(ch.ID)
		check(ch)
		c.Release(ch.Heap)
	}
}
