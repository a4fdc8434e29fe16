package assemble

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
)

// Errors a chunk placer's heapSlot gives for a heap it does not place (begin counts neither as dropped):
// errNotPlaced, it counted the heap already (too_old_heaps, rejected_heaps); errDuplicateHeap, the heap's
// position is filled or being filled by another heap, so its packets count as duplicate_packets.
var (
	errNotPlaced     = errors.New("spead: heap not placed in a chunk")
	errDuplicateHeap = errors.New("spead: heap for a chunk position already filled")
)

// Placement decides where each heap of a chunk-mode ring lands, as spead2's chunk_place does: a heap's
// chunk, its position in the chunk and its byte offset there. The Assembler's chunk placer asks it for
// every heap it begins and does the rest (the window of open chunks, a slot per chunk, the presence map,
// publication, the counters). Two are built in: ItemPlacement, the ring's time and axis items (the
// default), and recv --chunk-place's C function (spead2's chunk_place, loaded at run time); a Go program
// that assembles heaps itself can give its own (AssemblerConfig.Placement).
type Placement interface {
	// Items are the ids of the immediate items whose values Place gets, in this order (at most
	// MaxChunkPlaceItems). NewAssembler asks once and keeps a copy.
	Items() []uint64
	// Place is where heap cnt goes. size is its heap length (ChunkPlaceMissing when the packet has none);
	// items the values of Items' immediate items in the heap's first packet, in order (ChunkPlaceMissing
	// for an item it lacks). It returns the chunk id, the position in the chunk (time-major, axis within,
	// below heaps × axis) and the heap's byte offset in its position; ok false rejects the heap. The
	// answer is checked: a position out of range, or an offset that leaves the heap no room, rejects the
	// heap too. A rejected heap is counted (rejected_heaps) and nothing of it is written.
	//
	// It is called on the Assembler's goroutine, once per heap unless that heap's first packet comes
	// again (a call whose inputs equal the previous call's is not repeated: its answer is reused), so it
	// must be a function of its inputs. It must not keep items, and should not allocate: it runs on the
	// hot path.
	Place(cnt, size uint64, items []uint64) (chunk, pos, offset uint64, ok bool)
}

// ChunkPlaceFunc is Placement's Place as a function (FuncPlacement makes it a Placement).
type ChunkPlaceFunc func(cnt, size uint64, items []uint64) (chunk, pos, offset uint64, ok bool)

// FuncPlacement is a Placement made of a function and the items whose values it gets.
type FuncPlacement struct {
	ItemIDs []uint64
	Func    ChunkPlaceFunc
}

// Items implements Placement.
func (f FuncPlacement) Items() []uint64 { return f.ItemIDs }

// Place implements Placement.
func (f FuncPlacement) Place(cnt, size uint64, items []uint64) (chunk, pos, offset uint64, ok bool) {
	return f.Func(cnt, size, items)
}

// ItemPlacement is a chunk-mode ring's own placement (spec §13), spead2's chunk stream: a heap's time item
// divided by the step and its axis item give its chunk and its position there, at offset 0. A heap that
// lacks either item, or whose axis is out of range, is rejected.
type ItemPlacement struct {
	Geometry ring.ChunkGeometry
}

// Items implements Placement: the time item, then the axis item if the geometry has one.
func (ip *ItemPlacement) Items() []uint64 {
	if ip.Geometry.AxisItem == 0 { // a null item stands for "no axis"
		return []uint64{ip.Geometry.TimeItem}
	}
	return []uint64{ip.Geometry.TimeItem, ip.Geometry.AxisItem}
}

// Place implements Placement.
func (ip *ItemPlacement) Place(_, _ uint64, items []uint64) (chunk, pos, offset uint64, ok bool) {
	g := &ip.Geometry
	// A ring's geometry is validated (a step and heaps per chunk); a zero one places nothing.
	if len(items) == 0 || items[0] == ChunkPlaceMissing || g.Step == 0 || g.Heaps == 0 {
		return 0, 0, 0, false
	}
	t, a := items[0]/g.Step, uint64(0)
	if g.AxisItem != 0 {
		if len(items) < 2 || items[1] == ChunkPlaceMissing || items[1] >= uint64(g.Axis) {
			return 0, 0, 0, false
		}
		a = items[1]
	}
	heaps := uint64(g.Heaps)
	return t / heaps, (t%heaps)*uint64(g.Axis) + a, 0, true
}

