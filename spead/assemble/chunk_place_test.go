package assemble_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/assemble"
	"github.com/ibvbridge/ibvbridge/spead/speadtest"
)

// ckPlaceItems are the items a user's placement asks for in these tests: the time and the axis item.
var ckPlaceItems = []uint64{ckTimeItem, ckAxisItem}

// ckUserPlace is the tests' geometry's placement written as a user's (what recv --chunk-by and
// --chunk-axis do), counting its calls.
func ckUserPlace(calls *int) assemble.ChunkPlaceFunc {
	return func(_, _ uint64, items []uint64) (chunk, pos, off uint64, ok bool) {
		*calls++
		ts, a := items[0], items[1]
		if ts == assemble.ChunkPlaceMissing || a == assemble.ChunkPlaceMissing || a >= ckAxis {
			return 0, 0, 0, false
		}
		t := ts / ckStep
		return t / ckHeaps, (t%ckHeaps)*ckAxis + a, 0, true
	}
}

// A user's placement that computes what the time and axis items say places exactly as they do: the
// stream of TestChunkPlacementExact (shuffled heaps, gaps, incomplete, late, duplicate and rejected heaps —
// the heap longer than a position rejected by the check of the answer, not by the function) gives every
// byte, presence bit and counter the same, copied and read straight into place.
func TestChunkPlaceFuncPlacesAsTheItemsDo(t *testing.T) {
	for _, placing := range []bool{false, true} {
		for seed := uint64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprintf("placing=%v/seed=%d", placing, seed), func(t *testing.T) {
				s := newCkStream(t, 12, seed)
				p, c := chunkRing(t, 32)
				calls := 0
				a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{ChunkWindow: 2,
					Placement: assemble.FuncPlacement{ItemIDs: ckPlaceItems, Func: ckUserPlace(&calls)}})
				if err != nil {
					t.Fatal(err)
				}
				if placing {
					placingFeed(t, a, s.packets, 4)
				} else {
					for i, b := range s.packets {
						a.Packet(b, int64(1000+i))
					}
				}
				a.Packet(speadtest.EncodeAll(t, spead.Flavour64_40, 1500, ptr(spead.StreamStopHeap(99999999)))[0], 0)
				if calls == 0 {
					t.Fatal("the user's placement was never called")
				}
				s.check(t, c, p.Stats())
			})
		}
	}
}

// The hook path allocates nothing per heap and calls the user's placement exactly once per heap, whether
// the heap's packets are copied (Packet) or read straight into place (a one-packet heap's only packet is
// looked up by Fits, Placed's Fits and begin: the repeated lookups reuse the answer).
func TestChunkPlaceFuncOncePerHeapAllocatesNothing(t *testing.T) {
	for _, tc := range []struct {
		placing   bool
		size, per int
	}{{false, ckHeapSize, 1}, {true, ckHeapSize, 1}, {false, 1000, 4}, {true, 1000, 4}} {
		placing := tc.placing
		t.Run(fmt.Sprintf("placing=%v/size=%d", placing, tc.size), func(t *testing.T) {
			p, c := chunkRing(t, 8)
			calls := 0
			a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{Placement: assemble.FuncPlacement{ItemIDs: ckPlaceItems, Func: ckUserPlace(&calls)}})
			if err != nil {
				t.Fatal(err)
			}
			feeder := newPlacingFeeder(t, a, tc.per)
			s := newPositionStream(t, tc.size) // 3 packets, or 1
			heaps, placed := 0, 0
			heap := func() {
				heaps++
				if placing {
					placed += feeder.feed(s.next())
				} else {
					for _, b := range s.next() {
						a.Packet(b, 1)
					}
				}
				releaseChunks(c)
			}
			for range 30 {
				heap()
			}
			if allocs := testing.AllocsPerRun(500, heap); allocs != 0 {
				t.Fatalf("%v allocations per heap", allocs)
			}
			if calls != heaps {
				t.Errorf("%d calls of the user's placement for %d heaps, want one per heap", calls, heaps)
			}
			if placing && placed < heaps/2 {
				t.Errorf("%d packets of %d heaps read straight into place", placed, heaps)
			}
			if st := p.Stats(); st.Get(ring.CounterChunks) < 40 || st.Get(ring.CounterIncompleteChunks) != 0 ||
				st.Get(ring.CounterHeaps) < 500 || st.Get(ring.CounterRejectedHeaps) != 0 {
				t.Fatalf("counters %v", st.Map())
			}
		})
	}
}

