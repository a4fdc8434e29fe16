package assemble_test

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/frame/frametest"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/assemble"
	"github.com/ibvbridge/ibvbridge/spead/speadtest"
)

// TestAssemblerCaptures assembles the four spead2 captures into a real ring, drained by a concurrent
// consumer, and checks what the consumer sees against spead2_recv's counts.
func TestAssemblerCaptures(t *testing.T) {
	for _, c := range frametest.Captures {
		t.Run(c.Name, func(t *testing.T) {
			packets := speadtest.CapturePayloads(t, c.Name)
			// The first heap carries the descriptors too: leave 64 KiB for them.
			p, cons := testRing(t, ring.Config{SlotCount: 8, SlotSize: c.HeapSize + 64<<10, MaxItems: 16, Policy: ring.PolicyBlock})
			a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{})
			if err != nil {
				t.Fatal(err)
			}
			var verifier *speadtest.Minstd
			if c.VerifyPayload {
				verifier = &speadtest.Minstd{X: 1}
			}
			next := uint64(1)
			var packetsInHeaps uint64
			d := startDrainer(cons, func(h ring.Heap) error {
				packetsInHeaps += uint64(h.Packets)
				if h.HeapCnt != next {
					return fmt.Errorf("heap cnt %d, want %d (in order: the capture is)", h.HeapCnt, next)
				}
				next++
				return checkCaptureHeap(h, c, verifier)
			})
			for i, b := range packets {
				a.Packet(b, int64(i))
			}
			select {
			case <-a.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the stream-stop packet did not close Done")
			}
			if err := <-d.done; err != nil {
				t.Fatal(err)
			}
			if got := d.heaps.Load(); got != uint64(c.DataHeaps) {
				t.Errorf("consumer read %d heaps, want %d", got, c.DataHeaps)
			}
			// spead2_recv: heaps N, incomplete 0, packets = frames (the stop packet included).
			expectCounters(t, cons.Stats(), map[ring.Counter]uint64{
				ring.CounterHeaps: uint64(c.DataHeaps), ring.CounterIncompleteHeaps: 0,
				ring.CounterPackets: uint64(c.Frames), ring.CounterMalformedPackets: 0,
				ring.CounterDuplicatePackets: 0, ring.CounterDroppedHeaps: 0, ring.CounterTruncatedHeaps: 0,
				ring.CounterEndOfStream: 1,
			})
			if packetsInHeaps != uint64(c.Frames-1) {
				t.Errorf("heaps were assembled from %d packets, want %d", packetsInHeaps, c.Frames-1)
			}
			descs, err := cons.Descriptors()
			if err != nil {
				t.Fatal(err)
			}
			if len(descs) != c.ItemsPerHeap {
				t.Fatalf("%d descriptors in the ring, want %d: %+v", len(descs), c.ItemsPerHeap, descs)
			}
			for i, ds := range descs {
				if ds.ID != 0x1000+uint64(i) || ds.Name != fmt.Sprintf("Test item %d", i) ||
					!strings.Contains(ds.DType, "'descr'") || !ds.ShapeKnown || len(ds.Shape) != 1 {
					t.Errorf("descriptor %d: %+v", i, ds)
				}
			}
			if n := a.MalformedByReason(); n != [spead.NumReasons]uint64{} {
				t.Errorf("malformed by reason: %v", n)
			}
		})
	}
}

// checkCaptureHeap checks a data heap of a capture: complete, the data items the sender made, the
// descriptors on the first heap only, and the payload rule of the verify capture.
func checkCaptureHeap(h ring.Heap, c frametest.Capture, verifier *speadtest.Minstd) error {
	if h.Flags&^ring.FlagHasDescriptors != ring.FlagComplete {
		return fmt.Errorf("flags %#x", h.Flags)
	}
	if (h.Flags&ring.FlagHasDescriptors != 0) != (h.HeapCnt == 1) {
		return fmt.Errorf("flags %#x: descriptors belong to the first heap only", h.Flags)
	}
	if h.HeapSize != h.Received || int(h.Packets) < c.PacketsMin || int(h.Packets) > c.PacketsMax {
		return fmt.Errorf("size %d, received %d, %d packets", h.HeapSize, h.Received, h.Packets)
	}
	var dataItems, descriptors int
	itemSize := uint64(c.HeapSize / c.ItemsPerHeap)
	for _, it := range h.Items {
		switch {
		case it.ID == spead.DescriptorID:
			descriptors++
		case it.ID == 0x1000+uint64(dataItems) && !it.Immediate() && it.Length == itemSize:
			if verifier != nil {
				b := h.ItemBytes(it)
				for i := 0; i+4 <= len(b); i += 4 {
					if got, want := binary.BigEndian.Uint32(b[i:]), verifier.Next(); got != want {
						return fmt.Errorf("item %#x word %d: %d, want %d", it.ID, i/4, got, want)
					}
				}
			}
			dataItems++
		default:
			return fmt.Errorf("unexpected item %+v", it)
		}
	}
	wantDescriptors := 0
	if h.HeapCnt == 1 {
		wantDescriptors = c.ItemsPerHeap
	}
	if dataItems != c.ItemsPerHeap || descriptors != wantDescriptors {
		return fmt.Errorf("%d data items, %d descriptors", dataItems, descriptors)
	}
	return nil
}
