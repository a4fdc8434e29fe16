package ring

import (
	"testing"
	"unsafe"
)

// The Go structs overlaid on the data file must match the spec's byte offsets exactly.
func TestStructsMatchLayout(t *testing.T) {
	var d descriptor
	var it Item
	checks := []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof descriptor", unsafe.Sizeof(d), DescSize},
		{"desc.seq", unsafe.Offsetof(d.Seq), descSeq},
		{"desc.heap_cnt", unsafe.Offsetof(d.HeapCnt), descHeapCnt},
		{"desc.heap_size", unsafe.Offsetof(d.HeapSize), descHeapSize},
		{"desc.received", unsafe.Offsetof(d.Received), descReceived},
		{"desc.timestamp_ns", unsafe.Offsetof(d.TimestampNs), descTimestamp},
		{"desc.slot", unsafe.Offsetof(d.Slot), descSlot},
		{"desc.flags", unsafe.Offsetof(d.Flags), descFlags},
		{"desc.item_count", unsafe.Offsetof(d.ItemCount), descItemCount},
		{"desc.packets", unsafe.Offsetof(d.Packets), descPackets},
		{"sizeof item", unsafe.Sizeof(it), ItemSize},
		{"item.id", unsafe.Offsetof(it.ID), itemID},
		{"item.value", unsafe.Offsetof(it.Value), itemValue},
		{"item.length", unsafe.Offsetof(it.Length), itemLength},
		{"item.flags", unsafe.Offsetof(it.Flags), itemFlags},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d, spec says %d", c.name, c.got, c.want)
		}
	}
}
