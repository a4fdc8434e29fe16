package assemble_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/assemble"
	"github.com/ibvbridge/ibvbridge/spead/speadtest"
	"github.com/ibvbridge/ibvbridge/transport"
)

var _ transport.Sink = (*assemble.Assembler)(nil)

const testPacketSize = 256 // small packets: multi-packet heaps from small payloads

func TestAssemblerReorderedPackets(t *testing.T) {
	for _, f := range []spead.Flavour{spead.Flavour64_40, spead.Flavour64_48} {
		t.Run(f.String(), func(t *testing.T) {
			packets := encodeHeaps(t, f, testPacketSize, patternHeap(5, 3000))[0]
			r := rand.New(rand.NewPCG(1, 2))
			r.Shuffle(len(packets), func(i, j int) { packets[i], packets[j] = packets[j], packets[i] })
			heaps, stats, _ := assembleAll(t, ring.Config{}, assemble.AssemblerConfig{}, packets)
			if len(heaps) != 1 {
				t.Fatalf("%d heaps", len(heaps))
			}
			checkPatternHeap(t, heaps[0], 5, 3000, f)
			if int(heaps[0].packets) != len(packets) {
				t.Errorf("%d packets, want %d", heaps[0].packets, len(packets))
			}
			expectCounters(t, stats, map[ring.Counter]uint64{ring.CounterHeaps: 1, ring.CounterPackets: uint64(len(packets)),
				ring.CounterBytes: 3000, ring.CounterDuplicatePackets: 0, ring.CounterIncompleteHeaps: 0})
		})
	}
}

func TestAssemblerInterleavedHeaps(t *testing.T) {
	perHeap := encodeHeaps(t, spead.Flavour64_40, testPacketSize, patternHeap(1, 2000), patternHeap(2, 1000), patternHeap(3, 3000))
	// Round robin across the three heaps: they complete out of cnt order (2 first, it is shortest).
	var packets [][]byte
	for i := 0; ; i++ {
		added := false
		for _, hp := range perHeap {
			if i < len(hp) {
				packets = append(packets, hp[i])
				added = true
			}
		}
		if !added {
			break
		}
	}
	heaps, stats, _ := assembleAll(t, ring.Config{}, assemble.AssemblerConfig{MaxHeaps: 3}, packets)
	if got := cnts(heaps); !slices.Equal(got, []uint64{2, 1, 3}) {
		t.Fatalf("published %v, want completion order [2 1 3]", got)
	}
	sizes := map[uint64]int{1: 2000, 2: 1000, 3: 3000}
	for _, h := range heaps {
		checkPatternHeap(t, h, h.cnt, sizes[h.cnt], spead.Flavour64_40)
	}
	expectCounters(t, stats, map[ring.Counter]uint64{ring.CounterHeaps: 3, ring.CounterPackets: uint64(len(packets)), ring.CounterBytes: 6000})
}

func cnts(heaps []gotHeap) []uint64 {
	out := make([]uint64, len(heaps))
	for i, h := range heaps {
		out[i] = h.cnt
	}
	return out
}

func TestAssemblerDuplicates(t *testing.T) {
	hp := encodeHeaps(t, spead.Flavour64_40, testPacketSize, patternHeap(9, 2000))[0]
	// Every other packet twice, one of them much later, and a partial overlap: a packet carrying the
	// second half of packet 0 and the first half of packet 1 (spead2 rejects partial overlaps too).
	var packets [][]byte
	dups := 0
	for i, b := range hp {
		packets = append(packets, b)
		if i%2 == 0 && i < len(hp)-1 {
			packets = append(packets, b)
			dups++
		}
	}
	var p0 spead.Packet
	if err := spead.Decode(hp[0], &p0); err != nil {
		t.Fatal(err)
	}
	half := uint64(len(p0.Payload) / 2)
	overlap := speadtest.RawPacket(3, 5, []uint64{speadtest.Imm40(1, 9), speadtest.Imm40(2, 2000), speadtest.Imm40(3, half), speadtest.Imm40(4, 2*half)}, make([]byte, 2*half))
	packets = slices.Insert(packets, 3, overlap)
	dups++
	packets = append(packets[:len(packets)-1], hp[0], packets[len(packets)-1]) // late duplicate before the last packet
	dups++
	heaps, stats, _ := assembleAll(t, ring.Config{}, assemble.AssemblerConfig{}, packets)
	if len(heaps) != 1 {
		t.Fatalf("%d heaps", len(heaps))
	}
	checkPatternHeap(t, heaps[0], 9, 2000, spead.Flavour64_40)
	if int(heaps[0].packets) != len(hp) {
		t.Errorf("heap assembled from %d packets, want %d", heaps[0].packets, len(hp))
	}
	expectCounters(t, stats, map[ring.Counter]uint64{ring.CounterDuplicatePackets: uint64(dups),
		ring.CounterPackets: uint64(len(hp)), ring.CounterBytes: 2000, ring.CounterHeaps: 1})
}

