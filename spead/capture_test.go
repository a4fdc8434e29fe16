package spead_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/ibvbridge/ibvbridge/frame/frametest"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/speadtest"
)

// TestCaptures decodes every packet of the four spead2 captures and checks them against the counts
// spead2_recv reported.
func TestCaptures(t *testing.T) {
	for _, c := range frametest.Captures {
		t.Run(c.Name, func(t *testing.T) {
			packets := speadtest.CapturePayloads(t, c.Name)
			if len(packets) != c.Frames {
				t.Errorf("%d packets, want %d", len(packets), c.Frames)
			}
			heaps, order := reassemble(t, packets)
			if len(heaps) != c.DataHeaps+1 {
				t.Fatalf("%d distinct heap cnts, want %d data heaps + 1 stop heap", len(heaps), c.DataHeaps)
			}
			for i, cnt := range order {
				if cnt != uint64(i+1) {
					t.Fatalf("heap %d has cnt %d, want %d", i, cnt, i+1)
				}
			}
			stopCnt := uint64(c.DataHeaps + 1)
			stop := heaps[stopCnt]
			if !stop.stop || stop.packets != 1 || int(stop.flavour) != c.StopAddrBits {
				t.Errorf("stop heap %d: stop %v, %d packets, %v", stopCnt, stop.stop, stop.packets, stop.flavour)
			}
			for cnt := uint64(1); cnt <= uint64(c.DataHeaps); cnt++ {
				h := heaps[cnt]
				if h.stop || int(h.flavour) != c.DataAddrBits {
					t.Fatalf("heap %d: stop %v, flavour %v", cnt, h.stop, h.flavour)
				}
				if h.packets < c.PacketsMin || h.packets > c.PacketsMax {
					t.Errorf("heap %d: %d packets, want %d..%d", cnt, h.packets, c.PacketsMin, c.PacketsMax)
				}
				var dataItems, descriptors int
				for _, it := range h.items {
					switch {
					case it.id == spead.DescriptorID:
						descriptors++
					case it.id >= 0x1000 && it.id < 0x1000+uint64(c.ItemsPerHeap):
						if len(it.data) != c.HeapSize/c.ItemsPerHeap {
							t.Fatalf("heap %d item %#x: %d bytes", cnt, it.id, len(it.data))
						}
						dataItems++
					default:
						t.Fatalf("heap %d: unexpected item %#x", cnt, it.id)
					}
				}
				wantDescriptors := 0
				if cnt == 1 {
					wantDescriptors = c.ItemsPerHeap
				}
				if dataItems != c.ItemsPerHeap || descriptors != wantDescriptors {
					t.Errorf("heap %d: %d data items, %d descriptors", cnt, dataItems, descriptors)
				}
			}
		})
	}
}

// TestCaptureSmallOnePacketHeaps checks that small_4KiB_1pkt sends each heap as one packet whose payload is
// the 4096-byte item (plus, for heap 1 only, the item descriptor).
func TestCaptureSmallOnePacketHeaps(t *testing.T) {
	packets := speadtest.CapturePayloads(t, "small_4KiB_1pkt.pcap")
	for i, b := range packets[:len(packets)-1] {
		var p spead.Packet
		if err := spead.Decode(b, &p); err != nil {
			t.Fatal(err)
		}
		if p.HeapCnt != uint64(i+1) || p.PayloadOffset != 0 || p.HeapLength != uint64(len(p.Payload)) {
			t.Fatalf("packet %d: heap %d, offset %d, %d of %d bytes", i, p.HeapCnt, p.PayloadOffset, len(p.Payload), p.HeapLength)
		}
		want := 4096
		if i == 0 {
			desc := p.Pointers.At(5).Value // item 0x1000's address: the descriptor comes first
			want += int(desc)
		}
		if len(p.Payload) != want {
			t.Fatalf("packet %d: payload %d bytes, want %d", i, len(p.Payload), want)
		}
	}
}

