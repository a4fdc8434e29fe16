package ringsim

import (
	"fmt"
	"slices"
)

// Policy is the full-ring policy (spec §2.1 header 0x14).
type Policy uint32

const (
	Drop  Policy = 0
	Block Policy = 1
)

func (p Policy) String() string {
	if p == Block {
		return "block"
	}
	return "drop"
}

// Row states (spec §2.2).
const (
	RowFree      = 0
	RowAttached  = 1
	RowOverrun   = 2
	RowBadCursor = 3
	RowGone      = 4
)

// Handshake statuses (spec §1.2) the simulation meets.
const (
	StatusOK      = 0
	StatusNotPerm = 2
	StatusBusy    = 3
	StatusClosing = 4
)

// Result is what a publish came to.
type Result int

const (
	Published Result = iota
	Dropped          // drop: every attached consumer holds the ring back (dropped_heaps)
	Pending          // block: the producer waits (blocked_on names whom)
	Full             // the end-of-stream marker found no slot
)

func (r Result) String() string {
	return [...]string{"published", "dropped", "pending", "full"}[r]
}

// Row is one consumer-table row as a target reports it (spec §2.2).
type Row struct {
	State, Gen, Group, Minor                        uint32
	Released, Assigned, Read, Queued, Skipped, Lost uint64
	Wakes                                           uint64
}

// Stats are the counters the simulation compares (spec §2.3).
type Stats struct {
	Dropped, Overruns, Errors, GroupLost, GroupSkipped, EOS uint64
}

// Outcome is what every target reports after each operation.
type Outcome struct {
	Head      uint64
	Stats     Stats
	Rows      []Row
	MaskFrom  uint64   // Masks[i] is the assign word of position MaskFrom+i
	Masks     []uint64 // published positions still described (the last slot_count at most)
	BlockedOn uint32
	Pending   bool
	Free      int // free slots after a reclaim, -1 when the target cannot say
}

// Mutation names a deliberate defect the model can be built with, to prove the checks catch it.
type Mutation string

const (
	MutNone              Mutation = ""
	MutRowAfterReuse     Mutation = "row-after-reuse"     // an overrun row is written after its slot is reused
	MutSettleAtNewStart  Mutation = "settle-at-new-start" // 2.1: settle at the next publish, up to the new consumer's start
	MutBlameByReleased   Mutation = "blame-by-released"   // 2.1: drop detaches the consumers with the least released
	MutWindowFromTail    Mutation = "window-from-tail"    // 2.1: a 2.2 member's tail bounds the window
	MutSkippedNotCounted Mutation = "skipped-not-counted" // group_skipped never counted
)

// Mutations lists the mutations a test must see caught.
var Mutations = []Mutation{MutRowAfterReuse, MutSettleAtNewStart, MutBlameByReleased, MutWindowFromTail, MutSkippedNotCounted}

// Violation is an invariant the model found broken in itself (a spec rule a mutation breaks).
type Violation struct{ Msg string }

func (v *Violation) Error() string { return v.Msg }

type mcons struct {
	row     int
	seq     uint64 // attach order
	group   uint32
	minor   uint16
	start   uint64
	relDone uint64 // released, as the producer accepted it
	read    uint64 // accepted read (2.2 member); tail for the others
	// counters the row shows
	assigned, relAssigned, skipped, wakes, lastPick uint64
	// region: what the consumer wrote
	regTail, regRead, regHanded, regWakeAt uint64
	regWaiting                             uint32
	// settle deferred (MutSettleAtNewStart)
	limit    uint64
	limitSet bool
}

func (c *mcons) member() bool   { return c.group != 0 }
func (c *mcons) member22() bool { return c.group != 0 && c.minor >= 2 }

type mrow struct {
	state, gen uint32
	c          *mcons // the consumer last attached here
	lost       uint64
	deferState uint32 // MutRowAfterReuse: state to store after the next slot write
}

