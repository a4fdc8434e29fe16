package ring

// This file is the ring layout of docs/ring-layout.md, version 1.0, as Go constants. The C header and the
// Python layout module carry the same numbers; TestGolden* checks that all three agree.

const (
	Magic        uint64 = 0x474E495242564249 // "IBVBRING" little-endian
	MajorVersion uint16 = 1
	MinorVersion uint16 = 0

	CtlSize = 4096

	// Header fields.
	offMagic          = 0x00
	offMajor          = 0x08
	offMinor          = 0x0A
	offCtlSize        = 0x0C
	offState          = 0x10
	offPolicy         = 0x14
	offSessionID      = 0x18
	offProducerPID    = 0x20
	offProducerStart  = 0x28
	offSlotCount      = 0x30
	offSlotSize       = 0x38
	offMaxItems       = 0x40
	offDescSize       = 0x44
	offItemSize       = 0x48
	offPageSize       = 0x4C
	offDataFileSize   = 0x50
	offDescOffset     = 0x58
	offItemsOffset    = 0x60
	offMetaOffset     = 0x68
	offMetaSize       = 0x70
	offPayloadOffset  = 0x78
	offPacketOffset   = 0x80
	offPacketSize     = 0x88
	offFeatures       = 0x90
	offStatsCount     = 0x98
	offDataPath       = 0x100
	DataPathMax       = 256
	offHead           = 0x200
	offConsWaiting    = 0x280
	offConsFutex      = 0x284
	offTail           = 0x300
	offProdWaiting    = 0x380
	offProdFutex      = 0x384
	offConsumerPID    = 0x400
	offConsumerAttach = 0x408
	offHeartbeat      = 0x480
	offStats          = 0x500
	StatsSlots        = 32

	// Descriptor (one per position), in the data file.
	DescSize       = 64
	descSeq        = 0x00
	descHeapCnt    = 0x08
	descHeapSize   = 0x10
	descReceived   = 0x18
	descTimestamp  = 0x20
	descSlot       = 0x28
	descFlags      = 0x2C
	descItemCount  = 0x30
	descPackets    = 0x34
	itemID         = 0x00
	itemValue      = 0x08
	itemLength     = 0x10
	itemFlags      = 0x18
	ItemSize       = 32
	metaHeaderSize = 16

	RegionAlign  = 4096
	MaxSlotCount = 1 << 24
	MaxItems     = 65536
)

// State is the ring's lifecycle state word.
type State uint32

const (
	StateInit   State = 0
	StateReady  State = 1
	StateClosed State = 2
)

// Policy says what a producer does when no slot is free.
type Policy uint32

const (
	// PolicyDrop drops the newest heap and counts it: the network path never blocks.
	PolicyDrop Policy = 0
	// PolicyBlock makes the producer wait for the consumer: nothing is lost (file replay).
	PolicyBlock Policy = 1
)

// Heap flags (descriptor field flags).
const (
	FlagComplete       uint32 = 0x01
	FlagIncomplete     uint32 = 0x02
	FlagTruncated      uint32 = 0x04
	FlagEndOfStream    uint32 = 0x08
	FlagHasDescriptors uint32 = 0x10
	FlagItemsOverflow  uint32 = 0x20
	FlagNoHeapSize     uint32 = 0x40
)

// ItemImmediate marks an item entry whose value is the item itself rather than a payload offset.
const ItemImmediate uint32 = 0x1

// Counter indexes the stats block.
type Counter int

const (
	CounterPackets Counter = iota
	CounterBytes
	CounterHeaps
	CounterIncompleteHeaps
	CounterDroppedHeaps
	CounterMalformedPackets
	CounterDuplicatePackets
	CounterTruncatedHeaps
	CounterDiscardedIncompleteHeaps
	CounterEndOfStream
	numCounters // stats_count of this minor version
)

var counterNames = [numCounters]string{
	"packets", "bytes", "heaps", "incomplete_heaps", "dropped_heaps", "malformed_packets",
	"duplicate_packets", "truncated_heaps", "discarded_incomplete_heaps", "end_of_stream",
}

// String returns the counter's name as the spec and the JSON output spell it.
func (c Counter) String() string {
	if c >= 0 && c < numCounters {
		return counterNames[c]
	}
	return "unknown"
}

// Counters lists every counter defined by this layout version, in index order.
func Counters() []Counter {
	cs := make([]Counter, numCounters)
	for i := range cs {
		cs[i] = Counter(i)
	}
	return cs
}

// descriptor is one entry of the descriptor ring (spec §4), overlaid on the data file.
type descriptor struct {
	Seq         uint64
	HeapCnt     uint64
	HeapSize    uint64
	Received    uint64
	TimestampNs uint64
	Slot        uint32
	Flags       uint32
	ItemCount   uint32
	Packets     uint32
	_           uint64
}

