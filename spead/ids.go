package spead

// Item ids with a meaning defined by the SPEAD specification.
const (
	NullID          uint64 = 0x0 // padding; its payload bytes carry nothing
	HeapCntID       uint64 = 0x1
	HeapLengthID    uint64 = 0x2
	PayloadOffsetID uint64 = 0x3
	PayloadLengthID uint64 = 0x4
	DescriptorID    uint64 = 0x5 // value: an embedded SPEAD packet describing one item
	StreamControlID uint64 = 0x6

	// Items inside an item descriptor's embedded packet.
	DescriptorNameID        uint64 = 0x10
	DescriptorDescriptionID uint64 = 0x11
	DescriptorShapeID       uint64 = 0x12
	DescriptorFormatID      uint64 = 0x13
	DescriptorIDID          uint64 = 0x14 // the id of the item being described
	DescriptorDTypeID       uint64 = 0x15 // numpy header string
)

// Stream control values (item 0x6), as spead2 defines them.
const (
	StreamStart       uint64 = 0
	DescriptorReissue uint64 = 1
	StreamStop        uint64 = 2
	DescriptorUpdate  uint64 = 3
)

const (
	headerSize  = 8
	pointerSize = 8
	magic       = 0x53
	version     = 4
)