// Model is the reference producer: spec §7 and §14 as a state machine over positions, slots and rows.
// Every loop over positions covers at most slot_count of them; LoopMax counts the longest.
type Model struct {
	N      uint64
	policy Policy
	p0     uint64
	mut    Mutation

	head     uint64
	pseq     []uint64 // per descriptor: seq = position + 1
	pmask    []uint64 // live assign bits: cleared at release and at the member's detach
	porig    []uint64 // assign as published
	peos     []bool
	pheld    []bool
	pslot    []int
	slotPos  []uint64
	slotUsed []bool
	free     []int // FIFO

	rows     []mrow
	attached []*mcons // attach order
	attachN  uint64
	picks    uint64
	departed []*mcons // MutSettleAtNewStart only

	stats     Stats
	pending   bool
	blockedOn uint32
	ended     bool

	skippedGone uint64 // skipped of the members that left

	obsMasks []uint64
	obsRows  []Row

	LoopMax uint64 // the longest loop over positions any step ran
	steps   uint64 // positions looked at, for steps/s figures
	viol    *Violation
}

// NewModel makes a model ring of n slots (a power of two), rows consumer rows, cursors starting at p0.
func NewModel(n uint64, rows int, policy Policy, p0 uint64, mut Mutation) *Model {
	m := &Model{N: n, policy: policy, p0: p0, mut: mut, head: p0,
		pseq: make([]uint64, n), pmask: make([]uint64, n), porig: make([]uint64, n), peos: make([]bool, n),
		pheld: make([]bool, n), pslot: make([]int, n), slotPos: make([]uint64, n), slotUsed: make([]bool, n),
		rows: make([]mrow, rows)}
	for i := range n {
		m.free = append(m.free, int(i))
	}
	return m
}

// before reports a < b for positions (spec: compare by subtraction).
func before(a, b uint64) bool { return int64(a-b) < 0 }

func (m *Model) fail(format string, a ...any) {
	if m.viol == nil {
		m.viol = &Violation{fmt.Sprintf(format, a...)}
	}
}

// Violation is the first invariant the model found broken, nil if none.
func (m *Model) Violation() *Violation { return m.viol }

// windowLo is the first position whose descriptor may still be current.
func (m *Model) windowLo() uint64 {
	if m.head-m.p0 < m.N {
		return m.p0
	}
	return m.head - m.N
}

func (m *Model) idx(q uint64) uint64 { return q & (m.N - 1) }

func (m *Model) published(q uint64) bool {
	return !before(q, m.windowLo()) && before(q, m.head) && m.pseq[m.idx(q)] == q+1
}

func (m *Model) held(q uint64) bool { return m.published(q) && m.pheld[m.idx(q)] }

// loop runs f over positions [from, to), at most slot_count of them (spec §14.7), counting steps.
func (m *Model) loop(from, to uint64, f func(q uint64)) {
	n := to - from
	if before(to, from) && m.mut != MutSettleAtNewStart {
		n = 0
	}
	if n > m.N && m.mut != MutSettleAtNewStart {
		panic(fmt.Sprintf("model loop over %d positions", n))
	}
	if n > m.LoopMax {
		m.LoopMax = n
	}
	if n > m.N {
		m.fail("a producer loop walks %d positions (%d to %d), more than slot_count %d", n, from, to, m.N)
		return
	}
	for q := from; n > 0; q, n = q+1, n-1 {
		m.steps++
		f(q)
	}
}

// clampLo is from, or the window's first position when from is below it.
func (m *Model) clampLo(from uint64) uint64 {
	if lo := m.windowLo(); before(from, lo) {
		return lo
	}
	return from
}

// needed reports whether position q's slot must stay: an attached independent has not released it, or
// a member's bit is still set (spec §14.5).
func (m *Model) needed(q uint64) bool {
	if m.pmask[m.idx(q)] != 0 {
		return true
	}
	for _, c := range m.attached {
		if !c.member() && !before(q, c.relDone) && !before(q, c.start) {
			return true
		}
	}
	return false
}

func (m *Model) freePos(q uint64) {
	i := m.idx(q)
	if m.pheld[i] {
		m.pheld[i] = false
		m.free = append(m.free, m.pslot[i])
	}
}

