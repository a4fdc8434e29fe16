package spead

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// chunkHeap is one heap of the chunk test stream: its time index, axis value, and whether it is sent.
type chunkHeap struct {
	t, axis uint64
}

// chunkPayload is heap (t, axis)'s payload: bytes that differ for every heap and position.
func chunkPayload(h chunkHeap, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(h.t*7 + h.axis*131 + uint64(i) + 1)
	}
	return b
}

// Heaps shuffled within a chunk's worth, with gaps, duplicates, heaps too old for the window and heaps
// outside the axis, land at their positions: every chunk is handed over once, in order of id, with every
// byte of every heap that arrived at its place, nothing where none did, the presence map exact, and the
// too-old, rejected and duplicate heaps counted, never written.
func TestChunkPlacementExact(t *testing.T) {
	const heapsPerChunk, axes, heapBytes, chunks, step = 8, 2, 16, 8, 0x100
	cfg := ChunkConfig{HeapsPerChunk: heapsPerChunk, Step: step, AxisCount: axes, Window: 3, HeapBytes: heapBytes}
	var handed []*Chunk
	cp, err := newChunkPlacer(cfg, func() ([]byte, error) { return make([]byte, heapsPerChunk*axes*heapBytes), nil },
		func(c *Chunk) { handed = append(handed, c) })
	if err != nil {
		t.Fatal(err)
	}
	var stream []chunkHeap
	sent := map[chunkHeap]bool{}
	for ti := uint64(0); ti < heapsPerChunk*chunks; ti++ {
		for a := uint64(0); a < axes; a++ {
			h := chunkHeap{ti, a}
			if (ti*axes+a)%13 == 5 {
				continue // a gap
			}
			stream, sent[h] = append(stream, h), true
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i+heapsPerChunk <= len(stream); i += heapsPerChunk {
		rng.Shuffle(heapsPerChunk, func(j, k int) { stream[i+j], stream[i+k] = stream[i+k], stream[i+j] })
	}
	var wire []chunkHeap
	dups := 0
	for i, h := range stream {
		wire = append(wire, h)
		if i%11 == 10 {
			wire, dups = append(wire, h), dups+1
		}
		if i == len(stream)/2 {
			wire = append(wire, chunkHeap{0, 0}, chunkHeap{1, 1}) // chunk 0 left the window long ago
			wire = append(wire, chunkHeap{stream[i].t, axes})     // outside the axis
		}
	}
	for _, h := range wire {
		c, pos, region, err := cp.heapRegion(h.t*step+step/2, h.axis)
		if err != nil {
			continue
		}
		copy(region, chunkPayload(h, heapBytes))
		cp.heapDone(c, pos)
	}
	cp.flush()
	if cp.tooOld != 2 || cp.rejected != 1 || cp.duplicates != uint64(dups) {
		t.Errorf("too old %d, rejected %d, duplicates %d (want 2, 1, %d)", cp.tooOld, cp.rejected, cp.duplicates, dups)
	}
	if len(handed) != chunks {
		t.Fatalf("%d chunks handed over, want %d", len(handed), chunks)
	}
	for k, c := range handed {
		if c.ID != uint64(k) {
			t.Fatalf("chunk %d handed over as number %d", c.ID, k)
		}
		checkChunk(t, c, sent, heapsPerChunk, axes, heapBytes)
	}
}

// checkChunk checks every position of c against the heaps sent.
func checkChunk(t *testing.T, c *Chunk, sent map[chunkHeap]bool, heapsPerChunk, axes, heapBytes int) {
	t.Helper()
	for off := range heapsPerChunk {
		for a := range axes {
			h := chunkHeap{c.ID*uint64(heapsPerChunk) + uint64(off), uint64(a)}
			pos := off*axes + a
			got := c.Data[pos*heapBytes : (pos+1)*heapBytes]
			want := make([]byte, heapBytes)
			if sent[h] {
				want = chunkPayload(h, heapBytes)
			}
			if c.Present[pos] != sent[h] || string(got) != string(want) {
				t.Fatalf("chunk %d position %d (heap %v): present %v (sent %v), bytes %x, want %x", c.ID, pos, h,
					c.Present[pos], sent[h], got, want)
			}
		}
	}
}

// A heap far ahead moves the window past every open chunk: they are handed over, oldest first, whatever
// they hold; a chunk whose memory cannot be had rejects its heap; a configuration without positions is
// refused.
func TestChunkWindowJumpsAndLimits(t *testing.T) {
	var handed []uint64
	fail := false
	cp, err := newChunkPlacer(ChunkConfig{HeapsPerChunk: 4, Window: 2, HeapBytes: 8},
		func() ([]byte, error) {
			if fail {
				return nil, errors.New("no slot")
			}
			return make([]byte, 32), nil
		}, func(c *Chunk) { handed = append(handed, c.ID) })
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range []uint64{0, 5} { // chunks 0 and 1
		c, pos, _, err := cp.heapRegion(ti, 0)
		if err != nil {
			t.Fatal(err)
		}
		cp.heapDone(c, pos)
	}
	if _, _, _, err := cp.heapRegion(400, 0); err != nil { // chunk 100
		t.Fatal(err)
	}
	if len(handed) != 2 || handed[0] != 0 || handed[1] != 1 {
		t.Fatalf("handed over %v, want [0 1]", handed)
	}
	if _, _, _, err := cp.heapRegion(7, 0); !errors.Is(err, errHeapNotPlaced) || cp.tooOld != 1 {
		t.Errorf("a heap of chunk 1 after the jump: %v, too old %d", err, cp.tooOld)
	}
	fail = true
	if _, _, _, err := cp.heapRegion(404, 0); !errors.Is(err, errHeapNotPlaced) || cp.rejected != 1 {
		t.Errorf("no memory for chunk 101: %v, rejected %d", err, cp.rejected)
	}
	cp.flush()
	if len(handed) != 3 || handed[2] != 100 {
		t.Errorf("handed over %v after flush, want [0 1 100]", handed)
	}
	if _, err := newChunkPlacer(ChunkConfig{Window: 1, HeapBytes: 8}, nil, nil); err == nil {
		t.Error("0 heaps per chunk accepted")
	}
}
