package assemble

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rs/zerolog"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
)

// AssemblerConfig tunes an Assembler.
type AssemblerConfig struct {
	// MaxHeaps is the live-heap window (spead2's max_heaps, default 4): how many heaps may be under
	// assembly at once. A packet of a new heap when the window is full evicts the oldest live heap.
	MaxHeaps int
	// Incomplete publishes heaps that end with missing payload, flagged INCOMPLETE; without it they are
	// counted (incomplete_heaps and discarded_incomplete_heaps) and dropped.
	Incomplete bool
	// EOSTimeout bounds the wait for a free slot for the end-of-stream marker (default 1 s).
	EOSTimeout time.Duration
	// ChunkWindow is how many chunks are open at once on a chunk-mode ring (default 2; spec §13).
	ChunkWindow int
	// Placement, on a chunk-mode ring, places each heap instead of the ring's time and axis items
	// (ItemPlacement, the default).
	Placement Placement
	// KeepGoing makes a stream stop end that stream, not the ring (spead2's stop_on_stop_item=False):
	// the live heaps are flushed, a STREAM_END marker is published (spec §4.1) and the next packets begin
	// the next stream; Done closes only when the ring's input ends. Heap cnts are a stream's own: after
	// a stop the next stream may reuse any of them.
	KeepGoing bool
	// OnStreamEnd, if set, is called after each STREAM_END marker with the stop heap's cnt and the
	// marker's error (nil: published). It runs on the source's goroutine: keep it short.
	OnStreamEnd func(stopCnt uint64, err error)
	// OnTruncated, if set, is called for each heap published TRUNCATED with the slot size that would
	// have held it whole (its length, or furthest extent). It runs on the source's goroutine.
	OnTruncated func(need uint64)
	// Log receives warnings that are not per-packet (item descriptors that do not fit the metadata
	// area, an end-of-stream marker that found no slot); nil: silent.
	Log *zerolog.Logger
}

const (
	defaultMaxHeaps   = 4
	defaultEOSTimeout = time.Second

	// initialRanges is the preallocated size of a live heap's set of received payload ranges. Packets
	// usually arrive in order and coalesce into one range; the set grows (allocating, off the common
	// path) only under heavy reordering, up to maxRanges.
	initialRanges = 16
	// maxRanges bounds the range set: a packet that would need more disjoint ranges is dropped, so a
	// hostile sender cannot make a heap's bookkeeping grow without limit.
	maxRanges = 4096
	// extraPointers is room in a live heap's pointer list beyond the ring's max_items for pointers that
	// never reach the item table (null padding items) but still delimit address items.
	extraPointers = 64
)

// Assembler reassembles SPEAD heaps from packets directly into the slots of a ring and publishes them
// as they complete. It implements transport.Sink: one goroutine feeds it.
//
// Semantics (spead2's receive rules where the ring spec does not say otherwise):
//   - Each live heap owns a ring slot from its first packet; payload is copied once, straight into the
//     slot at its heap offset. If no slot is free (drop policy, or a blocked Acquire interrupted) the heap
//     is dropped: dropped_heaps counts it once and the window remembers its cnt so later packets of it
//     are ignored, not re-counted. As in spead2, a packet of a heap that already left the window (it
//     completed or was evicted) starts a new heap.
//   - A packet whose payload range overlaps one already received is a duplicate (duplicate_packets) and
//     is ignored, as spead2 rejects exact and partial overlaps alike. Zero-length payloads are never
//     duplicates. A packet inconsistent with its heap (another heap length or flavour, or a heap length
//     below what the heap already holds) is rejected as spead2 does and counted as malformed with
//     ReasonOther. A heap whose payload is already split into maxRanges disjoint ranges drops packets
//     that would add another (RangeOverflows counts them); the heap then ends incomplete.
//   - A heap with a HEAP_LENGTH is complete when all its bytes arrived and no item address lies past
//     its end; it is published at once. A heap without one (NO_HEAP_SIZE) can only end at eviction,
//     Flush or stream stop; it is then published as COMPLETE if its payload is contiguous from 0 to its
//     furthest byte or item address (spead2 hands such a heap to the user as a heap, though its stats
//     file it under incomplete), else it is incomplete. Its heap_size is the bytes received.
//   - A heap larger than the slot keeps its first slot_size bytes and is flagged TRUNCATED
//     (truncated_heaps); completeness still counts every byte of the heap, so a truncated heap whose
//     bytes all arrived is COMPLETE|TRUNCATED. Its received field is the bytes kept (at most
//     slot_size), address items are clipped to the slot and items starting past it are left out.
//   - Item table: the heap's item pointers in wire order, deduplicated across packets, without ids
//     0x1–0x4 and null items; an address item's length is the distance to the next address (null items
//     included) in address order, ties in wire order, the last one running to the heap size; zero-length
//     address items are left out, as spead2 does. More pointers than the table holds set ITEMS_OVERFLOW.
//   - Item descriptors (0x5) that arrived whole are parsed into the stream's descriptor table (later ones
//     replace earlier ones with the same id), which is written to the ring's metadata area.
//   - The packet counter counts packets accepted into a heap, the stop packet included (as spead2_recv
//     counts it); packets of dropped heaps, duplicates, malformed and range-overflow packets are not.
//   - Stream stop (item 0x6 = 2): the stop heap is not published; every live heap is flushed, the
//     end-of-stream marker is published and Done is closed. Packets after the stop are ignored and
//     counted only by PacketsAfterStop: the stream is over and the ring's counters describe it.
type Assembler struct {
	p        *ring.Producer
	cfg      AssemblerConfig
	slotSize uint64

	pkt     spead.Packet // decoded in place: reusing it keeps Decode allocation-free
	fitsPkt spead.Packet // Fits' decoding, apart from pkt (Placed decodes into pkt after Fits)
	window  []liveHeap
	lastHit int    // window index of the previous packet's heap: consecutive packets usually share it
	arrival uint64 // first-arrival sequence number, for oldest-first eviction

	// Scratch for item lengths at publication, sized for the largest pointer list.
	sortScratch []addressRef
	lengths     []uint64

	recent recentHeaps // cnts of the heaps most recently published complete

	pl      placer // where heaps go (streamPlacer)
	scratch []byte // a misplaced datagram is joined back here

	descriptors     map[uint64]ring.ItemDescriptor
	descriptorOrder []uint64

	malformed        [spead.NumReasons]atomic.Uint64
	badDescriptors   atomic.Uint64
	rangeOverflows   atomic.Uint64
	packetsAfterStop atomic.Uint64
	chunkRebases     atomic.Uint64 // chunk mode: the window re-based to a time index far behind it (§13.4)

	stopped bool
	done    chan struct{}
}