// ChunkPlaceMissing stands, in Placement's Place, for an item (or heap length) a heap's packet does not
// carry: no immediate value is this large (they have at most 56 bits).
const ChunkPlaceMissing = ^uint64(0)

// MaxChunkPlaceItems bounds a Placement's Items (each is looked for in every first packet).
const MaxChunkPlaceItems = 64

// defaultChunkWindow is how many chunks are open at once unless AssemblerConfig.ChunkWindow says.
const defaultChunkWindow = 2

// maxChunkWindow bounds the open chunks (each holds a ring slot and a position table).
const maxChunkWindow = 1 << 10

// maxChunkLiveHeaps bounds the heaps under assembly in chunk mode (AssemblerConfig.MaxHeaps), where they
// do not hold slots: each has its own preallocated bookkeeping.
const maxChunkLiveHeaps = 1 << 12

// Position states of an open chunk, private to the placer (the ring's presence map holds only 0 and 1).
const (
	posEmpty   uint8 = iota
	posFilling       // a live heap is being received into it
	posPresent       // a complete heap is in it
)

// openChunk is one chunk of the window: the ring slot it fills, its positions' states and what arrived.
type openChunk struct {
	id       uint64
	slot     *ring.Slot // nil: no heap arrived for it yet, or no slot was free (its heaps were dropped)
	noSlot   bool       // Acquire failed: its heaps are dropped, not retried per heap
	state    []uint8    // per position
	present  int        // positions in posPresent
	received uint64
	packets  uint32
	firstNs  uint64
}

// chunkPlacer places heaps into chunks (spec §13), spead2's chunk stream: its Placement (by default a
// heap's time item, divided by the step, and axis item) gives a heap's chunk and its position there; the heap is received straight into that
// position, so a chunk is one slot whose payload is every heap of a time range in order, with a presence
// map after it. W chunks are open at once, [oldest, oldest+W); a heap for a later chunk moves the window,
// publishing the chunks it passes (incomplete ones flagged), a heap for an earlier one is too old — unless
// it is more than W chunks earlier: then the time index jumped, and the window re-bases to it (counted).
// Chunks are published in id order between re-bases: when the oldest is full, when the window moves past
// them, at the end.
//
// Guesses (transport.Placer): the next packet of the heap the latest packet joined, inside its position;
// then the next heaps, one position after the other from the latest heap's (time-major, axis within),
// in open chunks, as long as the last heap that completed, in packets as long as the latest first one.
type chunkPlacer struct {
	follower
	lastID, lastPos uint64    // the chunk and position of the heap begun last
	aheadView       ring.Slot // expected's answer for a heap not begun
	p               *ring.Producer
	g               ring.ChunkGeometry
	chunks          []openChunk // the window, chunk id mod W
	oldest          uint64      // the window's first chunk id
	started         bool        // a heap has set the window
	evict           func(*openChunk)
	rebases         *atomic.Uint64 // the Assembler's count of window re-bases (spec §13.4)
	// retiring: a chunk is being retired, its live heaps ended; ended must not retire it a second time.
	retiring bool
	// Where heaps go (AssemblerConfig.Placement, else the ring's time and axis items).
	placement Placement
	custom    bool     // the placement is the config's, not the built-in ItemPlacement
	itemIDs   []uint64 // the item ids whose values it gets
	vals      []uint64 // scratch: their values in the packet being placed
	memo      placeMemo
	// spanNs is how long a full chunk takes, from its first heap to the heap that completes it (their first
	// packets' receive times), a moving average over the chunks completed in order that gives each a
	// quarter of the weight, and falls at once to a span less than half of it (the stream sped up).
	// 0: no chunk completed yet.
	spanNs int64
}

// placeMemo is the placement's last call: its inputs and its answer.
type placeMemo struct {
	valid        bool
	cnt, size    uint64
	vals         []uint64
	id, pos, off uint64
	ok           bool
}

var _ placer = (*chunkPlacer)(nil)

