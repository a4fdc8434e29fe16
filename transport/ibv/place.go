package ibv

import (
	"context"
	"fmt"
	"time"
	"unsafe"

	"github.com/ibvbridge/ibvbridge/frame"
	"github.com/ibvbridge/ibvbridge/internal/rxloop"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/transport"
	"github.com/ibvbridge/ibvbridge/verbs"
)

// placing is the receive queue as rxloop sees it when payloads are placed: a verbs.SplitQueue whose
// work requests, where the sink (a transport.Placer) can say where a packet's payload belongs, are split
// — the frame's headers into the slot's head in the packet area, the payload straight into its heap's
// ring slot — and plain elsewhere. The loop's frame callback decides each completion of a batch; its
// Repost takes the batch, then posts the batch's work requests again.
//
// Where a work request's payload goes is decided when it is posted, long before its frame arrives:
// work requests are filled in posting order, so one posted behind d others receives the (d+1)-th frame
// from now, and it is split when Place's guess reaches that far (the packets of the heap being filled in
// order, after the last one taken). So the first Slots()+1 or so packets of a heap always take the copy
// (their work requests were posted before the heap's first packet had shown where its slot is): the
// queue must be shorter than a heap for placement to pay.
//
// What keeps a region safe while its work request is posted (it "awaits" its frame, and the NIC may
// write it at any moment), the rules udp's readPlaced follows, stretched over time:
//   - a region goes to one posted work request at a time, and only bytes of its heap not yet received,
//     inside the heap's length (Place only guesses those; the awaited regions of one heap form a window
//     of increasing offsets, and a new one must start past the window);
//   - every completion of a batch is decided before any is taken: a frame that did not land where it was
//     expected is copied out of its pieces first;
//   - nothing is handed to the sink that could write into an awaited region or end the heap it lies in
//     (another heap's packet may evict it, a stream stop publishes it): such a packet, and every one after
//     it, is held (copied out) until no work request awaits a region — none is split meanwhile, so the
//     window drains as frames arrive — and is then handed over in order. A held stream stop flushes the
//     queue (the stream is over) so the window drains at once; on cancellation the receiver is released
//     before what is held is handed over.
type placing struct {
	r       *Receiver
	q       verbs.SplitQueue
	pl      transport.Placer
	slotLen int

	posted, polled uint64 // work requests posted since the queue opened (all of them, plain, at first); completions polled

	wqes []wqe // per slot: how it is posted now
	// win is the window: the split work requests posted and not yet taken, in posting order (a ring
	// buffer); all of them point into heap winCnt's slot, which starts at winBase.
	win              []uint64
	winHead, winLen  int
	winCnt           uint64
	winBase          uintptr
	anchor           anchor
	acts             []act // the batch's completions, as Poll returned them, and what to do with each
	cur              int   // the frame callback's position in acts
	copies           []byte
	held             []heldPacket
	hold             []byte
	holding, stopped bool // holding packets back; one of them is a stream stop
	flushed          bool
	regions          [][]byte
	wrs              []verbs.SplitWR
	now              int64
	pkt              spead.Packet
}

// wqe is how a slot's work request is posted: split (hdr frame bytes into the slot, then region, at
// payload offset off of the window's heap) or plain (region nil).
type wqe struct {
	hdr    int
	region []byte
	off    uint64
}

// anchor is what the last packet taken showed, when it showed it for sure: that Place's next guess is
// heap cnt's slot, which starts at base, from payload offset next on, within the heap's length.
type anchor struct {
	ok     bool
	cnt    uint64
	base   uintptr
	next   uint64
	length uint64
}

type actKind uint8

const (
	actNone actKind = iota // an error completion or a dropped frame: nothing to take
	actHit                 // its payload is where it belongs: Placed
	actCopy                // data is the UDP payload, contiguous: Packet (or hold)
)

type act struct {
	id     uint64
	kind   actKind
	payLen int
	data   []byte
}

type heldPacket struct {
	off, n int
	nanos  int64
}

