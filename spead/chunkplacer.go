package spead

import (
	"errors"
	"fmt"
)

// Chunk placement (issue 21), the start of a second placement beside streamPlacer: heaps are placed by an
// immediate item's value into large chunks, each with a presence map, as spead2's chunking stream does. It
// is not wired into the Assembler nor the ring layout yet: a chunk's memory and what happens to a chunk
// that leaves the window are the caller's (newChunk, ready), so the placement rules are tested alone.

// ChunkConfig says how heaps map into chunks.
type ChunkConfig struct {
	HeapsPerChunk int    // heap positions along the time axis of a chunk
	Step          uint64 // the time item's value divided by Step is the heap's time index (0: 1)
	AxisCount     int    // positions along the second axis (0 or 1: none)
	Window        int    // chunks open at once
	HeapBytes     int    // bytes of a heap position: a heap's payload lands at its position × HeapBytes
}

// Chunk is a chunk under assembly: its id (time index / HeapsPerChunk), its data and which heap
// positions arrived (position = time offset × AxisCount + axis value).
type Chunk struct {
	ID      uint64
	Data    []byte
	Present []bool
	filled  int
}

// Complete reports whether every heap position of the chunk arrived.
func (c *Chunk) Complete() bool { return c.filled == len(c.Present) }

// chunkPlacer places heaps into the chunks of a window that moves forward: a heap whose chunk is older
// than the window is too old (counted, never written); one whose chunk lies past the window moves the
// window, handing the chunks it leaves to ready, complete or not.
type chunkPlacer struct {
	cfg      ChunkConfig
	newChunk func() ([]byte, error)
	ready    func(*Chunk)
	open     []*Chunk // by chunk id modulo Window; nil: not open
	base     uint64   // the oldest chunk id the window holds
	started  bool

	tooOld, rejected, duplicates uint64
}

func newChunkPlacer(cfg ChunkConfig, newChunk func() ([]byte, error), ready func(*Chunk)) (*chunkPlacer, error) {
	if cfg.Step == 0 {
		cfg.Step = 1
	}
	cfg.AxisCount = max(cfg.AxisCount, 1)
	if cfg.HeapsPerChunk < 1 || cfg.Window < 1 || cfg.HeapBytes < 1 {
		return nil, fmt.Errorf("spead: chunk placement: heaps per chunk %d, window %d, heap bytes %d: want each ≥ 1",
			cfg.HeapsPerChunk, cfg.Window, cfg.HeapBytes)
	}
	return &chunkPlacer{cfg: cfg, newChunk: newChunk, ready: ready, open: make([]*Chunk, cfg.Window)}, nil
}

// errHeapNotPlaced says a heap has no place: too old, outside the axes, or no memory for its chunk.
var errHeapNotPlaced = errors.New("spead: heap not placed")

// heapRegion is where the heap with time item value timeValue and axis value axis goes: its chunk, its
// position there, and the region of the chunk's data its payload fills.
func (cp *chunkPlacer) heapRegion(timeValue, axis uint64) (*Chunk, int, []byte, error) {
	if axis >= uint64(cp.cfg.AxisCount) {
		cp.rejected++
		return nil, 0, nil, errHeapNotPlaced
	}
	t := timeValue / cp.cfg.Step
	id, offset := t/uint64(cp.cfg.HeapsPerChunk), int(t%uint64(cp.cfg.HeapsPerChunk))
	if !cp.started {
		cp.base, cp.started = id, true
	}
	if id < cp.base {
		cp.tooOld++
		return nil, 0, nil, errHeapNotPlaced
	}
	if id >= cp.base+uint64(cp.cfg.Window) {
		cp.advance(id - uint64(cp.cfg.Window) + 1)
	}
	c, err := cp.chunk(id)
	if err != nil {
		cp.rejected++
		return nil, 0, nil, errHeapNotPlaced
	}
	pos := offset*cp.cfg.AxisCount + int(axis)
	start := pos * cp.cfg.HeapBytes
	return c, pos, c.Data[start : start+cp.cfg.HeapBytes : start+cp.cfg.HeapBytes], nil
}

// chunk returns the open chunk id, opening it if it is not.
func (cp *chunkPlacer) chunk(id uint64) (*Chunk, error) {
	i := id % uint64(len(cp.open))
	if c := cp.open[i]; c != nil {
		return c, nil
	}
	data, err := cp.newChunk()
	if err != nil {
		return nil, err
	}
	n := cp.cfg.HeapsPerChunk * cp.cfg.AxisCount
	if len(data) < n*cp.cfg.HeapBytes {
		return nil, fmt.Errorf("spead: chunk of %d bytes for %d heaps of %d", len(data), n, cp.cfg.HeapBytes)
	}
	c := &Chunk{ID: id, Data: data, Present: make([]bool, n)}
	cp.open[i] = c
	return c, nil
}

// heapDone marks position pos of c present (its heap arrived whole); a chunk that is then complete
// leaves the window at once if it is the oldest, as spead2 hands over chunks in order.
func (cp *chunkPlacer) heapDone(c *Chunk, pos int) {
	if c.Present[pos] {
		cp.duplicates++
		return
	}
	c.Present[pos] = true
	c.filled++
	for cp.started {
		i := cp.base % uint64(len(cp.open))
		if o := cp.open[i]; o == nil || !o.Complete() {
			return
		}
		cp.advance(cp.base + 1)
	}
}

// advance moves the window's oldest chunk id to base, handing every open chunk older than it to ready,
// oldest first. Open chunks lie below base + Window, so a jump further ahead hands over no more.
func (cp *chunkPlacer) advance(base uint64) {
	for end := min(base, cp.base+uint64(len(cp.open))); cp.base < end; cp.base++ {
		i := cp.base % uint64(len(cp.open))
		if c := cp.open[i]; c != nil {
			cp.open[i] = nil
			cp.ready(c)
		}
	}
	cp.base = max(cp.base, base)
}

// flush hands every open chunk to ready, oldest first.
func (cp *chunkPlacer) flush() {
	if cp.started {
		cp.advance(cp.base + uint64(len(cp.open)))
	}
}