// heapState is the state of one window entry.
type heapState uint8

const (
	heapFree       heapState = iota
	heapAssembling           // owns a slot
	heapDropped              // no slot was free: later packets of this cnt are ignored
)

// liveHeap is one heap under assembly. Its slices are allocated once, at NewAssembler, and reused.
type liveHeap struct {
	state      heapState
	cnt        uint64
	arrival    uint64
	slot       *ring.Slot
	flavour    spead.Flavour
	heapLength uint64
	hasLength  bool
	// extent is spead2's min_length: the furthest payload byte or item address seen. A heap is complete
	// only if it does not exceed the heap length.
	extent       uint64
	received     uint64 // payload bytes accepted, including those past the slot
	stored       uint64 // of those, the bytes inside the slot
	packets      uint32
	firstNanos   int64
	ranges       []byteRange // received payload, sorted, disjoint and coalesced
	pointers     []uint64    // raw item pointers except ids 0x1–0x4, wire order, deduplicated across packets
	seen         pointerSet  // the same pointers, for an O(1) duplicate test whatever the heap's item count
	pointersLost bool
	// Item descriptors of a heap longer than its slot: the bytes from the first descriptor's address on
	// (at most maxDescTail) are kept here too, so descriptors after the slot's end still reach the stream's
	// descriptor table (the metadata area) when the payload is cut. descAt is that address (^0: none).
	descAt   uint64
	descTail []byte // allocated at the first heap that needs it, then reused
	// Chunk mode: the heap's position in an open chunk, view its bytes there; dup: a heap for a position
	// already filled, whose packets count as duplicates.
	chunk    *openChunk
	chunkPos uint64
	chunkOff uint64 // the heap's offset in its position (a user's placement may give one)
	view     ring.Slot
	dup      bool
}

// byteRange is a half-open range of heap payload offsets.
type byteRange struct{ start, end uint64 }

// addressRef is an address item (or null item) for the length computation: its address and its index
// in the heap's pointer list.
type addressRef struct {
	address uint64
	index   int
}

// NewAssembler returns an assembler publishing into p. MaxHeaps may not exceed the ring's slot count:
// every live heap holds a slot, and with the block policy a window larger than the pool would wait for
// slots only the assembler itself can free.
func NewAssembler(p *ring.Producer, cfg AssemblerConfig) (*Assembler, error) {
	if p == nil {
		return nil, errors.New("spead: new assembler: nil ring producer")
	}
	if cfg.MaxHeaps == 0 {
		cfg.MaxHeaps = defaultMaxHeaps
	}
	if cfg.EOSTimeout == 0 {
		cfg.EOSTimeout = defaultEOSTimeout
	}
	geo := p.Geometry()
	limit := geo.SlotCount // every live heap holds a slot
	if p.Chunks().Enabled() {
		limit = maxChunkLiveHeaps // live heaps hold positions in the open chunks, not slots
	}
	if cfg.MaxHeaps < 1 || uint64(cfg.MaxHeaps) > limit {
		return nil, fmt.Errorf("spead: new assembler on ring %s: max heaps %d must be in 1..%d (the ring's slot count, or in chunk mode %d)",
			p.Name(), cfg.MaxHeaps, geo.SlotCount, uint64(maxChunkLiveHeaps))
	}
	maxPointers := int(geo.MaxItems) + extraPointers
	a := &Assembler{
		p:           p,
		cfg:         cfg,
		slotSize:    uint64(p.SlotSize()),
		window:      make([]liveHeap, cfg.MaxHeaps),
		sortScratch: make([]addressRef, 0, maxPointers),
		lengths:     make([]uint64, maxPointers),
		descriptors: map[uint64]ring.ItemDescriptor{},
		done:        make(chan struct{}),
		recent:      newRecentHeaps(recentHeapsFor(cfg.MaxHeaps)),
	}
	if p.Chunks().Enabled() {
		cp, err := newChunkPlacer(p, cfg.ChunkWindow, cfg.Placement, a.evictChunk, &a.chunkRebases)
		if err != nil {
			return nil, err
		}
		a.pl = cp
	} else {
		if cfg.Placement != nil {
			return nil, fmt.Errorf("spead: new assembler on ring %s: a chunk placement needs a ring in chunk mode", p.Name())
		}
		a.pl = newStreamPlacer(p)
	}
	for i := range a.window {
		a.window[i].ranges = make([]byteRange, 0, initialRanges)
		a.window[i].pointers = make([]uint64, 0, maxPointers)
		a.window[i].seen = newPointerSet(maxPointers)
	}
	return a, nil
}