// lossyStream is three heaps with the third packet of heap 2 lost; lostBytes is that packet's payload.
func lossyStream(t *testing.T) (packets [][]byte, lostBytes uint64) {
	perHeap := encodeHeaps(t, spead.Flavour64_40, testPacketSize, patternHeap(1, 1500), patternHeap(2, 1500), patternHeap(3, 1500))
	var lost spead.Packet
	if err := spead.Decode(perHeap[1][2], &lost); err != nil {
		t.Fatal(err)
	}
	perHeap[1] = slices.Delete(perHeap[1], 2, 3)
	for _, hp := range perHeap {
		packets = append(packets, hp...)
	}
	return packets, uint64(len(lost.Payload))
}

func TestAssemblerLossIncompletePublished(t *testing.T) {
	packets, lostBytes := lossyStream(t)
	// MaxHeaps 1: heap 3's first packet evicts heap 2.
	heaps, stats, _ := assembleAll(t, ring.Config{}, assemble.AssemblerConfig{MaxHeaps: 1, Incomplete: true}, packets)
	if got := cnts(heaps); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("published %v", got)
	}
	h := heaps[1]
	if !h.has(ring.FlagIncomplete) || h.has(ring.FlagComplete) {
		t.Fatalf("heap 2 flags %#x", h.flags)
	}
	if h.heapSize != 1500 || h.received != 1500-lostBytes {
		t.Errorf("heap 2: size %d received %d, want 1500 and %d", h.heapSize, h.received, 1500-lostBytes)
	}
	if it, ok := itemByID(h, 0x1000); !ok || it.Length != 1500 {
		t.Errorf("heap 2 item 0x1000: %+v", it)
	}
	expectCounters(t, stats, map[ring.Counter]uint64{ring.CounterHeaps: 3, ring.CounterIncompleteHeaps: 1,
		ring.CounterDiscardedIncompleteHeaps: 0, ring.CounterBytes: 4500 - lostBytes})
}

func TestAssemblerLossIncompleteDiscarded(t *testing.T) {
	packets, lostBytes := lossyStream(t)
	heaps, stats, _ := assembleAll(t, ring.Config{}, assemble.AssemblerConfig{MaxHeaps: 1}, packets)
	if got := cnts(heaps); !slices.Equal(got, []uint64{1, 3}) {
		t.Fatalf("published %v", got)
	}
	checkPatternHeap(t, heaps[1], 3, 1500, spead.Flavour64_40)
	expectCounters(t, stats, map[ring.Counter]uint64{ring.CounterHeaps: 2, ring.CounterIncompleteHeaps: 1,
		ring.CounterDiscardedIncompleteHeaps: 1, ring.CounterBytes: 4500 - lostBytes})
}

