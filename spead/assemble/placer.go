package assemble

import (
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
)

// placer decides where heaps land in the ring. The Assembler owns reassembly (the live-heap window,
// received ranges, item tables, publication); a placer owns which slot a heap is read into and what the
// accepted packets teach about the packets still to come. spead2 splits its receiver the same way (a
// heap's memory comes from an allocator, a chunk stream places heaps into chunks).
//
// streamPlacer is the placement every stream has: one slot per heap, and for a source that reads payloads
// straight into place (transport.Placer), guesses of where the next datagrams belong. chunkPlacer
// (chunks.go) is the second: heaps placed by their items into the positions of chunks (spec §13). One goroutine calls a placer (the Assembler's).
type placer interface {
	// heapSlot is where heap h.cnt, which begins now with packet pkt, goes: a slot the placer took ahead
	// for it, else one from the pool (ring.ErrFull or ring.ErrClosed when there is none); a chunk placer
	// returns a view of the heap's position in its chunk (h.view), or errNotPlaced when it counted the heap
	// as too old or rejected, or errDuplicateHeap.
	heapSlot(h *liveHeap, pkt *spead.Packet) (*ring.Slot, error)
	// accepted learns from a packet just accepted into h, its payload at [start, end) after hdrLen
	// header bytes; complete: h is now whole and about to be published.
	accepted(h *liveHeap, start, end uint64, hdrLen int, complete bool)
	// ended takes a heap that leaves the window (complete or not) if the placer publishes heaps itself
	// (chunks); false: the Assembler publishes or discards it.
	ended(h *liveHeap, complete bool) bool
	// guess fills dst with the regions where the next datagrams' payloads are expected, each after a
	// hdrLen-byte header (transport.Placer's Place). n == 0: no guess.
	guess(dst [][]byte) (hdrLen, n int)
	// expected is where packet pkt's payload was guessed to go: into live, the heap the latest packet
	// joined, or into a slot (a chunk position) taken ahead for a heap not begun yet (live nil); nil, nil:
	// nowhere. It changes nothing the Assembler can see.
	expected(pkt *spead.Packet) (live *liveHeap, ahead *ring.Slot)
	// release gives every slot held for heaps not begun back to the pool; a chunk placer publishes its
	// open chunks (the input ended).
	release()
}

// follower follows the heap the latest accepted packet joined and guesses that its next packet comes
// right after it, as long as it, up to the end of the heap's slot (or position) and length. It also keeps
// what both placers guess the next heaps from: the length of the last heap that completed and the
// lengths of the latest first packet of a heap. Its accepted is both placers'.
type follower struct {
	heap   *liveHeap
	cnt    uint64
	next   uint64
	length uint64
	hdrLen int
	// The length of the last heap that completed (0: no guess), the payload and header length of the
	// latest first packet (offset 0) of a heap.
	nextLength uint64
	firstLen   uint64
	firstHdr   int
	// The payload and header length of the latest packet that was neither its heap's first nor its last,
	// and whether the latest packet was a first one.
	restLen     uint64
	restHdr     int
	latestFirst bool
}

func (f *follower) accepted(h *liveHeap, start, end uint64, hdrLen int, complete bool) {
	f.heap, f.cnt, f.next, f.length, f.hdrLen = h, h.cnt, end, end-start, hdrLen
	f.latestFirst = start == 0
	if start == 0 {
		f.firstLen, f.firstHdr = f.length, hdrLen
	} else if !h.hasLength || end < h.heapLength {
		f.restLen, f.restHdr = f.length, hdrLen // not its heap's last packet, which may be shorter
	}
	if complete {
		f.nextLength = h.heapLength
	}
}

// nextStep is the header length and payload length the live heap's next packets are expected with: the
// latest packet's, or after a heap's first packet, which may carry more item pointers than the rest
// (spead2 sends them so), the previous heap's middle packets'.
func (f *follower) nextStep() (hdrLen int, step uint64) {
	if f.latestFirst && f.restHdr != 0 {
		return f.restHdr, f.restLen
	}
	return f.hdrLen, f.length
}

// live is the heap the latest packet joined if it is still under assembly, else nil.
func (f *follower) live() *liveHeap {
	if h := f.heap; h != nil && h.state == heapAssembling && h.cnt == f.cnt {
		return h
	}
	return nil
}

// regions fills dst with the live heap's next regions, step bytes each; ok is false when the heap is not
// filling in order (something past the expected offset arrived already) or there is no live heap.
func (f *follower) regions(dst [][]byte, step uint64) (n int, ok bool) {
	h := f.live()
	if h == nil {
		return 0, true
	}
	if rs := h.ranges; len(rs) == 0 || rs[len(rs)-1].end != f.next {
		return 0, false
	}
	limit := uint64(len(h.slot.Payload))
	if h.hasLength {
		limit = min(limit, h.heapLength)
	}
	return fillRegions(dst, h.slot.Payload, f.next, limit, step), true
}

// streamPlacer guesses that heaps arrive in order: a heap's next packet right after its latest one, as
// long as it, up to the heap's end; then the heaps after it, cnt + stride apart, as long as the last heap
// that completed in order, in packets as long as the latest heap's first one, each in a slot taken ahead
// for it. Every guessed region holds nothing received yet, so a wrong guess overwrites nothing.
type streamPlacer struct {
	p        *ring.Producer
	slotSize uint64

	follower // the heap the latest accepted packet joined
	// The heaps expected after it: the cnt stride between heaps as they begin (learnt from two equal gaps
	// in a row) and the slots taken ahead for them.
	lastBegun uint64
	lastGap   uint64
	stride    uint64
	ahead     []aheadSlot
}