// reclaim returns the slots nobody needs, with at least one consumer attached (with none, drop takes
// the oldest back only as it needs slots and block keeps everything: spec §7.1).
func (m *Model) reclaim() {
	if len(m.attached) == 0 {
		return
	}
	m.loop(m.windowLo(), m.head, func(q uint64) {
		if m.held(q) && !m.needed(q) {
			m.freePos(q)
		}
	})
}

// oldestHeld is the lowest position still holding a slot.
func (m *Model) oldestHeld() (uint64, bool) {
	for q := m.windowLo(); q != m.head; q++ {
		if m.held(q) {
			return q, true
		}
	}
	return 0, false
}

// Oldest is the first position from which every published position holds its slot (spec §14.5).
func (m *Model) Oldest() uint64 {
	x := m.head
	for x != m.windowLo() && m.held(x-1) {
		x--
	}
	return x
}

// advance moves c's released to t (valid), counting and clearing its assigned positions passed.
func (m *Model) advance(c *mcons, t uint64) {
	if t == c.relDone {
		return
	}
	if c.member() {
		bit := uint64(1) << c.row
		m.loop(m.clampLo(c.relDone), m.clampHead(t), func(q uint64) {
			i := m.idx(q)
			if m.published(q) && m.pmask[i]&bit != 0 && c.ownsRow(m, q) {
				m.pmask[i] &^= bit
				c.relAssigned++
			}
		})
	}
	c.relDone = t
}

// ownsRow reports whether the bit of c's row at q is c's (not a departed predecessor's: positions before
// c attached are not its).
func (c *mcons) ownsRow(m *Model, q uint64) bool { return !before(q, c.start) }

func (m *Model) clampHead(t uint64) uint64 {
	if before(m.head, t) {
		return m.head
	}
	return t
}

// readCursors is spec §7.2 and §14.2: each attached consumer's tail, then read; an invalid tail detaches it.
func (m *Model) readCursors() {
	for _, c := range slices.Clone(m.attached) {
		t := c.regTail
		if t-c.relDone > m.head-c.relDone {
			m.detach(c, RowBadCursor)
			continue
		}
		m.advance(c, t)
		c.read = t
		if c.member22() && c.regRead-t <= m.head-t {
			c.read = c.regRead
		}
		m.updateSkipped(c)
	}
	m.settleDeparted(false)
	m.reclaim()
}

func (m *Model) updateSkipped(c *mcons) {
	if !c.member22() {
		return
	}
	// spec §14.7: released assigned positions − handed, 0 if negative (handed counts held heaps too, so it
	// falls when a member hands out heaps it held after releasing others unread)
	c.skipped = 0
	if c.relAssigned > c.regHanded {
		c.skipped = c.relAssigned - c.regHanded
	}
}

// groupSkipped is stats 18: skipped summed over every member (§14.7), the departed ones' as they left.
func (m *Model) groupSkipped() uint64 {
	if m.mut == MutSkippedNotCounted {
		return 0
	}
	n := m.skippedGone
	for _, c := range m.attached {
		n += c.skipped
	}
	return n
}

// queued counts c's positions in [read, head), and returns the oldest.
func (m *Model) queued(c *mcons) (n, u uint64) {
	bit := uint64(1) << c.row
	m.loop(m.clampLo(c.read), m.clampHead(c.read+(m.head-c.read)), func(q uint64) {
		if m.published(q) && m.pmask[m.idx(q)]&bit != 0 && c.ownsRow(m, q) {
			if n == 0 {
				u = q
			}
			n++
		}
	})
	return n, u
}

// windowBound is the position c keeps the window at (q must stay below it + slot_count), ok false when
// c does not bound the window (spec §14.5).
func (m *Model) windowBound(c *mcons) (uint64, bool) {
	if m.mut == MutWindowFromTail {
		return c.relDone, true
	}
	return m.windowBoundSpec(c)
}

// windowBoundSpec is windowBound as the spec words it, whatever the mutation (HoldBack's).
func (m *Model) windowBoundSpec(c *mcons) (uint64, bool) {
	if !c.member22() {
		return c.relDone, true
	}
	n, u := m.queued(c)
	return u, n > 0
}