// Item is one entry of a slot's item table (spec §5). For an immediate item Value is the item itself; for
// an address item it is the offset of the item's bytes in the heap payload and Length their count.
type Item struct {
	ID     uint64
	Value  uint64
	Length uint64
	Flags  uint32
	_      uint32
}

// Immediate reports whether the item's value is carried in the item pointer itself.
func (it Item) Immediate() bool { return it.Flags&ItemImmediate != 0 }

// LayoutTable lists every constant and offset of the spec by name: header fields bare (the header's
// ctl_size, desc_size, item_size and stats_count fields as "header.NAME", the bare names being the
// values), descriptor fields "desc.NAME", item fields "item.NAME", metadata "meta.NAME" and
// "meta_record.NAME", enumerations "state.*", "policy.*", "flag.*", "item_flag.*", "counter.*". The golden
// cross-language test requires the C and Python clients' tables to be identical to it.
func LayoutTable() map[string]uint64 {
	t := map[string]uint64{
		"magic_value": Magic, "major_value": uint64(MajorVersion), "minor_value": uint64(MinorVersion),
		"ctl_size": CtlSize, "desc_size": DescSize, "item_size": ItemSize, "data_path_max": DataPathMax,
		"stats_slots": StatsSlots, "stats_count": uint64(numCounters), "region_align": RegionAlign,
		"max_slot_count": MaxSlotCount, "max_items_limit": MaxItems, "meta_header_size": metaHeaderSize,
		"meta_record_header_size": metaRecordFixed, "meta_ndim_unknown": 0xFFFFFFFF,

		"magic": offMagic, "major": offMajor, "minor": offMinor, "header.ctl_size": offCtlSize, "state": offState,
		"policy": offPolicy, "session_id": offSessionID, "producer_pid": offProducerPID,
		"producer_start_ns": offProducerStart, "slot_count": offSlotCount, "slot_size": offSlotSize,
		"max_items": offMaxItems, "header.desc_size": offDescSize, "header.item_size": offItemSize,
		"page_size": offPageSize, "data_file_size": offDataFileSize, "desc_offset": offDescOffset,
		"items_offset": offItemsOffset, "meta_offset": offMetaOffset, "meta_size": offMetaSize,
		"payload_offset": offPayloadOffset, "packet_offset": offPacketOffset, "packet_size": offPacketSize,
		"features": offFeatures, "header.stats_count": offStatsCount, "data_path": offDataPath,
		"head": offHead, "consumer_waiting": offConsWaiting, "consumer_futex": offConsFutex, "tail": offTail,
		"producer_waiting": offProdWaiting, "producer_futex": offProdFutex, "consumer_pid": offConsumerPID,
		"consumer_attach_ns": offConsumerAttach, "heartbeat_ns": offHeartbeat, "stats": offStats,
		"ctl_reserved": offStats + 8*StatsSlots,

		"desc.seq": descSeq, "desc.heap_cnt": descHeapCnt, "desc.heap_size": descHeapSize,
		"desc.received": descReceived, "desc.timestamp_ns": descTimestamp, "desc.slot": descSlot,
		"desc.flags": descFlags, "desc.item_count": descItemCount, "desc.packets": descPackets,
		"desc.reserved": descPackets + 4,
		"item.id":       itemID, "item.value": itemValue, "item.length": itemLength, "item.flags": itemFlags,
		"item.reserved": itemFlags + 4,
		"meta.seq":      0, "meta.length": 8, "meta.records": metaHeaderSize,
		"meta_record.record_size": 0, "meta_record.ndim": 4, "meta_record.id": 8, "meta_record.name_len": 0x10,
		"meta_record.description_len": 0x14, "meta_record.format_len": 0x18, "meta_record.dtype_len": 0x1C,
		"meta_record.shape": metaRecordFixed,

		"state.init": uint64(StateInit), "state.ready": uint64(StateReady), "state.closed": uint64(StateClosed),
		"policy.drop": uint64(PolicyDrop), "policy.block": uint64(PolicyBlock),
		"flag.complete": uint64(FlagComplete), "flag.incomplete": uint64(FlagIncomplete),
		"flag.truncated": uint64(FlagTruncated), "flag.end_of_stream": uint64(FlagEndOfStream),
		"flag.has_descriptors": uint64(FlagHasDescriptors), "flag.items_overflow": uint64(FlagItemsOverflow),
		"flag.no_heap_size": uint64(FlagNoHeapSize), "item_flag.immediate": uint64(ItemImmediate),
	}
	for _, c := range Counters() {
		t["counter."+c.String()] = uint64(c)
	}
	return t
}
