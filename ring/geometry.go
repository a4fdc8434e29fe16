package ring

import (
	"encoding/binary"
	"fmt"
	"math/bits"
)

// Geometry is where everything lies in the data memory (spec §4).
type Geometry struct {
	SlotCount     uint64
	SlotSize      uint64
	MaxItems      uint32
	PageSize      uint32
	DataSize      uint64
	DescOffset    uint64
	ItemsOffset   uint64
	MetaOffset    uint64
	MetaSize      uint64
	PayloadOffset uint64
	PacketOffset  uint64
	PacketSize    uint64
}

func alignUp(v, a uint64) uint64 { return (v + a - 1) &^ (a - 1) }

// layoutGeometry places the regions of spec §3 one after another, each 4096-aligned.
func layoutGeometry(slotCount, slotSize uint64, maxItems uint32, metaSize, packetSize uint64, pageSize uint32) Geometry {
	g := Geometry{SlotCount: slotCount, SlotSize: slotSize, MaxItems: maxItems, PageSize: pageSize,
		MetaSize: metaSize, PacketSize: packetSize}
	off := uint64(0)
	g.DescOffset = off
	off = alignUp(off+slotCount*DescSize, RegionAlign)
	g.ItemsOffset = off
	off = alignUp(off+slotCount*uint64(maxItems)*ItemSize, RegionAlign)
	g.MetaOffset = off
	off = alignUp(off+metaSize, RegionAlign)
	g.PayloadOffset = off
	off = alignUp(off+slotCount*slotSize, RegionAlign)
	g.PacketOffset = off
	off = alignUp(off+packetSize, RegionAlign)
	g.DataSize = alignUp(off, uint64(pageSize))
	return g
}

type region struct {
	name      string
	off, size uint64
}

// Validate checks the geometry as spec §7.2 step 4 requires, before anything in the data file is touched:
// a corrupt header gives an error, never an out-of-bounds access.
func (g Geometry) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
	if g.SlotCount == 0 || g.SlotCount > MaxSlotCount || g.SlotCount&(g.SlotCount-1) != 0 {
		return bad("slot_count %d is not a power of two in 1..%d", g.SlotCount, MaxSlotCount)
	}
	if g.SlotSize == 0 || g.SlotSize%64 != 0 || g.SlotSize > 1<<40 {
		return bad("slot_size %d is not a non-zero multiple of 64", g.SlotSize)
	}
	if g.MaxItems == 0 || g.MaxItems > MaxItems {
		return bad("max_items %d not in 1..%d", g.MaxItems, MaxItems)
	}
	if g.PageSize < 4096 || g.PageSize&(g.PageSize-1) != 0 {
		return bad("page_size %d is not a power of two >= 4096", g.PageSize)
	}
	if g.DataSize%uint64(g.PageSize) != 0 {
		return bad("data_size %d is not a multiple of page_size %d", g.DataSize, g.PageSize)
	}
	if g.MetaSize < metaHeaderSize {
		return bad("meta_size %d < %d", g.MetaSize, metaHeaderSize)
	}
	mul := func(a, b uint64) (uint64, bool) {
		hi, lo := bits.Mul64(a, b)
		return lo, hi == 0
	}
	descBytes, ok1 := mul(g.SlotCount, DescSize)
	itemBytes, ok2 := mul(g.SlotCount, uint64(g.MaxItems)*ItemSize)
	payloadBytes, ok3 := mul(g.SlotCount, g.SlotSize)
	if !ok1 || !ok2 || !ok3 {
		return bad("region sizes overflow")
	}
	regions := []region{
		{"descriptors", g.DescOffset, descBytes},
		{"item tables", g.ItemsOffset, itemBytes},
		{"metadata", g.MetaOffset, g.MetaSize},
		{"payload", g.PayloadOffset, payloadBytes},
		{"packet area", g.PacketOffset, g.PacketSize},
	}
	for i, r := range regions {
		// A region of size 0 need only have its offset ≤ data_size (spec §9 step 5): a producer may leave
		// an empty packet area's offset at the unaligned end of the payload slots.
		if r.size != 0 && r.off%RegionAlign != 0 {
			return bad("%s offset %d is not %d-aligned", r.name, r.off, RegionAlign)
		}
		end := r.off + r.size
		if end < r.off || end > g.DataSize {
			return bad("%s [%d, +%d) runs past data_size %d", r.name, r.off, r.size, g.DataSize)
		}
		for _, o := range regions[:i] {
			if r.size != 0 && o.size != 0 && r.off < o.off+o.size && o.off < end {
				return bad("%s overlaps %s", r.name, o.name)
			}
		}
	}
	return nil
}