// The user's placement gets the heap cnt, the heap length and its items' values (ChunkPlaceMissing for one
// the packet lacks); its answer is checked: a rejection, a position out of range, an offset at or past the
// position's end and an offset that leaves the heap too little room are each counted in rejected_heaps
// and write nothing, while a heap at an offset in its position lands there.
func TestChunkPlaceFuncAnswersChecked(t *testing.T) {
	type answer struct{ chunk, pos, off uint64 }
	answers := map[uint64]answer{ // by heap cnt; cnt 1 is rejected by the function
		2: {0, ckHeaps * ckAxis, 0},  // position out of range
		3: {0, 1, ckHeapSize},        // offset at the position's end
		4: {0, 2, ckHeapSize - 999},  // 1000 bytes do not fit
		5: {0, 5, ckHeapSize - 1000}, // fits exactly
	}
	type call struct{ cnt, size, time, axis uint64 }
	var got []call
	place := func(cnt, size uint64, items []uint64) (chunk, pos, off uint64, ok bool) {
		got = append(got, call{cnt, size, items[0], items[1]})
		a, ok := answers[cnt]
		return a.chunk, a.pos, a.off, ok
	}
	p, c := chunkRing(t, 4)
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{Placement: assemble.FuncPlacement{ItemIDs: ckPlaceItems, Func: place}})
	if err != nil {
		t.Fatal(err)
	}
	for cnt := uint64(1); cnt <= 5; cnt++ {
		h := ckHeap(cnt, cnt, 2, 1000, 0)
		if cnt == 3 {
			h.Items = h.Items[1:] // no time item
		}
		for _, b := range speadtest.EncodeAll(t, spead.Flavour64_40, 1500, &h) {
			a.Packet(b, 1)
		}
	}
	a.Flush()
	want := []call{{1, 1000, 1 * ckStep, 2}, {2, 1000, 2 * ckStep, 2}, {3, 1000, assemble.ChunkPlaceMissing, 2},
		{4, 1000, 4 * ckStep, 2}, {5, 1000, 5 * ckStep, 2}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("calls %v, want %v", got, want)
	}
	expectCounters(t, p.Stats(), map[ring.Counter]uint64{ring.CounterRejectedHeaps: 4, ring.CounterHeaps: 1, ring.CounterChunks: 1})
	ch, err := c.NextChunk(time.Second)
	if err != nil || ch.ID != 0 {
		t.Fatalf("chunk %d, %v", ch.ID, err)
	}
	for pos := range uint64(ckHeaps * ckAxis) {
		d := ch.HeapData(uint32(pos/ckAxis), uint32(pos%ckAxis))
		wantPresent, wantBytes := byte(0), make([]byte, ckHeapSize)
		if pos == 5 {
			wantPresent = 1
			for i := range 1000 {
				wantBytes[ckHeapSize-1000+i] = ckByte(5, 2, i, 0)
			}
		}
		if ch.Present[pos] != wantPresent || !bytes.Equal(d, wantBytes) {
			t.Errorf("position %d: presence %d (want %d), bytes as placed: %v", pos, ch.Present[pos], wantPresent, bytes.Equal(d, wantBytes))
		}
	}
}

// A placement on a ring not in chunk mode, or with more items than MaxChunkPlaceItems, is refused.
func TestChunkPlaceFuncRefusedWithoutChunks(t *testing.T) {
	place := func(_, _ uint64, _ []uint64) (uint64, uint64, uint64, bool) { return 0, 0, 0, true }
	p, _ := testRing(t, ring.Config{SlotCount: 4})
	if _, err := assemble.NewAssembler(p, assemble.AssemblerConfig{Placement: assemble.FuncPlacement{Func: place}}); err == nil {
		t.Error("a chunk placement on a ring without chunks was accepted")
	}
	p2, _ := chunkRing(t, 4)
	if _, err := assemble.NewAssembler(p2, assemble.AssemblerConfig{Placement: assemble.FuncPlacement{ItemIDs: make([]uint64, assemble.MaxChunkPlaceItems+1), Func: place}}); err == nil {
		t.Error("too many placement items were accepted")
	}
}

