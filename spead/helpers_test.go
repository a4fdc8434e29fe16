package spead_test

import (
	"cmp"
	"fmt"
	"slices"
	"testing"

	"github.com/ibvbridge/ibvbridge/spead"
)

// testHeap is a heap reassembled by the tests (the real assembler lives elsewhere): its payload and its
// items with spead2's length rule.
type testHeap struct {
	cnt     uint64
	flavour spead.Flavour
	payload []byte
	covered []bool
	packets int
	items   []testItem
	stop    bool
}

type testItem struct {
	id        uint64
	immediate bool
	value     uint64 // immediate value
	data      []byte // addressed value
}

// reassemble groups packets by heap cnt and places payloads by offset, failing on overlaps and holes.
func reassemble(t testing.TB, packets [][]byte) (map[uint64]*testHeap, []uint64) {
	t.Helper()
	heaps := map[uint64]*testHeap{}
	var order []uint64
	pointers := map[uint64][]spead.ItemPointer{}
	for i, b := range packets {
		var p spead.Packet
		if err := spead.Decode(b, &p); err != nil {
			t.Fatalf("packet %d: %v", i, err)
		}
		h := heaps[p.HeapCnt]
		if h == nil {
			if !p.HasHeapLength {
				t.Fatalf("packet %d: no heap length", i)
			}
			h = &testHeap{cnt: p.HeapCnt, flavour: p.Flavour, payload: make([]byte, p.HeapLength), covered: make([]bool, p.HeapLength)}
			heaps[p.HeapCnt] = h
			order = append(order, p.HeapCnt)
		}
		if p.Flavour != h.flavour {
			t.Fatalf("packet %d: flavour %v within a %v heap", i, p.Flavour, h.flavour)
		}
		h.packets++
		h.stop = h.stop || p.IsStreamStop()
		for j := range p.Payload {
			if h.covered[int(p.PayloadOffset)+j] {
				t.Fatalf("packet %d: heap %d byte %d received twice", i, p.HeapCnt, int(p.PayloadOffset)+j)
			}
			h.covered[int(p.PayloadOffset)+j] = true
		}
		copy(h.payload[p.PayloadOffset:], p.Payload)
		for _, ip := range p.Pointers.All() {
			if ip.Immediate && ip.ID >= spead.HeapCntID && ip.ID <= spead.PayloadLengthID {
				continue
			}
			pointers[p.HeapCnt] = append(pointers[p.HeapCnt], ip)
		}
	}
	for cnt, h := range heaps {
		if i := slices.Index(h.covered, false); i >= 0 {
			t.Fatalf("heap %d: byte %d never received", cnt, i)
		}
		h.items = itemsOf(h, pointers[cnt])
	}
	return heaps, order
}

// itemsOf applies the SPEAD length rule: an addressed item ends at the next addressed item in address
// order (ties in wire order), or at the heap end.
func itemsOf(h *testHeap, ptrs []spead.ItemPointer) []testItem {
	addressed := slices.DeleteFunc(slices.Clone(ptrs), func(ip spead.ItemPointer) bool { return ip.Immediate })
	slices.SortStableFunc(addressed, func(a, b spead.ItemPointer) int { return cmp.Compare(a.Value, b.Value) })
	var items []testItem
	for _, ip := range ptrs {
		if ip.ID == spead.NullID {
			continue
		}
		if ip.Immediate {
			items = append(items, testItem{id: ip.ID, immediate: true, value: ip.Value})
			continue
		}
		i := slices.Index(addressed, ip)
		end := uint64(len(h.payload))
		if i+1 < len(addressed) {
			end = addressed[i+1].Value
		}
		items = append(items, testItem{id: ip.ID, data: h.payload[ip.Value:end]})
	}
	return items
}

func hexPrefix(b []byte) string {
	if len(b) > 64 {
		return fmt.Sprintf("%x...", b[:64])
	}
	return fmt.Sprintf("%x", b)
}
