package assemble_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/ringtest"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/assemble"
	"github.com/ibvbridge/ibvbridge/spead/speadtest"
)

// gotHeap is a heap as a consumer read it from the ring, copied out before release.
type gotHeap struct {
	cnt      uint64
	flags    uint32
	heapSize uint64
	received uint64
	packets  uint32
	payload  []byte // the first received bytes of the slot
	items    []ring.Item
	data     map[uint64][]byte // address items' bytes by id (the first item with that id)
}

func (h gotHeap) has(flag uint32) bool { return h.flags&flag != 0 }

func copyHeap(h ring.Heap) gotHeap {
	g := gotHeap{cnt: h.HeapCnt, flags: h.Flags, heapSize: h.HeapSize, received: h.Received, packets: h.Packets,
		payload: bytes.Clone(h.Payload), items: append([]ring.Item(nil), h.Items...), data: map[uint64][]byte{}}
	for _, it := range h.Items {
		if _, dup := g.data[it.ID]; !it.Immediate() && !dup {
			g.data[it.ID] = bytes.Clone(h.ItemBytes(it))
		}
	}
	return g
}

// testRing creates a ring in a fresh directory and attaches its consumer.
func testRing(t testing.TB, cfg ring.Config) (*ring.Producer, *ring.Consumer) {
	t.Helper()
	cfg.HugePages = ring.HugePagesOff
	return ringtest.Pair(t, "asm", cfg, ring.AttachOptions{Timeout: time.Second})
}

// shmDir is a temporary directory in /dev/shm when there is one, so that benchmarks write ring memory
// rather than a disk file's page cache.
func shmDir(tb testing.TB) string {
	tb.Helper()
	if fi, err := os.Stat("/dev/shm"); err != nil || !fi.IsDir() {
		return tb.TempDir()
	}
	d, err := os.MkdirTemp("/dev/shm", "spead-asm-test-")
	if err != nil {
		return tb.TempDir()
	}
	tb.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// drain reads every heap published so far, copying and releasing each; eos reports the end-of-stream
// marker.
func drain(t testing.TB, c *ring.Consumer) (heaps []gotHeap, eos bool) {
	t.Helper()
	for {
		h, ok, err := c.TryNext()
		if errors.Is(err, ring.ErrEndOfStream) {
			return heaps, true
		}
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return heaps, false
		}
		heaps = append(heaps, copyHeap(h))
		c.Release(h)
	}
}

// assembleAll feeds packets to a new assembler on a fresh ring (64 slots unless set), flushes, publishes the
// end-of-stream marker if no stop packet did, and returns what the consumer read.
func assembleAll(t testing.TB, rcfg ring.Config, acfg assemble.AssemblerConfig, packets [][]byte) ([]gotHeap, ring.Stats, *assemble.Assembler) {
	t.Helper()
	if rcfg.SlotCount == 0 {
		rcfg.SlotCount = 64
	}
	if rcfg.SlotSize == 0 {
		rcfg.SlotSize = 64 << 10
	}
	p, c := testRing(t, rcfg)
	a, err := assemble.NewAssembler(p, acfg)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range packets {
		a.Packet(b, int64(1000+i))
	}
	a.Flush()
	select {
	case <-a.Done():
	default:
		if err := p.PublishEndOfStream(0, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	heaps, eos := drain(t, c)
	if !eos {
		t.Fatal("no end-of-stream marker")
	}
	return heaps, c.Stats(), a
}

// encodeHeaps packetizes heaps with the encoder, heap by heap.
func encodeHeaps(t testing.TB, f spead.Flavour, packetSize int, heaps ...spead.Heap) [][][]byte {
	t.Helper()
	out := make([][][]byte, len(heaps))
	for i := range heaps {
		out[i] = speadtest.EncodeAll(t, f, packetSize, &heaps[i])
	}
	return out
}

// patternHeap is heap cnt with one address item 0x1000 of size bytes (byte i = cnt+i) and an immediate
// item 0x1001 = cnt.
func patternHeap(cnt uint64, size int) spead.Heap {
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(cnt + uint64(i))
	}
	return spead.Heap{Cnt: cnt, Items: []spead.Item{
		{ID: 0x1000, Data: data},
		{ID: 0x1001, Immediate: true, Value: cnt},
	}}
}

// checkPatternHeap checks a complete heap made by patternHeap.
func checkPatternHeap(t testing.TB, h gotHeap, cnt uint64, size int, f spead.Flavour) {
	t.Helper()
	if h.cnt != cnt || !h.has(ring.FlagComplete) || h.has(ring.FlagIncomplete) {
		t.Fatalf("heap %d (want %d): flags %#x", h.cnt, cnt, h.flags)
	}
	if h.heapSize != uint64(size) || h.received != uint64(size) {
		t.Fatalf("heap %d: size %d received %d, want %d", cnt, h.heapSize, h.received, size)
	}
	want := patternHeap(cnt, size)
	if !bytes.Equal(h.data[0x1000], want.Items[0].Data) {
		t.Fatalf("heap %d: item 0x1000 differs (%d bytes)", cnt, len(h.data[0x1000]))
	}
	it, ok := itemByID(h, 0x1001)
	if !ok || !it.Immediate() || it.Value != cnt || it.Length != uint64(f.ImmediateBytes()) {
		t.Fatalf("heap %d: immediate item %+v (found %v)", cnt, it, ok)
	}
	if len(h.items) != 2 {
		t.Fatalf("heap %d: %d items, want 2: %+v", cnt, len(h.items), h.items)
	}
}

func itemByID(h gotHeap, id uint64) (ring.Item, bool) {
	for _, it := range h.items {
		if it.ID == id {
			return it, true
		}
	}
	return ring.Item{}, false
}

// expectCounters compares the named ring counters.
func expectCounters(t testing.TB, s ring.Stats, want map[ring.Counter]uint64) {
	t.Helper()
	for c, v := range want {
		if s.Get(c) != v {
			t.Errorf("counter %s = %d, want %d (all: %v)", c, s.Get(c), v, s.Map())
		}
	}
}

// drainer is a consumer goroutine that hands every heap to fn and releases it, until end of stream.
type drainer struct {
	heaps atomic.Uint64
	done  chan error
}

func startDrainer(c *ring.Consumer, fn func(ring.Heap) error) *drainer {
	d := &drainer{done: make(chan error, 1)}
	go func() {
		var firstErr error
		for {
			h, err := c.Next(30 * time.Second)
			if errors.Is(err, ring.ErrEndOfStream) {
				d.done <- firstErr
				return
			}
			if err != nil {
				d.done <- errors.Join(firstErr, err)
				return
			}
			if fn != nil && firstErr == nil {
				if err := fn(h); err != nil {
					// Keep draining so that a blocked producer finishes and the test can report.
					firstErr = fmt.Errorf("heap %d: %w", h.HeapCnt, err)
				}
			}
			d.heaps.Add(1)
			c.Release(h)
		}
	}()
	return d
}