// Done is closed when the stream stopped: a stream-stop item was received, the live heaps were flushed
// and the end-of-stream marker published.
func (a *Assembler) Done() <-chan struct{} { return a.done }

// MalformedByReason returns the rejected packets per reason; they sum to the ring's malformed_packets.
// ReasonOther counts packets inconsistent with their heap. Safe from any goroutine.
func (a *Assembler) MalformedByReason() [spead.NumReasons]uint64 {
	var out [spead.NumReasons]uint64
	for i := range out {
		out[i] = a.malformed[i].Load()
	}
	return out
}

// BadDescriptors counts item descriptors (item 0x5) that arrived whole but did not parse; they are not
// packets, so the ring's malformed_packets does not count them. Safe from any goroutine.
func (a *Assembler) BadDescriptors() uint64 { return a.badDescriptors.Load() }

// RangeOverflows counts packets dropped because their heap already had maxRanges disjoint payload
// ranges (pathological reordering or a hostile sender). Safe from any goroutine.
func (a *Assembler) RangeOverflows() uint64 { return a.rangeOverflows.Load() }

// PacketsAfterStop counts packets ignored because they arrived after the stream stopped. Safe from any
// goroutine.
func (a *Assembler) PacketsAfterStop() uint64 { return a.packetsAfterStop.Load() }

// ChunkRebases is how many times a chunk-mode window re-based: a heap's chunk id was more than the
// window behind it, so the time index had jumped (spec §13.4). Safe from any goroutine.
func (a *Assembler) ChunkRebases() uint64 { return a.chunkRebases.Load() }

// Packet takes one SPEAD packet (a UDP payload) received at recvNanos. It implements transport.Sink and
// allocates nothing unless the packet carries item descriptors.
func (a *Assembler) Packet(payload []byte, recvNanos int64) {
	if a.stopped {
		a.packetsAfterStop.Add(1)
		return
	}
	pkt := &a.pkt
	if err := spead.Decode(payload, pkt); err != nil {
		a.reject(spead.ReasonOf(err))
		return
	}
	if pkt.IsStreamStop() {
		a.stop(pkt)
		return
	}
	h := a.find(pkt.HeapCnt)
	if h == nil {
		if a.recent.contains(pkt.HeapCnt, recvNanos) {
			// A late copy of a heap already published whole: every byte of it arrived, so this packet
			// can only repeat some. Starting a heap for it would publish a phantom incomplete copy.
			a.p.Add(ring.CounterDuplicatePackets, 1)
			return
		}
		h = a.begin(pkt, recvNanos)
	}
	if h.state == heapDropped {
		if h.dup {
			a.p.Add(ring.CounterDuplicatePackets, 1)
		}
		return
	}
	a.add(h, pkt, false)
}

// BeginBatch implements transport.Batcher: heaps completed until EndBatch are published together.
func (a *Assembler) BeginBatch() { a.p.BeginBatch() }

// EndBatch publishes the batch's heaps and counters.
func (a *Assembler) EndBatch() { a.p.EndBatch() }

// Absorbs implements transport.Absorber: how long a source may let the stream wait in the kernel, given
// the ring's free slots and the rate heaps (or chunks) are published (ring.Producer.Absorbs).
func (a *Assembler) Absorbs(max time.Duration) time.Duration { return a.p.Absorbs(max) }