func newPlacing(r *Receiver, q verbs.SplitQueue, pl transport.Placer) *placing {
	n := q.Slots()
	return &placing{r: r, q: q, pl: pl, slotLen: len(q.Slot(0)), posted: uint64(n), wqes: make([]wqe, n),
		win: make([]uint64, n), regions: make([][]byte, n), acts: make([]act, 0, 64), wrs: make([]verbs.SplitWR, 0, 64)}
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// Poll implements rxloop.Queue: it starts a batch.
func (s *placing) Poll(out []rxloop.Completion) (int, error) {
	n, err := s.q.Poll(out)
	if n > 0 {
		s.polled += uint64(n)
		s.acts, s.cur, s.copies = s.acts[:0], 0, s.copies[:0]
		for _, c := range out[:n] {
			s.acts = append(s.acts, act{id: c.ID})
		}
		s.now = time.Now().UnixNano()
	}
	return n, err
}

// frame is the loop's callback: it decides one good completion of the batch, taking nothing yet.
func (s *placing) frame(id uint64, f []byte) {
	for s.acts[s.cur].id != id { // the loop hands over the polled completions in order, skipping bad ones
		s.cur++
	}
	a := &s.acts[s.cur]
	s.cur++
	// A split frame is parsed where it starts: the slot's head holds its headers and the length checks
	// need only len(f); the payload frame.Parse points at is not used.
	u, ok := s.r.parse(f)
	if !ok {
		return
	}
	w := &s.wqes[id]
	end := frame.HeaderLen + len(u.Payload)
	if w.region == nil || end <= w.hdr { // plain, or short enough to be all in the slot's head
		a.kind, a.data = actCopy, u.Payload
		return
	}
	pay := end - w.hdr
	if pay <= len(w.region) && s.pl.Fits(f[frame.HeaderLen:w.hdr], w.region, pay) {
		a.kind, a.payLen = actHit, pay
		return
	}
	s.r.misses.Add(1)
	a.kind, a.data = actCopy, s.join(id, w, pay)
}

// join copies a split frame's UDP payload out of its pieces: the SPEAD header in the slot's head, the
// payload's first bytes in the region, the rest in the slot after the head.
func (s *placing) join(id uint64, w *wqe, pay int) []byte {
	slot := s.q.Slot(id)
	in := min(pay, len(w.region))
	start := len(s.copies)
	s.copies = append(s.copies, slot[frame.HeaderLen:w.hdr]...)
	s.copies = append(s.copies, w.region[:in]...)
	s.copies = append(s.copies, slot[w.hdr:w.hdr+pay-in]...)
	return s.copies[start:len(s.copies):len(s.copies)]
}

// Repost implements rxloop.Queue: the batch is over, so it is taken, then its work requests are posted.
func (s *placing) Repost(ids []uint64) error {
	if err := s.take(); err != nil {
		return err
	}
	return s.post(ids)
}

func (s *placing) Arm() error                     { return s.q.Arm() }
func (s *placing) Wait(ctx context.Context) error { return s.q.Wait(ctx) }
func (s *placing) Slot(id uint64) []byte          { return s.q.Slot(id) }

// take hands the batch to the sink, in order, holding back what is not safe to hand over yet.
func (s *placing) take() error {
	for i := range s.acts {
		a := &s.acts[i]
		if s.wqes[a.id].region != nil {
			if s.winLen == 0 || s.win[s.winHead] != a.id {
				return fmt.Errorf("ibverbs placement: work request %d completed out of posting order", a.id)
			}
			s.winHead, s.winLen = (s.winHead+1)%len(s.win), s.winLen-1
		}
		switch a.kind {
		case actHit:
			s.takeHit(a)
		case actCopy:
			s.takeCopy(a.data)
		}
	}
	switch {
	case s.holding && s.winLen == 0:
		s.replay()
	case s.stopped && !s.flushed:
		// The stream is over, yet work requests still await regions of a heap it would publish: end the
		// queue, so that they complete (flushed, unwritten) and the stop goes in.
		s.flushed = true
		if err := s.q.Flush(); err != nil {
			return fmt.Errorf("ibverbs placement: flush the queue for the stream stop: %w", err)
		}
	}
	return nil
}

func (s *placing) takeHit(a *act) {
	w := &s.wqes[a.id]
	hdr := s.q.Slot(a.id)[frame.HeaderLen:w.hdr]
	// Fits again: it held when decided, and only packets of this heap below the window were taken since,
	// which leave it as it was; if it no longer holds, the packet goes the safe way.
	if spead.DecodeSplit(hdr, w.region[:a.payLen], &s.pkt) == nil && s.pl.Fits(hdr, w.region, a.payLen) {
		s.pl.Placed(hdr, w.region, a.payLen, s.now)
		s.r.placed.Add(1)
		s.anchor = anchor{}
		if p := &s.pkt; p.HasHeapLength {
			s.anchor = anchor{ok: true, cnt: p.HeapCnt, base: addr(w.region) - uintptr(p.PayloadOffset),
				next: p.PayloadOffset + uint64(a.payLen), length: p.HeapLength}
		}
		return
	}
	s.r.misses.Add(1)
	s.takeCopy(s.join(a.id, w, a.payLen))
}

// takeCopy hands b, a UDP payload, to the sink as Packet does, unless it might write into an awaited
// region or end the window's heap: then it (and all after it, until the window is empty) is held.
func (s *placing) takeCopy(b []byte) {
	p := &s.pkt
	err := spead.Decode(b, p)
	if !s.holding && (err != nil || s.safe(p)) {
		next := anchor{}
		if err == nil {
			next = s.verify(b, p)
		}
		s.pl.Packet(b, s.now)
		s.anchor = next
		return
	}
	s.anchor = anchor{}
	if !s.holding {
		s.holding = true
		s.r.holds.Add(1)
	}
	if err == nil && p.IsStreamStop() {
		s.stopped = true
	}
	s.held = append(s.held, heldPacket{off: len(s.hold), n: len(b), nanos: s.now})
	s.hold = append(s.hold, b...)
}

// safe reports whether the sink may take p now: no region awaits, or p is a packet of the window's heap
// whose payload lies outside the window (it cannot begin or end a heap, nor write an awaited byte). A
// packet that does not decode is safe: the sink rejects it.
func (s *placing) safe(p *spead.Packet) bool {
	if s.winLen == 0 {
		return true
	}
	if p.IsStreamStop() || p.HeapCnt != s.winCnt {
		return false
	}
	first := &s.wqes[s.win[s.winHead]]
	last := &s.wqes[s.win[(s.winHead+s.winLen-1)%len(s.win)]]
	start, end := p.PayloadOffset, p.PayloadOffset+uint64(len(p.Payload))
	return end <= first.off || start >= last.off+uint64(len(last.region))
}

// verify tells, before the sink takes p (in b), whether p is the packet Place expects next — its
// payload goes where Place's first guess starts — and if so returns the anchor it will leave.
func (s *placing) verify(b []byte, p *spead.Packet) anchor {
	n := len(p.Payload)
	if n == 0 || !p.HasHeapLength {
		return anchor{}
	}
	if _, k := s.pl.Place(s.regions[:1]); k == 0 || !s.pl.Fits(b[:p.Size-n], s.regions[0], n) {
		return anchor{}
	}
	return anchor{ok: true, cnt: p.HeapCnt, base: addr(s.regions[0]) - uintptr(p.PayloadOffset),
		next: p.PayloadOffset + uint64(n), length: p.HeapLength}
}

// replay hands over what was held, in order, once no region awaits a frame (or the NIC has stopped).
func (s *placing) replay() {
	for _, h := range s.held {
		s.pl.Packet(s.hold[h.off:h.off+h.n], h.nanos)
	}
	s.held, s.hold = s.held[:0], s.hold[:0]
	s.holding, s.stopped = false, false
	s.anchor = anchor{}
}

// post posts the batch's work requests again, splitting those whose frame Place can guess: the one
// posted behind d others gets Place's guess number d.
func (s *placing) post(ids []uint64) error {
	if s.flushed {
		return nil // the queue is in its error state: nothing goes back
	}
	hdr, n := 0, 0
	if an := s.anchor; an.ok && !s.holding && (s.winLen == 0 || an.cnt == s.winCnt && an.base == s.winBase) {
		var hdrLen int
		hdrLen, n = s.pl.Place(s.regions[:min(len(s.regions), int(s.posted-s.polled)+len(ids))])
		hdr = frame.HeaderLen + hdrLen
		if n > 0 && (hdrLen <= 0 || hdr >= s.slotLen || addr(s.regions[0]) != an.base+uintptr(an.next)) {
			n = 0 // not the guess the last packet taken showed
		}
	}
	wrs := s.wrs[:0]
	for _, id := range ids {
		d := int(s.posted - s.polled)
		s.posted++
		s.wqes[id] = wqe{}
		wr := verbs.SplitWR{ID: id}
		if d < n {
			if region, off, ok := s.fit(s.regions[d], hdr); ok {
				if s.winLen == 0 {
					s.winCnt, s.winBase = s.anchor.cnt, s.anchor.base
				}
				s.win[(s.winHead+s.winLen)%len(s.win)] = id
				s.winLen++
				s.wqes[id] = wqe{hdr: hdr, region: region, off: off}
				wr.HdrLen, wr.Region = hdr, region
			}
		}
		wrs = append(wrs, wr)
	}
	s.wrs = wrs
	return s.q.PostSplit(wrs)
}

// fit trims a guessed region so that header and region fit the slot, and checks it may be posted: inside
// the heap and the registered memory, and past every region the window awaits.
func (s *placing) fit(region []byte, hdr int) ([]byte, uint64, bool) {
	region = region[:min(len(region), s.slotLen-hdr)]
	off := uint64(addr(region) - s.anchor.base)
	if len(region) == 0 || off+uint64(len(region)) > s.anchor.length || !s.q.Covers(region) {
		return nil, 0, false
	}
	if s.winLen > 0 {
		if last := &s.wqes[s.win[(s.winHead+s.winLen-1)%len(s.win)]]; off < last.off+uint64(len(last.region)) {
			return nil, 0, false
		}
	}
	return region, off, true
}

var _ rxloop.Queue = (*placing)(nil)
