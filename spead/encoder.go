package spead

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Item is one item of a heap to send.
type Item struct {
	ID uint64
	// Immediate items travel inside their item pointer: Value, at most Flavour.MaxValue.
	Immediate bool
	Value     uint64
	// Data holds an addressed item's bytes; they go into the heap payload in item order.
	Data []byte
}

// Heap is a heap to send.
type Heap struct {
	Cnt   uint64
	Items []Item
}

// StreamStopHeap is the heap that ends a stream: one immediate stream control item with value StreamStop
// (the encoder pads it with a null item and one payload byte, as spead2_send does).
func StreamStopHeap(cnt uint64) Heap {
	return Heap{Cnt: cnt, Items: []Item{{ID: StreamControlID, Immediate: true, Value: StreamStop}}}
}

// Errors from the encoder; they are programming errors, not wire conditions, so they have no Reason.
var (
	ErrPacketSizeTooSmall = errors.New("spead: packet size too small")
	ErrBufferTooSmall     = errors.New("spead: destination buffer smaller than the next packet")
	ErrValueTooLarge      = errors.New("spead: value does not fit the flavour")
	ErrNoHeap             = errors.New("spead: encoder has no heap (call Reset)")
)

// Encoder splits heaps into packets the way spead2_send does, so its output matches spead2's byte for
// byte: every packet starts with immediate heap cnt, heap length, payload offset and payload length; the
// heap's own item pointers follow in the first packet (spilling into later ones if they do not fit); every
// packet carries some payload, padded with a null item if the heap has too little. An Encoder is reused
// across heaps and allocates nothing per packet.
type Encoder struct {
	flavour       Flavour
	maxPacketSize int
	maxPointers   int // heap item pointers per packet, besides the four specials

	heap          *Heap
	payloadSize   uint64
	needNullItem  bool
	payloadOffset uint64
	nextPointer   int // index into heap.Items (== len: the null item) of the next pointer to send
	nextAddress   uint64
	nextItem      int // item whose bytes are sent next
	nextItemByte  int
}

// specialPointers is the number of per-packet items: heap cnt, heap length, payload offset, payload length.
const specialPointers = 4

const prefixSize = headerSize + specialPointers*pointerSize

// NewEncoder returns an encoder for flavour f producing packets of at most maxPacketSize bytes (UDP
// payload size), rounded down to a multiple of 8 so that payload stays aligned, as spead2 does.
func NewEncoder(f Flavour, maxPacketSize int) (*Encoder, error) {
	if !f.Valid() {
		return nil, fmt.Errorf("spead: new encoder for flavour %d: %w", f, ErrUnsupportedFlavour)
	}
	maxPacketSize &^= 7
	// Room for the prefix, one item pointer and 8 bytes of payload.
	if maxPacketSize < prefixSize+2*pointerSize {
		return nil, fmt.Errorf("spead: new encoder with %d-byte packets: %w", maxPacketSize, ErrPacketSizeTooSmall)
	}
	return &Encoder{
		flavour:       f,
		maxPacketSize: maxPacketSize,
		maxPointers:   (maxPacketSize - prefixSize - pointerSize) / pointerSize,
	}, nil
}

// Flavour is the encoder's flavour.
func (e *Encoder) Flavour() Flavour { return e.flavour }

// MaxPacketSize is the largest packet Next writes: a buffer this large always suffices.
func (e *Encoder) MaxPacketSize() int { return e.maxPacketSize }