// canPublish is spec §14.5 for position q.
func (m *Model) canPublish(q uint64) (ok bool, o uint64, hasO bool) {
	o, hasO = m.oldestHeld()
	if hasO && q-o >= m.N {
		return false, o, hasO
	}
	for _, c := range m.attached {
		if b, ok := m.windowBound(c); ok && q-b >= m.N {
			return false, o, hasO
		}
	}
	return true, o, hasO
}

// HoldBack is spec §14.6: the rows of the attached consumers holding the ring back at q, lowest first.
func (m *Model) HoldBack(q, o uint64, hasO bool) []int {
	var rows []int
	for _, c := range m.attached {
		hb := false
		if b, ok := m.windowBoundSpec(c); ok && q-b >= m.N {
			hb = true
		}
		if hasO && !before(o, c.relDone) {
			if !c.member() && !before(o, c.start) {
				hb = true
			}
			if c.member() && m.porig[m.idx(o)]&(1<<c.row) != 0 && m.pmask[m.idx(o)]&(1<<c.row) != 0 {
				hb = true
			}
		}
		if hb {
			rows = append(rows, c.row)
		}
	}
	slices.Sort(rows)
	return rows
}

// blameByReleased is 2.1's rule (MutBlameByReleased): the attached consumers with the least released.
func (m *Model) blameByReleased() []int {
	var low *mcons
	for _, c := range m.attached {
		if low == nil || m.head-c.relDone > m.head-low.relDone {
			low = c
		}
	}
	var rows []int
	for _, c := range m.attached {
		if c.relDone == low.relDone {
			rows = append(rows, c.row)
		}
	}
	slices.Sort(rows)
	return rows
}

// Publish publishes one heap (eos: the end-of-stream marker), spec §7.3 and §14.
func (m *Model) Publish(eos bool) Result {
	if m.pending {
		panic("publish while a publish is pending")
	}
	m.readCursors()
	r := m.tryPublish(eos)
	if r == Pending && !eos {
		m.pending = true
	}
	return r
}

func (m *Model) tryPublish(eos bool) Result {
	q := m.head
	for tries := 0; ; tries++ {
		if tries > len(m.rows)+int(m.N)+2 {
			m.fail("publish of %d: the producer loops", q)
			return Dropped
		}
		ok, o, hasO := m.canPublish(q)
		if ok {
			break
		}
		if len(m.attached) == 0 {
			if m.policy == Drop && hasO {
				m.freePos(o)
				continue
			}
			if eos {
				return Full
			}
			m.blockedOn = 0
			return Pending
		}
		hb := m.HoldBack(q, o, hasO)
		if len(hb) == 0 {
			m.fail("position %d cannot be published and no consumer holds the ring back (§14.6)", q)
		}
		if m.policy == Drop {
			blame := hb
			if m.mut == MutBlameByReleased {
				blame = m.blameByReleased()
			}
			if len(blame) > 0 && len(blame) < len(m.attached) {
				for _, r := range blame {
					if !slices.Contains(hb, r) {
						m.fail("drop detached row %d, which does not hold the ring back at %d (§14.6: %v do)", r, q, hb)
					}
					m.detach(m.rows[r].c, RowOverrun)
				}
				m.settleDeparted(false)
				m.reclaim()
				continue
			}
			if eos {
				return Full
			}
			m.stats.Dropped++
			return Dropped
		}
		if eos {
			return Full
		}
		m.blockedOn = 0
		if len(hb) > 0 {
			m.blockedOn = uint32(hb[0]) + 1
		}
		return Pending
	}
	m.settleDeparted(true)
	// take a slot
	s := m.free[0]
	m.free = m.free[1:]
	if m.slotUsed[s] {
		m.checkReuse(m.slotPos[s])
	}
	i := m.idx(q)
	m.slotUsed[s], m.slotPos[s] = true, q
	m.pheld[i], m.pslot[i], m.pseq[i], m.peos[i] = true, s, q+1, eos
	m.pmask[i], m.porig[i] = 0, 0
	if !eos {
		mask := m.assign(q)
		m.pmask[i], m.porig[i] = mask, mask
	}
	for r := range m.rows {
		if st := m.rows[r].deferState; st != 0 {
			m.rows[r].state, m.rows[r].deferState = st, 0
		}
	}
	m.head = q + 1
	m.blockedOn = 0
	if eos {
		m.ended = true
		m.stats.EOS = 1
	}
	m.wake(q, eos)
	return Published
}

