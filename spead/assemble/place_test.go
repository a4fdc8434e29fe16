package assemble_test

import (
	"testing"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/assemble"
	"github.com/ibvbridge/ibvbridge/spead/speadtest"
)

// placingFeeder hands packets to an assembler as a placing source does, a read of up to len(regions)
// datagrams at a time: each datagram's header goes to a header buffer and its payload into the region
// Place gave (as the kernel scatters it), then Fits decides, for a leading run, whether Placed takes it in
// place; the rest are taken whole by Packet. Its buffers are allocated once, so feeding allocates nothing
// of its own.
type placingFeeder struct {
	t       testing.TB
	a       *assemble.Assembler
	regions [][]byte
	hdrs    [][]byte
	fits    []bool
}

func newPlacingFeeder(t testing.TB, a *assemble.Assembler, per int) *placingFeeder {
	f := &placingFeeder{t: t, a: a, regions: make([][]byte, per), hdrs: make([][]byte, per), fits: make([]bool, per)}
	for j := range f.hdrs {
		f.hdrs[j] = make([]byte, 0, 512)
	}
	return f
}

// feed hands over packets and returns how many were placed.
func (f *placingFeeder) feed(packets [][]byte) (placed int) {
	f.t.Helper()
	for len(packets) > 0 {
		hdrLen, n := f.a.Place(f.regions)
		k := min(len(f.regions), len(packets))
		read := packets[:k]
		packets = packets[k:]
		clear(f.fits)
		for j, p := range read {
			if j >= n || len(p) <= hdrLen || len(p)-hdrLen > len(f.regions[j]) {
				break // the rest of this read is not in place
			}
			f.hdrs[j] = append(f.hdrs[j][:0], p[:hdrLen]...)
			copy(f.regions[j], p[hdrLen:])
			if f.fits[j] = f.a.Fits(f.hdrs[j], f.regions[j], len(p)-hdrLen); !f.fits[j] {
				break
			}
		}
		for j, p := range read {
			if f.fits[j] {
				if !f.a.Placed(f.hdrs[j], f.regions[j], len(p)-hdrLen, int64(j)) {
					f.t.Fatalf("Placed refused a datagram Fits approved")
				}
				placed++
				continue
			}
			f.a.Packet(p, int64(j))
		}
	}
	return placed
}

// placingFeed feeds packets through a new placingFeeder, per datagrams a read.
func placingFeed(t testing.TB, a *assemble.Assembler, packets [][]byte, per int) (placed int) {
	return newPlacingFeeder(t, a, per).feed(packets)
}

// TestPlacedPathAllocatesNothing: heaps of one and of several packets read straight into place (the
// next packets of a heap into its slot, the next heaps' first packets into slots taken ahead) allocate
// nothing per heap, and the path is really taken: nearly every packet is placed.
func TestPlacedPathAllocatesNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int
	}{{"1packet", 4096}, {"multipacket", 64 << 10}} {
		t.Run(tc.name, func(t *testing.T) {
			p, c := testRing(t, ring.Config{SlotCount: 32, SlotSize: tc.size + 4096, Policy: ring.PolicyDrop})
			a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{})
			if err != nil {
				t.Fatal(err)
			}
			h := patternHeap(1, tc.size)
			packets := speadtest.EncodeAll(t, spead.Flavour64_40, 8972, &h)
			feeder := newPlacingFeeder(t, a, 4)
			cnt, placed, runs := uint64(1), 0, 0
			heap := func() {
				cnt++
				runs++
				for _, b := range packets {
					setHeapCnt(b, cnt)
				}
				placed += feeder.feed(packets)
				ch, ok, err := c.TryNext()
				if !ok || err != nil || ch.Flags != ring.FlagComplete || ch.HeapCnt != cnt {
					panic("heap not published whole")
				}
				c.Release(ch)
			}
			for range 4 { // learn the stride and take slots ahead
				heap()
			}
			placed, runs = 0, 0
			if allocs := testing.AllocsPerRun(200, heap); allocs != 0 {
				t.Fatalf("%v allocations per heap", allocs)
			}
			// A heap of several packets has its first read of 4 copied (its first packet has a longer
			// header than the rest, so nothing is guessed for it) and the rest placed; heaps of one packet
			// go to slots taken ahead while the pool (reclaimed only as heaps begin) has some to spare.
			if total := runs * len(packets); placed < total/2 {
				t.Fatalf("%d of %d packets placed, want at least half", placed, total)
			}
		})
	}
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
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{})
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

// A heap's first packet carries more item pointers than the rest (spead2_send's layout), so its header
// is longer: the packet after it is expected with the header and payload length the previous heap's
// middle packets had, not the first packet's. Read a datagram at a time, every packet is then placed but
// each heap's first (and the second of the very first heap, before any middle packet was seen).
func TestPlacesThePacketAfterALongerFirstHeader(t *testing.T) {
	const heaps, size = 6, 64 << 10
	var all []spead.Heap
	for cnt := uint64(1); cnt <= heaps; cnt++ {
		all = append(all, patternHeap(cnt, size))
	}
	var packets [][]byte
	perHeap := 0
	for _, hp := range encodeHeaps(t, spead.Flavour64_40, 8972, all...) {
		packets = append(packets, hp...)
		perHeap = len(hp)
	}
	if perHeap < 4 {
		t.Fatalf("%d packets a heap", perHeap)
	}
	p, c := testRing(t, ring.Config{SlotCount: 32, SlotSize: size + 4096})
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	placed := placingFeed(t, a, packets, 1)
	got, _ := drain(t, c)
	if len(got) != heaps {
		t.Fatalf("%d heaps, want %d", len(got), heaps)
	}
	for _, h := range got {
		checkPatternHeap(t, h, h.cnt, size, spead.Flavour64_40)
	}
	if want := len(packets) - heaps - 1; placed != want {
		t.Errorf("%d of %d packets placed, want %d", placed, len(packets), want)
	}
}
