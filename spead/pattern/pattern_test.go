package pattern_test

import (
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

func TestFillVerifyChecksum(t *testing.T) {
	b := make([]byte, 1000)
	pattern.FillPattern(b, 7)
	if i := pattern.VerifyPattern(b, 7); i != -1 {
		t.Fatalf("fresh pattern differs at %d", i)
	}
	if b[10] != pattern.PatternByte(7, 10) {
		t.Errorf("byte 10 = %d, PatternByte says %d", b[10], pattern.PatternByte(7, 10))
	}
	sum := pattern.Checksum(b)
	b[999]++
	if pattern.VerifyPattern(b, 7) != 999 || pattern.Checksum(b) == sum {
		t.Error("a changed last byte went unnoticed")
	}
}

// Verify accepts an intact patterned heap and refuses one whose payload or cnt item is wrong.
func TestVerify(t *testing.T) {
	heap := func(cnt, itemCnt uint64, payload []byte) *ring.Heap {
		return &ring.Heap{HeapCnt: cnt, Payload: payload,
			Items: []ring.Item{{ID: pattern.PayloadItemID, Length: uint64(len(payload))},
				{ID: pattern.CntItemID, Value: itemCnt, Length: 5, Flags: ring.ItemImmediate}}}
	}
	p := make([]byte, 64)
	pattern.FillPattern(p, 3)
	if !pattern.Verify(heap(3, 3, p)) {
		t.Error("intact heap refused")
	}
	if pattern.Verify(heap(4, 4, p)) {
		t.Error("heap 3's payload accepted as heap 4's")
	}
	if pattern.Verify(heap(3, 9, p)) {
		t.Error("wrong cnt item accepted")
	}
}

// HeapGen's heaps encode to a stream whose payload is the pattern and whose cnt item is the heap's cnt;
// with descriptors, heap 1 carries them after the data items.
func TestHeapGen(t *testing.T) {
	g, err := pattern.NewHeapGen(spead.Flavour64_48, 3000, 3, true, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, cnt := range []uint64{1, 2} {
		h := g.Heap(cnt)
		if h.Cnt != cnt {
			t.Fatalf("cnt %d, want %d", h.Cnt, cnt)
		}
		var payload []byte
		var cntItem uint64
		descriptors := 0
		for _, it := range h.Items {
			switch {
			case it.ID == pattern.CntItemID:
				cntItem = it.Value
			case it.ID == spead.DescriptorID:
				descriptors++
			default:
				payload = append(payload, it.Data...)
			}
		}
		if len(payload) != 3000 || pattern.VerifyPattern(payload, cnt) != -1 || cntItem != cnt {
			t.Errorf("heap %d: %d payload bytes, pattern ok %v, cnt item %d", cnt, len(payload), pattern.VerifyPattern(payload, cnt) == -1, cntItem)
		}
		if want := map[uint64]int{1: 4, 2: 0}[cnt]; descriptors != want {
			t.Errorf("heap %d: %d descriptors, want %d", cnt, descriptors, want)
		}
		enc, err := spead.NewEncoder(spead.Flavour64_48, 1472)
		if err != nil {
			t.Fatal(err)
		}
		if err := enc.Reset(h); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1472)
		packets := 0
		for {
			if _, err := enc.Next(buf); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatal(err)
			}
			packets++
		}
		if packets < 3 {
			t.Errorf("heap %d: %d packets", cnt, packets)
		}
	}
	if _, err := pattern.NewHeapGen(spead.Flavour64_48, 2, 3, false, false); err == nil {
		t.Error("3 items in a 2-byte heap accepted")
	}
}

// With Options.Timestamp every heap carries immediate item 0x1600 = (cnt-1) × heap size, and heap 1's
// descriptors name it "timestamp" with a u<address bits> format.
func TestHeapGenTimestampItem(t *testing.T) {
	g, err := pattern.NewHeapGenOptions(spead.Flavour64_48, 100, 1, pattern.Options{Pattern: true, Descriptors: true, Timestamp: true})
	if err != nil {
		t.Fatal(err)
	}
	named := false
	for _, cnt := range []uint64{1, 2, 7} {
		h := g.Heap(cnt)
		var ts *spead.Item
		for i := range h.Items {
			it := &h.Items[i]
			if it.ID == pattern.TimestampItemID {
				ts = it
			}
			if it.ID == spead.DescriptorID {
				d, err := spead.ParseDescriptor(it.Data)
				if err != nil {
					t.Fatal(err)
				}
				if d.ID == pattern.TimestampItemID {
					named = d.Name == "timestamp" && len(d.Format) == 1 && d.Format[0] == spead.FormatField{Code: 'u', Bits: 48}
				}
			}
		}
		if ts == nil || !ts.Immediate || ts.Value != (cnt-1)*100 {
			t.Fatalf("heap %d: timestamp item %+v, want immediate %d", cnt, ts, (cnt-1)*100)
		}
	}
	if !named {
		t.Error("heap 1 has no descriptor naming 0x1600 \"timestamp\" with format u48")
	}
}

// TestChecksumUnrolledMatchesWordSum: the large-buffer path (four sums, a touch ahead) gives the plain
// little-endian word sum the C and Python tools compute, for lengths around its edges.
func TestChecksumUnrolledMatchesWordSum(t *testing.T) {
	b := make([]byte, 3*4096+200)
	for i := range b {
		b[i] = byte(i*131 + i>>8)
	}
	for _, n := range []int{0, 7, 8, 4096 + 63, 4096 + 64, 4096 + 65, 8192, 2*4096 + 71, len(b)} {
		var want uint64
		for i := 0; i < n; i += 8 {
			var w [8]byte
			copy(w[:], b[i:min(i+8, n)])
			want += binary.LittleEndian.Uint64(w[:])
		}
		if got := pattern.Checksum(b[:n]); got != want {
			t.Errorf("Checksum of %d bytes = %#x, want %#x", n, got, want)
		}
	}
}
