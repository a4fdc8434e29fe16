package spead_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/speadtest"
)

func TestDecodeValid(t *testing.T) {
	b := speadtest.ValidPacket()
	var p spead.Packet
	if err := spead.Decode(b, &p); err != nil {
		t.Fatal(err)
	}
	if p.Flavour != spead.Flavour64_40 || p.HeapCnt != 7 || !p.HasHeapLength || p.HeapLength != 10 ||
		p.PayloadOffset != 2 || p.PayloadLength() != 4 || !p.IsStreamStop() || p.Size != len(b) {
		t.Fatalf("decoded %+v", p)
	}
	if !bytes.Equal(p.Payload, []byte{1, 2, 3, 4}) || &p.Payload[0] != &b[len(b)-4] {
		t.Fatal("payload is not a view of the buffer's tail")
	}
	if p.Pointers.Len() != 6 {
		t.Fatalf("%d pointers", p.Pointers.Len())
	}
	want := spead.ItemPointer{ID: 0x1000, Immediate: false, Value: 0}
	if got := p.Pointers.At(4); got != want {
		t.Fatalf("pointer 4: %+v", got)
	}
	if got := p.Pointers.At(0); got != (spead.ItemPointer{ID: 1, Immediate: true, Value: 7}) {
		t.Fatalf("pointer 0: %+v", got)
	}
	// 64-48: the id field shrinks to 15 bits and values grow to 48.
	b48 := speadtest.RawPacket(2, 6, []uint64{1<<63 | 1<<48 | 1<<47, 1<<63 | 3<<48, 1<<63 | 4<<48, 0x7fff<<48 | 5}, nil)
	if err := spead.Decode(b48, &p); err != nil {
		t.Fatal(err)
	}
	if p.Flavour != spead.Flavour64_48 || p.HeapCnt != 1<<47 || p.HasHeapLength ||
		p.Pointers.At(3) != (spead.ItemPointer{ID: 0x7fff, Value: 5}) {
		t.Fatalf("64-48 decoded %+v, pointer 3 %+v", p, p.Pointers.At(3))
	}
}

