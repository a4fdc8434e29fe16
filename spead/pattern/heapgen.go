package pattern

import (
	"fmt"

	"github.com/ibvbridge/ibvbridge/spead"
)

// HeapGen builds the heaps of a generated stream (`ibvbridge send`), reusing one Heap and one payload
// buffer: heap cnt N has nItems address items splitting heapSize bytes, ids 0x1000 onwards. With the
// pattern, the payload is heap N's pattern and immediate item 0x1001 carries N, so Verify can check it;
// without, every heap carries the same fixed bytes. With descriptors, heap 1 also carries the items'
// descriptors, after the data items (as spead2_send puts them in its first heap).
type HeapGen struct {
	payload  []byte
	h        spead.Heap
	first    spead.Heap // heap 1 when it also carries descriptors
	pattern  bool
	tsIndex  int    // index of the timestamp item in both heaps' items, -1 without one
	heapSize uint64 // the timestamp's step
	chunk    *ChunkItems
}

// ChunkItems makes a stream a chunk-mode receiver can place (spec §13): heap cnt N (from 1) carries the
// immediate TimeItem = ((N-1) / AxisCount) × Step and, with an AxisItem, AxisItem = (N-1) mod AxisCount —
// every axis position of one timestamp, then the next timestamp.
type ChunkItems struct {
	TimeItem, Step      uint64
	AxisItem, AxisCount uint64 // AxisItem 0: none (AxisCount is then 1)
}

// TimestampItemID is the id of the timestamp item (Options.Timestamp), the one MeerKAT's digitiser streams
// give their ADC sample counter.
const TimestampItemID = 0x1600

// Options says what a generated stream carries besides its payload items.
type Options struct {
	Pattern     bool // payload = the test pattern, plus immediate item 0x1001 "heap_cnt" = the heap cnt
	Descriptors bool // heap 1 also carries every item's descriptor
	// Timestamp adds immediate item 0x1600 "timestamp" = (cnt-1) × heap size: a sample counter, as a
	// digitiser's stream has (one byte a sample), so spead2-style receivers have a named scalar to read.
	Timestamp bool
}

// NewHeapGen makes the generator of a stream with a pattern and descriptors or not (see Options).
func NewHeapGen(f spead.Flavour, heapSize, nItems int, pattern, descriptors bool) (*HeapGen, error) {
	return NewHeapGenOptions(f, heapSize, nItems, Options{Pattern: pattern, Descriptors: descriptors})
}

// NewHeapGenOptions makes the generator.
func NewHeapGenOptions(f spead.Flavour, heapSize, nItems int, o Options) (*HeapGen, error) {
	pattern, descriptors := o.Pattern, o.Descriptors
	if heapSize < 1 || nItems < 1 || nItems > heapSize {
		return nil, fmt.Errorf("pattern: %d items in a %d-byte heap: want 1..heap size items", nItems, heapSize)
	}
	g := &HeapGen{payload: make([]byte, heapSize), pattern: pattern, tsIndex: -1, heapSize: uint64(heapSize)}
	if pattern {
		g.h.Items = append(g.h.Items, spead.Item{ID: CntItemID, Immediate: true})
	} else {
		FillPattern(g.payload, 0) // fixed, recognisable bytes
	}
	var descs []spead.Descriptor
	if pattern {
		descs = append(descs, spead.Descriptor{ID: CntItemID, Name: "heap_cnt",
			Description: "the heap's cnt (test pattern)", Format: []spead.FormatField{{Code: 'u', Bits: uint64(f)}}, Flavour: f})
	}
	off := 0
	for i := range nItems {
		size := heapSize / nItems
		if i == nItems-1 {
			size = heapSize - off
		}
		id := uint64(PayloadItemID + i)
		if pattern && i > 0 {
			id++ // 0x1001 is the heap cnt
		}
		g.h.Items = append(g.h.Items, spead.Item{ID: id, Data: g.payload[off : off+size]})
		descs = append(descs, spead.Descriptor{ID: id, Name: fmt.Sprintf("Test item %d", i),
			Description: fmt.Sprintf("%d bytes of generated payload", size),
			DType:       fmt.Sprintf("{'descr': '|u1', 'fortran_order': False, 'shape': (%d,)}", size), Flavour: f})
		off += size
	}
	if o.Timestamp {
		g.tsIndex = len(g.h.Items)
		g.h.Items = append(g.h.Items, spead.Item{ID: TimestampItemID, Immediate: true})
		descs = append(descs, spead.Descriptor{ID: TimestampItemID, Name: "timestamp",
			Description: "sample counter: (heap cnt - 1) x heap size", Format: []spead.FormatField{{Code: 'u', Bits: uint64(f)}}, Flavour: f})
	}
	if descriptors {
		dh, err := spead.DescriptorHeap(1, f, descs...)
		if err != nil {
			return nil, fmt.Errorf("descriptor heap: %w", err)
		}
		// The descriptors follow the data items, so the payload still starts with the data.
		g.first.Items = append(append([]spead.Item{}, g.h.Items...), dh.Items...)
	}
	return g, nil
}

// SetChunkItems adds the time (and axis) immediate items of ci to every heap, before its other items.
func (g *HeapGen) SetChunkItems(ci ChunkItems) error {
	if ci.TimeItem == 0 || ci.Step == 0 || ci.AxisItem != 0 && ci.AxisCount == 0 || ci.AxisItem == ci.TimeItem {
		return fmt.Errorf("pattern: chunk items %+v: want a time item and step, an axis item other than it with a count", ci)
	}
	if g.tsIndex >= 0 && (ci.TimeItem == TimestampItemID || ci.AxisItem == TimestampItemID) {
		return fmt.Errorf("pattern: chunk item %#x is the timestamp item already in the stream", uint64(TimestampItemID))
	}
	if ci.AxisItem == 0 {
		ci.AxisCount = 1
	}
	g.chunk = &ci
	add := func(h *spead.Heap) {
		ids := []spead.Item{{ID: ci.TimeItem, Immediate: true}}
		if ci.AxisItem != 0 {
			ids = append(ids, spead.Item{ID: ci.AxisItem, Immediate: true})
		}
		h.Items = append(ids, h.Items...)
	}
	if g.tsIndex >= 0 {
		g.tsIndex += 1 + min(int(ci.AxisItem), 1) // the items before it moved up
	}
	add(&g.h)
	if g.first.Items != nil {
		add(&g.first)
	}
	return nil
}

// Heap returns heap cnt, ready to encode; valid until the next call.
func (g *HeapGen) Heap(cnt uint64) *spead.Heap {
	h := &g.h
	if cnt == 1 && g.first.Items != nil {
		h = &g.first
	}
	h.Cnt = cnt
	items := h.Items
	if ci := g.chunk; ci != nil {
		items[0].Value = (cnt - 1) / ci.AxisCount * ci.Step
		if ci.AxisItem != 0 {
			items[1].Value = (cnt - 1) % ci.AxisCount
			items = items[2:]
		} else {
			items = items[1:]
		}
	}
	if g.pattern {
		FillPattern(g.payload, cnt)
		items[0].Value = cnt
	}
	if g.tsIndex >= 0 {
		h.Items[g.tsIndex].Value = (cnt - 1) * g.heapSize
	}
	return h
}
