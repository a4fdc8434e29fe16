package assemble_test

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/assemble"
	"github.com/ibvbridge/ibvbridge/spead/speadtest"
)

// A stream stop that carries the cnt of a heap still under assembly must not make that heap vanish: it is
// counted incomplete (and published flagged with Incomplete), never lost uncounted.
func TestAssemblerStopReusingALiveHeapsCnt(t *testing.T) {
	perHeap := encodeHeaps(t, spead.Flavour64_40, testPacketSize,
		patternHeap(1, 1000), patternHeap(2, 1000), spead.StreamStopHeap(2))
	if len(perHeap[1]) < 2 {
		t.Fatal("heap 2 must take several packets")
	}
	packets := append(append(append([][]byte{}, perHeap[0]...), perHeap[1][0]), perHeap[2]...)
	for _, incomplete := range []bool{false, true} {
		heaps, stats, _ := assembleAll(t, ring.Config{}, assemble.AssemblerConfig{Incomplete: incomplete}, packets)
		want := []uint64{1}
		discarded := uint64(1)
		if incomplete {
			want, discarded = []uint64{1, 2}, 0
		}
		if got := cnts(heaps); !slices.Equal(got, want) {
			t.Errorf("incomplete=%v: published %v, want %v", incomplete, got, want)
		}
		expectCounters(t, stats, map[ring.Counter]uint64{ring.CounterIncompleteHeaps: 1,
			ring.CounterDiscardedIncompleteHeaps: discarded, ring.CounterEndOfStream: 1})
	}
}

// Late copies of packets of heaps already published whole are duplicates: with duplicates and reordering
// (issue: 2 % duplicates within 7 packets gave 306–309 heaps out of 300) exactly the sent heaps come out,
// each once and complete, and every late copy is counted.
func TestAssemblerLateDuplicatesOfPublishedHeaps(t *testing.T) {
	const n = 300
	heaps := make([]spead.Heap, n)
	for i := range heaps {
		heaps[i] = patternHeap(uint64(i+1), 1000)
	}
	perHeap := encodeHeaps(t, spead.Flavour64_40, testPacketSize, heaps...)
	var stream [][]byte
	for _, ps := range perHeap {
		stream = append(stream, ps...)
	}
	// Every 50th packet is sent again 7 packets later: by then its heap (3 packets) has been published.
	var packets [][]byte
	late := map[int][]byte{}
	dups := 0
	for i, p := range stream {
		packets = append(packets, p)
		if i%50 == 0 {
			late[i+7] = p
			dups++
		}
		if d, ok := late[i]; ok {
			packets = append(packets, d)
		}
	}
	got, stats, _ := assembleAll(t, ring.Config{SlotCount: 512}, assemble.AssemblerConfig{Incomplete: true}, packets)
	if len(got) != n {
		t.Fatalf("%d heaps published, want %d", len(got), n)
	}
	for i, h := range got {
		if h.cnt != uint64(i+1) || !h.has(ring.FlagComplete) {
			t.Fatalf("heap %d: cnt %d flags %#x, want cnt %d complete", i, h.cnt, h.flags, i+1)
		}
	}
	expectCounters(t, stats, map[ring.Counter]uint64{ring.CounterHeaps: n, ring.CounterIncompleteHeaps: 0,
		ring.CounterDuplicatePackets: uint64(dups)})
}

// A packet repeating many item pointers that an earlier packet of the heap already gave adds nothing to
// the item table, however many there are (the duplicate test is a hash lookup, not a scan of the list);
// within one packet pointers are kept as given.
func TestAssemblerRepeatedPointers(t *testing.T) {
	const distinct, repeats = 50, 1000
	header := func(offset uint64) []uint64 {
		return []uint64{speadtest.Imm40(1, 9), speadtest.Imm40(2, 8), speadtest.Imm40(3, offset), speadtest.Imm40(4, 4)}
	}
	ptrs := header(0)
	for i := range uint64(distinct) {
		ptrs = append(ptrs, speadtest.Imm40(0x2000+i, i))
	}
	first := speadtest.RawPacket(3, 5, ptrs, []byte{1, 2, 3, 4})
	ptrs = header(4)
	for i := range uint64(repeats) {
		ptrs = append(ptrs, speadtest.Imm40(0x2000+i%distinct, i%distinct)) // each of the 50 again, 20 times
	}
	second := speadtest.RawPacket(3, 5, ptrs, []byte{5, 6, 7, 8})
	got, _, _ := assembleAll(t, ring.Config{MaxItems: 64}, assemble.AssemblerConfig{}, [][]byte{first, second})
	if len(got) != 1 {
		t.Fatalf("%d heaps, want 1", len(got))
	}
	if len(got[0].items) != distinct || got[0].has(ring.FlagItemsOverflow) {
		t.Errorf("%d items (flags %#x), want the %d distinct ones", len(got[0].items), got[0].flags, distinct)
	}
}

// BenchmarkRepeatedPointers: packets that each repeat ~1000 item pointers of their heap (the audit's
// hostile sender). The duplicate test is a hash lookup, so a packet costs O(its pointers), not
// O(pointers × the heap's item count).
func BenchmarkRepeatedPointers(b *testing.B) {
	const repeats = 1000
	ptrs := []uint64{speadtest.Imm40(1, 1), speadtest.Imm40(2, 1<<20), speadtest.Imm40(3, 0), speadtest.Imm40(4, 4)}
	for i := range uint64(repeats) {
		ptrs = append(ptrs, speadtest.Imm40(0x2000+i%60, i))
	}
	p, _ := testRing(b, ring.Config{SlotCount: 8, SlotSize: 1 << 20, MaxItems: 64})
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	packets := make([][]byte, 4096)
	for i := range packets {
		ptrs[2] = speadtest.Imm40(3, uint64(i)*4) // a new 4-byte range of the same heap each time
		packets[i] = speadtest.RawPacket(3, 5, ptrs, []byte{1, 2, 3, 4})
	}
	b.ResetTimer()
	for i := range b.N {
		pkt := packets[i%len(packets)]
		binary.BigEndian.PutUint64(pkt[8:], speadtest.Imm40(1, uint64(i/len(packets)+1))) // each pass a new heap: no duplicates
		a.Packet(pkt, 0)
	}
}
