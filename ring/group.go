package ring

import (
	"fmt"
	"os/user"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Consumer groups, the producer's side (spec §14): what members publish is read at every cursor read
// (§14.2), positions are assigned from it (§14.3), the window and who holds the ring back follow from it
// (§14.5, §14.6), and a departure is settled at its detach (§14.7). Everything here runs under mu; only
// the hot path frees slots (hot = true), another goroutine leaves that to the next reclaim (rescan).
// Every loop over positions starts no earlier than the oldest position holding a slot (no bit is set
// below it), is direction-checked and covers at most slot_count positions.

// GroupGrant lists who may join a consumer group (spec §14.1): a peer whose uid is in UIDs, or whose
// primary or supplementary groups include one of GIDs. uid 0 may always join.
type GroupGrant struct {
	UIDs []uint32
	GIDs []uint32
}

// grant is a GroupGrant as the producer keeps it: by the group's id, with its name for messages.
type grant struct {
	name string
	GroupGrant
}

// ParseGroupGrant reads recv's --consumer-group value: NAME=UID|@GID[,UID|@GID...], each UID a number or
// a user name, each GID a number or a group name after "@".
func ParseGroupGrant(s string) (string, GroupGrant, error) {
	name, list, ok := strings.Cut(s, "=")
	var g GroupGrant
	if !ok || list == "" {
		return "", g, fmt.Errorf("%w: consumer group %q: want NAME=UID|@GID[,...]", ErrBadConfig, s)
	}
	if err := checkGroupName(name); err != nil {
		return "", g, err
	}
	for _, e := range strings.Split(list, ",") {
		who, isGroup := strings.CutPrefix(e, "@")
		kind, look := "user", lookupUser
		if isGroup {
			kind, look = "group", lookupGroup
		}
		id, err := lookupID(who, look)
		if err != nil {
			return "", g, fmt.Errorf("%w: consumer group %s: %s %q: %v", ErrBadConfig, name, kind, who, err)
		}
		if isGroup {
			g.GIDs = append(g.GIDs, id)
		} else {
			g.UIDs = append(g.UIDs, id)
		}
	}
	return name, g, nil
}

// lookupUser and lookupGroup are a user's and a group's id by name.
func lookupUser(n string) (string, error) {
	u, err := user.Lookup(n)
	if err != nil {
		return "", err
	}
	return u.Uid, nil
}

func lookupGroup(n string) (string, error) {
	g, err := user.LookupGroup(n)
	if err != nil {
		return "", err
	}
	return g.Gid, nil
}

// lookupID reads a decimal id, or looks a name up with look.
func lookupID(s string, look func(string) (string, error)) (uint32, error) {
	if s == "" {
		return 0, fmt.Errorf("empty")
	}
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return uint32(n), nil
	}
	v, err := look(s)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(v, 10, 32)
	return uint32(n), err
}

// GroupNameMax is the longest consumer group name, in bytes of UTF-8 (spec §14.1).
const GroupNameMax = 64

// checkGroupName is spec §14.1's rule for a group's name: 1 … GroupNameMax bytes of UTF-8, no NUL.
func checkGroupName(name string) error {
	if len(name) < 1 || len(name) > GroupNameMax || strings.ContainsRune(name, 0) {
		return fmt.Errorf("%w: consumer group name %q: want 1 to %d bytes, no NUL", ErrBadConfig, name, GroupNameMax)
	}
	return nil
}

// setGrants keeps cfg.Groups by group id, refusing a bad name and two names with one id.
func (p *Producer) setGrants() error {
	for name, g := range p.cfg.Groups {
		if err := checkGroupName(name); err != nil {
			return err
		}
		id := GroupID(name)
		if other, ok := p.grants[id]; ok {
			return fmt.Errorf("%w: consumer groups %q and %q have the same id %#08x: choose other names", ErrBadConfig, other.name, name, id)
		}
		if p.grants == nil {
			p.grants = map[uint32]grant{}
		}
		p.grants[id] = grant{name: name, GroupGrant: g}
	}
	return nil
}