// TestAssemblerEvictionOrder overflows a window of 2 with heaps that never complete, interleaved with
// complete ones, so that slots are discarded out of acquisition order; the ring stays consistent.
func TestAssemblerEvictionOrder(t *testing.T) {
	var packets [][]byte
	const nHeaps = 40
	perHeap := make([][][]byte, nHeaps)
	for i := range perHeap {
		perHeap[i] = encodeHeaps(t, spead.Flavour64_40, testPacketSize, patternHeap(uint64(i+1), 1000))[0]
	}
	// Heaps 1, 3, 5, ... lose their last packet; each odd heap's packets interleave with the next even one.
	wantComplete := 0
	for i := 0; i < nHeaps; i += 2 {
		odd, even := perHeap[i][:len(perHeap[i])-1], perHeap[i+1]
		for k := range max(len(odd), len(even)) {
			if k < len(odd) {
				packets = append(packets, odd[k])
			}
			if k < len(even) {
				packets = append(packets, even[k])
			}
		}
		wantComplete++
	}
	for _, incomplete := range []bool{false, true} {
		// A 4-slot ring cannot hold 40 heaps: drain after every packet.
		p, c := testRing(t, ring.Config{SlotCount: 4, SlotSize: 4096, Policy: ring.PolicyDrop})
		a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{MaxHeaps: 2, Incomplete: incomplete})
		if err != nil {
			t.Fatal(err)
		}
		var got []gotHeap
		for i, b := range packets {
			a.Packet(b, int64(i))
			hs, _ := drain(t, c)
			got = append(got, hs...)
		}
		a.Flush()
		hs, _ := drain(t, c)
		got = append(got, hs...)
		var complete, incompleteSeen int
		for _, h := range got {
			switch {
			case h.has(ring.FlagComplete):
				checkPatternHeap(t, h, h.cnt, 1000, spead.Flavour64_40)
				if h.cnt%2 != 0 {
					t.Errorf("heap %d complete, but it lost a packet", h.cnt)
				}
				complete++
			case h.has(ring.FlagIncomplete):
				if h.cnt%2 != 1 {
					t.Errorf("heap %d incomplete", h.cnt)
				}
				incompleteSeen++
			}
		}
		wantIncomplete := 0
		if incomplete {
			wantIncomplete = nHeaps / 2
		}
		if complete != wantComplete || incompleteSeen != wantIncomplete {
			t.Errorf("incomplete=%v: %d complete, %d incomplete heaps; want %d, %d", incomplete, complete, incompleteSeen, wantComplete, wantIncomplete)
		}
		expectCounters(t, c.Stats(), map[ring.Counter]uint64{ring.CounterIncompleteHeaps: nHeaps / 2,
			ring.CounterDroppedHeaps: 0, ring.CounterHeaps: uint64(len(got))})
		p.Close()
		c.Close()
	}
}

// noLengthPacket is a SPEAD-64-40 packet without HEAP_LENGTH.
func noLengthPacket(cnt, offset uint64, payload []byte, pointers ...uint64) []byte {
	ps := append([]uint64{speadtest.Imm40(1, cnt), speadtest.Imm40(3, offset), speadtest.Imm40(4, uint64(len(payload)))}, pointers...)
	return speadtest.RawPacket(3, 5, ps, payload)
}

func TestAssemblerNoHeapLength(t *testing.T) {
	data := make([]byte, 150)
	for i := range data {
		data[i] = byte(i)
	}
	packets := [][]byte{
		noLengthPacket(7, 100, data[100:], speadtest.Imm40(0x1001, 42)),
		noLengthPacket(7, 0, data[:100], speadtest.Addr40(0x1000, 0), speadtest.Addr40(0x1002, 120)),
		// Heap 8 has a hole: 0..50 and 100..150.
		noLengthPacket(8, 0, data[:50], speadtest.Addr40(0x1000, 0)),
		noLengthPacket(8, 100, data[100:]),
	}
	for _, incomplete := range []bool{false, true} {
		heaps, stats, _ := assembleAll(t, ring.Config{}, assemble.AssemblerConfig{Incomplete: incomplete}, packets)
		want := 1
		if incomplete {
			want = 2
		}
		if len(heaps) != want {
			t.Fatalf("incomplete=%v: %d heaps", incomplete, len(heaps))
		}
		h := heaps[0]
		if h.cnt != 7 || h.flags != ring.FlagComplete|ring.FlagNoHeapSize || h.heapSize != 150 || h.received != 150 || h.packets != 2 {
			t.Fatalf("heap %+v", h)
		}
		// Items in wire order of their packets; 0x1000 runs to 0x1002's address, 0x1002 to the end.
		wantItems := []ring.Item{
			{ID: 0x1001, Value: 42, Length: 5, Flags: ring.ItemImmediate},
			{ID: 0x1000, Value: 0, Length: 120},
			{ID: 0x1002, Value: 120, Length: 30},
		}
		if !slices.Equal(h.items, wantItems) {
			t.Fatalf("items %+v, want %+v", h.items, wantItems)
		}
		if !bytes.Equal(h.payload, data) {
			t.Fatal("payload differs")
		}
		if incomplete {
			h8 := heaps[1]
			if h8.cnt != 8 || h8.flags != ring.FlagIncomplete|ring.FlagNoHeapSize || h8.heapSize != 100 || h8.received != 100 {
				t.Fatalf("heap 8: %+v", h8)
			}
		}
		expectCounters(t, stats, map[ring.Counter]uint64{ring.CounterIncompleteHeaps: 1})
	}
}