func TestDecodeRejects(t *testing.T) {
	good := speadtest.ValidPacket()
	specials := func(drop uint64) []uint64 {
		var out []uint64
		for _, p := range []uint64{speadtest.Imm40(1, 7), speadtest.Imm40(2, 10), speadtest.Imm40(3, 2), speadtest.Imm40(4, 4)} {
			if p>>40&0x7fffff != drop {
				out = append(out, p)
			}
		}
		return out
	}
	cases := []struct {
		name string
		buf  []byte
		want error
	}{
		{"empty", nil, spead.ErrShortHeader},
		{"7 bytes", good[:7], spead.ErrShortHeader},
		{"bad magic", append([]byte{0x54}, good[1:]...), spead.ErrBadMagic},
		{"version 3", append([]byte{0x53, 3}, good[2:]...), spead.ErrBadVersion},
		{"SPEAD-64-32", append([]byte{0x53, 4, 4, 4}, good[4:]...), spead.ErrUnsupportedFlavour},
		{"SPEAD-64-56", append([]byte{0x53, 4, 1, 7}, good[4:]...), spead.ErrUnsupportedFlavour},
		{"SPEAD-32-24 widths", append([]byte{0x53, 4, 1, 3}, good[4:]...), spead.ErrUnsupportedFlavour},
		{"zero widths", append([]byte{0x53, 4, 0, 0}, good[4:]...), spead.ErrUnsupportedFlavour},
		{"pointers cut", good[:8+8*5], spead.ErrItemsPastEnd},
		{"65535 items", append(append([]byte{}, good[:6]...), append([]byte{0xff, 0xff}, good[8:]...)...), spead.ErrItemsPastEnd},
		{"no items", speadtest.RawPacket(3, 5, nil, nil), spead.ErrMissingHeapCnt},
		{"no heap cnt", speadtest.RawPacket(3, 5, specials(1), make([]byte, 4)), spead.ErrMissingHeapCnt},
		{"addressed heap cnt", speadtest.RawPacket(3, 5, append(specials(1), speadtest.Addr40(1, 7)), make([]byte, 4)), spead.ErrMissingHeapCnt},
		{"no payload offset", speadtest.RawPacket(3, 5, specials(3), make([]byte, 4)), spead.ErrMissingPayloadOffset},
		{"no payload length", speadtest.RawPacket(3, 5, specials(4), make([]byte, 4)), spead.ErrMissingPayloadLength},
		{"payload cut", good[:len(good)-1], spead.ErrPayloadPastEnd},
		{"huge payload length", speadtest.RawPacket(3, 5, []uint64{speadtest.Imm40(1, 1), speadtest.Imm40(3, 0), speadtest.Imm40(4, 1<<40-1)}, nil), spead.ErrPayloadPastEnd},
		{"past heap", speadtest.RawPacket(3, 5, []uint64{speadtest.Imm40(1, 1), speadtest.Imm40(2, 5), speadtest.Imm40(3, 2), speadtest.Imm40(4, 4)}, make([]byte, 4)), spead.ErrPayloadPastHeap},
		{"trailing byte", append(bytes.Clone(good), 0), spead.ErrSizeMismatch},
	}
	for _, c := range cases {
		var p spead.Packet
		err := spead.Decode(c.buf, &p)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
		if r := spead.ReasonOf(err); r == spead.ReasonNone || r == spead.ReasonOther {
			t.Errorf("%s: reason %v", c.name, r)
		}
	}
	// DecodePrefix accepts what follows the packet and says where the packet ends.
	var p spead.Packet
	if err := spead.DecodePrefix(append(bytes.Clone(good), 9, 9, 9), &p); err != nil || p.Size != len(good) {
		t.Errorf("DecodePrefix: size %d, err %v", p.Size, err)
	}
	// A packet with no payload is valid: spead2 accepts it, and the assembler decides what it means.
	if err := spead.Decode(speadtest.RawPacket(3, 5, []uint64{speadtest.Imm40(1, 1), speadtest.Imm40(3, 0), speadtest.Imm40(4, 0)}, nil), &p); err != nil {
		t.Errorf("empty payload: %v", err)
	}
}

func TestReasonStrings(t *testing.T) {
	seen := map[string]bool{}
	for r := spead.ReasonNone; r < spead.NumReasons; r++ {
		s := r.String()
		if s == "" || s == "unknown" || seen[s] {
			t.Errorf("reason %d: %q", r, s)
		}
		seen[s] = true
	}
	if spead.NumReasons.String() != "unknown" || spead.ReasonOf(errors.New("x")) != spead.ReasonOther {
		t.Error("out-of-range reason or foreign error")
	}
}

// randomHeap makes a heap of random immediate and addressed items.
func randomHeap(r *rand.Rand, f spead.Flavour) spead.Heap {
	h := spead.Heap{Cnt: r.Uint64N(f.MaxValue() + 1)}
	for i := range r.IntN(40) {
		it := spead.Item{ID: 0x1000 + uint64(i)}
		if r.IntN(3) == 0 {
			it.Immediate, it.Value = true, r.Uint64N(f.MaxValue()+1)
		} else {
			it.Data = make([]byte, r.IntN([]int{1, 10, 3000, 100000}[r.IntN(4)]))
			for j := range it.Data {
				it.Data[j] = byte(r.Uint32())
			}
		}
		h.Items = append(h.Items, it)
	}
	return h
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		f := []spead.Flavour{spead.Flavour64_40, spead.Flavour64_48}[trial%2]
		size := []int{56, 64, 100, 1472, 8972, 9000}[r.IntN(6)]
		h := randomHeap(r, f)
		packets := speadtest.EncodeAll(t, f, size, &h)
		for i, b := range packets {
			if len(b) > size {
				t.Fatalf("trial %d: packet %d is %d bytes > %d", trial, i, len(b), size)
			}
			var p spead.Packet
			if err := spead.Decode(b, &p); err != nil {
				t.Fatalf("trial %d packet %d: %v", trial, i, err)
			}
			if p.Flavour != f || p.HeapCnt != h.Cnt || len(p.Payload) == 0 {
				t.Fatalf("trial %d packet %d: %+v", trial, i, p)
			}
		}
		heaps, _ := reassemble(t, packets)
		got := heaps[h.Cnt].items
		var want []testItem
		for _, it := range h.Items {
			want = append(want, testItem{id: it.ID, immediate: it.Immediate, value: it.Value, data: it.Data})
		}
		if len(got) != len(want) {
			t.Fatalf("trial %d: %d items, want %d", trial, len(got), len(want))
		}
		for i := range got {
			g, w := got[i], want[i]
			if g.id != w.id || g.immediate != w.immediate || g.value != w.value || !bytes.Equal(g.data, w.data) {
				t.Fatalf("trial %d item %d: got %#x %v %d %d bytes, want %#x %v %d %d bytes",
					trial, i, g.id, g.immediate, g.value, len(g.data), w.id, w.immediate, w.value, len(w.data))
			}
		}
	}
}