// mayJoin reports whether the peer may join group id (spec §14.1): every group is open without grants;
// with them, only a granted group, and only for its uids and gids (and root).
func (p *Producer) mayJoin(cred *unix.Ucred, groups []uint32, id uint32) bool {
	if p.grants == nil || cred.Uid == 0 {
		return true
	}
	g, ok := p.grants[id]
	if !ok {
		return false
	}
	if slices.Contains(g.UIDs, cred.Uid) || slices.Contains(g.GIDs, cred.Gid) {
		return true
	}
	return slices.ContainsFunc(groups, func(x uint32) bool { return slices.Contains(g.GIDs, x) })
}

// groupName is a group's name when the producer was given it, else its id.
func (p *Producer) groupName(id uint32) string {
	if g, ok := p.grants[id]; ok {
		return g.name
	}
	return fmt.Sprintf("%#08x", id)
}

// before reports position a earlier than b (by subtraction, wrap-around safe).
func before(a, b uint64) bool { return int64(a-b) < 0 }

// span is where a loop over positions [from, to) starts: no earlier than the oldest position holding a
// slot (no bit is set below it) nor than to − slot_count; ok is false when nothing is left to look at.
func (p *Producer) span(from, to uint64) (start uint64, ok bool) {
	start = from
	if before(start, p.reclaim) {
		start = p.reclaim
	}
	if n := uint64(len(p.slots)); to-start > n && !before(to, start) {
		start = to - n
	}
	return start, before(start, to)
}

// readCursorsLocked reads every attached consumer's cursor (spec §7.2, §14.2): a valid one becomes its
// released position (and its row's), an invalid one detaches it. The upper end of the valid range is the
// hot path's own committed position, or for other goroutines the published head — loaded after the
// cursor, so it is at least any head the consumer saw before it stored that cursor. Only the hot path frees
// slots. mu held.
func (p *Producer) readCursorsLocked(hot bool) {
	for i := 0; i < len(p.members); {
		m := p.members[i]
		t := m.tail.Load()
		var head uint64
		if hot {
			head = p.committed // the hot path's own
		} else {
			head = p.head.Load()
		}
		// A consumer can write anything into its cursor: one outside [released, head] detaches it.
		if t-m.released > head-m.released {
			p.detachLocked(m, ConsumerBadCursor, fmt.Sprintf("cursor %d outside [%d, %d]", t, m.released, head))
			continue // detachLocked removed members[i]
		}
		p.acceptCursorLocked(m, t, head, hot)
		i++
	}
}

// acceptCursorLocked takes m's valid tail t (spec §7.2) and, for a member, its read and handed (§14.2: read
// after tail; a read outside [tail, head] is taken as tail): its queued positions are counted, the bits of
// the positions it released cleared, and its row brought up to date. mu held.
func (p *Producer) acceptCursorLocked(m *member, t, head uint64, hot bool) {
	r, handed, prevRead := t, uint64(0), m.read
	if m.v22() {
		r, handed = m.readW.Load(), m.handedW.Load()
		if r-t > head-t {
			r = t
		}
	}
	if m.group != 0 {
		p.countReadLocked(m, r, head)
		p.sweepLocked(m, t, hot)
		if m.v22() && m.relAssigned > handed && m.relAssigned-handed > m.skipped {
			d := m.relAssigned - handed - m.skipped
			m.skipped += d
			p.stats[CounterGroupSkipped].Store(p.stats[CounterGroupSkipped].Load() + d)
			u64at(m.row, rowSkipped).Store(m.skipped)
		}
		u64at(m.row, rowQueued).Store(m.queued)
	}
	if t != m.released {
		m.released = t
		u64at(m.row, rowReleased).Store(t)
	}
	if r != prevRead {
		m.read = r
		u64at(m.row, rowRead).Store(r)
	}
}