// Awaits implements transport.Awaiter: how long until what a consumer sees next as one unit, the heap the
// latest packet joined (in chunk mode, the chunk of the heap begun last, even when the latest packet
// completed its heap), is complete, at the rate its bytes arrived so far (from its first packet's receive
// time to now; a chunk, as long as the chunks before it took: chunkPlacer.awaits). ok is false when
// nothing is in assembly (the latest packet completed its heap, or its chunk) or its size is unknown (no
// heap length yet). The estimate can only err short while the bytes
// come at a steady rate: receive times are read times, which trail arrival. Hot path only: it reads the
// window, nothing else.
func (a *Assembler) Awaits(nowNanos int64) (left time.Duration, ok bool) {
	if a.stopped {
		return 0, false
	}
	h := &a.window[a.lastHit]
	live := h.state == heapAssembling
	if cp, isChunk := a.pl.(*chunkPlacer); isChunk {
		return cp.awaits(h, live, nowNanos)
	}
	if !live {
		return 0, false
	}
	return timeLeft(h.heapLength, h.received, nowNanos-h.firstNanos) // heapLength 0 (unknown): no estimate
}

// timeLeft is how long the rest of total bytes takes at the rate have bytes took in elapsed nanoseconds.
func timeLeft(total, have uint64, elapsed int64) (time.Duration, bool) {
	if have == 0 || have >= total {
		return 0, false
	}
	if elapsed <= 0 {
		return 0, true
	}
	return time.Duration(float64(elapsed) * float64(total-have) / float64(have)), true
}

// Place implements transport.Placer: it fills dst with the regions where the placer expects the next
// datagrams' payloads (regions that hold nothing received yet, so a wrong guess overwrites nothing) and
// returns the header length the guess assumes and how many regions it filled (0: no guess).
func (a *Assembler) Place(dst [][]byte) (hdrLen, n int) {
	if a.stopped {
		return 0, 0
	}
	return a.pl.guess(dst)
}

// Fits implements transport.Placer: whether the datagram read as hdr + region[:payloadLen] is the packet
// Place expected there — its payload at its own offset in its own heap's slot — so Placed can take it
// without a copy. It changes nothing.
func (a *Assembler) Fits(hdr, region []byte, payloadLen int) bool {
	pkt := &a.fitsPkt
	if a.stopped || payloadLen <= 0 || payloadLen > len(region) || spead.DecodeSplit(hdr, region[:payloadLen], pkt) != nil ||
		pkt.IsStreamStop() || pkt.PayloadOffset >= a.slotSize {
		return false
	}
	live, slot := a.pl.expected(pkt)
	switch {
	case live != nil:
		slot = live.slot
	case slot == nil || a.find(pkt.HeapCnt) != nil || a.recent.contains(pkt.HeapCnt, a.recent.newest()):
		return false // only the first packets of a heap not begun go to the slot taken ahead for it
	}
	if pkt.PayloadOffset >= uint64(len(slot.Payload)) { // a chunk position is shorter than the ring's slot
		return false
	}
	return unsafe.SliceData(pkt.Payload) == unsafe.SliceData(slot.Payload[pkt.PayloadOffset:])
}

// Placed implements transport.Placer: it takes a datagram Fits approved, its payload already where it
// belongs, without copying it. (A datagram that does not fit is joined back and taken as Packet takes
// one; a source should have copied such datagrams out before taking any of a read's packets, since taking
// one may move bytes into a region another still occupies.)
func (a *Assembler) Placed(hdr, region []byte, payloadLen int, recvNanos int64) bool {
	if !a.Fits(hdr, region, payloadLen) {
		if a.scratch == nil {
			a.scratch = make([]byte, 0, 1<<16)
		}
		a.scratch = append(append(a.scratch[:0], hdr...), region[:min(payloadLen, len(region))]...)
		a.Packet(a.scratch, recvNanos)
		return false
	}
	pkt := &a.pkt
	*pkt = a.fitsPkt // Fits decoded exactly this datagram: no second decode
	h := a.find(pkt.HeapCnt)
	if h == nil {
		h = a.begin(pkt, recvNanos) // the placer hands it the slot Fits found
	}
	a.add(h, pkt, true)
	return true
}

// reject counts a malformed or inconsistent packet.
func (a *Assembler) reject(r spead.Reason) {
	a.malformed[r].Add(1)
	a.p.Add(ring.CounterMalformedPackets, 1)
}

// find returns the window entry of heap cnt, or nil.
func (a *Assembler) find(cnt uint64) *liveHeap {
	if h := &a.window[a.lastHit]; h.state != heapFree && h.cnt == cnt {
		return h
	}
	for i := range a.window {
		if h := &a.window[i]; h.state != heapFree && h.cnt == cnt {
			a.lastHit = i
			return h
		}
	}
	return nil
}

