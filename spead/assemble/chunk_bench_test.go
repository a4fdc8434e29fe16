package assemble_test

import (
	"encoding/binary"
	"testing"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/assemble"
	"github.com/ibvbridge/ibvbridge/spead/speadtest"
)

// BenchmarkAssembleChunk1Packet is decode + place + assemble of a one-packet 1 KiB heap on a chunk-mode
// ring (chunks of 64 heaps, placed by the time item: the built-in placement), a chunk published every 64
// heaps: ns/op is ns per packet and per heap.
func BenchmarkAssembleChunk1Packet(b *testing.B) {
	const heapSize, heaps, slots, timeItem = 1024, 64, 64, 0x1600
	g := ring.ChunkGeometry{Heaps: heaps, Axis: 1, HeapSize: heapSize, Step: 1, TimeItem: timeItem}
	p, c := testRing(b, ring.Config{Dir: shmDir(b), SlotCount: slots, Chunks: g, Policy: ring.PolicyBlock})
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	h := spead.Heap{Cnt: 1, Items: []spead.Item{{ID: timeItem, Immediate: true}, {ID: 0x3000, Data: make([]byte, heapSize)}}}
	packet := speadtest.EncodeAll(b, spead.Flavour64_40, 8972, &h)[0]
	timeAt := -1 // the byte offset of the time item's pointer
	for off := 8; off+8 <= len(packet); off += 8 {
		if binary.BigEndian.Uint64(packet[off:]) == speadtest.Imm40(timeItem, 0) {
			timeAt = off
			break
		}
	}
	if timeAt < 0 {
		b.Fatal("no time item in the packet")
	}
	b.SetBytes(heapSize)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		setHeapCnt(packet, uint64(i+1))
		binary.BigEndian.PutUint64(packet[timeAt:], speadtest.Imm40(timeItem, uint64(i)))
		a.Packet(packet, 0)
		if i%(heaps*slots/2) == heaps*slots/2-1 {
			b.StopTimer()
			releaseAll(b, c)
			b.StartTimer()
		}
	}
	b.StopTimer()
	a.Flush()
	if got := p.Stats().Get(ring.CounterHeaps); got != uint64(b.N) {
		b.Fatalf("%d heaps placed, want %d", got, b.N)
	}
}
