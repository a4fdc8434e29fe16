package ring

import "fmt"

//go:generate go run ./internal/gencontract -root ..

// This file is the ring layout of docs/ring-layout.md, version 2.2, as Go constants. The C header and the
// Python layout module carry the same numbers; TestGoldenLayout (interop) checks that all three agree.
// Minor 1 adds rules and uses reserved space only: a consumer checks its row after reading a heap (validate
// after read), the producer stores a detached row's lost_heaps and state before it reuses any slot that
// consumer held, and chunk mode (§13: header chunk_* fields, feature CHUNKS, flag CHUNK, counters 13–16). Minor 2
// adds what group members publish (region read, handed), the rows' client_minor, read, queued and skipped,
// ctl blocked_on and blocked_since_ns, and counter 18 group_skipped (§14). Any minor of major 2 is accepted
// both ways.

// The layout's constants and offsets (spec §1–§6): the exported ones are what clients and tools need
// (versions, sizes, limits, handshake roles, starts and statuses); the unexported ones are byte offsets
// that only this package reads, through u64at/u32at.
const (
	Magic        uint64 = 0x474E495242564249 // "IBVBRING" little-endian
	MajorVersion uint16 = 2
	MinorVersion uint16 = 2

	// Control memory (spec §2): header, producer blocks, stats, then the consumer table.
	offMagic         = 0x00
	offMajor         = 0x08
	offMinor         = 0x0A
	offCtlSize       = 0x0C
	offState         = 0x10
	offPolicy        = 0x14
	offSessionID     = 0x18
	offProducerPID   = 0x20
	offProducerStart = 0x28
	offSlotCount     = 0x30
	offSlotSize      = 0x38
	offMaxItems      = 0x40
	offDescSize      = 0x44
	offItemSize      = 0x48
	offPageSize      = 0x4C
	offDataSize      = 0x50
	offDescOffset    = 0x58
	offItemsOffset   = 0x60
	offMetaOffset    = 0x68
	offMetaSize      = 0x70
	offPayloadOffset = 0x78
	offPacketOffset  = 0x80
	offPacketSize    = 0x88
	offFeatures      = 0x90
	offStatsCount    = 0x98
	offMaxConsumers  = 0x9C
	// Chunk geometry (§13), in the header's reserved space; all 0 unless features has CHUNKS.
	offChunkHeaps    = 0xA0
	offChunkAxis     = 0xA4
	offChunkHeapSize = 0xA8
	offChunkStep     = 0xB0
	offChunkTimeItem = 0xB8
	offChunkAxisItem = 0xC0
	// producer_version (2.2, §2): the producing program's name and version, NUL-padded UTF-8, in the
	// block after the header that was reserved; constant once handed out.
	offProducerVersion = 0x100
	ProducerVersionMax = 64
	offHead            = 0x200
	offProdWaiting     = 0x280
	offHeartbeat       = 0x300
	offOldest          = 0x308
	offBlockedOn       = 0x310 // §14.6: u32, row + 1 of the consumer a block producer waits for, 0 none
	offBlockedSince    = 0x318 // §14.6: u64, CLOCK_REALTIME when that wait began
	offStats           = 0x500
	offTable           = 0x1000
	StatsSlots         = 32

	// Consumer table row (spec §2.2), at offTable + TableRowSize*index.
	TableRowSize   = 128
	rowState       = 0x00
	rowGeneration  = 0x04
	rowPID         = 0x08
	rowUID         = 0x10
	rowAttachNs    = 0x18
	rowReleased    = 0x20
	rowWakes       = 0x28
	rowLostHeaps   = 0x30
	rowAssigned    = 0x38 // §14: positions assigned to this row as a group member (0 for an independent one)
	rowGroupID     = 0x40 // §14: u32, the member's group id, 0 = independent
	rowClientMinor = 0x44 // §14.1: u32, the minor of the consumer's hello
	rowRead        = 0x48 // §14.2: a member's read position as the producer last accepted it
	rowQueued      = 0x50 // §14.2: positions assigned to a member, published, not yet read by it
	rowSkipped     = 0x58 // §14.7: positions assigned to a 2.2 member it released without handing them out

	// Consumer region (spec §3), one per attachment.
	RegionSize         = 4096
	regTail            = 0x000
	regConsWaiting     = 0x080
	regConsFutex       = 0x084
	regWakeAt          = 0x088
	regRead            = 0x090 // §14.2: a member's read position (every position below it looked at)
	regHanded          = 0x098 // §14.2: a member's own heaps handed to its caller since attach
	regReleaseFutex    = 0x100
	regSpinBudget      = 0x180
	MaxConsumersLimit  = 64
	DefaultMaxConsumer = 8

	// Handshake records (spec §1.2).
	HelloSize        = 32
	WelcomeSize      = 64
	ErrorRecordMax   = 256
	msgMagic         = 0x00
	msgMajor         = 0x08
	msgMinor         = 0x0A
	helloRole        = 0x0C
	helloStart       = 0x10
	helloGroup       = 0x14 // §14: u32 group_id, FNV-1a 32 of the group name, 0 = no group
	helloReserved    = 0x18 // up to HelloSize: reserved, 0
	welcomeStatus    = 0x0C
	welcomeIndex     = 0x10
	welcomeGen       = 0x14
	welcomeSession   = 0x18
	welcomeCtlSize   = 0x20
	welcomeDataSize  = 0x28
	welcomeRegion    = 0x30
	errorMessage     = 0x10
	RoleConsumer     = 1
	RoleObserver     = 2
	StartOldest      = 0
	StartHead        = 1
	noConsumerIndex  = 0xFFFFFFFF
	StatusOK         = 0
	StatusVersion    = 1
	StatusNotAllowed = 2
	StatusBusy       = 3
	StatusClosing    = 4
	StatusProtocol   = 5

	// Descriptor (one per position), in the data memory.
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
	descAssign     = 0x38 // §14: bitmask over consumer rows, one group member's bit per group
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

// CtlSizeFor is the control memory's size for a consumer table of maxConsumers rows (spec §2).
func CtlSizeFor(maxConsumers int) int {
	return int(alignUp(uint64(offTable+TableRowSize*maxConsumers), 4096))
}

// ConsumerState is a consumer-table row's state word (spec §2.2).
type ConsumerState uint32

// Consumer-table row states (spec §2.2): free, attached, or why the producer detached it.
const (
	ConsumerFree      ConsumerState = 0
	ConsumerAttached  ConsumerState = 1
	ConsumerOverrun   ConsumerState = 2
	ConsumerBadCursor ConsumerState = 3
	ConsumerGone      ConsumerState = 4
)

// String is the state's name as stat prints it and the spec spells it.
func (s ConsumerState) String() string {
	switch s {
	case ConsumerFree:
		return "free"
	case ConsumerAttached:
		return "attached"
	case ConsumerOverrun:
		return "overrun"
	case ConsumerBadCursor:
		return "bad-cursor"
	case ConsumerGone:
		return "gone"
	}
	return fmt.Sprintf("state(%d)", uint32(s))
}

// FeatureReplayTimestamps: descriptors' timestamp_ns is the capture's time, not the arrival time.
const FeatureReplayTimestamps uint64 = 0x1

// FeatureChunks: the ring is in chunk mode (§13): a position is a chunk of heaps placed by their time
// (and axis) items, with a presence map after the payload; the header's chunk_* fields give the geometry.
const FeatureChunks uint64 = 0x2

// State is the ring's lifecycle state word.
type State uint32

// Ring states (spec §2): INIT while the producer builds it, READY while it serves, CLOSED after it ended.
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
	FlagItemsCut       uint32 = 0x80
	// FlagChunk marks a chunk's descriptor (§13): heap_cnt is the chunk id, heap_size chunk_bytes.
	FlagChunk uint32 = 0x100
	// FlagStreamEnd marks a stream boundary (2.2, §4.1): one sender's stream stopped and the ring goes on
	// (recv --keep-going). A marker, not a heap: heap_cnt is the stop heap's cnt, no payload, no items.
	FlagStreamEnd uint32 = 0x200
)