// FuzzChunkPlaceFunc: whatever a user's placement answers — any chunk id, positions and offsets in and out
// of range, rejections — the Assembler never panics, publishes chunks in increasing id order, writes a heap
// only inside the position it was given, from its offset on, and writes nothing into a position no valid
// answer named. Each heap (one packet of 1000 bytes) carries bytes that depend on the answer it gets, so a
// present position shows which heap filled it.
//
// Input: 4 bytes per heap: chunk id (low 3 bits), position (may be ≥ 12, out of range), offset / 16 (may
// leave the heap too little room), bit 0 of the fourth byte rejecting the heap.
func FuzzChunkPlaceFunc(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 1, 2, 0, 1, 5, 127, 0, 0, 12, 0, 0, 2, 3, 200, 0, 0, 0, 0, 1})
	f.Add([]byte{3, 2, 1, 0, 1, 2, 1, 0, 5, 11, 0, 0, 0, 4, 125, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		type answer struct{ chunk, pos, off uint64 }
		answers := map[uint64]answer{}
		rejected := map[uint64]bool{}
		var packets [][]byte
		named := map[[2]uint64]bool{} // positions some valid answer named
		for cnt, in := uint64(1), data; len(in) >= 4; cnt, in = cnt+1, in[4:] {
			a := answer{uint64(in[0] & 7), uint64(in[1]), uint64(in[2]) * 16}
			answers[cnt], rejected[cnt] = a, in[3]&1 != 0
			if !rejected[cnt] && a.pos < ckHeaps*ckAxis && a.off+1000 <= ckHeapSize {
				named[[2]uint64{a.chunk, a.pos}] = true
			}
			payload := make([]byte, 1000)
			for i := range payload {
				payload[i] = byte(uint64(i)*7+a.chunk*13+a.pos*31) ^ byte(a.off)
			}
			h := spead.Heap{Cnt: cnt, Items: []spead.Item{{ID: ckDataItem, Data: payload}}}
			packets = append(packets, speadtest.EncodeAll(t, spead.Flavour64_40, 1500, &h)...)
		}
		place := func(cnt, _ uint64, _ []uint64) (chunk, pos, off uint64, ok bool) {
			a := answers[cnt]
			return a.chunk, a.pos, a.off, !rejected[cnt]
		}
		p, c := chunkRing(t, 16) // more slots than chunk ids: none is reused, untouched bytes stay 0
		a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{ChunkWindow: 2, Placement: assemble.FuncPlacement{Func: place}})
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range packets {
			a.Packet(b, 1)
		}
		eachChunkInOrder(t, a, p, c, func(ch ring.Chunk) {
			for pos := range uint64(ckHeaps * ckAxis) {
				d := ch.HeapData(uint32(pos/ckAxis), uint32(pos%ckAxis))
				if !named[[2]uint64{ch.ID, pos}] {
					if ch.Present[pos] != 0 || !bytes.Equal(d, make([]byte, ckHeapSize)) {
						t.Fatalf("chunk %d position %d: no valid answer named it, yet it was written", ch.ID, pos)
					}
					continue
				}
				if ch.Present[pos] != 1 {
					continue
				}
				found := false
				for cnt, an := range answers { // the heap that filled it: one given this position
					if rejected[cnt] || an.chunk != ch.ID || an.pos != pos || an.off+1000 > ckHeapSize {
						continue
					}
					ok := true
					for i := range 1000 {
						if d[an.off+uint64(i)] != byte(uint64(i)*7+an.chunk*13+an.pos*31)^byte(an.off) {
							ok = false
							break
						}
					}
					found = found || ok
				}
				if !found {
					t.Fatalf("chunk %d position %d present, but no heap given it is there at its offset", ch.ID, pos)
				}
			}
		})
	})
}
