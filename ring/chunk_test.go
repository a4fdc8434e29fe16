package ring_test

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/ringtest"
)

func chunkConfig(t *testing.T) ring.Config {
	return ring.Config{Dir: t.TempDir(), HugePages: ring.HugePagesOff, SlotCount: 8,
		Chunks: ring.ChunkGeometry{Heaps: 4, Axis: 3, HeapSize: 100, Step: 8, TimeItem: 0x1600, AxisItem: 0x4101}}
}

// A chunk ring's slot size is derived from its geometry: 12 positions × 100 bytes + 12 presence bytes,
// rounded up to 64; the header carries the geometry and the CHUNKS feature.
func TestChunkRingSlotSizeDerivedAndHeaderWritten(t *testing.T) {
	cfg := chunkConfig(t)
	p := ringtest.New(t, "chunks", cfg)
	if got, want := p.SlotSize(), 1216; got != want { // 1212 rounded up to 64
		t.Fatalf("slot size %d, want %d", got, want)
	}
	c := ringtest.Attach(t, "chunks", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	g, ok := c.Chunks()
	if !ok || g != cfg.Chunks {
		t.Fatalf("consumer reads chunk geometry %+v (ok %v), producer made %+v", g, ok, cfg.Chunks)
	}
	ctl := ring.CtlForTest(p)
	if f := binary.LittleEndian.Uint64(ctl[0x90:]); f&ring.FeatureChunks == 0 {
		t.Fatalf("features %#x lack CHUNKS", f)
	}
}

// Geometries whose sizes overflow, or that do not fit the slot asked for, are refused before any memory.
func TestChunkConfigRefusesOverflowAndSmallSlots(t *testing.T) {
	for name, g := range map[string]ring.ChunkGeometry{
		"overflowing product": {Heaps: 1 << 31, Axis: 1 << 31, HeapSize: 1 << 40, TimeItem: 1},
		"no time item":        {Heaps: 1, HeapSize: 8},
		"no heap size":        {Heaps: 1, TimeItem: 1},
		"axis item, no heaps": {AxisItem: 5},
	} {
		cfg := chunkConfig(t)
		cfg.Chunks = g
		if _, err := ring.Create("bad", cfg); !errors.Is(err, ring.ErrBadConfig) {
			t.Errorf("%s: %v, want ErrBadConfig", name, err)
		}
	}
	cfg := chunkConfig(t)
	cfg.SlotSize = -1
	if _, err := ring.Create("negative", cfg); !errors.Is(err, ring.ErrBadConfig) {
		t.Errorf("slot size -1: %v, want ErrBadConfig", err)
	}
	cfg.SlotSize = 1150 // 1152 once rounded to 64: not even the payload fits
	if _, err := ring.Create("small", cfg); !errors.Is(err, ring.ErrBadConfig) {
		t.Errorf("slot of 1152 bytes for 1212: %v, want ErrBadConfig", err)
	}
}

// A published chunk reads back as a Chunk: id, geometry, the payload bytes at their positions and the
// presence map after them; a chunk with a missing position is INCOMPLETE and counted.
func TestChunkPublishedAndReadBack(t *testing.T) {
	cfg := chunkConfig(t)
	p := ringtest.New(t, "chunks", cfg)
	c := ringtest.Attach(t, "chunks", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	g := p.Chunks()
	for id := uint64(7); id <= 8; id++ {
		s, err := p.Acquire()
		if err != nil {
			t.Fatal(err)
		}
		pres := g.Presence(s.Payload)
		for i := range pres {
			pres[i] = 1
			for b := range g.HeapSize {
				s.Payload[uint64(i)*g.HeapSize+b] = byte(uint64(i) + id)
			}
		}
		if id == 8 {
			pres[5] = 0
		}
		p.PublishChunk(s, ring.ChunkInfo{ID: id, Received: 1200, Packets: 12, TimestampNs: 42})
	}
	for id := uint64(7); id <= 8; id++ {
		ch, err := c.NextChunk(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if ch.ID != id || ch.Heaps != 4 || ch.Axis != 3 || ch.HeapSize != 100 || len(ch.Data) != 1200 || len(ch.Present) != 12 ||
			ch.Packets != 12 || ch.Received != 1200 || ch.TimestampNs != 42 || ch.Flags&ring.FlagChunk == 0 {
			t.Fatalf("chunk %+v", ch)
		}
		wantFlag := ring.FlagComplete
		if id == 8 {
			wantFlag = ring.FlagIncomplete
		}
		if ch.Flags&(ring.FlagComplete|ring.FlagIncomplete) != wantFlag {
			t.Errorf("chunk %d flags %#x", id, ch.Flags)
		}
		for pos := range uint32(12) {
			want := byte(1)
			if id == 8 && pos == 5 {
				want = 0
			}
			if ch.Present[pos] != want {
				t.Errorf("chunk %d presence[%d] = %d", id, pos, ch.Present[pos])
			}
			hd := ch.HeapData(pos/3, pos%3)
			for _, b := range hd {
				if b != byte(uint64(pos)+id) {
					t.Fatalf("chunk %d position %d holds %d", id, pos, b)
				}
			}
		}
		if !c.Valid(ch.Heap) {
			t.Fatal("chunk not valid while held")
		}
		if err := c.Release(ch.Heap); err != nil {
			t.Fatal(err)
		}
	}
	st := p.Stats()
	if st.Get(ring.CounterChunks) != 2 || st.Get(ring.CounterIncompleteChunks) != 1 {
		t.Errorf("chunks %d, incomplete %d", st.Get(ring.CounterChunks), st.Get(ring.CounterIncompleteChunks))
	}
}

// A descriptor claiming a heap_size other than chunk_bytes, or received past it, is refused, not viewed;
// a plain ring has no chunks to give.
func TestChunkOfRefusesCorruptDescriptors(t *testing.T) {
	cfg := chunkConfig(t)
	p := ringtest.New(t, "chunks", cfg)
	c := ringtest.Attach(t, "chunks", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	for _, info := range []ring.HeapInfo{
		{HeapCnt: 1, HeapSize: 1300, Received: 10, Flags: ring.FlagChunk | ring.FlagComplete},
		{HeapCnt: 2, HeapSize: 1200, Received: 1210, Flags: ring.FlagChunk | ring.FlagComplete},
	} {
		s, _ := p.Acquire()
		p.Publish(s, info)
	}
	for range 2 {
		if _, err := c.NextChunk(time.Second); !errors.Is(err, ring.ErrCorrupt) {
			t.Errorf("corrupt chunk descriptor: %v, want ErrCorrupt", err)
		}
	}
	plain := testConfig(t)
	pp := ringtest.New(t, "plain", plain)
	pc := ringtest.Attach(t, "plain", ring.AttachOptions{Dir: plain.Dir, Timeout: time.Second})
	s, _ := pp.Acquire()
	pp.Publish(s, ring.HeapInfo{HeapCnt: 1, Flags: ring.FlagComplete})
	if _, err := pc.NextChunk(time.Second); !errors.Is(err, ring.ErrNotChunk) {
		t.Errorf("plain ring: %v, want ErrNotChunk", err)
	}
}

// A header whose chunk geometry does not fit its slot (a corrupt or hostile producer) is refused at attach.
func TestAttachRefusesChunkGeometryPastSlot(t *testing.T) {
	cfg := chunkConfig(t)
	p := ringtest.New(t, "chunks", cfg)
	binary.LittleEndian.PutUint64(ring.CtlForTest(p)[0xA8:], 1<<62) // chunk_heap_size
	if _, err := ring.Attach("chunks", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second}); !errors.Is(err, ring.ErrCorrupt) {
		t.Fatalf("attach: %v, want ErrCorrupt", err)
	}
}