func newChunkPlacer(p *ring.Producer, window int, placement Placement, evict func(*openChunk), rebases *atomic.Uint64) (*chunkPlacer, error) {
	if window == 0 {
		window = defaultChunkWindow
	}
	geo := p.Geometry()
	if window < 1 || window > maxChunkWindow || uint64(window) > geo.SlotCount {
		return nil, fmt.Errorf("spead: chunk window %d must be in 1..%d and at most the ring's %d slots",
			window, maxChunkWindow, geo.SlotCount)
	}
	cp := &chunkPlacer{p: p, g: p.Chunks(), chunks: make([]openChunk, window), evict: evict, rebases: rebases}
	for i := range cp.chunks {
		cp.chunks[i].state = make([]uint8, cp.g.Positions())
	}
	cp.placement, cp.custom = placement, placement != nil
	if placement == nil {
		cp.placement = &ItemPlacement{Geometry: cp.g}
	}
	ids := cp.placement.Items()
	if len(ids) > MaxChunkPlaceItems {
		return nil, fmt.Errorf("spead: %d chunk placement items: at most %d", len(ids), MaxChunkPlaceItems)
	}
	cp.itemIDs = slices.Clone(ids)
	cp.vals, cp.memo.vals = make([]uint64, len(ids)), make([]uint64, len(ids))
	return cp, nil
}

// place is heap pkt's chunk id, its position in the chunk and its offset there, as the placement answers
// for its cnt, heap length and items among the packet's immediate items (unless its inputs are the
// previous call's: the Assembler may look a heap's first packet up more than once), checked against the
// geometry. ok false: the heap is rejected (the placement rejected it, or gave a place out of range or
// one that leaves the heap no room).
func (cp *chunkPlacer) place(pkt *spead.Packet) (id, pos, off uint64, ok bool) {
	vals := cp.vals
	for i := range vals {
		vals[i] = ChunkPlaceMissing
	}
	ps := pkt.Pointers
	for i := range ps.Len() {
		ip := pkt.Flavour.SplitPointer(ps.Raw(i))
		if !ip.Immediate {
			continue
		}
		for j, want := range cp.itemIDs {
			if ip.ID == want {
				vals[j] = ip.Value
			}
		}
	}
	size := ChunkPlaceMissing
	if pkt.HasHeapLength {
		size = pkt.HeapLength
	}
	m := &cp.memo
	if !m.valid || m.cnt != pkt.HeapCnt || m.size != size || !slices.Equal(m.vals, vals) {
		m.id, m.pos, m.off, m.ok = cp.placement.Place(pkt.HeapCnt, size, vals)
		m.valid, m.cnt, m.size = true, pkt.HeapCnt, size
		copy(m.vals, vals)
	}
	hs := cp.g.HeapSize
	if !m.ok || m.pos >= cp.g.Positions() || m.off >= hs || pkt.HasHeapLength && pkt.HeapLength > hs-m.off {
		return 0, 0, 0, false
	}
	return m.id, m.pos, m.off, true
}

func (cp *chunkPlacer) heapSlot(h *liveHeap, pkt *spead.Packet) (*ring.Slot, error) {
	id, pos, off, ok := cp.place(pkt)
	if !ok {
		cp.p.Add(ring.CounterRejectedHeaps, 1)
		return nil, errNotPlaced
	}
	if !cp.started {
		cp.started, cp.oldest = true, id
	}
	w := uint64(len(cp.chunks))
	if d := id - cp.oldest; int64(d) < 0 && cp.oldest-id <= w {
		cp.p.Add(ring.CounterTooOldHeaps, 1)
		return nil, errNotPlaced
	} else if int64(d) < 0 {
		// More than a window behind: not a late heap but a time index that jumped (a sender restarted, or
		// an earlier heap carried a wild one). Re-base, or every later heap would be too old (spec §13.4).
		cp.advance(cp.oldest + w)
		cp.oldest = id
		cp.rebases.Add(1)
	} else if d >= w {
		cp.advance(id - w + 1)
	}
	c := &cp.chunks[id%w]
	if c.slot == nil && !c.noSlot {
		if err := cp.take(c, id); err != nil {
			return nil, err
		}
	}
	if c.noSlot {
		return nil, ring.ErrFull
	}
	if c.state[pos] != posEmpty {
		return nil, errDuplicateHeap
	}
	c.state[pos] = posFilling
	h.chunk, h.chunkPos, h.chunkOff = c, pos, off
	h.view = cp.view(c, pos, off)
	cp.lastID, cp.lastPos = id, pos
	return &h.view, nil
}

