package spead_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/speadtest"
)

func TestDescriptorRoundTrip(t *testing.T) {
	descs := []spead.Descriptor{
		{ID: 0x1000, Name: "timestamp", Description: "ADC sample count", Format: []spead.FormatField{{'u', 48}}},
		{ID: 0x1600, Name: "xeng_raw", Shape: []int64{4096, 40, 2}, Format: []spead.FormatField{{'i', 32}}},
		{ID: 0x7fff, Name: "variable", Shape: []int64{-1, 3, 0}, Format: []spead.FormatField{{'f', 32}, {'c', 8}}},
		{ID: 1, Name: "x", DType: "{'descr': '<c8', 'fortran_order': True, 'shape': (2, 3)}"},
		{ID: 2}, // everything empty: the encoder pads with a null item
	}
	for _, f := range []spead.Flavour{spead.Flavour64_40, spead.Flavour64_48} {
		for _, d := range descs {
			d.Flavour = f
			b, err := spead.EncodeDescriptor(d, f)
			if err != nil {
				t.Fatal(err)
			}
			got, err := spead.ParseDescriptor(b)
			if err != nil {
				t.Fatalf("%v %q: %v", f, d.Name, err)
			}
			if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", d) {
				t.Errorf("%v round trip\n got %+v\nwant %+v", f, got, d)
			}
		}
	}
}

func TestNumpyShape(t *testing.T) {
	cases := []struct {
		dtype string
		shape []int64
		ok    bool
	}{
		{"{'shape': (4096,), 'fortran_order': False, 'descr': '>u4'}", []int64{4096}, true},
		{"{'descr': '<c8', 'fortran_order': True, 'shape': (2, 3), }", []int64{2, 3}, true},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': ()}", []int64{}, true},
		{"{'descr': '<f4', 'shape': (10L, 2L)}", []int64{10, 2}, true},
		{"", nil, false},
		{"{'shape': [3]}", nil, false},
		{"{'shape': (3,", nil, false},
		{"{'shape': (-1,)}", nil, false},
	}
	for _, c := range cases {
		d := spead.Descriptor{DType: c.dtype}
		shape, ok := d.NumpyShape()
		if ok != c.ok || fmt.Sprint(shape) != fmt.Sprint(c.shape) {
			t.Errorf("%q: got %v %v, want %v %v", c.dtype, shape, ok, c.shape, c.ok)
		}
	}
}

func TestParseDescriptorRejects(t *testing.T) {
	// A descriptor heap of 3 bytes split: payload offset 1.
	fragmented := speadtest.RawPacket(3, 5, []uint64{speadtest.Imm40(1, 1), speadtest.Imm40(2, 3), speadtest.Imm40(3, 1), speadtest.Imm40(4, 2), speadtest.Imm40(0x14, 9)}, []byte{1, 2})
	noID := speadtest.RawPacket(3, 5, []uint64{speadtest.Imm40(1, 1), speadtest.Imm40(2, 1), speadtest.Imm40(3, 0), speadtest.Imm40(4, 1), speadtest.Addr40(0x10, 0)}, []byte{'x'})
	zeroID := speadtest.RawPacket(3, 5, []uint64{speadtest.Imm40(1, 1), speadtest.Imm40(3, 0), speadtest.Imm40(4, 0), speadtest.Imm40(0x14, 0)}, nil)
	pastHeap := speadtest.RawPacket(3, 5, []uint64{speadtest.Imm40(1, 1), speadtest.Imm40(3, 0), speadtest.Imm40(4, 1), speadtest.Imm40(0x14, 9), speadtest.Addr40(0x10, 5)}, []byte{'x'})
	badShape := speadtest.RawPacket(3, 5, []uint64{speadtest.Imm40(1, 1), speadtest.Imm40(3, 0), speadtest.Imm40(4, 5), speadtest.Imm40(0x14, 9), speadtest.Addr40(0x12, 0)}, make([]byte, 5))
	badFormat := speadtest.RawPacket(3, 5, []uint64{speadtest.Imm40(1, 1), speadtest.Imm40(3, 0), speadtest.Imm40(4, 5), speadtest.Imm40(0x14, 9), speadtest.Addr40(0x13, 0)}, make([]byte, 5))
	cases := []struct {
		name string
		b    []byte
		want error
	}{
		{"not spead", []byte("hello world"), spead.ErrBadMagic},
		{"fragmented", fragmented, spead.ErrDescriptorFragmented},
		{"no id", noID, spead.ErrDescriptorNoID},
		{"zero id", zeroID, spead.ErrDescriptorNoID},
		{"item past heap", pastHeap, spead.ErrDescriptorItemPastHeap},
		{"shape not whole fields", badShape, spead.ErrDescriptorBadField},
		{"format not whole fields", badFormat, spead.ErrDescriptorBadField},
	}
	for _, c := range cases {
		_, err := spead.ParseDescriptor(c.b)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
		if r := spead.ReasonOf(err); r == spead.ReasonNone || r == spead.ReasonOther {
			t.Errorf("%s: reason %v", c.name, r)
		}
	}
}

func TestEncodeDescriptorErrors(t *testing.T) {
	if _, err := spead.EncodeDescriptor(spead.Descriptor{ID: 1}, 16); !errors.Is(err, spead.ErrUnsupportedFlavour) {
		t.Errorf("flavour 16: %v", err)
	}
	if _, err := spead.EncodeDescriptor(spead.Descriptor{ID: 1, Shape: []int64{1 << 40}}, spead.Flavour64_40); !errors.Is(err, spead.ErrValueTooLarge) {
		t.Errorf("dimension 2^40: %v", err)
	}
	if _, err := spead.EncodeDescriptor(spead.Descriptor{ID: 1, Format: []spead.FormatField{{'u', 1 << 16}}}, spead.Flavour64_48); !errors.Is(err, spead.ErrValueTooLarge) {
		t.Errorf("format bits 2^16 in 64-48: %v", err)
	}
	if _, err := spead.EncodeDescriptor(spead.Descriptor{ID: 1 << 40}, spead.Flavour64_40); !errors.Is(err, spead.ErrValueTooLarge) {
		t.Errorf("id 2^40: %v", err)
	}
}
