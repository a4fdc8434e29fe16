package spead

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// FormatField is one entry of a SPEAD format: a type code ('u', 'i', 'f', 'c', 'b', ...) and a bit width.
type FormatField struct {
	Code byte
	Bits uint64
}

// Descriptor is a parsed item descriptor (item 0x5). When DType (a numpy header) is set, it supersedes
// Format and Shape, which senders then leave empty; NumpyShape extracts the shape from it.
type Descriptor struct {
	ID          uint64
	Name        string
	Description string
	Format      []FormatField
	// Shape lists the dimensions; -1 marks a variable-length dimension.
	Shape []int64
	DType string
	// Flavour is the flavour of the embedded packet; it sets the width of shape and format fields.
	Flavour Flavour
}

// shapeFieldSize and formatFieldSize are the widths spead2 uses (without PySPEAD bug compatibility): a
// flag or code byte followed by a heap-address-wide size, or by an id-wide bit count.
func shapeFieldSize(f Flavour) int  { return 1 + f.ImmediateBytes() }
func formatFieldSize(f Flavour) int { return 1 + pointerSize - f.ImmediateBytes() }

// shapeVariable is the flag bit of a shape field marking a variable dimension.
const shapeVariable = 0x01

// ParseDescriptor parses an item descriptor: the value of an item 0x5, which is an embedded SPEAD packet
// holding the whole descriptor heap. Bytes after that packet are ignored. It allocates; descriptors are rare.
func ParseDescriptor(b []byte) (Descriptor, error) {
	var p Packet
	if err := DecodePrefix(b, &p); err != nil {
		return Descriptor{}, fmt.Errorf("spead: item descriptor: %w", err)
	}
	heapLength := uint64(len(p.Payload))
	if p.PayloadOffset != 0 || (p.HasHeapLength && p.HeapLength != heapLength) {
		return Descriptor{}, fmt.Errorf("spead: item descriptor: payload %d bytes at offset %d of heap length %d: %w",
			heapLength, p.PayloadOffset, p.HeapLength, ErrDescriptorFragmented)
	}

	// Item lengths follow spead2: sort the pointers, addressed ones first by address (stable, so ties keep
	// wire order), and an addressed item ends where the next addressed item starts, or at the heap end.
	n := p.Pointers.Len()
	pointers := make([]ItemPointer, 0, n)
	for _, ip := range p.Pointers.All() {
		if ip.Immediate && ip.ID >= HeapCntID && ip.ID <= PayloadLengthID {
			continue
		}
		pointers = append(pointers, ip)
	}
	slices.SortStableFunc(pointers, func(a, b ItemPointer) int {
		if a.Immediate != b.Immediate {
			if a.Immediate {
				return 1
			}
			return -1
		}
		if a.Immediate {
			return 0
		}
		return cmp.Compare(a.Value, b.Value)
	})

	d := Descriptor{Flavour: p.Flavour}
	haveID := false
	for i, ip := range pointers {
		if ip.ID == NullID {
			continue
		}
		if ip.Immediate {
			if ip.ID == DescriptorIDID {
				d.ID, haveID = ip.Value, true
			}
			continue
		}
		end := heapLength
		if i+1 < len(pointers) && !pointers[i+1].Immediate {
			end = pointers[i+1].Value
		}
		if ip.Value > end || end > heapLength {
			return Descriptor{}, fmt.Errorf("spead: item descriptor: item %#x at %d..%d of %d: %w",
				ip.ID, ip.Value, end, heapLength, ErrDescriptorItemPastHeap)
		}
		value := p.Payload[ip.Value:end]
		var err error
		switch ip.ID {
		case DescriptorNameID:
			d.Name = string(value)
		case DescriptorDescriptionID:
			d.Description = string(value)
		case DescriptorDTypeID:
			d.DType = string(value)
		case DescriptorFormatID:
			d.Format, err = ParseFormat(value, p.Flavour)
		case DescriptorShapeID:
			d.Shape, err = parseShape(value, p.Flavour)
		}
		if err != nil {
			return Descriptor{}, fmt.Errorf("spead: item descriptor: item %#x: %w", ip.ID, err)
		}
	}
	// spead2 also drops descriptors whose id is 0: there is no item to describe.
	if !haveID || d.ID == 0 {
		return Descriptor{}, fmt.Errorf("spead: item descriptor %q: %w", d.Name, ErrDescriptorNoID)
	}
	return d, nil
}

// ParseFormat parses a descriptor's format field in its raw wire form for flavour f: per field a type-code
// byte and a bit count in the flavour's width (what the ring keeps). ErrDescriptorBadField: b is not a
// whole number of fields.
func ParseFormat(b []byte, f Flavour) ([]FormatField, error) {
	size := formatFieldSize(f)
	if len(b)%size != 0 {
		return nil, fmt.Errorf("format of %d bytes, fields of %d: %w", len(b), size, ErrDescriptorBadField)
	}
	if len(b) == 0 {
		return nil, nil
	}
	out := make([]FormatField, 0, len(b)/size)
	for i := 0; i < len(b); i += size {
		out = append(out, FormatField{Code: b[i], Bits: loadBE(b[i+1 : i+size])})
	}
	return out, nil
}