// TestAssemblerTruncated: a heap longer than its slot whose bytes all arrived is TRUNCATED, never COMPLETE
// (spec §4.1: COMPLETE says every byte is in the slot); the item running past the slot is clipped and
// flagged CUT, the one starting past it left out (ITEMS_CUT).
func TestAssemblerTruncated(t *testing.T) {
	const slotSize = 1024
	heap := spead.Heap{Cnt: 4, Items: []spead.Item{
		{ID: 0x1000, Data: bytes.Repeat([]byte{0xAA}, 2048)},
		{ID: 0x1001, Data: bytes.Repeat([]byte{0xBB}, 952)},
		{ID: 0x1002, Immediate: true, Value: 99},
	}}
	packets := encodeHeaps(t, spead.Flavour64_40, testPacketSize, heap)[0]
	heaps, stats, _ := assembleAll(t, ring.Config{SlotSize: slotSize}, assemble.AssemblerConfig{}, packets)
	if len(heaps) != 1 {
		t.Fatalf("%d heaps", len(heaps))
	}
	h := heaps[0]
	if h.flags != ring.FlagTruncated|ring.FlagItemsCut || h.heapSize != 3000 || h.received != slotSize {
		t.Fatalf("heap: flags %#x size %d received %d", h.flags, h.heapSize, h.received)
	}
	// 0x1000 is clipped to the slot, 0x1001 starts past it and is left out (ITEMS_CUT says so).
	wantItems := []ring.Item{{ID: 0x1000, Value: 0, Length: slotSize, Flags: ring.ItemCut}, {ID: 0x1002, Value: 99, Length: 5, Flags: ring.ItemImmediate}}
	if !slices.Equal(h.items, wantItems) {
		t.Fatalf("items %+v", h.items)
	}
	if !bytes.Equal(h.data[0x1000], bytes.Repeat([]byte{0xAA}, slotSize)) {
		t.Fatal("payload differs")
	}
	expectCounters(t, stats, map[ring.Counter]uint64{ring.CounterTruncatedHeaps: 1, ring.CounterHeaps: 1,
		ring.CounterMalformedPackets: 0, ring.CounterBytes: 3000})
}

func TestAssemblerItemsOverflow(t *testing.T) {
	heap := spead.Heap{Cnt: 3}
	for i := range 6 {
		heap.Items = append(heap.Items, spead.Item{ID: 0x1000 + uint64(i), Data: []byte{byte(i), byte(i)}})
	}
	packets := encodeHeaps(t, spead.Flavour64_48, testPacketSize, heap)[0]
	heaps, _, _ := assembleAll(t, ring.Config{MaxItems: 4}, assemble.AssemblerConfig{}, packets)
	if len(heaps) != 1 {
		t.Fatalf("%d heaps", len(heaps))
	}
	h := heaps[0]
	if h.flags != ring.FlagComplete|ring.FlagItemsOverflow || len(h.items) != 4 {
		t.Fatalf("flags %#x, %d items", h.flags, len(h.items))
	}
	for i, it := range h.items {
		if it.ID != 0x1000+uint64(i) || it.Value != uint64(2*i) || it.Length != 2 {
			t.Errorf("item %d: %+v", i, it)
		}
	}
}

