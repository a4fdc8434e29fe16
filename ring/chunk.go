package ring

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"strconv"
	"time"
)

// ChunkGeometry is a chunk-mode ring's geometry (spec §13): each position is one chunk of Heaps × Axis
// heap positions of HeapSize bytes, heap (t, a) at byte (t × Axis + a) × HeapSize, followed in the slot by
// a presence map of one byte per position (1: that heap arrived complete). The zero value: no chunks.
type ChunkGeometry struct {
	Heaps    uint32 // heap positions along the time axis per chunk (≥ 1)
	Axis     uint32 // positions along the second axis (1 when there is none)
	HeapSize uint64 // bytes per heap position
	Step     uint64 // value of the time item per heap position
	TimeItem uint64 // the immediate item giving the time index
	AxisItem uint64 // the immediate item giving the axis index (0: none)
}

// Enabled reports whether g describes chunks at all.
func (g ChunkGeometry) Enabled() bool { return g.Heaps != 0 }

// Positions is heap positions per chunk: Heaps × Axis (never overflows: both are 32-bit).
func (g ChunkGeometry) Positions() uint64 { return uint64(g.Heaps) * uint64(g.Axis) }

// Bytes is a chunk's payload size, Positions × HeapSize (valid once SlotBytes reported ok).
func (g ChunkGeometry) Bytes() uint64 { return g.Positions() * g.HeapSize }

// SlotBytes is the slot size a chunk needs: payload, presence map, rounded up to 64. ok is false when the
// sum overflows (or exceeds the largest slot_size the spec allows).
func (g ChunkGeometry) SlotBytes() (uint64, bool) {
	hi, payload := bits.Mul64(g.Positions(), g.HeapSize)
	if hi != 0 {
		return 0, false
	}
	n, carry := bits.Add64(payload, g.Positions(), 0)
	if carry != 0 || n > maxSlotSize {
		return 0, false
	}
	return alignUp(n, 64), true
}

// maxSlotSize is the largest slot_size Geometry.Validate accepts.
const maxSlotSize = 1 << 40

// check validates g against a slot size: the consumer's check of a header (spec §13) and the producer's
// of its configuration.
func (g ChunkGeometry) check(slotSize uint64) error {
	if g.Heaps < 1 || g.Axis < 1 || g.HeapSize < 1 || g.Step < 1 {
		return fmt.Errorf("chunk geometry %d heaps × %d axis × %d bytes, step %d: each must be at least 1",
			g.Heaps, g.Axis, g.HeapSize, g.Step)
	}
	need, ok := g.SlotBytes()
	if !ok || need > slotSize {
		return fmt.Errorf("chunk of %d × %d positions of %d bytes and its presence map do not fit a slot of %d bytes",
			g.Heaps, g.Axis, g.HeapSize, slotSize)
	}
	return nil
}

// Presence is the presence map inside a chunk's slot payload (slot_size bytes).
func (g ChunkGeometry) Presence(slot []byte) []byte {
	b, n := g.Bytes(), g.Positions()
	return slot[b : b+n : b+n]
}

// setChunkDefaults fills a chunk configuration's defaults and derives the slot size from it (spec §13).
func (c *Config) setChunkDefaults() error {
	g := &c.Chunks
	if !g.Enabled() {
		if *g != (ChunkGeometry{}) {
			return fmt.Errorf("%w: chunk fields set without chunk heaps", ErrBadConfig)
		}
		return nil
	}
	if g.Axis == 0 {
		g.Axis = 1
	}
	if g.Step == 0 {
		g.Step = 1
	}
	if g.TimeItem == 0 {
		return fmt.Errorf("%w: chunks need a time item", ErrBadConfig)
	}
	need, ok := g.SlotBytes()
	if !ok {
		return fmt.Errorf("%w: a chunk of %d × %d heaps of %d bytes is too large", ErrBadConfig, g.Heaps, g.Axis, g.HeapSize)
	}
	switch {
	case c.SlotSize < 0:
		return fmt.Errorf("%w: slot size %d must be positive", ErrBadConfig, c.SlotSize)
	case c.SlotSize == 0:
		c.SlotSize = int(need)
	}
	if err := g.check(alignUp(uint64(c.SlotSize), 64)); err != nil {
		return fmt.Errorf("%w: %v", ErrBadConfig, err)
	}
	return nil
}

func (g ChunkGeometry) write(ctl []byte) {
	le := binary.LittleEndian
	le.PutUint32(ctl[offChunkHeaps:], g.Heaps)
	le.PutUint32(ctl[offChunkAxis:], g.Axis)
	le.PutUint64(ctl[offChunkHeapSize:], g.HeapSize)
	le.PutUint64(ctl[offChunkStep:], g.Step)
	le.PutUint64(ctl[offChunkTimeItem:], g.TimeItem)
	le.PutUint64(ctl[offChunkAxisItem:], g.AxisItem)
}

func readChunkGeometry(ctl []byte) ChunkGeometry {
	le := binary.LittleEndian
	return ChunkGeometry{
		Heaps: le.Uint32(ctl[offChunkHeaps:]), Axis: le.Uint32(ctl[offChunkAxis:]),
		HeapSize: le.Uint64(ctl[offChunkHeapSize:]), Step: le.Uint64(ctl[offChunkStep:]),
		TimeItem: le.Uint64(ctl[offChunkTimeItem:]), AxisItem: le.Uint64(ctl[offChunkAxisItem:]),
	}
}

