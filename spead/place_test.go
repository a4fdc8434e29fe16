package spead_test

import (
	"testing"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
)

// placingFeed hands packets to a as a placing source does, a read of up to len(regions) datagrams at a
// time: each datagram's header goes to a header buffer and its payload into the region Place gave (as
// the kernel scatters it), then Fits decides, for a leading run, whether Placed takes it in place; the
// rest are taken whole by Packet. It returns how many were placed.
func placingFeed(t testing.TB, a *spead.Assembler, packets [][]byte, per int) (placed int) {
	t.Helper()
	regions := make([][]byte, per)
	for len(packets) > 0 {
		hdrLen, n := a.Place(regions)
		k := min(per, len(packets))
		read := packets[:k]
		packets = packets[k:]
		fits := make([]bool, k)
		hdrs := make([][]byte, k)
		for j, p := range read {
			if j >= n || len(p) <= hdrLen || len(p)-hdrLen > len(regions[j]) {
				break // the rest of this read is not in place
			}
			hdrs[j] = append([]byte(nil), p[:hdrLen]...)
			copy(regions[j], p[hdrLen:])
			if fits[j] = a.Fits(hdrs[j], regions[j], len(p)-hdrLen); !fits[j] {
				break
			}
		}
		for j, p := range read {
			if fits[j] {
				if !a.Placed(hdrs[j], regions[j], len(p)-hdrLen, int64(j)) {
					t.Fatalf("Placed refused a datagram Fits approved")
				}
				placed++
				continue
			}
			a.Packet(p, int64(j))
		}
	}
	return placed
}

// One-packet heaps are read straight into slots taken ahead for the heaps expected next; a heap that
// arrives late (12 before 11) and a late copy of a heap already published (12 again, while a slot is
// keyed to 12 because 11 came last) are taken correctly: every heap once and whole, the copy counted as
// a duplicate, not published again.
func TestAssemblerPlacesNextHeaps(t *testing.T) {
	const size = 1000
	var heaps []spead.Heap
	order := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 11, 12}
	for cnt := uint64(13); cnt <= 40; cnt++ {
		order = append(order, cnt)
	}
	for _, cnt := range order {
		heaps = append(heaps, patternHeap(cnt, size))
	}
	var packets [][]byte
	for _, hp := range encodeHeaps(t, spead.Flavour64_40, 1472, heaps...) {
		if len(hp) != 1 {
			t.Fatalf("a heap of %d packets, want 1", len(hp))
		}
		packets = append(packets, hp[0])
	}
	p, c := testRing(t, ring.Config{SlotCount: 64, SlotSize: 4096})
	a, err := spead.NewAssembler(p, spead.AssemblerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	placed := placingFeed(t, a, packets, 4)
	a.Flush()
	if err := p.PublishEndOfStream(0, 0); err != nil {
		t.Fatal(err)
	}
	got, eos := drain(t, c)
	if !eos || len(got) != 40 {
		t.Fatalf("%d heaps (eos %v), want 40", len(got), eos)
	}
	seen := map[uint64]bool{}
	for _, h := range got {
		if seen[h.cnt] {
			t.Fatalf("heap %d published twice", h.cnt)
		}
		seen[h.cnt] = true
		checkPatternHeap(t, h, h.cnt, size, spead.Flavour64_40)
	}
	expectCounters(t, p.Stats(), map[ring.Counter]uint64{ring.CounterHeaps: 40, ring.CounterDuplicatePackets: 1,
		ring.CounterIncompleteHeaps: 0})
	if placed < 25 {
		t.Errorf("%d of %d datagrams placed", placed, len(packets))
	}
	t.Logf("%d of %d datagrams placed", placed, len(packets))
}