// TestAssemblerRingFullDrop fills a 2-slot ring nobody drains: every later heap is dropped and counted
// once, whatever its number of packets.
func TestAssemblerRingFullDrop(t *testing.T) {
	p, c := testRing(t, ring.Config{SlotCount: 2, SlotSize: 4096, Policy: ring.PolicyDrop})
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{MaxHeaps: 2})
	if err != nil {
		t.Fatal(err)
	}
	var packetsPerHeap int
	for cnt := uint64(1); cnt <= 6; cnt++ {
		hp := encodeHeaps(t, spead.Flavour64_40, testPacketSize, patternHeap(cnt, 1000))[0]
		packetsPerHeap = len(hp)
		for i, b := range hp {
			a.Packet(b, int64(i))
		}
	}
	a.Flush()
	heaps, _ := drain(t, c)
	if got := cnts(heaps); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("published %v", got)
	}
	expectCounters(t, c.Stats(), map[ring.Counter]uint64{ring.CounterDroppedHeaps: 4, ring.CounterHeaps: 2,
		ring.CounterPackets: uint64(2 * packetsPerHeap), ring.CounterDuplicatePackets: 0})
	// With the slots released, the next heap gets one.
	for i, b := range encodeHeaps(t, spead.Flavour64_40, testPacketSize, patternHeap(7, 1000))[0] {
		a.Packet(b, int64(i))
	}
	heaps, _ = drain(t, c)
	if len(heaps) != 1 {
		t.Fatalf("%d heaps after draining", len(heaps))
	}
	checkPatternHeap(t, heaps[0], 7, 1000, spead.Flavour64_40)
}

func TestAssemblerStreamStop(t *testing.T) {
	perHeap := encodeHeaps(t, spead.Flavour64_40, testPacketSize,
		patternHeap(1, 1000), patternHeap(2, 1000), patternHeap(3, 1000), spead.StreamStopHeap(4), patternHeap(5, 100))
	var packets [][]byte
	packets = append(packets, perHeap[0]...)
	packets = append(packets, perHeap[1][:2]...) // heap 2 and 3 still live at the stop
	packets = append(packets, perHeap[2][:1]...)
	packets = append(packets, perHeap[3]...)
	packets = append(packets, perHeap[4]...) // after the stop: ignored
	for _, incomplete := range []bool{false, true} {
		heaps, stats, a := assembleAll(t, ring.Config{}, assemble.AssemblerConfig{Incomplete: incomplete}, packets)
		select {
		case <-a.Done():
		default:
			t.Fatal("Done not closed")
		}
		want := []uint64{1}
		if incomplete {
			want = []uint64{1, 2, 3}
		}
		if got := cnts(heaps); !slices.Equal(got, want) {
			t.Fatalf("incomplete=%v: published %v, want %v", incomplete, got, want)
		}
		if a.PacketsAfterStop() != uint64(len(perHeap[4])) {
			t.Errorf("%d packets after stop, want %d", a.PacketsAfterStop(), len(perHeap[4]))
		}
		expectCounters(t, stats, map[ring.Counter]uint64{ring.CounterIncompleteHeaps: 2, ring.CounterEndOfStream: 1,
			ring.CounterPackets: uint64(len(perHeap[0]) + 3 + 1)})
	}
}

func TestAssemblerMalformedAndInconsistent(t *testing.T) {
	good := encodeHeaps(t, spead.Flavour64_40, testPacketSize, patternHeap(1, 1000))[0]
	packets := [][]byte{
		{0x53, 4},                       // short header
		append(bytes.Clone(good[0]), 0), // trailing byte
		good[0],
		// Same heap, another heap length.
		speadtest.RawPacket(3, 5, []uint64{speadtest.Imm40(1, 1), speadtest.Imm40(2, 2000), speadtest.Imm40(3, 1500), speadtest.Imm40(4, 4)}, []byte{1, 2, 3, 4}),
		// Same heap, other flavour.
		speadtest.RawPacket(2, 6, []uint64{1<<63 | 1<<48 | 1, 1<<63 | 2<<48 | 1000, 1<<63 | 3<<48 | 996, 1<<63 | 4<<48 | 4}, []byte{1, 2, 3, 4}),
	}
	packets = append(packets, good[1:]...)
	heaps, stats, a := assembleAll(t, ring.Config{}, assemble.AssemblerConfig{}, packets)
	if len(heaps) != 1 {
		t.Fatalf("%d heaps", len(heaps))
	}
	checkPatternHeap(t, heaps[0], 1, 1000, spead.Flavour64_40)
	expectCounters(t, stats, map[ring.Counter]uint64{ring.CounterMalformedPackets: 4})
	var want [spead.NumReasons]uint64
	want[spead.ReasonShortHeader], want[spead.ReasonSizeMismatch], want[spead.ReasonOther] = 1, 1, 2
	if got := a.MalformedByReason(); got != want {
		t.Errorf("by reason %v, want %v", got, want)
	}
}