func TestEncoderErrors(t *testing.T) {
	if _, err := spead.NewEncoder(32, 1500); !errors.Is(err, spead.ErrUnsupportedFlavour) {
		t.Errorf("flavour 32: %v", err)
	}
	if _, err := spead.NewEncoder(spead.Flavour64_40, 55); !errors.Is(err, spead.ErrPacketSizeTooSmall) {
		t.Errorf("55-byte packets: %v", err)
	}
	enc, err := spead.NewEncoder(spead.Flavour64_48, 1500)
	if err != nil {
		t.Fatal(err)
	}
	if enc.MaxPacketSize() != 1496 {
		t.Errorf("max packet size %d, want 1500 rounded down to 1496", enc.MaxPacketSize())
	}
	if _, err := enc.Next(make([]byte, 1500)); !errors.Is(err, spead.ErrNoHeap) {
		t.Errorf("Next before Reset: %v", err)
	}
	for _, h := range []spead.Heap{
		{Cnt: 1 << 48},
		{Items: []spead.Item{{ID: 1 << 15}}},
		{Items: []spead.Item{{ID: 1, Immediate: true, Value: 1 << 48}}},
	} {
		if err := enc.Reset(&h); !errors.Is(err, spead.ErrValueTooLarge) {
			t.Errorf("Reset(%+v): %v", h, err)
		}
	}
	h := spead.Heap{Items: []spead.Item{{ID: 0x1000, Data: make([]byte, 100)}}}
	if err := enc.Reset(&h); err != nil {
		t.Fatal(err)
	}
	if _, err := enc.Next(make([]byte, 100)); !errors.Is(err, spead.ErrBufferTooSmall) {
		t.Errorf("small buffer: %v", err)
	}
	if _, err := enc.Next(make([]byte, 1500)); err != nil {
		t.Fatal(err)
	}
	if _, err := enc.Next(make([]byte, 1500)); err == nil {
		t.Error("Next after the last packet: no error")
	}
}

func TestZeroAllocsPerPacket(t *testing.T) {
	payload := make([]byte, 1<<20)
	h := spead.Heap{Cnt: 1, Items: []spead.Item{{ID: 0x1000, Data: payload}, {ID: 0x1001, Immediate: true, Value: 5}}}
	enc, err := spead.NewEncoder(spead.Flavour64_40, 8972)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, enc.MaxPacketSize())
	var p spead.Packet
	var sum uint64
	allocs := testing.AllocsPerRun(200, func() {
		if !enc.More() {
			h.Cnt++
			if err := enc.Reset(&h); err != nil {
				t.Fatal(err)
			}
		}
		n, err := enc.Next(buf)
		if err != nil {
			t.Fatal(err)
		}
		if err := spead.Decode(buf[:n], &p); err != nil {
			t.Fatal(err)
		}
		for _, ip := range p.Pointers.All() {
			sum += ip.Value
		}
		err = spead.Decode(buf[:n-1], &p) // the rejection path must not allocate either
		sum += uint64(spead.ReasonOf(err))
	})
	if allocs != 0 {
		t.Errorf("%v allocations per encode+decode, want 0", allocs)
	}
}
