package spead

import (
	"encoding/binary"
	"iter"
)

// ItemPointer is one decoded item pointer.
type ItemPointer struct {
	ID        uint64
	Immediate bool
	// Value is the immediate value when Immediate, else the item's byte offset in the heap payload.
	Value uint64
}

// ItemPointers is a view of a packet's item pointers inside the packet buffer (no copy). The zero value is
// empty.
type ItemPointers struct {
	raw     []byte
	flavour Flavour
}

// Len is the number of item pointers, including the special ones (heap cnt, payload offset, ...).
func (ps ItemPointers) Len() int { return len(ps.raw) / pointerSize }

// Raw is the big-endian 64-bit pointer i as sent.
func (ps ItemPointers) Raw(i int) uint64 {
	return binary.BigEndian.Uint64(ps.raw[i*pointerSize:])
}

// At decodes pointer i. It panics if i is out of range, like a slice index.
func (ps ItemPointers) At(i int) ItemPointer { return ps.flavour.SplitPointer(ps.Raw(i)) }

// All yields every pointer with its index, in wire order.
func (ps ItemPointers) All() iter.Seq2[int, ItemPointer] {
	return func(yield func(int, ItemPointer) bool) {
		for i := range ps.Len() {
			if !yield(i, ps.At(i)) {
				return
			}
		}
	}
}

// Packet is one decoded SPEAD packet. Pointers and Payload alias the buffer given to Decode.
type Packet struct {
	Flavour       Flavour
	HeapCnt       uint64
	HeapLength    uint64 // valid only if HasHeapLength
	HasHeapLength bool
	PayloadOffset uint64
	// StreamControl is the value of an immediate stream control item (0x6), valid only if HasStreamControl.
	StreamControl    uint64
	HasStreamControl bool
	// Pointers holds every item pointer of the packet, the special ones included.
	Pointers ItemPointers
	// Payload is the packet's slice of heap payload: len(Payload) is the payload length item's value.
	Payload []byte
	// Size is the number of bytes the packet occupies: header, pointers and payload.
	Size int
}

// PayloadLength is the value of the packet's payload length item.
func (p *Packet) PayloadLength() int { return len(p.Payload) }

// IsStreamStop reports whether the packet carries the stream control item with value "stream stop".
func (p *Packet) IsStreamStop() bool { return p.HasStreamControl && p.StreamControl == StreamStop }

// Decode decodes the SPEAD packet that fills buf exactly (one UDP payload). On error *p is unspecified and
// the error is one of this package's sentinels. It never allocates and never panics.
func Decode(buf []byte, p *Packet) error {
	if err := DecodePrefix(buf, p); err != nil {
		return err
	}
	if p.Size != len(buf) {
		// spead2's UDP readers discard such datagrams too: a length mismatch means a mangled packet.
		return ErrSizeMismatch
	}
	return nil
}

// DecodePrefix decodes the SPEAD packet at the start of buf, allowing bytes after it (packets back to back
// in memory, or an embedded descriptor packet); p.Size tells where the packet ends.
func DecodePrefix(buf []byte, p *Packet) error {
	pointersEnd, payloadLength, err := decodeHeader(buf, p)
	if err != nil {
		return err
	}
	// Values are at most 48 bits, so the comparison cannot overflow.
	if payloadLength > uint64(len(buf)-pointersEnd) {
		return ErrPayloadPastEnd
	}
	p.Size = pointersEnd + int(payloadLength)
	p.Payload = buf[pointersEnd:p.Size:p.Size]
	return nil
}

// DecodeSplit decodes a datagram read in two pieces: hdr holds exactly its header and item pointers,
// payload exactly its payload (a source that read the payload straight into place). It fails as Decode
// would on the joined bytes, with ErrSizeMismatch when hdr is not exactly the header.
func DecodeSplit(hdr, payload []byte, p *Packet) error {
	pointersEnd, payloadLength, err := decodeHeader(hdr, p)
	if err != nil {
		return err
	}
	if pointersEnd != len(hdr) || payloadLength != uint64(len(payload)) {
		return ErrSizeMismatch
	}
	p.Size = len(hdr) + len(payload)
	p.Payload = payload[:len(payload):len(payload)]
	return nil
}

// decodeHeader decodes the header and item pointers at the start of buf; it returns where the pointers
// end and the payload length item's value.
func decodeHeader(buf []byte, p *Packet) (pointersEnd int, payloadLength uint64, err error) {
	*p = Packet{}
	if len(buf) < headerSize {
		return 0, 0, ErrShortHeader
	}
	if buf[0] != magic {
		return 0, 0, ErrBadMagic
	}
	if buf[1] != version {
		return 0, 0, ErrBadVersion
	}
	// Byte 2 is the item pointer width minus the heap address width, byte 3 the heap address width, both
	// in bytes; only 64-bit item pointers with 40- or 48-bit addresses are supported.
	flavour := Flavour(buf[3] * 8)
	if int(buf[2])+int(buf[3]) != pointerSize || !flavour.Valid() {
		return 0, 0, ErrUnsupportedFlavour
	}
	nItems := int(binary.BigEndian.Uint16(buf[6:8]))
	pointersEnd = headerSize + nItems*pointerSize
	if pointersEnd > len(buf) {
		return 0, 0, ErrItemsPastEnd
	}
	p.Flavour = flavour
	p.Pointers = ItemPointers{raw: buf[headerSize:pointersEnd], flavour: flavour}

	var haveCnt, haveOffset, haveLength bool
	for i := range nItems {
		ip := p.Pointers.At(i)
		// Like spead2, special items count only in immediate form; an addressed one is an ordinary item.
		if !ip.Immediate {
			continue
		}
		switch ip.ID {
		case HeapCntID:
			p.HeapCnt, haveCnt = ip.Value, true
		case HeapLengthID:
			p.HeapLength, p.HasHeapLength = ip.Value, true
		case PayloadOffsetID:
			p.PayloadOffset, haveOffset = ip.Value, true
		case PayloadLengthID:
			payloadLength, haveLength = ip.Value, true
		case StreamControlID:
			p.StreamControl, p.HasStreamControl = ip.Value, true
		}
	}
	switch {
	case !haveCnt:
		return 0, 0, ErrMissingHeapCnt
	case !haveOffset:
		return 0, 0, ErrMissingPayloadOffset
	case !haveLength:
		return 0, 0, ErrMissingPayloadLength
	}
	// Values are at most 48 bits, so the sum cannot overflow.
	if p.HasHeapLength && p.PayloadOffset+payloadLength > p.HeapLength {
		return 0, 0, ErrPayloadPastHeap
	}
	return pointersEnd, payloadLength, nil
}