// header is the decoded constant part of the control memory.
type header struct {
	Major, Minor uint16
	CtlSize      uint32
	Policy       Policy
	SessionID    uint64
	ProducerPID  uint64
	StartNanos   uint64
	Features     uint64
	StatsCount   uint32
	MaxConsumers uint32
	Chunks       ChunkGeometry // zero unless Features has FeatureChunks
	Geometry
}

// parseHeader decodes and validates the control memory's header (spec §9 step 5) before anything else
// is mapped: a corrupt header gives an error, never an out-of-bounds access.
func parseHeader(ctl []byte) (header, error) {
	var h header
	le := binary.LittleEndian
	if len(ctl) < offTable {
		return h, fmt.Errorf("%w: control memory is %d bytes, want at least %d", ErrCorrupt, len(ctl), offTable)
	}
	if magic := le.Uint64(ctl[offMagic:]); magic != Magic {
		return h, fmt.Errorf("%w: bad magic %#x", ErrCorrupt, magic)
	}
	h.Major = le.Uint16(ctl[offMajor:])
	h.Minor = le.Uint16(ctl[offMinor:])
	if h.Major != MajorVersion {
		return h, &VersionError{Found: h.Major, Supported: MajorVersion}
	}
	if st := State(u32at(ctl, offState).Load()); st != StateReady && st != StateClosed {
		// INIT is never handed out; a minor never adds a state (spec §2.1, §8)
		return h, fmt.Errorf("%w: header state %d in memory handed out", ErrCorrupt, uint32(st))
	}
	h.CtlSize = le.Uint32(ctl[offCtlSize:])
	h.MaxConsumers = le.Uint32(ctl[offMaxConsumers:])
	if h.MaxConsumers < 1 || h.MaxConsumers > MaxConsumersLimit {
		return h, fmt.Errorf("%w: max_consumers %d not in 1..%d", ErrCorrupt, h.MaxConsumers, MaxConsumersLimit)
	}
	if want := CtlSizeFor(int(h.MaxConsumers)); int(h.CtlSize) != want || len(ctl) != want {
		return h, fmt.Errorf("%w: ctl_size %d (mapped %d), want %d for %d consumers", ErrCorrupt, h.CtlSize, len(ctl), want, h.MaxConsumers)
	}
	if d := le.Uint32(ctl[offDescSize:]); d != DescSize {
		return h, fmt.Errorf("%w: desc_size %d, want %d", ErrCorrupt, d, DescSize)
	}
	if s := le.Uint32(ctl[offItemSize:]); s != ItemSize {
		return h, fmt.Errorf("%w: item_size %d, want %d", ErrCorrupt, s, ItemSize)
	}
	h.Policy = Policy(le.Uint32(ctl[offPolicy:]))
	h.SessionID = le.Uint64(ctl[offSessionID:])
	h.ProducerPID = le.Uint64(ctl[offProducerPID:])
	h.StartNanos = le.Uint64(ctl[offProducerStart:])
	h.Features = le.Uint64(ctl[offFeatures:])
	h.StatsCount = le.Uint32(ctl[offStatsCount:])
	h.Geometry = Geometry{
		SlotCount:     le.Uint64(ctl[offSlotCount:]),
		SlotSize:      le.Uint64(ctl[offSlotSize:]),
		MaxItems:      le.Uint32(ctl[offMaxItems:]),
		PageSize:      le.Uint32(ctl[offPageSize:]),
		DataSize:      le.Uint64(ctl[offDataSize:]),
		DescOffset:    le.Uint64(ctl[offDescOffset:]),
		ItemsOffset:   le.Uint64(ctl[offItemsOffset:]),
		MetaOffset:    le.Uint64(ctl[offMetaOffset:]),
		MetaSize:      le.Uint64(ctl[offMetaSize:]),
		PayloadOffset: le.Uint64(ctl[offPayloadOffset:]),
		PacketOffset:  le.Uint64(ctl[offPacketOffset:]),
		PacketSize:    le.Uint64(ctl[offPacketSize:]),
	}
	if err := h.Geometry.Validate(); err != nil {
		return h, err
	}
	if h.Features&FeatureChunks != 0 {
		h.Chunks = readChunkGeometry(ctl)
		if err := h.Chunks.check(h.SlotSize); err != nil {
			return h, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
	}
	return h, nil
}
