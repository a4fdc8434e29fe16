package assemble_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/assemble"
	"github.com/ibvbridge/ibvbridge/spead/speadtest"
)

// benchRing is a block-policy ring in /dev/shm with its consumer, for benchmarks that drain it inline.
//
// Draining inline, in the producer's goroutine, rather than in a concurrent consumer: on this class of
// machine (2 vCPUs) a consumer spinning in Next on the other vCPU halves the producer's copy bandwidth
// (the vCPUs may share a physical core), and one that sleeps between polls makes the producer wait for
// slots at the timer's resolution; either way the benchmark would measure the machine, not the
// assembler. The timer stops while the benchmark drains, so ns/op is the producer's cost alone;
// BenchmarkAssemble1PacketConcurrent shows the end-to-end figure with a spinning consumer goroutine.
func benchRing(b *testing.B, slotCount, slotSize int) (*ring.Producer, *ring.Consumer) {
	b.Helper()
	return testRing(b, ring.Config{Dir: shmDir(b), SlotCount: slotCount, SlotSize: slotSize, MaxItems: 8, Policy: ring.PolicyBlock})
}

// releaseAll releases every published heap.
func releaseAll(b *testing.B, c *ring.Consumer) {
	for {
		h, ok, err := c.TryNext()
		if err != nil {
			b.Fatal(err)
		}
		if !ok {
			return
		}
		c.Release(h)
	}
}

// BenchmarkAssemble1Packet is decode + assemble + publish of a one-packet heap (one address item and one
// immediate, as spead2_send makes them): ns/op is ns per packet and per heap.
func BenchmarkAssemble1Packet(b *testing.B) {
	for _, size := range []int{64, 4096} {
		b.Run(byteSize(size), func(b *testing.B) {
			packet := onePacketHeap(b, size)
			const slots = 1024
			p, c := benchRing(b, slots, size+64)
			a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{})
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				setHeapCnt(packet, uint64(i+1))
				a.Packet(packet, 0)
				if i%(slots/2) == slots/2-1 {
					b.StopTimer()
					releaseAll(b, c)
					b.StartTimer()
				}
			}
			b.StopTimer()
			if got := p.Stats().Get(ring.CounterHeaps); got != uint64(b.N) {
				b.Fatalf("%d heaps published, want %d", got, b.N)
			}
		})
	}
}

// BenchmarkAssemble1PacketConcurrent is BenchmarkAssemble1Packet with the consumer in its own goroutine
// (spinning in Next, then sleeping on the futex), as in production: it adds the cross-core hand-off.
func BenchmarkAssemble1PacketConcurrent(b *testing.B) {
	packet := onePacketHeap(b, 4096)
	p, c := benchRing(b, 1024, 4096+64)
	d := startDrainer(c, nil)
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(4096)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		setHeapCnt(packet, uint64(i+1))
		a.Packet(packet, 0)
	}
	b.StopTimer()
	if err := p.PublishEndOfStream(0, 5*time.Second); err != nil {
		b.Fatal(err)
	}
	if err := <-d.done; err != nil {
		b.Fatal(err)
	}
	if got := d.heaps.Load(); got != uint64(b.N) {
		b.Fatalf("consumer read %d heaps, want %d", got, b.N)
	}
}

func onePacketHeap(b *testing.B, size int) []byte {
	h := patternHeap(1, size)
	packets := speadtest.EncodeAll(b, spead.Flavour64_40, 8972, &h)
	if len(packets) != 1 {
		b.Fatalf("%d packets", len(packets))
	}
	return packets[0]
}

// largeHeapPackets is a 1 MiB heap cut into spead2_send --packet 8972 packets (8932 payload bytes in
// all but the first and last).
func largeHeapPackets(b *testing.B) (packets [][]byte, payloadSize int) {
	h := spead.Heap{Cnt: 1, Items: []spead.Item{{ID: 0x1000, Data: make([]byte, 1<<20)}}}
	packets = speadtest.EncodeAll(b, spead.Flavour64_40, 8972, &h)
	var p spead.Packet
	if err := spead.Decode(packets[1], &p); err != nil {
		b.Fatal(err)
	}
	return packets, len(p.Payload)
}

const largeBenchSlots = 16

// BenchmarkAssembleLargeHeap assembles 1 MiB heaps of 8972-byte packets; compare its MB/s with
// BenchmarkMemcpy, the bare copy of the same packets into the same kind of ring slots.
func BenchmarkAssembleLargeHeap(b *testing.B) {
	packets, _ := largeHeapPackets(b)
	p, c := benchRing(b, largeBenchSlots, 1<<20)
	a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(1 << 20)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		for _, pk := range packets {
			setHeapCnt(pk, uint64(i+1))
			a.Packet(pk, 0)
		}
		if i%(largeBenchSlots/2) == largeBenchSlots/2-1 {
			b.StopTimer()
			releaseAll(b, c)
			b.StartTimer()
		}
	}
	b.StopTimer()
	if got := p.Stats().Get(ring.CounterHeaps); got != uint64(b.N) {
		b.Fatalf("%d heaps published, want %d", got, b.N)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(packets)), "ns/packet")
}

// BenchmarkMemcpy copies the payloads of the same 1 MiB heap's packets into rotating ring slots, with
// nothing else: the ceiling for BenchmarkAssembleLargeHeap.
func BenchmarkMemcpy(b *testing.B) {
	packets, _ := largeHeapPackets(b)
	payloads := make([][]byte, len(packets))
	offsets := make([]int, len(packets))
	for i, pk := range packets {
		var p spead.Packet
		if err := spead.Decode(pk, &p); err != nil {
			b.Fatal(err)
		}
		payloads[i], offsets[i] = p.Payload, int(p.PayloadOffset)
	}
	p, _ := testRing(b, ring.Config{Dir: shmDir(b), SlotCount: largeBenchSlots, SlotSize: 1 << 20, Policy: ring.PolicyDrop})
	var slots [][]byte
	for {
		s, err := p.Acquire()
		if err != nil {
			break
		}
		slots = append(slots, s.Payload)
	}
	b.SetBytes(1 << 20)
	b.ResetTimer()
	for i := range b.N {
		dst := slots[i%len(slots)]
		for k, pl := range payloads {
			copy(dst[offsets[k]:], pl)
		}
	}
}

func byteSize(n int) string {
	if n >= 1024 && n%1024 == 0 {
		return strconv.Itoa(n/1024) + "KiB"
	}
	return strconv.Itoa(n) + "B"
}
