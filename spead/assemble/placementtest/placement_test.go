// Package placement_test places heaps through assemble.Placement from outside package assemble, as a Go
// program that assembles heaps itself would: the exported interface must be enough.
package placement_test

import (
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/ringtest"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/assemble"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
	"github.com/ibvbridge/ibvbridge/spead/speadtest"
)

// The geometry: chunks of 4 rows × 2 axis positions of 1024 bytes; the ring's time item is not what
// places heaps here (the placement below ignores it), it is only required of a chunk ring.
const (
	rows, axis, heapSize = 4, 2, 1024
	positions            = rows * axis
	tagItem, dataItem    = 0x4000, 0x3000 // tagItem: an immediate item, cnt × 3, the placement checks
	payload              = 1000
)

// cntPlacement puts heap cnt in chunk cnt / positions, at position positions−1 − cnt mod positions (the
// rows filled backwards, so that no built-in placement could land it there by chance); it rejects heaps
// whose cnt is a multiple of 5 and heaps whose tag item is missing or is not cnt × 3.
type cntPlacement struct{ calls int }

func (*cntPlacement) Items() []uint64 { return []uint64{tagItem} }

func (cp *cntPlacement) Place(cnt, size uint64, items []uint64) (chunk, pos, offset uint64, ok bool) {
	cp.calls++
	if cnt%5 == 0 || items[0] == assemble.ChunkPlaceMissing || items[0] != cnt*3 || size != payload {
		return 0, 0, 0, false
	}
	return cnt / positions, positions - 1 - cnt%positions, 0, true
}

var _ assemble.Placement = (*cntPlacement)(nil)

// A placement written outside package assemble places every heap where it says, through the exported
// interface: each placed heap's bytes are at the position it named in the chunk it named, read back with
// the Go consumer, its presence bit set; every heap it rejects (a multiple of 5, a heap without its tag
// item) is absent and counted in rejected_heaps, and nothing else is dropped.
func TestPlacementFromOutsideThePackagePlacesHeapsWhereItSays(t *testing.T) {
	g := ring.ChunkGeometry{Heaps: rows, Axis: axis, HeapSize: heapSize, Step: 1, TimeItem: 0x1600}
	p, c := ringtest.Pair(t, "placement", ring.Config{SlotCount: 16, Chunks: g, HugePages: ring.HugePagesOff},
		ring.AttachOptions{Timeout: time.Second})
	pl := &cntPlacement{}
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{Placement: pl, ChunkWindow: 8})
	if err != nil {
		t.Fatal(err)
	}
	const last = 4*positions - 1 // heaps 1..31: chunks 0..3
	send := func(h spead.Heap) {
		for _, b := range speadtest.EncodeAll(t, spead.Flavour64_40, 400, &h) { // 3 packets a heap
			a.Packet(b, 1)
		}
	}
	var placed, rejected uint64
	for cnt := uint64(1); cnt <= last; cnt++ {
		data := make([]byte, payload)
		pattern.FillPattern(data, cnt)
		send(spead.Heap{Cnt: cnt, Items: []spead.Item{{ID: tagItem, Immediate: true, Value: cnt * 3}, {ID: dataItem, Data: data}}})
		if cnt%5 == 0 {
			rejected++
		} else {
			placed++
		}
	}
	// No tag item: rejected by the placement, whose cnt alone would have placed it (chunk 4).
	send(spead.Heap{Cnt: 33, Items: []spead.Item{{ID: dataItem, Data: make([]byte, payload)}}})
	rejected++
	send(spead.StreamStopHeap(100))

	for id := uint64(0); id < 4; id++ {
		ch, err := c.NextChunk(time.Second)
		if err != nil {
			t.Fatalf("chunk %d: %v", id, err)
		}
		if ch.ID != id {
			t.Fatalf("chunk id %d, want %d", ch.ID, id)
		}
		for pos := uint64(0); pos < positions; pos++ {
			cnt := id*positions + positions - 1 - pos
			b := ch.HeapData(uint32(pos/axis), uint32(pos%axis))
			want := cnt >= 1 && cnt <= last && cnt%5 != 0
			if got := ch.Present[pos] == 1; got != want {
				t.Fatalf("chunk %d position %d (heap %d): present %v, want %v", id, pos, cnt, got, want)
			}
			if want {
				if i := pattern.VerifyPattern(b[:payload], cnt); i >= 0 {
					t.Fatalf("chunk %d position %d: byte %d is not heap %d's", id, pos, i, cnt)
				}
			}
		}
		if err := c.Release(ch.Heap); err != nil {
			t.Fatal(err)
		}
	}
	if ch, err := c.NextChunk(100 * time.Millisecond); err == nil {
		t.Fatalf("a chunk %d no placed heap belongs to", ch.ID)
	}
	s := p.Stats()
	if got := s.Get(ring.CounterRejectedHeaps); got != rejected {
		t.Fatalf("rejected_heaps %d, want %d (every heap the placement rejects)", got, rejected)
	}
	if got := s.Get(ring.CounterHeaps); got != placed {
		t.Fatalf("heaps %d, want %d", got, placed)
	}
	for _, ctr := range []ring.Counter{ring.CounterTooOldHeaps, ring.CounterIncompleteHeaps, ring.CounterDuplicatePackets} {
		if n := s.Get(ctr); n != 0 {
			t.Fatalf("%v: %d, want 0", ctr, n)
		}
	}
	if pl.calls < last {
		t.Fatalf("the placement was asked %d times for %d heaps", pl.calls, last+1)
	}
}