// countReadLocked moves member m's read position to r: positions assigned to it that r passes are no
// longer queued, and the oldest still queued is found (spec §14.2, §14.5). A read that moved back (only a
// member harming itself does that) is counted afresh. mu held.
func (p *Producer) countReadLocked(m *member, r, head uint64) {
	bit := uint64(1) << m.index
	if !before(r, m.read) {
		if start, ok := p.span(m.read, r); ok {
			for q := start; q != r; q++ {
				if p.posNeed[q&p.mask]&bit != 0 && m.queued > 0 {
					m.queued--
				}
			}
		}
	} else {
		m.queued = 0
		if start, ok := p.span(r, head); ok {
			for q := start; q != head; q++ {
				if p.posNeed[q&p.mask]&bit != 0 {
					m.queued++
				}
			}
		}
		m.oldestQ = r
	}
	m.read = r
	// oldestQ still stands if it is at or past read, still described (posNeed is indexed like the
	// descriptors: a position a ring or more behind head names a newer one's entry) and still needs m
	if m.queued == 0 || !before(m.oldestQ, r) && (head-m.oldestQ-1 < uint64(len(p.slots)) || testMutants["stale-oldest-queued"]) &&
		p.posNeed[m.oldestQ&p.mask]&bit != 0 {
		return
	}
	start, ok := p.span(max64From(m.oldestQ, r), head)
	for q := start; ok && q != head; q++ {
		if p.posNeed[q&p.mask]&bit != 0 {
			m.oldestQ = q
			return
		}
	}
	m.queued = 0 // none found: the count was off (a member that moved its read about)
}

// max64From is the later of two positions.
func max64From(a, b uint64) uint64 {
	if before(a, b) {
		return b
	}
	return a
}

// sweepLocked settles member m's releases up to t (spec §14.5): each position it released that was
// assigned to it no longer needs it; one that reclaim has passed and nobody else needs is free — at once on
// the hot path, else at the next reclaim. mu held.
func (p *Producer) sweepLocked(m *member, t uint64, hot bool) {
	bit := uint64(1) << m.index
	start, ok := p.span(m.swept, t)
	for q := start; ok && q != t; q++ {
		i := q & p.mask
		if p.posNeed[i]&bit == 0 {
			continue
		}
		p.posNeed[i] &^= bit
		m.outstanding--
		m.relAssigned++
		if p.posNeed[i] == 0 && before(q, p.scan) {
			if hot {
				p.freePos(q)
			} else {
				p.rescan = true
			}
		}
	}
	if !before(t, m.swept) {
		m.swept = t
	}
}

// settleLocked settles a departing member at its detach (spec §14.7), up to head (every position carrying
// its bit is below it: with groups, head is stored under mu): what it had released is released, what it
// had been assigned at or after its final tail is lost for its group (group_lost). Its bit is cleared from
// every position; the next reclaim frees the slots nothing else needs. mu held.
func (p *Producer) settleLocked(m *member, head uint64) {
	bit := uint64(1) << m.index
	var lost uint64
	start, ok := p.span(m.swept, head)
	for q := start; ok && q != head; q++ {
		i := q & p.mask
		if p.posNeed[i]&bit == 0 {
			continue
		}
		p.posNeed[i] &^= bit
		if !before(q, m.released) {
			lost++
		}
	}
	m.swept, m.queued, m.outstanding = head, 0, 0
	p.rescan = true
	// What an attached independent consumer has not released stays held; the rest is free once nobody
	// needs it, whether or not anybody stays attached (reclaimLocked).
	front := head
	for _, o := range p.members {
		if o != m && o.group == 0 && before(o.released, front) {
			front = o.released
		}
	}
	if !p.settleFrontSet || before(p.settleFront, front) {
		p.settleFront, p.settleFrontSet = front, true
	}
	if lost > 0 {
		p.stats[CounterGroupLost].Store(p.stats[CounterGroupLost].Load() + lost)
	}
}

// setWindowLocked bounds the positions the hot path may take slots for (spec §14.5): within slot_count of
// the oldest position holding a slot, of every independent consumer's and 2.1 member's tail, and of every
// 2.2 member's oldest queued position. mu held.
func (p *Producer) setWindowLocked() {
	n := uint64(len(p.slots))
	end := p.reclaim + n
	for _, m := range p.members {
		var b uint64
		switch {
		case !m.v22():
			b = m.released + n
		case m.queued > 0:
			b = m.oldestQ + n
		default:
			continue // holds nothing unread: it bounds nothing
		}
		if before(b, end) {
			end = b
		}
	}
	p.windowEnd = end
}