// Chunks is the ring's chunk geometry (the zero value when it is not in chunk mode).
func (p *Producer) Chunks() ChunkGeometry { return p.cfg.Chunks }

// ChunkInfo is what the producer knows about a chunk when it publishes it; the presence map is already in
// the slot.
type ChunkInfo struct {
	ID          uint64 // time index / chunk heaps
	Received    uint64 // payload bytes that arrived
	Packets     uint32 // packets placed
	TimestampNs uint64 // the first packet's time
}

// PublishChunk publishes the chunk in s (spec §13): flags CHUNK and COMPLETE when every presence byte is
// 1, else INCOMPLETE; heap_size is chunk_bytes, no items. It counts chunks and incomplete_chunks. After
// PublishEndOfStream it publishes nothing and returns ErrStreamEnded (as Publish).
func (p *Producer) PublishChunk(s *Slot, c ChunkInfo) error {
	if p.ended {
		p.freeSlot(s.Index)
		return p.endedError("publish chunk " + strconv.FormatUint(c.ID, 10))
	}
	g := p.cfg.Chunks
	flags := FlagChunk | FlagComplete
	for _, b := range g.Presence(s.Payload) {
		if b != 1 {
			flags = FlagChunk | FlagIncomplete
			p.Add(CounterIncompleteChunks, 1)
			break
		}
	}
	s.ResetItems()
	p.Add(CounterChunks, 1)
	return p.Publish(s, HeapInfo{HeapCnt: c.ID, HeapSize: g.Bytes(), Received: min(c.Received, g.Bytes()),
		TimestampNs: c.TimestampNs, Flags: flags, Packets: c.Packets})
}

// Chunk is a chunk read from a chunk-mode ring (spec §13). Heap is its validated descriptor copy (release
// it with Consumer.Release(ch.Heap); check Consumer.Valid(ch.Heap) after reading, as for any heap). Data
// and Present view ring memory, read-only: Data holds heap position (t, a) at (t × Axis + a) × HeapSize;
// bytes of a position whose Present byte is not 1 are undefined. A chunk whose Flags has FlagComplete has
// every position present (spec §13.3): Present need not be read.
type Chunk struct {
	Heap            // the descriptor: Heap.HeapSize is the chunk's bytes, Heap.Received what arrived
	ID       uint64 // the chunk id: time index / Heaps
	Data     []byte // Heaps × Axis × HeapSize bytes
	Present  []byte // Heaps × Axis bytes, 1 = that heap arrived complete
	Heaps    uint32 // time positions
	Axis     uint32 // axis positions per time position
	HeapSize uint64 // bytes per heap position (shadows Heap.HeapSize)
}

// HeapData is heap position (t, a)'s bytes within the chunk.
func (ch *Chunk) HeapData(t, a uint32) []byte {
	off := (uint64(t)*uint64(ch.Axis) + uint64(a)) * ch.HeapSize
	return ch.Data[off : off+ch.HeapSize : off+ch.HeapSize]
}

// Chunks is the ring's chunk geometry, validated at attach; ok is false when the ring is not in chunk mode.
func (c *Consumer) Chunks() (ChunkGeometry, bool) { return c.hdr.Chunks, c.hdr.Chunks.Enabled() }

// ChunkOf views heap h (from Next or TryNext) as a chunk. The geometry is the one validated at attach;
// the descriptor's heap_size and received are checked against it (spec §13), so nothing outside the slot
// is ever viewed. ErrNotChunk: the ring is not in chunk mode or h is not a chunk (an end-of-stream marker).
func (c *Consumer) ChunkOf(h Heap) (Chunk, error) {
	g, ok := c.Chunks()
	if !ok || h.Flags&FlagChunk == 0 {
		return Chunk{}, fmt.Errorf("ring %s position %d: %w", c.name, h.Position, ErrNotChunk)
	}
	if h.HeapSize != g.Bytes() || h.Received > g.Bytes() {
		return Chunk{}, fmt.Errorf("%w: ring %s position %d: chunk heap_size %d, received %d, want %d",
			ErrCorrupt, c.name, h.Position, h.HeapSize, h.Received, g.Bytes())
	}
	slot := h.Payload[:cap(h.Payload)] // slot_size bytes: the attach check put chunk and presence inside
	return Chunk{Heap: h, ID: h.HeapCnt, Data: slot[:g.Bytes():g.Bytes()], Present: g.Presence(slot),
		Heaps: g.Heaps, Axis: g.Axis, HeapSize: g.HeapSize}, nil
}

// NextChunk is Next for a chunk-mode ring: it waits up to timeout (<0: forever) for the next chunk. Its
// errors are Next's (ErrEndOfStream after the last chunk), and ChunkOf's.
func (c *Consumer) NextChunk(timeout time.Duration) (Chunk, error) {
	h, err := c.Next(timeout)
	if err != nil {
		return Chunk{}, err
	}
	return c.ChunkOf(h)
}