// ItemImmediate marks an item entry whose value is the item itself rather than a payload offset.
const ItemImmediate uint32 = 0x1

// ItemCut (2.2, §5) marks an address item of a TRUNCATED heap that runs past the slot: its length was
// clipped to the slot, so only its first bytes are in the payload.
const ItemCut uint32 = 0x2

// Counter indexes the stats block.
type Counter int

// The counters of the stats block (spec §2.3), in index order; String gives their names.
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
	CounterConsumersAttached
	CounterConsumerOverruns
	CounterConsumerErrors
	CounterChunks           // chunks published (§13)
	CounterIncompleteChunks // of those, chunks with a presence byte 0
	CounterTooOldHeaps      // heaps for a chunk the window had already passed
	CounterRejectedHeaps    // heaps no chunk position could take (time item missing, axis out of range, too large)
	CounterGroupLost        // positions a group member had been assigned and had not released when it left (§14)
	CounterGroupSkipped     // positions members released without handing them out (§14.7)
	CounterStreamsEnded     // 2.2: STREAM_END markers published (streams that ended while the ring went on)
	numCounters             // stats_count of this minor version
)

var counterNames = [numCounters]string{
	"packets", "bytes", "heaps", "incomplete_heaps", "dropped_heaps", "malformed_packets",
	"duplicate_packets", "truncated_heaps", "discarded_incomplete_heaps", "end_of_stream",
	"consumers_attached", "consumer_overruns", "consumer_errors",
	"chunks", "incomplete_chunks", "too_old_heaps", "rejected_heaps",
	"group_lost", "group_skipped", "streams_ended",
}