// checkReuse is spec §7.7: a slot that held position p0 is written again only after every row whose
// consumer still held p0 says detached.
func (m *Model) checkReuse(p0 uint64) {
	for r := range m.rows {
		row := &m.rows[r]
		c := row.c
		if row.state != RowAttached || c == nil || before(p0, c.start) || before(p0, c.relDone) {
			continue
		}
		if p0-c.start >= 1<<62 || (c.member() && m.porig[m.idx(p0)]&(1<<c.row) == 0) {
			continue
		}
		if m.pseq[m.idx(p0)] != p0+1 {
			continue
		}
		m.fail("the slot of position %d is reused while row %d, which holds it, still says attached (§7.7)", p0, r)
	}
}

// TieByRow breaks ties between members never picked by row (the C and Python producers) rather than by
// attach order (the Go producer): §14.3's "the one picked least recently" does not order members never
// picked.
var TieByRow = true

// assign is spec §14.3: per group, the member with the fewest positions queued, ties to the one picked
// least recently (never picked: attached first).
func (m *Model) assign(q uint64) uint64 {
	var mask uint64
	var groups []uint32
	for _, c := range m.attached {
		if c.member() && !slices.Contains(groups, c.group) {
			groups = append(groups, c.group)
		}
	}
	for _, g := range groups {
		var best *mcons
		var bestQ uint64
		for _, c := range m.attached {
			if c.group != g {
				continue
			}
			n, _ := m.queued(c)
			tie := best != nil && c.seq < best.seq
			if TieByRow && best != nil {
				tie = c.row < best.row
			}
			if best == nil || n < bestQ || n == bestQ && (c.lastPick < best.lastPick || c.lastPick == best.lastPick && tie) {
				best, bestQ = c, n
			}
		}
		m.picks++
		best.lastPick = m.picks
		best.assigned++
		mask |= 1 << best.row
	}
	return mask
}

// wake is spec §7.5 and §14.4 after publishing q.
func (m *Model) wake(q uint64, eos bool) {
	for _, c := range m.attached {
		if c.regWaiting == 0 {
			continue
		}
		w := eos
		if !w {
			if c.member22() {
				// wake_at is a head value (§7.5: head − wake_at < 2^63), so "a position assigned to it at or
				// after its wake_at" (§14.4) is q + 1 ≥ wake_at: read literally it misses the very position
				// a member that stored wake_at = read + 1 waits for.
				w = m.porig[m.idx(q)]&(1<<c.row) != 0 && !before(q+1, c.regWakeAt)
			} else {
				w = !before(m.head, c.regWakeAt)
			}
		}
		if w {
			c.regWaiting = 0
			c.wakes++
		}
	}
}

// detach ends c's attachment (spec §7.6, §14.7): final tail, lost_heaps, settle, then the row.
func (m *Model) detach(c *mcons, kind uint32) {
	if t := c.regTail; t-c.relDone <= m.head-c.relDone && kind != RowBadCursor {
		m.advance(c, t)
	}
	m.updateSkipped(c)
	m.skippedGone += c.skipped
	row := &m.rows[c.row]
	row.lost = m.head - c.relDone
	i := slices.Index(m.attached, c)
	m.attached = slices.Delete(m.attached, i, i+1)
	if c.member() {
		if m.mut == MutSettleAtNewStart {
			m.departed = append(m.departed, c)
		} else {
			m.settle(c, m.head)
		}
	}
	if m.mut == MutRowAfterReuse && kind == RowOverrun {
		row.deferState = kind
	} else {
		row.state = kind
	}
	switch kind {
	case RowOverrun:
		m.stats.Overruns++
	case RowBadCursor:
		m.stats.Errors++
	}
}

