package relay

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/ringtest"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/transport"
)

// captureSender is a transport.HeapSender that keeps a copy of every heap it is given.
type captureSender struct {
	heaps   []spead.Heap
	flushes int
}

func (c *captureSender) SendHeap(_ context.Context, h *spead.Heap) error {
	cp := spead.Heap{Cnt: h.Cnt}
	for _, it := range h.Items {
		it.Data = bytes.Clone(it.Data)
		cp.Items = append(cp.Items, it)
	}
	c.heaps = append(c.heaps, cp)
	return nil
}
func (c *captureSender) Flush(context.Context) error  { c.flushes++; return nil }
func (c *captureSender) Totals() transport.SendTotals { return transport.SendTotals{} }
func (c *captureSender) Close() error                 { return nil }

// testRing is a small ring and its consumer, closed when the test ends.
func testRing(t *testing.T) (*ring.Producer, *ring.Consumer) {
	t.Helper()
	return ringtest.Pair(t, "relay", ring.Config{HugePages: ring.HugePagesOff}, ring.AttachOptions{Timeout: time.Second})
}

func publish(t *testing.T, p *ring.Producer, cnt uint64, payload []byte, flags uint32, items ...ring.Item) {
	t.Helper()
	s, err := p.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	copy(s.Payload, payload)
	for _, it := range items {
		s.AddItem(it)
	}
	p.Publish(s, ring.HeapInfo{HeapCnt: cnt, HeapSize: uint64(len(payload)), Received: uint64(len(payload)), Flags: flags, Packets: 1})
}

// Heaps go out with their items as the ring holds them — immediates as values, address items as their
// bytes — incomplete ones are skipped and counted, and the ring's end becomes a stream stop after the
// last cnt sent.
func TestRunRelaysHeaps(t *testing.T) {
	p, c := testRing(t)
	publish(t, p, 7, []byte("hello world!"), ring.FlagComplete,
		ring.Item{ID: 0x1000, Value: 0, Length: 5}, ring.Item{ID: 0x1001, Value: 42, Length: 5, Flags: ring.ItemImmediate},
		ring.Item{ID: 0x1002, Value: 6, Length: 6})
	publish(t, p, 8, []byte("partial"), ring.FlagIncomplete, ring.Item{ID: 0x1000, Value: 0, Length: 7})
	publish(t, p, 9, []byte("last"), ring.FlagComplete, ring.Item{ID: 0x1000, Value: 0, Length: 4})
	if err := p.PublishEndOfStream(0, time.Second); err != nil {
		t.Fatal(err)
	}
	var cs captureSender
	res, err := Run(context.Background(), c, &cs, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Heaps != 2 || res.SkippedIncomplete != 1 || !res.EndOfStream || res.LastHeapCnt != 9 || cs.flushes == 0 {
		t.Fatalf("result %+v, %d flushes", res, cs.flushes)
	}
	if len(cs.heaps) != 3 {
		t.Fatalf("%d heaps sent, want 2 and the stop", len(cs.heaps))
	}
	h := cs.heaps[0]
	if h.Cnt != 7 || len(h.Items) != 3 || string(h.Items[0].Data) != "hello" || !h.Items[1].Immediate ||
		h.Items[1].Value != 42 || string(h.Items[2].Data) != "world!" {
		t.Errorf("heap 7 sent as %+v", h)
	}
	stop := spead.StreamStopHeap(10)
	if got := cs.heaps[2]; got.Cnt != 10 || len(got.Items) != len(stop.Items) {
		t.Errorf("stop heap %+v, want cnt 10", got)
	}
}

// A cancelled relay on an idle ring returns at once, interrupted, and still ends the stream downstream.
func TestRunCancelled(t *testing.T) {
	_, c := testRing(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	var cs captureSender
	start := time.Now()
	res, err := Run(ctx, c, &cs, Config{})
	if err != nil || !res.Interrupted || len(cs.heaps) != 1 || cs.heaps[0].Cnt != 1 {
		t.Fatalf("res %+v, err %v, sent %d heaps", res, err, len(cs.heaps))
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v to stop", d)
	}
}

// A relay that attached after the heap carrying the stream's descriptors announces them from the ring's
// metadata in its first heap (and only there); a heap that carries descriptors itself gets none added.
func TestRunAnnouncesDescriptorsFromMetadata(t *testing.T) {
	p, c := testRing(t)
	want := []ring.ItemDescriptor{
		{ID: 0x2000, Name: "power", Description: "a spectrum", DType: "{'descr': '<f4', 'fortran_order': False, 'shape': (4,)}",
			Shape: []int64{4}, ShapeKnown: true},
		{ID: 0x2001, Name: "flags", Format: []byte{'u', 0, 0, 8}, Shape: []int64{-1}, ShapeKnown: true}, // 64-40 width
	}
	if err := p.SetDescriptors(want); err != nil {
		t.Fatal(err)
	}
	publish(t, p, 5, make([]byte, 16), ring.FlagComplete, ring.Item{ID: 0x2000, Value: 0, Length: 16})
	publish(t, p, 6, make([]byte, 16), ring.FlagComplete, ring.Item{ID: 0x2000, Value: 0, Length: 16})
	if err := p.PublishEndOfStream(0, time.Second); err != nil {
		t.Fatal(err)
	}
	var cs captureSender
	if _, err := Run(context.Background(), c, &cs, Config{Flavour: spead.Flavour64_48}); err != nil {
		t.Fatal(err)
	}
	first, second := cs.heaps[0], cs.heaps[1]
	var got []spead.Descriptor
	for _, it := range first.Items {
		if it.ID == spead.DescriptorID {
			d, err := spead.ParseDescriptor(it.Data)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, d)
		}
	}
	if len(got) != 2 || got[0].ID != 0x2000 || got[0].Name != "power" || got[0].DType != want[0].DType ||
		got[1].ID != 0x2001 || len(got[1].Format) != 1 || got[1].Format[0] != (spead.FormatField{Code: 'u', Bits: 8}) ||
		len(got[1].Shape) != 1 || got[1].Shape[0] != -1 {
		t.Fatalf("descriptors announced: %+v", got)
	}
	for _, it := range second.Items {
		if it.ID == spead.DescriptorID {
			t.Fatal("descriptors announced again in the second heap")
		}
	}
}
