package verbs

import (
	"fmt"
	"unsafe"
)

// SlotAlign is the alignment of every receive slot: one cache line, so the
// NIC's DMA writes never share a line with a neighbouring slot and header
// parsing starts on a line boundary.
const SlotAlign = 64

// RegionLayout is how a packet area is carved into receive slots. Slot i is
// area[Start+i*Stride : Start+i*Stride+SlotSize].
type RegionLayout struct {
	Start    int // offset of slot 0 (aligns the first slot to SlotAlign)
	Stride   int // distance between slots: SlotSize rounded up to SlotAlign
	SlotSize int // bytes the NIC may write into a slot (MaxSize)
	Slots    int // number of receive work requests
}

// Offset returns slot i's offset within the area.
func (l RegionLayout) Offset(i int) int { return l.Start + i*l.Stride }

// Slot returns slot i of area.
func (l RegionLayout) Slot(area []byte, i int) []byte {
	off := l.Offset(i)
	return area[off : off+l.SlotSize : off+l.SlotSize]
}

// Span is the number of bytes of the area the layout uses.
func (l RegionLayout) Span() int {
	if l.Slots == 0 {
		return l.Start
	}
	return l.Offset(l.Slots-1) + l.SlotSize
}

// PlanRegion lays out BufferSize/MaxSize slots of MaxSize bytes (at least one)
// in the packet area that starts at address base and is length bytes long. It
// fails if the area cannot hold them, saying how many it can hold.
func PlanRegion(base uintptr, length, maxSize, bufferSize int) (RegionLayout, error) {
	if maxSize <= 0 {
		return RegionLayout{}, fmt.Errorf("ibverbs: max size %d must be positive", maxSize)
	}
	if bufferSize <= 0 {
		return RegionLayout{}, fmt.Errorf("ibverbs: buffer size %d must be positive", bufferSize)
	}
	if length < 0 {
		return RegionLayout{}, fmt.Errorf("ibverbs: packet area length %d is negative", length)
	}
	l := RegionLayout{
		Start:    int((SlotAlign - base%SlotAlign) % SlotAlign),
		Stride:   alignUp(maxSize, SlotAlign),
		SlotSize: maxSize,
		Slots:    max(1, bufferSize/maxSize),
	}
	fit := 0
	if usable := length - l.Start; usable >= maxSize {
		fit = (usable-maxSize)/l.Stride + 1
	}
	if fit < l.Slots {
		return RegionLayout{}, fmt.Errorf("ibverbs: packet area %s holds %d packets of %d bytes; buffer size %s needs %d",
			formatBytes(length), fit, maxSize, formatBytes(bufferSize), l.Slots)
	}
	return l, nil
}

// AreaSize is the packet area PlanRegion needs for BufferSize/MaxSize slots
// wherever the area starts: the slots plus the worst-case alignment of the
// first one. Size ring.Config.PacketArea with it. It is 0 for a bad size.
func AreaSize(maxSize, bufferSize int) int {
	if maxSize <= 0 || bufferSize <= 0 {
		return 0
	}
	slots := max(1, bufferSize/maxSize)
	return (SlotAlign - 1) + (slots-1)*alignUp(maxSize, SlotAlign) + maxSize
}

// PlanArea is PlanRegion for a slice.
func PlanArea(area []byte, maxSize, bufferSize int) (RegionLayout, error) {
	var base uintptr
	if len(area) > 0 {
		base = uintptr(unsafe.Pointer(unsafe.SliceData(area)))
	}
	return PlanRegion(base, len(area), maxSize, bufferSize)
}

func alignUp(n, a int) int { return (n + a - 1) / a * a }

// formatBytes writes exact binary multiples as "4 MiB", others in bytes, so
// error messages show the numbers the operator configured.
func formatBytes(n int) string {
	const kib, mib, gib = 1 << 10, 1 << 20, 1 << 30
	switch {
	case n != 0 && n%gib == 0:
		return fmt.Sprintf("%d GiB", n/gib)
	case n != 0 && n%mib == 0:
		return fmt.Sprintf("%d MiB", n/mib)
	case n != 0 && n%kib == 0:
		return fmt.Sprintf("%d KiB", n/kib)
	}
	return fmt.Sprintf("%d bytes", n)
}