// begin opens a window entry for a new heap, evicting the oldest live heap if the window is full, and
// takes the slot the placer gives it. With no slot free the entry is marked dropped, so the heap's later
// packets are recognised and ignored.
func (a *Assembler) begin(pkt *spead.Packet, recvNanos int64) *liveHeap {
	cnt, flavour := pkt.HeapCnt, pkt.Flavour
	free, oldest := -1, -1
	for i := range a.window {
		h := &a.window[i]
		if h.state == heapFree {
			free = i
			break
		}
		if oldest < 0 || h.arrival < a.window[oldest].arrival {
			oldest = i
		}
	}
	if free < 0 {
		// Evict before acquiring: the evicted heap's slot may be the one the new heap needs.
		a.finish(&a.window[oldest])
		free = oldest
	}
	h := &a.window[free]
	a.lastHit = free
	a.arrival++
	h.cnt, h.arrival, h.dup = cnt, a.arrival, false
	slot, err := a.pl.heapSlot(h, pkt)
	if err != nil {
		// ErrFull (drop policy) or ErrClosed (interrupted while blocked): either way the heap cannot be
		// received into the ring. Remember it so its other packets are not counted again. A chunk placer
		// counted a heap it does not place (too old, rejected); a duplicate's packets count as such.
		h.state = heapDropped
		switch err {
		case errNotPlaced:
		case errDuplicateHeap:
			h.dup = true
		default:
			a.p.Add(ring.CounterDroppedHeaps, 1)
		}
		return h
	}
	h.state = heapAssembling
	h.slot = slot
	h.flavour = flavour
	h.heapLength, h.hasLength = 0, false
	h.extent, h.received, h.stored, h.packets = 0, 0, 0, 0
	h.firstNanos = recvNanos
	h.ranges = h.ranges[:0]
	h.pointers = h.pointers[:0]
	h.seen.reset()
	h.pointersLost = false
	h.descAt = noDescriptor
	return h
}

// noDescriptor is liveHeap.descAt for a heap with no descriptor item seen.
const noDescriptor = ^uint64(0)

// maxDescTail bounds the descriptor bytes kept beside a heap longer than its slot: a heap's descriptors
// are a few hundred bytes each, and SPEAD senders put them together.
const maxDescTail = 64 << 10

// keepDescBytes copies what of the packet's bytes [start, end) lies in h's descriptor window
// [descAt, descAt+maxDescTail) into descTail, for a heap whose length already runs past its slot.
func (h *liveHeap) keepDescBytes(start, end uint64, payload []byte, slotLen uint64) {
	if h.descAt == noDescriptor || max(h.extent, h.heapLength) <= slotLen {
		return
	}
	lo, hi := max(start, h.descAt), min(end, h.descAt+maxDescTail)
	if lo >= hi {
		return
	}
	if h.descTail == nil {
		h.descTail = make([]byte, maxDescTail) // rare: a cut heap that carries descriptors
	}
	copy(h.descTail[lo-h.descAt:hi-h.descAt], payload[lo-start:hi-start])
}

// descBytes returns the bytes [start, end) of h's payload for a descriptor item: from the slot when they
// lie in it, else from descTail; nil when they were not all received or not kept.
func (h *liveHeap) descBytes(start, end, slotLen uint64) []byte {
	if end < start || !h.covered(start, end) {
		return nil
	}
	if end <= slotLen {
		return h.slot.Payload[start:end]
	}
	if h.descTail == nil || start < h.descAt || end-h.descAt > maxDescTail {
		return nil
	}
	return h.descTail[start-h.descAt : end-h.descAt]
}

// add adds an accepted packet of heap h (spead2's live_heap::add_packet) and publishes the heap if it is
// now complete. inPlace: its payload was read straight into the slot (Placed), so nothing is copied.
func (a *Assembler) add(h *liveHeap, pkt *spead.Packet, inPlace bool) {
	if !a.consistent(h, pkt) {
		a.reject(spead.ReasonOther)
		return
	}
	start := pkt.PayloadOffset
	end := start + uint64(len(pkt.Payload))
	if start != end {
		switch h.addRange(start, end) {
		case rangeDuplicate:
			a.p.Add(ring.CounterDuplicatePackets, 1)
			return
		case rangeOverflow:
			a.rangeOverflows.Add(1)
			return
		}
	}
	if !h.hasLength && pkt.HasHeapLength {
		h.heapLength, h.hasLength = pkt.HeapLength, true
	}
	h.extent = max(h.extent, end)
	a.addPointers(h, pkt)
	if end > a.slotSize && h.chunk == nil {
		h.keepDescBytes(start, end, pkt.Payload, a.slotSize)
	}
	if limit := uint64(len(h.slot.Payload)); start < limit { // the slot, or the heap's position in a chunk
		if inPlace {
			h.stored += min(uint64(len(pkt.Payload)), limit-start)
		} else {
			h.stored += uint64(copy(h.slot.Payload[start:], pkt.Payload))
		}
	}
	h.received += uint64(len(pkt.Payload))
	h.packets++
	a.p.Add(ring.CounterPackets, 1)
	a.p.Add(ring.CounterBytes, uint64(len(pkt.Payload)))
	complete := h.hasLength && h.received == h.heapLength && h.extent <= h.heapLength
	a.pl.accepted(h, start, end, pkt.Size-len(pkt.Payload), complete)
	if complete {
		a.publish(h, true)
	}
}

// consistent applies spead2's sanity checks of a packet against the heap it joins.
func (a *Assembler) consistent(h *liveHeap, pkt *spead.Packet) bool {
	if pkt.Flavour != h.flavour {
		return false
	}
	if pkt.HasHeapLength {
		if h.hasLength && pkt.HeapLength != h.heapLength {
			return false
		}
		if pkt.HeapLength < h.extent {
			return false
		}
	}
	return true
}