func parseShape(b []byte, f Flavour) ([]int64, error) {
	size := shapeFieldSize(f)
	if len(b)%size != 0 {
		return nil, fmt.Errorf("shape of %d bytes, fields of %d: %w", len(b), size, ErrDescriptorBadField)
	}
	if len(b) == 0 {
		return nil, nil
	}
	out := make([]int64, 0, len(b)/size)
	for i := 0; i < len(b); i += size {
		dim := int64(loadBE(b[i+1 : i+size])) // at most 48 bits: never negative
		if b[i]&shapeVariable != 0 {
			dim = -1
		}
		out = append(out, dim)
	}
	return out, nil
}

// loadBE reads a big-endian unsigned integer of up to 8 bytes.
func loadBE(b []byte) uint64 {
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}

func storeBE(b []byte, v uint64) {
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = byte(v)
		v >>= 8
	}
}

// FormatBytes is ff in its raw wire form for flavour f, the inverse of ParseFormat: per field a type-code
// byte and a bit count in the flavour's width. ErrValueTooLarge: a bit count does not fit that width.
func FormatBytes(ff []FormatField, f Flavour) ([]byte, error) {
	size := formatFieldSize(f)
	out := make([]byte, size*len(ff))
	for i, x := range ff {
		if x.Bits >= 1<<(8*uint(size-1)) {
			return nil, fmt.Errorf("format bits %d: %w", x.Bits, ErrValueTooLarge)
		}
		out[i*size] = x.Code
		storeBE(out[i*size+1:(i+1)*size], x.Bits)
	}
	return out, nil
}

// EncodeDescriptor encodes d as the embedded packet that is the value of an item 0x5, in flavour f, laid
// out as spead2 does: descriptor id immediate; name, description, format and shape addressed (even when
// empty); dtype addressed if set.
func EncodeDescriptor(d Descriptor, f Flavour) ([]byte, error) {
	if !f.Valid() {
		return nil, fmt.Errorf("spead: encode descriptor %q: %w", d.Name, ErrUnsupportedFlavour)
	}
	shapeSize := shapeFieldSize(f)
	format, err := FormatBytes(d.Format, f)
	if err != nil {
		return nil, fmt.Errorf("spead: encode descriptor %q: %w", d.Name, err)
	}
	shape := make([]byte, shapeSize*len(d.Shape))
	for i, dim := range d.Shape {
		field := shape[i*shapeSize : (i+1)*shapeSize]
		if dim < 0 {
			field[0] = shapeVariable
			continue
		}
		if uint64(dim) > f.MaxValue() {
			return nil, fmt.Errorf("spead: encode descriptor %q: dimension %d: %w", d.Name, dim, ErrValueTooLarge)
		}
		storeBE(field[1:], uint64(dim))
	}
	items := []Item{
		{ID: DescriptorIDID, Immediate: true, Value: d.ID},
		{ID: DescriptorNameID, Data: []byte(d.Name)},
		{ID: DescriptorDescriptionID, Data: []byte(d.Description)},
		{ID: DescriptorFormatID, Data: format},
		{ID: DescriptorShapeID, Data: shape},
	}
	if d.DType != "" {
		items = append(items, Item{ID: DescriptorDTypeID, Data: []byte(d.DType)})
	}
	// spead2 numbers the embedded heap 1 and sends it as one packet of unbounded size.
	heap := Heap{Cnt: 1, Items: items}
	payload := 0
	for _, it := range items {
		payload += len(it.Data)
	}
	size := prefixSize + (len(items)+2)*pointerSize + payload + 8
	enc, err := NewEncoder(f, size)
	if err != nil {
		return nil, err
	}
	if err := enc.Reset(&heap); err != nil {
		return nil, fmt.Errorf("spead: encode descriptor %q: %w", d.Name, err)
	}
	out := make([]byte, enc.MaxPacketSize())
	n, err := enc.Next(out)
	if err != nil {
		return nil, fmt.Errorf("spead: encode descriptor %q: %w", d.Name, err)
	}
	if enc.More() {
		return nil, fmt.Errorf("spead: encode descriptor %q: needs more than one packet", d.Name)
	}
	return out[:n:n], nil
}

// DescriptorHeap is a heap carrying one item 0x5 per descriptor, for a stream's first heap or a reissue.
func DescriptorHeap(cnt uint64, f Flavour, descriptors ...Descriptor) (Heap, error) {
	h := Heap{Cnt: cnt, Items: make([]Item, 0, len(descriptors))}
	for _, d := range descriptors {
		b, err := EncodeDescriptor(d, f)
		if err != nil {
			return Heap{}, err
		}
		h.Items = append(h.Items, Item{ID: DescriptorID, Data: b})
	}
	return h, nil
}

// NumpyShape extracts the shape tuple from DType, a numpy header such as
// "{'descr': '>u4', 'fortran_order': False, 'shape': (8, 2), }". ok is false if there is no DType or its
// shape cannot be read.
func (d *Descriptor) NumpyShape() (shape []int64, ok bool) {
	const key = "'shape':"
	i := strings.Index(d.DType, key)
	if i < 0 {
		return nil, false
	}
	rest := strings.TrimLeft(d.DType[i+len(key):], " ")
	if !strings.HasPrefix(rest, "(") {
		return nil, false
	}
	end := strings.IndexByte(rest, ')')
	if end < 0 {
		return nil, false
	}
	shape = []int64{}
	for _, part := range strings.Split(rest[1:end], ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		part = strings.TrimSuffix(part, "L") // Python 2 long literals
		dim, err := strconv.ParseInt(part, 10, 64)
		if err != nil || dim < 0 {
			return nil, false
		}
		shape = append(shape, dim)
	}
	return shape, true
}
