// Package pattern owns the synthetic stream ibvbridge uses to prove a path end to end: a payload pattern
// every consumer (Go, C, Python) can verify byte for byte, the checksum that proves a consumer read every
// byte it was given, the heaps `send` generates (HeapGen, plain or patterned), and the check a consumer
// makes of a patterned heap (Verify). `send --pattern`, `consume --verify`, the benchmarks and the tests
// all use it.
package pattern

import (
	"encoding/binary"
	"fmt"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
)

// Item ids of a pattern heap: the payload as one address item, and the heap cnt as an immediate.
const (
	PayloadItemID = 0x1000
	CntItemID     = 0x1001
)

// PatternByte is byte i of the payload of heap cnt: (cnt*31 + i) mod 256.
func PatternByte(cnt uint64, i int) byte { return byte(cnt*31 + uint64(i)) }

// FillPattern writes the pattern of heap cnt into b.
func FillPattern(b []byte, cnt uint64) {
	start := byte(cnt * 31)
	for i := range b {
		b[i] = start + byte(i)
	}
}

// VerifyPattern returns the index of the first byte that differs from the pattern, or -1.
func VerifyPattern(b []byte, cnt uint64) int {
	start := byte(cnt * 31)
	for i, v := range b {
		if v != start+byte(i) {
			return i
		}
	}
	return -1
}

// Checksum is the wrapping sum of b read as little-endian uint64 words, the last one zero-padded.
// touchAhead is how far ahead Checksum touches a large buffer; touchSink keeps those loads.
const touchAhead = 4096

var touchSink byte

func Checksum(b []byte) uint64 {
	var s uint64
	n := len(b) &^ 7
	i := 0
	if n >= touchAhead+64 {
		// Large heaps: 64 bytes a step in four sums, and a load touchAhead bytes on as a prefetch (Go has
		// none): the hardware prefetcher stops at every 4 KiB page, and a slot the producer has just
		// written (the pool hands out the slot released last, still in cache) comes from the other core's
		// cache line by line — a latency-bound stream without it (65 → 127 µs per 1 MiB heap). As the C
		// tools' checksum does with __builtin_prefetch.
		var s0, s1, s2, s3 uint64
		var touch byte
		for ; i+64 <= n; i += 64 {
			if i+touchAhead < len(b) {
				touch ^= b[i+touchAhead]
			}
			w := b[i : i+64 : i+64]
			s0 += binary.LittleEndian.Uint64(w[0:]) + binary.LittleEndian.Uint64(w[32:])
			s1 += binary.LittleEndian.Uint64(w[8:]) + binary.LittleEndian.Uint64(w[40:])
			s2 += binary.LittleEndian.Uint64(w[16:]) + binary.LittleEndian.Uint64(w[48:])
			s3 += binary.LittleEndian.Uint64(w[24:]) + binary.LittleEndian.Uint64(w[56:])
		}
		touchSink = touch
		s = s0 + s1 + s2 + s3
	}
	for ; i < n; i += 8 {
		s += binary.LittleEndian.Uint64(b[i:])
	}
	if n < len(b) {
		var last [8]byte
		copy(last[:], b[n:])
		s += binary.LittleEndian.Uint64(last[:])
	}
	return s
}

// Publisher publishes pattern heaps of one size.
type Publisher struct {
	P    *ring.Producer
	Size int
	// Fill writes heap cnt's pattern into every heap, so consumers can verify each byte. Without it each
	// slot is written once, on first use, and keeps those bytes: a benchmark then measures the ring and
	// the consumer rather than the producer's pattern loop, and the checksum still proves every byte read.
	Fill       bool
	slotSum    []uint64
	slotFilled []bool
}

// Publish acquires a slot, writes heap cnt's pattern and publishes it; it returns the checksum of the
// payload as published. ring.ErrFull passes through (drop policy).
func (pb *Publisher) Publish(cnt uint64, nowNanos uint64) (uint64, error) {
	if pb.Size > pb.P.SlotSize() {
		return 0, fmt.Errorf("heap size %d > slot size %d", pb.Size, pb.P.SlotSize())
	}
	s, err := pb.P.Acquire()
	if err != nil {
		return 0, err
	}
	payload := s.Payload[:pb.Size]
	var sum uint64
	if pb.Fill {
		FillPattern(payload, cnt)
		sum = Checksum(payload)
	} else {
		if pb.slotSum == nil {
			n := pb.P.Geometry().SlotCount
			pb.slotSum, pb.slotFilled = make([]uint64, n), make([]bool, n)
		}
		if !pb.slotFilled[s.Index] {
			FillPattern(payload, uint64(s.Index))
			pb.slotSum[s.Index], pb.slotFilled[s.Index] = Checksum(payload), true
		}
		sum = pb.slotSum[s.Index]
	}
	s.AddItem(ring.Item{ID: PayloadItemID, Value: 0, Length: uint64(pb.Size)})
	s.AddItem(ring.Item{ID: CntItemID, Value: cnt, Length: 5, Flags: ring.ItemImmediate})
	pb.P.Publish(s, ring.HeapInfo{HeapCnt: cnt, HeapSize: uint64(pb.Size), Received: uint64(pb.Size),
		TimestampNs: nowNanos, Flags: ring.FlagComplete, Packets: 1})
	pb.P.Add(ring.CounterHeaps, 1)
	pb.P.Add(ring.CounterPackets, 1)
	pb.P.Add(ring.CounterBytes, uint64(pb.Size))
	return sum, nil
}

// Verify reports whether a complete heap of a patterned stream is intact: its payload — up to its item
// descriptors, which `send --descriptors` appends after the data — is heap cnt's pattern, and its cnt
// item, if it has one, carries the heap's cnt. An incomplete heap's holes hold unspecified bytes: check
// only complete ones.
func Verify(h *ring.Heap) bool {
	data := h.Payload
	for _, it := range h.Items {
		if it.ID == spead.DescriptorID && !it.Immediate() && it.Value < uint64(len(data)) {
			data = data[:it.Value]
		}
	}
	if VerifyPattern(data, h.HeapCnt) >= 0 {
		return false
	}
	if it, ok := h.Item(CntItemID); ok && (!it.Immediate() || it.Value != h.HeapCnt) {
		return false
	}
	return true
}