// TestCaptureMultiItemsPayload checks multi_items_verify's payload rule and its item descriptors.
func TestCaptureMultiItemsPayload(t *testing.T) {
	packets := speadtest.CapturePayloads(t, "multi_items_verify_p1472.pcap")
	heaps, _ := reassemble(t, packets)
	var gen speadtest.Minstd
	gen.X = 1
	want := make([]byte, 16384)
	for cnt := uint64(1); cnt <= 200; cnt++ {
		var got [4][]byte
		for _, it := range heaps[cnt].items {
			if it.id >= 0x1000 && it.id < 0x1004 {
				got[it.id-0x1000] = it.data
			}
		}
		for i, data := range got {
			gen.Fill(want)
			if !bytes.Equal(data, want) {
				t.Fatalf("heap %d item %#x: got %s, want %s", cnt, 0x1000+i, hexPrefix(data), hexPrefix(want))
			}
		}
	}

	var n int
	for _, it := range heaps[1].items {
		if it.id != spead.DescriptorID {
			continue
		}
		d, err := spead.ParseDescriptor(it.data)
		if err != nil {
			t.Fatal(err)
		}
		wantD := spead.Descriptor{
			ID:          0x1000 + uint64(n),
			Name:        fmt.Sprintf("Test item %d", n),
			Description: "A test item with arbitrary value",
			DType:       "{'shape': (4096,), 'fortran_order': False, 'descr': '>u4'}",
			Flavour:     spead.Flavour64_40,
		}
		if fmt.Sprint(d) != fmt.Sprint(wantD) {
			t.Errorf("descriptor %d:\n got %+v\nwant %+v", n, d, wantD)
		}
		if shape, ok := d.NumpyShape(); !ok || len(shape) != 1 || shape[0] != 4096 {
			t.Errorf("descriptor %d: numpy shape %v %v", n, shape, ok)
		}
		// Re-encoding the parsed descriptor must give spead2's bytes back.
		re, err := spead.EncodeDescriptor(d, d.Flavour)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(re, it.data) {
			t.Errorf("descriptor %d re-encoded\n got %x\nwant %x", n, re, it.data)
		}
		n++
	}
	if n != 4 {
		t.Errorf("%d descriptors, want 4", n)
	}
}

// TestEncoderMatchesSpead2 re-encodes heaps of the captures and compares with spead2_send's packets byte
// for byte.
func TestEncoderMatchesSpead2(t *testing.T) {
	t.Run("multi_items heap 1 and stop", func(t *testing.T) {
		packets := speadtest.CapturePayloads(t, "multi_items_verify_p1472.pcap")
		var descs []spead.Descriptor
		for i := range 4 {
			descs = append(descs, spead.Descriptor{
				ID: 0x1000 + uint64(i), Name: fmt.Sprintf("Test item %d", i),
				Description: "A test item with arbitrary value",
				DType:       "{'shape': (4096,), 'fortran_order': False, 'descr': '>u4'}",
			})
		}
		h, err := spead.DescriptorHeap(1, spead.Flavour64_40, descs...)
		if err != nil {
			t.Fatal(err)
		}
		gen := speadtest.Minstd{X: 1}
		for i := range 4 {
			data := make([]byte, 16384)
			gen.Fill(data)
			h.Items = append(h.Items, spead.Item{ID: 0x1000 + uint64(i), Data: data})
		}
		got := speadtest.EncodeAll(t, spead.Flavour64_40, 1472, &h)
		comparePackets(t, got, packets[:len(got)])
		stop := spead.StreamStopHeap(201)
		comparePackets(t, speadtest.EncodeAll(t, spead.Flavour64_48, 1472, &stop), packets[len(packets)-1:])
	})
	t.Run("small heap 2 and stop", func(t *testing.T) {
		packets := speadtest.CapturePayloads(t, "small_4KiB_1pkt.pcap")
		h := spead.Heap{Cnt: 2, Items: []spead.Item{{ID: 0x1000, Data: make([]byte, 4096)}}}
		comparePackets(t, speadtest.EncodeAll(t, spead.Flavour64_40, 8972, &h), packets[1:2])
		stop := spead.StreamStopHeap(1991)
		comparePackets(t, speadtest.EncodeAll(t, spead.Flavour64_40, 8972, &stop), packets[len(packets)-1:])
	})
	t.Run("large_p8972 heap 2", func(t *testing.T) {
		packets := speadtest.CapturePayloads(t, "large_1MiB_p8972.pcap")
		h := spead.Heap{Cnt: 2, Items: []spead.Item{{ID: 0x1000, Data: make([]byte, 1<<20)}}}
		comparePackets(t, speadtest.EncodeAll(t, spead.Flavour64_40, 8972, &h), packets[118:236])
	})
}

func comparePackets(t testing.TB, got, want [][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d packets, want %d", len(got), len(want))
	}
	for i := range got {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("packet %d (%d vs %d bytes)\n got %s\nwant %s", i, len(got[i]), len(want[i]), hexPrefix(got[i]), hexPrefix(want[i]))
		}
	}
}