// String returns the counter's name as the spec and the JSON output spell it.
func (c Counter) String() string {
	if c >= 0 && c < numCounters && counterNames[c] != "" {
		return counterNames[c]
	}
	return "unknown"
}

// Counters lists every counter defined by this layout version, in index order (reserved indices left out).
func Counters() []Counter {
	cs := make([]Counter, 0, numCounters)
	for i := range Counter(numCounters) {
		if counterNames[i] != "" {
			cs = append(cs, i)
		}
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
	Assign      uint64 // §14: which rows' group members this position is for; 0 without groups
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

// Cut reports whether the item ran past the slot of a TRUNCATED heap: only its first Length bytes are kept.
func (it Item) Cut() bool { return it.Flags&ItemCut != 0 }

// Immediate reports whether the item's value is carried in the item pointer itself.
func (it Item) Immediate() bool { return it.Flags&ItemImmediate != 0 }

// LayoutTable lists every constant and offset of the spec by name: control-memory header fields bare (the
// header's ctl_size, desc_size, item_size, stats_count and max_consumers fields as "header.NAME"), the
// consumer-table row "row.NAME", the consumer region "region.NAME", handshake records "hello.NAME" /
// "welcome.NAME", descriptor fields "desc.NAME", item fields "item.NAME", metadata "meta.NAME" and
// "meta_record.NAME", plain values "NAME_value" or as named, enumerations "state.*", "policy.*",
// "consumer_state.*", "role.*", "start.*", "status.*", "flag.*", "item_flag.*", "feature.*", "counter.*".
// The golden cross-language test requires the C and Python clients' tables to be identical to it.
func LayoutTable() map[string]uint64 {
	t := map[string]uint64{
		"magic_value": Magic, "major_value": uint64(MajorVersion), "minor_value": uint64(MinorVersion),
		"desc_size": DescSize, "item_size": ItemSize, "stats_slots": StatsSlots,
		"stats_count": uint64(numCounters), "region_align": RegionAlign, "max_slot_count": MaxSlotCount,
		"max_items_limit": MaxItems, "meta_header_size": metaHeaderSize,
		"meta_record_header_size": metaRecordFixed, "meta_ndim_unknown": 0xFFFFFFFF,
		"row_size": TableRowSize, "region_size": RegionSize, "max_consumers_limit": MaxConsumersLimit,
		"default_max_consumers": DefaultMaxConsumer, "hello_size": HelloSize, "welcome_size": WelcomeSize,
		"error_record_max": ErrorRecordMax, "no_consumer_index": noConsumerIndex,

		"magic": offMagic, "major": offMajor, "minor": offMinor, "header.ctl_size": offCtlSize, "state": offState,
		"policy": offPolicy, "session_id": offSessionID, "producer_pid": offProducerPID,
		"producer_start_ns": offProducerStart, "slot_count": offSlotCount, "slot_size": offSlotSize,
		"max_items": offMaxItems, "header.desc_size": offDescSize, "header.item_size": offItemSize,
		"page_size": offPageSize, "data_size": offDataSize, "desc_offset": offDescOffset,
		"items_offset": offItemsOffset, "meta_offset": offMetaOffset, "meta_size": offMetaSize,
		"payload_offset": offPayloadOffset, "packet_offset": offPacketOffset, "packet_size": offPacketSize,
		"features": offFeatures, "header.stats_count": offStatsCount, "header.max_consumers": offMaxConsumers,
		"head": offHead, "producer_waiting": offProdWaiting, "heartbeat_ns": offHeartbeat, "oldest": offOldest,
		"blocked_on": offBlockedOn, "blocked_since_ns": offBlockedSince,
		"stats": offStats, "consumer_table": offTable,
		"chunk_heaps": offChunkHeaps, "chunk_axis": offChunkAxis, "chunk_heap_size": offChunkHeapSize,
		"chunk_step": offChunkStep, "chunk_time_item": offChunkTimeItem, "chunk_axis_item": offChunkAxisItem,

		"row.state": rowState, "row.generation": rowGeneration, "row.pid": rowPID, "row.uid": rowUID,
		"row.attach_ns": rowAttachNs, "row.released": rowReleased, "row.wakes": rowWakes,
		"row.lost_heaps": rowLostHeaps, "row.assigned": rowAssigned, "row.group_id": rowGroupID,
		"row.client_minor": rowClientMinor, "row.read": rowRead, "row.queued": rowQueued, "row.skipped": rowSkipped,
		"region.tail": regTail, "region.consumer_waiting": regConsWaiting, "region.consumer_futex": regConsFutex,
		"region.wake_at": regWakeAt, "region.read": regRead, "region.handed": regHanded,
		"region.release_futex": regReleaseFutex, "region.spin_budget_ns": regSpinBudget,

		"hello.magic": msgMagic, "hello.major": msgMajor, "hello.minor": msgMinor, "hello.role": helloRole,
		"hello.start": helloStart, "hello.group_id": helloGroup,
		"welcome.magic": msgMagic, "welcome.major": msgMajor, "welcome.minor": msgMinor,
		"welcome.status": welcomeStatus, "welcome.consumer_index": welcomeIndex, "welcome.generation": welcomeGen,
		"welcome.session_id": welcomeSession, "welcome.ctl_size": welcomeCtlSize,
		"welcome.data_size": welcomeDataSize, "welcome.region_size": welcomeRegion,
		"welcome.message": errorMessage,

		"desc.seq": descSeq, "desc.heap_cnt": descHeapCnt, "desc.heap_size": descHeapSize,
		"desc.received": descReceived, "desc.timestamp_ns": descTimestamp, "desc.slot": descSlot,
		"desc.flags": descFlags, "desc.item_count": descItemCount, "desc.packets": descPackets,
		"desc.assign": descAssign,
		"item.id":     itemID, "item.value": itemValue, "item.length": itemLength, "item.flags": itemFlags,
		"item.reserved": itemFlags + 4,
		"meta.seq":      0, "meta.length": 8, "meta.records": metaHeaderSize,
		"meta_record.record_size": 0, "meta_record.ndim": 4, "meta_record.id": 8, "meta_record.name_len": 0x10,
		"meta_record.description_len": 0x14, "meta_record.format_len": 0x18, "meta_record.dtype_len": 0x1C,
		"meta_record.shape": metaRecordFixed,

		"state.init": uint64(StateInit), "state.ready": uint64(StateReady), "state.closed": uint64(StateClosed),
		"policy.drop": uint64(PolicyDrop), "policy.block": uint64(PolicyBlock),
		"consumer_state.free": uint64(ConsumerFree), "consumer_state.attached": uint64(ConsumerAttached),
		"consumer_state.overrun": uint64(ConsumerOverrun), "consumer_state.bad_cursor": uint64(ConsumerBadCursor),
		"consumer_state.gone": uint64(ConsumerGone),
		"role.consumer":       RoleConsumer, "role.observer": RoleObserver,
		"start.oldest": StartOldest, "start.head": StartHead,
		"status.ok": StatusOK, "status.version": StatusVersion, "status.not_permitted": StatusNotAllowed,
		"status.busy": StatusBusy, "status.closing": StatusClosing, "status.protocol": StatusProtocol,
		"flag.complete": uint64(FlagComplete), "flag.incomplete": uint64(FlagIncomplete),
		"flag.truncated": uint64(FlagTruncated), "flag.end_of_stream": uint64(FlagEndOfStream),
		"flag.has_descriptors": uint64(FlagHasDescriptors), "flag.items_overflow": uint64(FlagItemsOverflow),
		"flag.no_heap_size": uint64(FlagNoHeapSize), "flag.items_cut": uint64(FlagItemsCut),
		"flag.chunk": uint64(FlagChunk), "flag.stream_end": uint64(FlagStreamEnd),
		"producer_version": offProducerVersion, "producer_version_max": ProducerVersionMax, "feature.chunks": FeatureChunks,
		"item_flag.immediate": uint64(ItemImmediate), "item_flag.cut": uint64(ItemCut),
		"feature.replay_timestamps": FeatureReplayTimestamps,

		"name_max": NameMax, "group_name_max": GroupNameMax,
	}
	for _, c := range Counters() {
		t["counter."+c.String()] = uint64(c)
	}
	return t
}

// LayoutStrings lists the contract's strings by name (spec §1.1): the ring directory defaults and the
// socket and lock file suffixes. The generated C header and Python module carry them next to LayoutTable.
func LayoutStrings() map[string]string {
	return map[string]string{
		"run_dir": RunDir, "env_dir": EnvDir, "shm_dir_prefix": ShmDirPrefix, "tmp_dir_prefix": TmpDirPrefix,
		"socket_suffix": socketSuffix, "lock_suffix": lockSuffix,
	}
}
