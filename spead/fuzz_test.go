package spead_test

import (
	"bytes"
	"testing"

	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/speadtest"
)

// Seeds from the captures live in testdata/fuzz; these are the hand-made malformed ones.
func addMalformedSeeds(f *testing.F) {
	good := speadtest.ValidPacket()
	f.Add(good)
	f.Add(good[:7])
	f.Add(good[:len(good)-1])
	f.Add(append(bytes.Clone(good), 0))
	f.Add(append([]byte{0x53, 4, 2, 6}, good[4:]...))
	f.Add(append([]byte{0x53, 4, 4, 4}, good[4:]...))
	f.Add(append(append([]byte{}, good[:6]...), append([]byte{0xff, 0xff}, good[8:]...)...))
	f.Add(speadtest.RawPacket(3, 5, []uint64{speadtest.Imm40(1, 1), speadtest.Imm40(3, 1<<40-1), speadtest.Imm40(4, 1<<40-1), speadtest.Imm40(2, 1<<40-1)}, nil))
	f.Add(speadtest.RawPacket(3, 5, []uint64{speadtest.Imm40(1, 1), speadtest.Imm40(3, 0), speadtest.Imm40(4, 2), speadtest.Imm40(0x14, 1), speadtest.Addr40(0x12, 1), speadtest.Addr40(0x13, 0)}, []byte{1, 2}))
}

func FuzzDecode(f *testing.F) {
	addMalformedSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		var p spead.Packet
		errPrefix := spead.DecodePrefix(data, &p)
		if errPrefix != nil {
			if r := spead.ReasonOf(errPrefix); r == spead.ReasonNone || r == spead.ReasonOther {
				t.Fatalf("error %v without a reason", errPrefix)
			}
		} else {
			checkPacket(t, data, &p)
		}
		errExact := spead.Decode(data, &p)
		switch {
		case errPrefix != nil && errExact != errPrefix:
			t.Fatalf("Decode %v, DecodePrefix %v", errExact, errPrefix)
		case errPrefix == nil && (errExact == nil) != (p.Size == len(data)):
			t.Fatalf("Decode %v for a %d-byte packet in %d bytes", errExact, p.Size, len(data))
		}
		if errExact == nil {
			checkPacket(t, data, &p)
		}
	})
}

// checkPacket checks the invariants of a successfully decoded packet.
func checkPacket(t *testing.T, data []byte, p *spead.Packet) {
	t.Helper()
	if !p.Flavour.Valid() {
		t.Fatalf("flavour %v", p.Flavour)
	}
	n := p.Pointers.Len()
	if p.Size != 8+8*n+len(p.Payload) || p.Size > len(data) {
		t.Fatalf("size %d with %d pointers and %d payload bytes in %d", p.Size, n, len(p.Payload), len(data))
	}
	if len(p.Payload) > 0 && &p.Payload[0] != &data[8+8*n] {
		t.Fatal("payload does not follow the pointers")
	}
	if p.HasHeapLength && p.PayloadOffset+uint64(len(p.Payload)) > p.HeapLength {
		t.Fatalf("payload %d+%d past heap length %d", p.PayloadOffset, len(p.Payload), p.HeapLength)
	}
	found := false
	for i, ip := range p.Pointers.All() {
		if ip.ID > p.Flavour.MaxID() || ip.Value > p.Flavour.MaxValue() || i >= n {
			t.Fatalf("pointer %d: %+v", i, ip)
		}
		found = found || (ip.Immediate && ip.ID == spead.HeapCntID)
	}
	if !found {
		t.Fatal("decoded without a heap cnt pointer")
	}
}

func FuzzParseDescriptor(f *testing.F) {
	addMalformedSeeds(f)
	f.Add(mustEncodeDescriptor(f, spead.Descriptor{ID: 0x1600, Name: "n", Shape: []int64{-1, 3}, Format: []spead.FormatField{{'u', 8}}}))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := spead.ParseDescriptor(data)
		if err != nil {
			if r := spead.ReasonOf(err); r == spead.ReasonNone || r == spead.ReasonOther {
				t.Fatalf("error %v without a reason", err)
			}
			return
		}
		if d.ID == 0 || !d.Flavour.Valid() {
			t.Fatalf("descriptor %+v", d)
		}
		for _, dim := range d.Shape {
			if dim < -1 {
				t.Fatalf("dimension %d", dim)
			}
		}
		// Whatever parsed must encode and parse back to the same thing.
		b, err := spead.EncodeDescriptor(d, d.Flavour)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", d, err)
		}
		d2, err := spead.ParseDescriptor(b)
		if err != nil {
			t.Fatalf("re-parse: %v", err)
		}
		if !equalDescriptors(d, d2) {
			t.Fatalf("round trip\n got %+v\nwant %+v", d2, d)
		}
	})
}

func equalDescriptors(a, b spead.Descriptor) bool {
	if a.ID != b.ID || a.Name != b.Name || a.Description != b.Description || a.DType != b.DType ||
		a.Flavour != b.Flavour || len(a.Shape) != len(b.Shape) || len(a.Format) != len(b.Format) {
		return false
	}
	for i := range a.Shape {
		if a.Shape[i] != b.Shape[i] {
			return false
		}
	}
	for i := range a.Format {
		if a.Format[i] != b.Format[i] {
			return false
		}
	}
	return true
}

func mustEncodeDescriptor(tb testing.TB, d spead.Descriptor) []byte {
	b, err := spead.EncodeDescriptor(d, spead.Flavour64_40)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