// view is position pos of chunk c from byte off on (off < the heap size) as a slot of its own.
func (cp *chunkPlacer) view(c *openChunk, pos, off uint64) ring.Slot {
	start, end := pos*cp.g.HeapSize, (pos+1)*cp.g.HeapSize
	return ring.Slot{Index: c.slot.Index, Payload: c.slot.Payload[start+off : end : end]}
}

// openChunk is chunk id's window entry if the chunk is open with a slot, else nil.
func (cp *chunkPlacer) open(id uint64) *openChunk {
	w := uint64(len(cp.chunks))
	if !cp.started || id-cp.oldest >= w {
		return nil
	}
	if c := &cp.chunks[id%w]; c.slot != nil && c.id == id {
		return c
	}
	return nil
}

// take takes a slot for chunk id and clears its presence map; a heap whose chunk finds no slot is dropped,
// and so are the chunk's other heaps.
func (cp *chunkPlacer) take(c *openChunk, id uint64) error {
	c.id, c.present, c.received, c.packets, c.firstNs = id, 0, 0, 0, 0
	clear(c.state)
	s, err := cp.p.Acquire()
	if err != nil {
		c.noSlot = true
		return err
	}
	c.slot = s
	clear(cp.g.Presence(s.Payload))
	return nil
}

// advance moves the window's start to oldest, publishing the chunks it passes in id order.
func (cp *chunkPlacer) advance(oldest uint64) {
	w := uint64(len(cp.chunks))
	for n := uint64(0); cp.oldest != oldest && n < w; n++ {
		cp.retire(&cp.chunks[cp.oldest%w])
		cp.oldest++
	}
	cp.oldest = oldest // a jump past the whole window: every chunk in it was retired above
}

// retire publishes a window entry's chunk if it has one (its live heaps ended first) and frees the entry.
func (cp *chunkPlacer) retire(c *openChunk) {
	if c.slot != nil {
		cp.retiring = true
		cp.evict(c)
		cp.retiring = false
		cp.p.PublishChunk(c.slot, ring.ChunkInfo{ID: c.id, Received: c.received, Packets: c.packets, TimestampNs: c.firstNs})
	}
	c.slot, c.noSlot = nil, false
}

// awaits is what Assembler.Awaits measures in chunk mode: how long until the chunk in assembly is
// complete — that of h, the heap the latest packet joined, while h is live; else (the packet completed
// h: every heap of one packet) the chunk of the heap begun last, while it is open. Without the second case
// a stream of one-packet heaps never coalesced in chunk mode.
//
// A chunk's own rate says little: its heaps' receive times are read times, so the first few, read together
// after a sleep, look instantaneous, and one read alone looks slow (its own rate made recv wake about six
// times per chunk of 64 one-packet heaps). So the estimate is the span of the chunks before it (spanNs)
// from its first heap; with no span yet, or once the span has passed, the rest at its own rate. A stream
// that slows down only costs more wakes. One that speeds up may have a chunk complete during a sleep,
// after which it is read (by less than the sleep, a share of the estimate: see the udp source's
// awaitShare); from twice as fast, only the first chunk at the new pace. Its bytes are those of its heaps
// that ended, and h's: its other live heaps are not counted, so its own rate can only overstate what is
// left.
func (cp *chunkPlacer) awaits(h *liveHeap, live bool, nowNanos int64) (left time.Duration, ok bool) {
	c := h.chunk
	if !live {
		c = cp.open(cp.lastID)
	}
	if c == nil || c.slot == nil {
		return 0, false
	}
	have, first := c.received, int64(c.firstNs)
	if live {
		have += h.stored
		if first == 0 || h.firstNanos < first {
			first = h.firstNanos
		}
	}
	if first == 0 {
		return 0, false
	}
	total := cp.g.Bytes()
	own, ok := timeLeft(total, have, nowNanos-first)
	if !ok || cp.spanNs == 0 {
		return own, ok
	}
	if span := time.Duration(first + cp.spanNs - nowNanos); span > 0 {
		return span, true
	}
	return own, true
}