// settle clears c's bits up to end: what it had not released is lost for its group (group_lost).
func (m *Model) settle(c *mcons, end uint64) {
	bit := uint64(1) << c.row
	from := m.clampLo(c.relDone)
	if m.mut == MutSettleAtNewStart {
		from = c.relDone // 2.1 walked from its swept position, unclamped
	}
	m.loop(from, end, func(q uint64) {
		i := m.idx(q)
		if m.published(q) && m.pmask[i]&bit != 0 && c.ownsRow(m, q) {
			m.pmask[i] &^= bit
			m.stats.GroupLost++
			if m.pmask[i] == 0 && !m.needed(q) && m.mut != MutSettleAtNewStart {
				m.freePos(q) // §14.7: free once nothing else needs it, consumers attached or not
			}
		}
	})
}

// settleDeparted is MutSettleAtNewStart's deferred settling (2.1: at the next publish).
func (m *Model) settleDeparted(publishing bool) {
	if !publishing {
		return
	}
	for _, c := range m.departed {
		end := m.head
		if c.limitSet {
			end = c.limit
		}
		m.settle(c, end)
	}
	m.departed = m.departed[:0]
}

// Retry tries the pending publish again (block), after a consumer moved.
func (m *Model) Retry() {
	if !m.pending {
		return
	}
	m.readCursors()
	if m.tryPublish(false) == Published {
		m.pending = false
		m.readCursors() // a producer's publish reads the cursors at the new head (its commit's wake)
	}
}

// Attach admits a consumer (spec §1.2, §7.1, §14.1): row and start are the model's own choice (lowest
// free row; start 0 at the lowest position an attached independent consumer has not released, from
// oldest on; head while group members alone are attached, as the Go and C producers choose).
func (m *Model) Attach(group uint32, minor uint16, start uint32) (row int, gen uint32, tail uint64, status int) {
	if m.ended {
		return -1, 0, 0, StatusClosing
	}
	row = -1
	for i := range m.rows {
		if m.rows[i].state != RowAttached && m.rows[i].deferState == 0 {
			row = i
			break
		}
	}
	if row < 0 {
		return -1, 0, 0, StatusBusy
	}
	m.readCursors()
	s := m.head
	if group == 0 && start == 0 {
		s = m.start0()
	}
	m.attachAt(row, group, minor, s)
	return row, m.rows[row].gen, s, StatusOK
}

// Rebase moves the consumer just attached in row to start s, a start=0 position a real producer chose
// differently (spec §7.1 lets producers differ: the lowest position an attached consumer has not released,
// or oldest, which moves when that producer reclaims). s must be within the last slot_count published
// positions; positions from s on that the model had taken back hold a slot again (the producer kept them).
func (m *Model) Rebase(row int, s uint64) bool {
	c := m.rows[row].c
	if c == nil || c.member() || before(m.head, s) || m.head-s > m.N || before(s, m.p0) {
		return false
	}
	// every position from s on still has its own slot, held or free and not reused since (the producer
	// kept it): checked before anything is taken back
	for q := s; q != m.head; q++ {
		i := m.idx(q)
		if m.pseq[i] != q+1 || !m.pheld[i] && (m.slotPos[m.pslot[i]] != q || !slices.Contains(m.free, m.pslot[i])) {
			return false
		}
	}
	for q := s; q != m.head; q++ {
		if i := m.idx(q); !m.pheld[i] {
			sl := m.pslot[i]
			m.free = slices.DeleteFunc(m.free, func(f int) bool { return f == sl })
			m.pheld[i] = true
			m.slotUsed[sl] = true
		}
	}
	c.start, c.relDone, c.read, c.regTail = s, s, s, s
	return true
}

func (m *Model) start0() uint64 {
	ox := m.Oldest()
	best, found, members := ox, false, false
	for _, c := range m.attached {
		if c.group != 0 {
			members = true
			continue
		}
		if !before(c.relDone, ox) && !before(m.head, c.relDone) && (!found || before(c.relDone, best)) {
			best, found = c.relDone, true
		}
	}
	if !found && members {
		return m.head // the producers' frontier of independents is head: what members hold is theirs
	}
	return best
}