// addPointers appends the packet's item pointers to the heap's list, skipping the per-packet ids
// 0x1–0x4 and pointers an earlier packet of the heap already gave.
func (a *Assembler) addPointers(h *liveHeap, pkt *spead.Packet) {
	ps := pkt.Pointers
	// Decode found immediate heap cnt, payload offset and payload length, and maybe heap length, each
	// with a distinct id: if that is all the pointers there are, the packet has nothing for the list.
	// This is every packet but a heap's first in spead2_send's layout.
	specials := 3
	if pkt.HasHeapLength {
		specials = 4
	}
	if ps.Len() == specials {
		return
	}
	seen := len(h.pointers)
	for i := range ps.Len() {
		raw := ps.Raw(i)
		ip := pkt.Flavour.SplitPointer(raw)
		if ip.ID >= spead.HeapCntID && ip.ID <= spead.PayloadLengthID {
			// spead2 keeps such an addressed pointer out of the item list but lets its address bound
			// the heap (min_length).
			if !ip.Immediate {
				h.extent = max(h.extent, ip.Value)
			}
			continue
		}
		if seen > 0 && h.seen.contains(raw) {
			continue
		}
		if len(h.pointers) == cap(h.pointers) {
			h.pointersLost = true
			continue
		}
		if !ip.Immediate {
			h.extent = max(h.extent, ip.Value)
			if ip.ID == spead.DescriptorID {
				h.descAt = min(h.descAt, ip.Value)
			}
		}
		h.pointers = append(h.pointers, raw)
	}
	// Only now: within one packet pointers are not deduplicated, across packets they are.
	for _, raw := range h.pointers[seen:] {
		h.seen.add(raw)
	}
}

// rangeResult is the outcome of recording a packet's payload range.
type rangeResult uint8

const (
	rangeAdded rangeResult = iota
	rangeDuplicate
	rangeOverflow
)

// addRange records [start, end) as received unless it overlaps a range already received. The set stays
// sorted and coalesced, so in-order packets keep it at one range and the common case is a single
// comparison with the last range.
func (h *liveHeap) addRange(start, end uint64) rangeResult {
	rs := h.ranges
	n := len(rs)
	if n > 0 && rs[n-1].end <= start {
		if rs[n-1].end == start {
			rs[n-1].end = end
			return rangeAdded
		}
		return h.insertRange(n, start, end)
	}
	// First range after start: everything before it starts at or before start.
	i, _ := slices.BinarySearchFunc(rs, start, func(r byteRange, s uint64) int {
		switch {
		case r.start <= s:
			return -1
		default:
			return 1
		}
	})
	if i > 0 && rs[i-1].end > start {
		return rangeDuplicate
	}
	if i < n && rs[i].start < end {
		return rangeDuplicate
	}
	joinPrev := i > 0 && rs[i-1].end == start
	joinNext := i < n && rs[i].start == end
	switch {
	case joinPrev && joinNext:
		rs[i-1].end = rs[i].end
		h.ranges = slices.Delete(rs, i, i+1)
	case joinPrev:
		rs[i-1].end = end
	case joinNext:
		rs[i].start = start
	default:
		return h.insertRange(i, start, end)
	}
	return rangeAdded
}

func (h *liveHeap) insertRange(i int, start, end uint64) rangeResult {
	if len(h.ranges) >= maxRanges {
		return rangeOverflow
	}
	h.ranges = slices.Insert(h.ranges, i, byteRange{start, end})
	return rangeAdded
}

// covered reports whether [start, end) was received entirely.
func (h *liveHeap) covered(start, end uint64) bool {
	if start == end {
		return true
	}
	for _, r := range h.ranges {
		if r.start <= start && end <= r.end {
			return true
		}
	}
	return false
}

// complete reports whether an ending heap has all its payload. Without a heap length that means the
// payload is contiguous up to its furthest byte or item address (spead2's is_contiguous); ranges never
// overlap, so the byte count is enough.
func (h *liveHeap) complete() bool {
	if h.hasLength {
		return h.received == h.heapLength && h.extent <= h.heapLength
	}
	return h.received == h.extent
}

// finish ends a live heap that is leaving the window (eviction, Flush, stream stop): it is published, or
// counted and discarded if it is incomplete and the configuration does not want incomplete heaps.
func (a *Assembler) finish(h *liveHeap) {
	switch h.state {
	case heapAssembling:
		complete := h.complete()
		if a.pl.ended(h, complete) {
			if complete {
				a.recent.add(h.cnt, h.firstNanos)
			}
			a.release(h)
			return
		}
		if !complete && !a.cfg.Incomplete {
			a.p.Add(ring.CounterIncompleteHeaps, 1)
			a.p.Add(ring.CounterDiscardedIncompleteHeaps, 1)
			a.p.Discard(h.slot)
			a.release(h)
			return
		}
		a.publish(h, complete)
	case heapDropped:
		a.release(h)
	}
}