// holdersLocked lists the consumers holding the ring back from a slot for position q (spec §14.6): those
// for which a bound of §14.5 fails at q, and those that still need the oldest held position. It reuses
// one slice (no allocation). mu held, reclaimLocked just run.
func (p *Producer) holdersLocked(q uint64) []*member {
	n := uint64(len(p.slots))
	o := p.reclaim
	oHeld := o != p.committed && p.posSlot[o&p.mask] != noSlot
	hs := p.holders[:0]
	for _, m := range p.members {
		var hold bool
		switch {
		case !m.v22():
			hold = !before(q-n, m.released) // q − tail ≥ slot_count
		case m.queued > 0:
			hold = !before(q-n, m.oldestQ)
		}
		if !hold && oHeld {
			if m.group == 0 {
				hold = !before(o, m.released) // it has not released o
			} else {
				hold = p.posNeed[o&p.mask]&(1<<m.index) != 0
			}
		}
		if hold {
			hs = append(hs, m)
		}
	}
	p.holders = hs
	return hs
}

// overrunLocked is the drop policy's answer to a full ring (spec §7.3, §14.6): if some attached consumer
// does not hold the ring back, those that do are detached as overrun and the producer reclaims and tries
// again; it reports whether a slot may be taken now. mu held, reclaimLocked just run.
func (p *Producer) overrunLocked() bool {
	for range len(p.members) + 1 {
		if p.slotReady() {
			return true
		}
		hs := p.holdersLocked(p.pos + p.inflight)
		if len(hs) == 0 || len(hs) == len(p.members) {
			return false
		}
		for _, m := range slices.Clone(hs) { // a detach only, not per heap
			p.detachLocked(m, ConsumerOverrun, fmt.Sprintf("%d heaps behind", p.pos-m.released))
		}
		p.reclaimLocked()
	}
	return p.slotReady()
}

// blockerLocked is the consumer a waiting producer waits for (spec §14.6): the first (lowest row) of
// those holding the ring back, or, when none does (WaitDrained), the first that has not released
// everything; nil with none attached. mu held.
func (p *Producer) blockerLocked() *member {
	var best *member
	consider := func(m *member) {
		if best == nil || m.index < best.index {
			best = m
		}
	}
	if !p.slotReady() {
		for _, m := range p.holdersLocked(p.pos + p.inflight) {
			consider(m)
		}
	}
	if best == nil {
		for _, m := range p.members {
			if m.released != p.committed {
				consider(m)
			}
		}
	}
	if best == nil && len(p.members) > 0 {
		return p.members[0]
	}
	return best
}

// assignLocked gives each staged position to one member of every group (spec §14.3): a member with nothing
// queued first, among several the one picked least recently (round robin); otherwise the one with the
// fewest queued, ties to the one picked least recently. The mask goes into the descriptor (before head is
// stored) and into posNeed. The end-of-stream marker is for everyone and assigned to nobody. Hot path, mu
// held, cursors just read. No allocation.
func (p *Producer) assignLocked(groups [][]*member) {
	p.commits++
	// Staged positions hold slots, so there are at most slot_count of them (spec §14.7: every loop over
	// positions is bounded; compared by subtraction, so cursors near 2^64 wrap safely).
	start := p.committed
	if n := uint64(len(p.slots)); p.pos-start > n {
		start = p.pos - n
	}
	for q := start; q != p.pos; q++ {
		d := &p.descs[q&p.mask]
		if d.Flags&(FlagEndOfStream|FlagStreamEnd) != 0 {
			continue // markers are everyone's
		}
		var mask uint64
		for _, g := range groups {
			best := g[0]
			for _, m := range g[1:] {
				idle, bestIdle := m.queued == 0, best.queued == 0
				switch {
				case idle != bestIdle:
					if idle {
						best = m
					}
				case idle || m.queued == best.queued:
					// least recently picked; never picked (0) before all, and among those the lowest row
					if m.lastPick < best.lastPick || m.lastPick == best.lastPick && m.index < best.index {
						best = m
					}
				case m.queued < best.queued:
					best = m
				}
			}
			p.picks++
			if best.queued == 0 {
				best.oldestQ = q
			}
			best.lastPick, best.lastQ, best.lastQCommit = p.picks, q, p.commits
			best.queued++
			best.outstanding++
			best.assigned++
			mask |= 1 << best.index
		}
		d.Assign = mask
		p.posNeed[q&p.mask] = mask
	}
	for _, g := range groups {
		for _, m := range g {
			if m.lastQCommit == p.commits {
				u64at(m.row, rowAssigned).Store(m.assigned)
			}
		}
	}
}