func TestAssemblerDescriptors(t *testing.T) {
	d1 := spead.Descriptor{ID: 0x1000, Name: "volts", Description: "v", Format: []spead.FormatField{{Code: 'u', Bits: 16}}, Shape: []int64{4, -1}}
	d2 := spead.Descriptor{ID: 0x1001, Name: "amps", DType: "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)}"}
	h1, err := spead.DescriptorHeap(1, spead.Flavour64_40, d1, d2)
	if err != nil {
		t.Fatal(err)
	}
	d1b := d1
	d1b.Name = "volts2"
	h2, err := spead.DescriptorHeap(2, spead.Flavour64_40, d1b)
	if err != nil {
		t.Fatal(err)
	}
	p, c := testRing(t, ring.Config{SlotCount: 8, SlotSize: 4096})
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range speadtest.EncodeAll(t, spead.Flavour64_40, testPacketSize, &h1) {
		a.Packet(b, 0)
	}
	heaps, _ := drain(t, c)
	if len(heaps) != 1 || heaps[0].flags != ring.FlagComplete|ring.FlagHasDescriptors {
		t.Fatalf("heaps %+v", heaps)
	}
	ds, err := c.Descriptors()
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 2 || ds[0].Name != "volts" || !bytes.Equal(ds[0].Format, []byte{'u', 0, 0, 16}) ||
		!slices.Equal(ds[0].Shape, []int64{4, -1}) || ds[1].Name != "amps" || ds[1].DType != d2.DType ||
		!slices.Equal(ds[1].Shape, []int64{3}) {
		t.Fatalf("descriptors %+v", ds)
	}
	for _, b := range speadtest.EncodeAll(t, spead.Flavour64_40, testPacketSize, &h2) {
		a.Packet(b, 0)
	}
	drain(t, c)
	if ds, err = c.Descriptors(); err != nil || len(ds) != 2 || ds[0].Name != "volts2" || ds[1].Name != "amps" {
		t.Fatalf("after replacement: %+v %v", ds, err)
	}
}

func TestNewAssemblerRejectsWindowLargerThanRing(t *testing.T) {
	p, _ := testRing(t, ring.Config{SlotCount: 2, SlotSize: 64})
	if _, err := assemble.NewAssembler(p, assemble.AssemblerConfig{MaxHeaps: 3}); err == nil {
		t.Fatal("max heaps 3 accepted for a 2-slot ring")
	}
}

// TestAssemblerZeroAllocs checks the hot path (decode, assemble, publish) allocates nothing, for
// one-packet and multi-packet heaps.
func TestAssemblerZeroAllocs(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int
	}{{"1packet", 4096}, {"multipacket", 64 << 10}} {
		t.Run(tc.name, func(t *testing.T) {
			p, c := testRing(t, ring.Config{SlotCount: 16, SlotSize: tc.size + 4096, Policy: ring.PolicyDrop})
			a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{})
			if err != nil {
				t.Fatal(err)
			}
			h := patternHeap(1, tc.size)
			packets := speadtest.EncodeAll(t, spead.Flavour64_40, 8972, &h)
			if tc.size == 4096 && len(packets) != 1 || tc.size > 4096 && len(packets) < 2 {
				t.Fatalf("%d packets", len(packets))
			}
			cnt := uint64(1)
			allocs := testing.AllocsPerRun(200, func() {
				cnt++
				for _, b := range packets {
					setHeapCnt(b, cnt)
					a.Packet(b, 0)
				}
				ch, ok, err := c.TryNext()
				if !ok || err != nil || ch.Flags != ring.FlagComplete {
					panic("heap not published")
				}
				c.Release(ch)
			})
			if allocs != 0 {
				t.Fatalf("%v allocations per heap", allocs)
			}
		})
	}
}

// setHeapCnt rewrites the heap cnt of an encoder-made SPEAD-64-40 packet (its first item pointer).
func setHeapCnt(packet []byte, cnt uint64) {
	v := speadtest.Imm40(spead.HeapCntID, cnt)
	for i := range 8 {
		packet[8+i] = byte(v >> (56 - 8*i))
	}
}