// aheadSlot is a slot taken from the pool for a heap not begun yet, where the guesses put its first
// packets' payloads.
type aheadSlot struct {
	cnt  uint64
	slot *ring.Slot
}

// maxAhead bounds the slots taken ahead (and the ring's capacity they hold back).
const maxAhead = 8

var _ placer = (*streamPlacer)(nil)

func newStreamPlacer(p *ring.Producer) *streamPlacer {
	return &streamPlacer{p: p, slotSize: uint64(p.SlotSize()), ahead: make([]aheadSlot, 0, maxAhead)}
}

func (sp *streamPlacer) heapSlot(h *liveHeap, _ *spead.Packet) (*ring.Slot, error) {
	cnt := h.cnt
	// One skipped or late heap must not send the guesses astray, so a stride is learnt only when two
	// heaps in a row begin that far apart.
	if d := cnt - sp.lastBegun; d != 0 && d <= maxAhead && d == sp.lastGap {
		sp.stride = d
	} else {
		sp.lastGap = d
	}
	sp.lastBegun = cnt
	if s := sp.takeAhead(cnt); s != nil {
		return s, nil
	}
	if sp.p.FreeSlots() == 0 {
		sp.release() // a heap that arrived comes before the ones expected
	}
	return sp.p.Acquire()
}

func (sp *streamPlacer) guess(dst [][]byte) (hdrLen, n int) {
	hdrLen, step := sp.nextStep()
	if step == 0 || hdrLen == 0 {
		return 0, 0
	}
	n, ok := sp.regions(dst, step)
	if !ok {
		return 0, 0 // not filling in order: something past the expected offset arrived already
	}
	if sp.nextLength == 0 || sp.stride == 0 || sp.firstLen == 0 || sp.firstHdr != hdrLen {
		// No guess for the next heaps; nor when their first packet has another header length than the
		// packets that follow it (more item pointers, as spead2 sends them).
		return hdrLen, n
	}
	for cnt := sp.cnt + sp.stride; n < len(dst); cnt += sp.stride {
		s := sp.aheadFor(cnt)
		if s == nil {
			break
		}
		n += fillRegions(dst[n:], s.Payload, 0, min(sp.slotSize, sp.nextLength), sp.firstLen)
	}
	return hdrLen, n
}

func (sp *streamPlacer) ended(*liveHeap, bool) bool { return false }

func (sp *streamPlacer) expected(pkt *spead.Packet) (*liveHeap, *ring.Slot) {
	cnt := pkt.HeapCnt
	if h := sp.live(); h != nil && h.cnt == cnt {
		return h, nil
	}
	if i := sp.aheadIndex(cnt); i >= 0 {
		return nil, sp.ahead[i].slot
	}
	return nil, nil
}

// fillRegions fills dst with consecutive regions of payload from off up to limit, each step bytes long
// (the last maybe shorter); it returns how many it filled.
func fillRegions(dst [][]byte, payload []byte, off, limit, step uint64) (n int) {
	for ; n < len(dst) && off < limit; n++ {
		end := min(off+step, limit)
		dst[n] = payload[off:end:end]
		off = end
	}
	return n
}

// aheadFor is the slot taken ahead for heap cnt: one already keyed to it, else one keyed to a heap no
// longer expected (at or before the current one, or past the look-ahead), else a new one if the pool
// has one to spare (never its last few: a heap that does arrive must find a slot). nil: no guess.
func (sp *streamPlacer) aheadFor(cnt uint64) *ring.Slot {
	if i := sp.aheadIndex(cnt); i >= 0 {
		return sp.ahead[i].slot
	}
	reach := sp.stride * maxAhead
	for i := range sp.ahead {
		if d := sp.ahead[i].cnt - sp.cnt; d == 0 || d > reach { // unsigned: at or behind it wraps large
			sp.ahead[i].cnt = cnt
			return sp.ahead[i].slot
		}
	}
	if len(sp.ahead) == maxAhead || sp.p.FreeSlots() <= maxAhead {
		return nil
	}
	s := sp.p.TryAcquire()
	if s == nil {
		return nil
	}
	sp.ahead = append(sp.ahead, aheadSlot{cnt: cnt, slot: s})
	return s
}

// aheadIndex is the index in sp.ahead of the slot taken ahead for heap cnt, -1 if there is none.
func (sp *streamPlacer) aheadIndex(cnt uint64) int {
	for i := range sp.ahead {
		if sp.ahead[i].cnt == cnt {
			return i
		}
	}
	return -1
}

// takeAhead removes and returns the slot taken ahead for heap cnt, nil if there is none.
func (sp *streamPlacer) takeAhead(cnt uint64) *ring.Slot {
	i := sp.aheadIndex(cnt)
	if i < 0 {
		return nil
	}
	s := sp.ahead[i].slot
	sp.ahead = append(sp.ahead[:i], sp.ahead[i+1:]...)
	return s
}

func (sp *streamPlacer) release() {
	for _, as := range sp.ahead {
		sp.p.Discard(as.slot)
	}
	sp.ahead = sp.ahead[:0]
}