// learnSpan learns from a chunk completed in order that took span ns from its first heap to its last.
func (cp *chunkPlacer) learnSpan(span int64) {
	switch {
	case span <= 0:
	case cp.spanNs == 0 || 2*span < cp.spanNs:
		cp.spanNs = span
	default:
		cp.spanNs += (span - cp.spanNs) / 4
	}
}

// ended records a heap leaving the window in its chunk: present if it is complete, fits its position and
// has a payload, else its position is free again (rejected if too long or empty). Full chunks at the window's start are published.
func (cp *chunkPlacer) ended(h *liveHeap, complete bool) bool {
	c := h.chunk
	if c == nil {
		return true // its chunk was retired meanwhile (cannot happen: retire evicts first)
	}
	c.received += h.stored
	c.packets += h.packets
	room := cp.g.HeapSize - h.chunkOff // the position's bytes from the heap's offset on
	switch {
	case h.extent > room || h.hasLength && h.heapLength > room:
		cp.p.Add(ring.CounterRejectedHeaps, 1) // a heap without a length that ran past its position
		c.state[h.chunkPos] = posEmpty
	case complete && h.extent == 0:
		// No payload: no byte of its position is its own (a reused slot holds an earlier chunk's there), so
		// it cannot be present (spec §13.4).
		cp.p.Add(ring.CounterRejectedHeaps, 1)
		c.state[h.chunkPos] = posEmpty
	case complete:
		c.state[h.chunkPos] = posPresent
		cp.g.Presence(c.slot.Payload)[h.chunkPos] = 1
		c.present++
		cp.p.Add(ring.CounterHeaps, 1)
	default:
		cp.p.Add(ring.CounterIncompleteHeaps, 1)
		c.state[h.chunkPos] = posEmpty
	}
	if c.firstNs == 0 || uint64(h.firstNanos) < c.firstNs {
		c.firstNs = uint64(h.firstNanos)
	}
	h.chunk = nil
	w := uint64(len(cp.chunks))
	for !cp.retiring {
		front := &cp.chunks[cp.oldest%w]
		if front.slot == nil || uint64(front.present) != cp.g.Positions() {
			break
		}
		cp.learnSpan(h.firstNanos - int64(front.firstNs))
		cp.retire(front)
		cp.oldest++
	}
	return true
}

func (cp *chunkPlacer) guess(dst [][]byte) (hdrLen, n int) {
	hdrLen, step := cp.nextStep()
	if step == 0 || hdrLen == 0 {
		return 0, 0
	}
	n, ok := cp.regions(dst, step)
	if !ok {
		return 0, 0
	}
	hs := cp.g.HeapSize
	if cp.nextLength == 0 || cp.nextLength > hs || cp.firstLen == 0 || cp.firstHdr != hdrLen {
		return hdrLen, n
	}
	id, pos := cp.lastID, cp.lastPos
	for n < len(dst) {
		if pos++; pos == cp.g.Positions() {
			id, pos = id+1, 0
		}
		c := cp.open(id)
		if c == nil || c.state[pos] != posEmpty {
			break
		}
		v := cp.view(c, pos, 0)
		n += fillRegions(dst[n:], v.Payload, 0, cp.nextLength, cp.firstLen)
	}
	return hdrLen, n
}

func (cp *chunkPlacer) expected(pkt *spead.Packet) (*liveHeap, *ring.Slot) {
	if h := cp.live(); h != nil && h.cnt == pkt.HeapCnt {
		return h, nil
	}
	// A heap not begun: its own position, if its chunk is open and nothing is there yet. A configured
	// placement is asked only for a heap's first packet (the one with its items): its other packets
	// would be asked about one by one while the heap is not the latest.
	if cp.custom && pkt.PayloadOffset != 0 {
		return nil, nil
	}
	id, pos, off, ok := cp.place(pkt)
	if !ok {
		return nil, nil
	}
	c := cp.open(id)
	if c == nil || c.state[pos] != posEmpty {
		return nil, nil
	}
	cp.aheadView = cp.view(c, pos, off)
	return nil, &cp.aheadView
}

// release publishes every open chunk in id order: the input ended, or the stream stopped (the Assembler
// has ended its live heaps first).
func (cp *chunkPlacer) release() {
	cp.advance(cp.oldest + uint64(len(cp.chunks)))
}