// TestAssemblerHeavyReordering shuffles a heap of many packets, so its range set grows past its
// preallocated size, and reverses another.
func TestAssemblerHeavyReordering(t *testing.T) {
	shuffled := encodeHeaps(t, spead.Flavour64_40, testPacketSize, patternHeap(1, 60000))[0]
	rand.New(rand.NewPCG(3, 4)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	reversed := encodeHeaps(t, spead.Flavour64_40, testPacketSize, patternHeap(2, 60000))[0]
	slices.Reverse(reversed)
	heaps, stats, a := assembleAll(t, ring.Config{}, assemble.AssemblerConfig{}, append(shuffled, reversed...))
	if len(heaps) != 2 {
		t.Fatalf("%d heaps", len(heaps))
	}
	checkPatternHeap(t, heaps[0], 1, 60000, spead.Flavour64_40)
	checkPatternHeap(t, heaps[1], 2, 60000, spead.Flavour64_40)
	expectCounters(t, stats, map[ring.Counter]uint64{ring.CounterDuplicatePackets: 0, ring.CounterIncompleteHeaps: 0})
	if a.RangeOverflows() != 0 {
		t.Errorf("%d range overflows", a.RangeOverflows())
	}
}

// TestAssemblerRangeOverflow sends one-byte packets at every other offset: past 4096 disjoint ranges the
// heap's bookkeeping stops growing and further such packets are dropped and counted.
func TestAssemblerRangeOverflow(t *testing.T) {
	const ranges = 4096
	var packets [][]byte
	for i := range ranges + 3 {
		packets = append(packets, speadtest.RawPacket(3, 5, []uint64{speadtest.Imm40(1, 1), speadtest.Imm40(2, 3*ranges), speadtest.Imm40(3, uint64(2*i)), speadtest.Imm40(4, 1)}, []byte{1}))
	}
	packets = append(packets, speadtest.RawPacket(3, 5, []uint64{speadtest.Imm40(1, 1), speadtest.Imm40(2, 3*ranges), speadtest.Imm40(3, 1), speadtest.Imm40(4, 1)}, []byte{1})) // joins two ranges
	heaps, stats, a := assembleAll(t, ring.Config{SlotSize: 3 * ranges}, assemble.AssemblerConfig{Incomplete: true}, packets)
	if a.RangeOverflows() != 3 {
		t.Errorf("%d range overflows, want 3", a.RangeOverflows())
	}
	if len(heaps) != 1 || heaps[0].received != ranges+1 || !heaps[0].has(ring.FlagIncomplete) {
		t.Fatalf("heaps %+v", heaps)
	}
	expectCounters(t, stats, map[ring.Counter]uint64{ring.CounterPackets: ranges + 1})
}

// TestAssemblerTruncatedKeepsDescriptors: a 1 MiB heap cut to a 64 KiB slot, its item descriptors after
// the data (as send --descriptors and spead2 lay them out) and so past the slot, still gives the stream's
// descriptors to the ring's metadata area; the heap is TRUNCATED (not COMPLETE), HAS_DESCRIPTORS, its
// data item flagged CUT. Without the bytes kept beside the slot the metadata area stays empty.
func TestAssemblerTruncatedKeepsDescriptors(t *testing.T) {
	const slotSize = 64 << 10
	data := bytes.Repeat([]byte{0x5A}, 1<<20)
	dh, err := spead.DescriptorHeap(1, spead.Flavour64_48,
		spead.Descriptor{ID: 0x1000, Name: "samples", Description: "1 MiB of them", Flavour: spead.Flavour64_48,
			DType: "{'descr': '|u1', 'fortran_order': False, 'shape': (1048576,)}"},
		spead.Descriptor{ID: 0x1600, Name: "timestamp", Flavour: spead.Flavour64_48,
			Format: []spead.FormatField{{Code: 'u', Bits: 48}}})
	if err != nil {
		t.Fatal(err)
	}
	heap := spead.Heap{Cnt: 1, Items: append([]spead.Item{{ID: 0x1000, Data: data}, {ID: 0x1600, Immediate: true, Value: 7}}, dh.Items...)}
	packets := encodeHeaps(t, spead.Flavour64_48, 8972, heap)[0]
	p, c := testRing(t, ring.Config{SlotSize: slotSize, SlotCount: 8})
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range packets {
		a.Packet(b, int64(1000+i))
	}
	h, err := c.Next(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if h.Flags&ring.FlagComplete != 0 || h.Flags&ring.FlagTruncated == 0 || h.Flags&ring.FlagHasDescriptors == 0 || h.Complete() {
		t.Errorf("flags %#x: want TRUNCATED|HAS_DESCRIPTORS, never COMPLETE", h.Flags)
	}
	it, ok := h.Item(0x1000)
	if !ok || !it.Cut() || it.Length != slotSize {
		t.Errorf("item 0x1000 %+v: want cut to the slot", it)
	}
	if _, err := h.ItemData(it); !errors.Is(err, ring.ErrItemCut) {
		t.Errorf("ItemData of a cut item: %v, want ErrItemCut", err)
	}
	ds, err := c.Descriptors()
	if err != nil {
		t.Fatal(err)
	}
	names := map[uint64]string{}
	for _, d := range ds {
		names[d.ID] = d.Name
	}
	if names[0x1000] != "samples" || names[0x1600] != "timestamp" {
		t.Fatalf("descriptors in the metadata area: %v; want samples and timestamp", names)
	}
}

// TestAssemblerKeepGoingStreams: with KeepGoing a stream stop ends the stream, not the ring: its live heaps
// are published, then a STREAM_END marker carrying the stop heap's cnt, and the next stream may reuse every
// heap cnt (heap 1 again, right after it was published whole). Done stays open. A sender that restarts
// without a stop and repeats cnts is the same stream: a packet of a heap published whole within 100 ms is
// a late copy (duplicate_packets), later the cnt begins a new heap.
func TestAssemblerKeepGoingStreams(t *testing.T) {
	p, c := testRing(t, ring.Config{SlotSize: 4096, SlotCount: 64})
	ends := 0
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{KeepGoing: true, OnStreamEnd: func(cnt uint64, err error) {
		if err == nil && cnt == 3 {
			ends++
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	now := int64(1_000_000_000)
	feed := func(hs ...spead.Heap) {
		for _, ps := range encodeHeaps(t, spead.Flavour64_40, testPacketSize, hs...) {
			for _, b := range ps {
				a.Packet(b, now)
			}
		}
	}
	stream := []spead.Heap{patternHeap(1, 1000), patternHeap(2, 1000), spead.StreamStopHeap(3)}
	feed(stream...)
	feed(stream...) // the same cnts: a new stream's own
	feed(patternHeap(1, 1000))
	now += int64(50 * time.Millisecond)
	feed(patternHeap(1, 1000)) // 50 ms later, no stop between: a late copy
	now += int64(200 * time.Millisecond)
	feed(patternHeap(1, 1000)) // a restarted sender's heap 1
	select {
	case <-a.Done():
		t.Fatal("Done closed by a stream stop under KeepGoing")
	default:
	}
	var got []string
	for {
		h, err := c.Next(100 * time.Millisecond)
		if errors.Is(err, ring.ErrStreamEnd) {
			if !h.StreamEnd() || !errors.Is(err, ring.ErrEndOfStream) {
				t.Errorf("marker %+v (%v): want StreamEnd, matching ErrEndOfStream", h, err)
			}
			got = append(got, "end:"+strconv.FormatUint(h.HeapCnt, 10))
			continue
		}
		if errors.Is(err, ring.ErrTimeout) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.Complete() {
			t.Errorf("heap %d flags %#x", h.HeapCnt, h.Flags)
		}
		got = append(got, strconv.FormatUint(h.HeapCnt, 10))
		c.Release(h)
	}
	want := []string{"1", "2", "end:3", "1", "2", "end:3", "1", "1"}
	if !slices.Equal(got, want) || ends != 2 {
		t.Fatalf("read %v (%d stream ends logged), want %v", got, ends, want)
	}
	st := c.Stats()
	if st.Get(ring.CounterStreamsEnded) != 2 || st.Get(ring.CounterEndOfStream) != 0 || st.Get(ring.CounterDuplicatePackets) == 0 {
		t.Errorf("counters %v: want 2 streams ended, no end of stream, the late copy's packets duplicates", st.Map())
	}
}