// release frees a window entry.
func (a *Assembler) release(h *liveHeap) {
	h.state = heapFree
	h.slot, h.chunk = nil, nil
}

// evictChunk ends every live heap placed in chunk c, which is about to be published: nothing may write
// into a chunk once a consumer can read it.
func (a *Assembler) evictChunk(c *openChunk) {
	for i := range a.window {
		if h := &a.window[i]; h.state == heapAssembling && h.chunk == c {
			a.finish(h)
		}
	}
}

// publish writes h's item table and descriptor into the ring and frees its window entry.
func (a *Assembler) publish(h *liveHeap, complete bool) {
	if a.pl.ended(h, complete) {
		if complete {
			a.recent.add(h.cnt, h.firstNanos)
		}
		a.release(h)
		return
	}
	heapSize := h.heapLength
	flags := uint32(0)
	if !h.hasLength {
		heapSize = h.received
		flags |= ring.FlagNoHeapSize
	}
	// Item lengths run to the heap's end as far as it is known: its length, else its furthest extent.
	itemsEnd := h.heapLength
	if !h.hasLength {
		itemsEnd = h.extent
	}
	// COMPLETE says every byte is in the slot: never with TRUNCATED (spec §4.1). A cut heap whose bytes
	// all arrived is TRUNCATED alone; one with holes too is INCOMPLETE|TRUNCATED.
	truncated := itemsEnd > a.slotSize
	switch {
	case !complete:
		flags |= ring.FlagIncomplete
		a.p.Add(ring.CounterIncompleteHeaps, 1)
	case !truncated:
		flags |= ring.FlagComplete
	}
	if truncated {
		flags |= ring.FlagTruncated
		a.p.Add(ring.CounterTruncatedHeaps, 1)
		if a.cfg.OnTruncated != nil {
			a.cfg.OnTruncated(itemsEnd)
		}
	}
	flags |= a.fillItems(h, itemsEnd)
	if h.pointersLost {
		flags |= ring.FlagItemsOverflow
	}
	a.p.Publish(h.slot, ring.HeapInfo{
		HeapCnt:     h.cnt,
		HeapSize:    heapSize,
		Received:    h.stored,
		TimestampNs: uint64(h.firstNanos),
		Flags:       flags,
		Packets:     h.packets,
	})
	a.p.Add(ring.CounterHeaps, 1)
	if complete {
		a.recent.add(h.cnt, h.firstNanos)
	}
	a.release(h)
}

// fillItems writes h's item table into its slot (spec §5) and returns the flags it implies.
func (a *Assembler) fillItems(h *liveHeap, itemsEnd uint64) (flags uint32) {
	immediateBytes := uint64(h.flavour.ImmediateBytes())
	ptrs := h.pointers
	a.addressLengths(h, itemsEnd)
	hasDescriptors := false
	for i, raw := range ptrs {
		ip := h.flavour.SplitPointer(raw)
		if ip.ID == spead.NullID {
			continue
		}
		it := ring.Item{ID: ip.ID, Value: ip.Value}
		if ip.Immediate {
			it.Length, it.Flags = immediateBytes, ring.ItemImmediate
		} else {
			length := a.lengths[i]
			if length == 0 {
				continue // empty: spead2 skips it
			}
			if ip.ID == spead.DescriptorID {
				hasDescriptors = true // read from the slot or, past it, from descTail
			}
			if ip.Value >= a.slotSize {
				flags |= ring.FlagItemsCut // wholly past the slot of a truncated heap: left out, said so
				continue
			}
			it.Length = min(length, a.slotSize-ip.Value)
			if it.Length < length {
				it.Flags |= ring.ItemCut // runs past the slot: its first bytes only
			}
		}
		h.slot.AddItem(it)
	}
	if hasDescriptors {
		flags |= ring.FlagHasDescriptors
		a.readDescriptors(h)
	}
	return flags
}

// addressLengths sets a.lengths[i] for every address pointer i of h: the distance to the next address
// in address order (ties in wire order), the last running to itemsEnd, never past itemsEnd.
func (a *Assembler) addressLengths(h *liveHeap, itemsEnd uint64) {
	refs := a.sortScratch[:0]
	for i, raw := range h.pointers {
		if ip := h.flavour.SplitPointer(raw); !ip.Immediate {
			refs = append(refs, addressRef{address: ip.Value, index: i})
		}
	}
	if len(refs) > 1 {
		// (address, wire index) is a total order, so an unstable sort gives the stable result.
		slices.SortFunc(refs, func(x, y addressRef) int {
			if x.address != y.address {
				if x.address < y.address {
					return -1
				}
				return 1
			}
			return x.index - y.index
		})
	}
	for k, r := range refs {
		end := itemsEnd
		if k+1 < len(refs) {
			end = min(refs[k+1].address, itemsEnd)
		}
		a.lengths[r.index] = 0
		if r.address < end {
			a.lengths[r.index] = end - r.address
		}
	}
	a.sortScratch = refs[:0]
}