// AttachAt admits a consumer at the row and start a real producer chose (checked by the caller).
func (m *Model) attachAt(row int, group uint32, minor uint16, s uint64) {
	m.attachN++
	c := &mcons{row: row, seq: m.attachN, group: group, minor: minor, start: s, relDone: s, read: s, regTail: s}
	for _, d := range m.departed {
		if d.row == row && !d.limitSet {
			d.limit, d.limitSet = s, true
		}
	}
	r := &m.rows[row]
	r.c, r.lost = c, 0
	r.gen++
	r.state = RowAttached
	m.attached = append(m.attached, c)
}

// Gone is the consumer's socket closing (spec §7.6): detach kind 4.
func (m *Model) Gone(row int) {
	if r := &m.rows[row]; r.state == RowAttached && r.c != nil && slices.Contains(m.attached, r.c) {
		m.detach(r.c, RowGone)
		m.reclaim()
	}
}

// Region field stores (the consumer's writes).
type Field int

const (
	FTail Field = iota
	FRead
	FHanded
	FWakeAt
	FWaiting
)

func (m *Model) Store(row int, f Field, v uint64) {
	c := m.rows[row].c
	if c == nil || !slices.Contains(m.attached, c) {
		return // a detached consumer's region is gone
	}
	switch f {
	case FTail:
		c.regTail = v
	case FRead:
		c.regRead = v
	case FHanded:
		c.regHanded = v
	case FWakeAt:
		c.regWakeAt = v
	case FWaiting:
		c.regWaiting = uint32(v)
	}
}

// Settle is what every report is preceded by: a cursor read and the pending publish retried.
func (m *Model) Settle() {
	m.readCursors()
	m.Retry()
	m.checkLeak()
}

// checkLeak: with consumers attached and every one of them at head, every slot is free (no leak).
func (m *Model) checkLeak() {
	if len(m.attached) == 0 || m.pending {
		return
	}
	for _, c := range m.attached {
		if c.relDone != m.head {
			return
		}
	}
	if len(m.free) != int(m.N) {
		m.fail("every attached consumer released everything (head %d) yet %d of %d slots are not free", m.head, int(m.N)-len(m.free), m.N)
	}
}

func (m *Model) Head() uint64 { return m.head }

func (m *Model) Desc(q uint64) (seq, mask uint64, eos bool) {
	i := m.idx(q)
	return m.pseq[i], m.porig[i], m.peos[i]
}

func (m *Model) RowState(row int) (uint32, uint32) { return m.rows[row].state, m.rows[row].gen }

// Pending reports a block publish waiting.
func (m *Model) IsPending() bool { return m.pending }

// caughtUp is the outcome's caughtUp, without building one.
func (m *Model) caughtUp() bool {
	for _, c := range m.attached {
		if c.relDone != m.head {
			return false
		}
	}
	return len(m.attached) > 0
}

// Observe reports the model's outcome.
func (m *Model) Observe() Outcome {
	m.stats.GroupSkipped = m.groupSkipped()
	o := Outcome{Head: m.head, Stats: m.stats, BlockedOn: m.blockedOn, Pending: m.pending, Free: len(m.free)}
	if !m.caughtUp() {
		o.Free = -1 // the producers count free slots only then (no leak: all of them)
	}
	if !m.pending {
		o.BlockedOn = 0
	}
	o.MaskFrom = m.windowLo()
	o.Masks, o.Rows = m.obsMasks[:0], m.obsRows[:0] // reused: an outcome is read before the next one is made
	for q := o.MaskFrom; q != m.head; q++ {
		o.Masks = append(o.Masks, m.porig[m.idx(q)])
	}
	defer func() { m.obsMasks, m.obsRows = o.Masks, o.Rows }()
	for i := range m.rows {
		r := &m.rows[i]
		row := Row{State: r.state, Gen: r.gen}
		if c := r.c; c != nil {
			row.Group, row.Minor, row.Released, row.Assigned = c.group, uint32(c.minor), c.relDone, c.assigned
			row.Skipped, row.Wakes = c.skipped, c.wakes
			if c.member() {
				row.Read = c.read
				row.Queued, _ = m.queued(c)
			}
			if r.state == RowOverrun || r.state == RowBadCursor {
				row.Lost = r.lost
			}
		}
		o.Rows = append(o.Rows, row)
	}
	return o
}