// Reset starts packetizing h. The encoder keeps h (and its items' Data) until the last packet is written.
func (e *Encoder) Reset(h *Heap) error {
	e.heap = nil
	f := e.flavour
	if h.Cnt > f.MaxValue() {
		return fmt.Errorf("spead: heap cnt %d: %w", h.Cnt, ErrValueTooLarge)
	}
	var payload uint64
	for i := range h.Items {
		it := &h.Items[i]
		if it.ID > f.MaxID() {
			return fmt.Errorf("spead: heap %d item %d: id %#x: %w", h.Cnt, i, it.ID, ErrValueTooLarge)
		}
		if it.Immediate {
			if it.Value > f.MaxValue() {
				return fmt.Errorf("spead: heap %d item %#x: immediate %d: %w", h.Cnt, it.ID, it.Value, ErrValueTooLarge)
			}
			continue
		}
		payload += uint64(len(it.Data))
	}
	// Every packet needs payload so that packets of a heap have distinct offsets; the packets that only
	// carry item pointers get 8 bytes each, the last one byte, plus a null item marking the padding.
	itemPackets := len(h.Items)/e.maxPointers + 1
	minPayload := uint64(itemPackets-1)*pointerSize + 1
	e.needNullItem = payload < minPayload
	if e.needNullItem {
		payload = minPayload
	}
	if payload > f.MaxValue() {
		return fmt.Errorf("spead: heap %d length %d: %w", h.Cnt, payload, ErrValueTooLarge)
	}
	e.heap = h
	e.payloadSize = payload
	e.payloadOffset = 0
	e.nextPointer, e.nextAddress = 0, 0
	e.nextItem, e.nextItemByte = 0, 0
	return nil
}

// HeapLength is the heap length (payload size, padding included) of the heap being packetized.
func (e *Encoder) HeapLength() uint64 { return e.payloadSize }

// More reports whether Next has another packet to write.
func (e *Encoder) More() bool { return e.heap != nil && e.payloadOffset < e.payloadSize }

// Next writes the heap's next packet to the start of dst and returns its size, or io.EOF after the last.
func (e *Encoder) Next(dst []byte) (int, error) {
	if e.heap == nil {
		return 0, ErrNoHeap
	}
	if e.payloadOffset >= e.payloadSize {
		return 0, io.EOF
	}
	items := e.heap.Items
	pointerCount := len(items) - e.nextPointer
	if e.needNullItem {
		pointerCount++
	}
	pointerCount = min(pointerCount, e.maxPointers)
	payloadLength := int(min(e.payloadSize-e.payloadOffset, uint64(e.maxPacketSize-prefixSize-pointerCount*pointerSize)))
	size := prefixSize + pointerCount*pointerSize + payloadLength
	if len(dst) < size {
		return 0, ErrBufferTooSmall
	}
	f := e.flavour
	be := binary.BigEndian
	be.PutUint64(dst[0:], uint64(magic)<<56|uint64(version)<<48|
		uint64(pointerSize-f.ImmediateBytes())<<40|uint64(f.ImmediateBytes())<<32|uint64(pointerCount+specialPointers))
	be.PutUint64(dst[8:], f.pointer(HeapCntID, true, e.heap.Cnt))
	be.PutUint64(dst[16:], f.pointer(HeapLengthID, true, e.payloadSize))
	be.PutUint64(dst[24:], f.pointer(PayloadOffsetID, true, e.payloadOffset))
	be.PutUint64(dst[32:], f.pointer(PayloadLengthID, true, uint64(payloadLength)))
	pos := prefixSize
	for range pointerCount {
		var ip uint64
		if e.nextPointer == len(items) {
			ip = f.pointer(NullID, false, e.nextAddress)
		} else if it := &items[e.nextPointer]; it.Immediate {
			ip = f.pointer(it.ID, true, it.Value)
		} else {
			ip = f.pointer(it.ID, false, e.nextAddress)
			e.nextAddress += uint64(len(it.Data))
		}
		be.PutUint64(dst[pos:], ip)
		pos += pointerSize
		e.nextPointer++
	}
	e.payloadOffset += uint64(payloadLength)
	for payloadLength > 0 {
		if e.nextItem == len(items) {
			// Padding after the last item: zeros, as spead2 sends.
			clear(dst[pos : pos+payloadLength])
			pos += payloadLength
			break
		}
		it := &items[e.nextItem]
		if !it.Immediate {
			n := copy(dst[pos:pos+payloadLength], it.Data[e.nextItemByte:])
			pos += n
			payloadLength -= n
			e.nextItemByte += n
		}
		if it.Immediate || e.nextItemByte == len(it.Data) {
			e.nextItem++
			e.nextItemByte = 0
		}
	}
	return size, nil
}