// readDescriptors parses the item descriptors of h that arrived whole and, if any did, rewrites the
// stream's descriptor table in the ring. Descriptors are rare, so this path may allocate.
func (a *Assembler) readDescriptors(h *liveHeap) {
	changed := false
	for i, raw := range h.pointers { // not the slot's table: a cut heap's descriptors may lie past the slot
		ip := h.flavour.SplitPointer(raw)
		if ip.ID != spead.DescriptorID || ip.Immediate || a.lengths[i] == 0 {
			continue
		}
		b := h.descBytes(ip.Value, ip.Value+a.lengths[i], a.slotSize)
		if b == nil {
			continue
		}
		d, err := spead.ParseDescriptor(b)
		if err != nil {
			a.badDescriptors.Add(1)
			continue
		}
		if _, known := a.descriptors[d.ID]; !known {
			a.descriptorOrder = append(a.descriptorOrder, d.ID)
		}
		a.descriptors[d.ID] = ringDescriptor(d)
		changed = true
	}
	if !changed {
		return
	}
	all := make([]ring.ItemDescriptor, 0, len(a.descriptorOrder))
	for _, id := range a.descriptorOrder {
		all = append(all, a.descriptors[id])
	}
	if err := a.p.SetDescriptors(all); err != nil && a.cfg.Log != nil {
		a.cfg.Log.Warn().Err(err).Msg("spead: item descriptors not published to the ring")
	}
}

// ringDescriptor converts a parsed descriptor to the ring's record: the format back to its raw wire
// form, the shape from the numpy header when there is one (it supersedes the shape field).
func ringDescriptor(d spead.Descriptor) ring.ItemDescriptor {
	rd := ring.ItemDescriptor{ID: d.ID, Name: d.Name, Description: d.Description, DType: d.DType}
	if len(d.Format) > 0 {
		// Parsed in d.Flavour's field width, every bit count fits it: FormatBytes cannot fail here.
		rd.Format, _ = spead.FormatBytes(d.Format, d.Flavour)
	}
	if d.DType != "" {
		rd.Shape, rd.ShapeKnown = d.NumpyShape()
	} else {
		rd.Shape, rd.ShapeKnown = d.Shape, true
	}
	return rd
}

// Flush ends the input: every live heap is published, or counted and discarded if incomplete and
// incomplete heaps are not wanted. It does not publish the end-of-stream marker: only a stream-stop item
// says the stream ended; the caller decides what the end of its input means.
func (a *Assembler) Flush() {
	a.flushWindow()
	a.pl.release()
}

// flushWindow finishes the live heaps in order of first arrival, so a consumer sees older heaps first.
func (a *Assembler) flushWindow() {
	for {
		oldest := -1
		for i := range a.window {
			if h := &a.window[i]; h.state != heapFree && (oldest < 0 || h.arrival < a.window[oldest].arrival) {
				oldest = i
			}
		}
		if oldest < 0 {
			return
		}
		a.finish(&a.window[oldest])
	}
}

// stop handles a stream-stop packet: the stop packet itself is not data and is never published; the live
// heaps are flushed (published, or counted and discarded), the end-of-stream marker published and Done
// closed.
func (a *Assembler) stop(pkt *spead.Packet) {
	if a.cfg.KeepGoing {
		a.endStream(pkt)
		return
	}
	a.stopped = true
	// A live heap with the stop's cnt (data packets of the stop heap, or a data heap whose cnt the stop
	// reuses) cannot be complete — a complete heap has left the window — so flushWindow below counts it as
	// incomplete (and publishes it with Incomplete), as spead2 does: it must not vanish uncounted.
	a.p.Add(ring.CounterPackets, 1)
	a.p.Add(ring.CounterBytes, uint64(len(pkt.Payload)))
	a.flushWindow()
	a.pl.release()
	if err := a.p.PublishEndOfStream(pkt.HeapCnt, a.cfg.EOSTimeout); err != nil && a.cfg.Log != nil {
		a.cfg.Log.Warn().Err(err).Msg("spead: stream stopped but the end-of-stream marker found no slot")
	}
	close(a.done)
}

// endStream handles a stream-stop packet under KeepGoing: as stop, but the marker is STREAM_END and the
// assembler goes on. The recently-published cnts are forgotten: the next stream may reuse them, and a
// packet of such a heap is a new heap, not a late copy.
func (a *Assembler) endStream(pkt *spead.Packet) {
	a.p.Add(ring.CounterPackets, 1)
	a.p.Add(ring.CounterBytes, uint64(len(pkt.Payload)))
	a.flushWindow()
	a.pl.release()
	a.recent.reset()
	err := a.p.PublishStreamEnd(pkt.HeapCnt, a.cfg.EOSTimeout)
	if err != nil && a.cfg.Log != nil {
		a.cfg.Log.Warn().Err(err).Uint64("stop_heap_cnt", pkt.HeapCnt).Msg("spead: stream stopped but the stream-end marker found no slot")
	}
	if a.cfg.OnStreamEnd != nil {
		a.cfg.OnStreamEnd(pkt.HeapCnt, err)
	}
}
