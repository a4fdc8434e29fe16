package ringsim

import (
	"fmt"
	"slices"
	"strings"
)

// actor is a consumer played through a target's memory, as a 2.2 client (or a 2.1 member) reads.
type actor struct {
	id                      int
	live                    bool // attached as far as the harness knows
	observer                bool
	row                     int
	gen                     uint32
	group                   uint32
	minor                   uint16
	start, read, tail       uint64
	handed                  uint64
	held                    []uint64
	stopped, thief, waiting bool
	departed                bool   // its departure was accounted in the ledger
	unread                  uint64 // own positions it released without handing them out
	skipHW                  uint64 // the most unread − held it showed the producer (its row's skipped)
}

func (a *actor) member22() bool { return a.group != 0 && a.minor >= 2 }

// lane is one target, its consumers and its ledger: what was assigned to whom and handed out, from
// which the invariants are checked whatever the target.
type lane struct {
	t      Target
	acts   []*actor
	owner  map[uint64]uint64 // position → assign as published
	handed map[uint64]uint64 // position → rows that handed it out
	seen   uint64            // positions below it have had their masks checked
	// what the ledger expects the counters to say
	expLost   uint64
	thiefSeen bool // a thief had released unread at the last check
	skipLag   bool // the last operation was no publish: the producer may not have counted skipped yet
}

// ledgerSpan is how many positions behind head the ledger remembers: more than any slot count simulated,
// so a position assigned and not released is always in it.
const ledgerSpan = 256

// Failure is a failed run: which seed, which step, and why.
type Failure struct {
	Scenario Scenario
	Step     int
	Op       Op
	Target   string
	Msg      string
	Trail    []string
	Targets  []string
	Mutation Mutation
	State    string // the outcomes at the failure, compactly
}

// summary is an outcome in one line: head, pending, blocked_on, free, counters, attached rows.
func summary(name string, o Outcome) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  %s: head %d pending %v blocked_on %d free %d %+v\n   ", name, o.Head, o.Pending, o.BlockedOn, o.Free, o.Stats)
	for i, r := range o.Rows {
		if r.State != RowFree {
			fmt.Fprintf(&b, " [%d st%d g%#x rel%d rd%d q%d as%d sk%d]", i, r.State, r.Group, r.Released, r.Read, r.Queued, r.Assigned, r.Skipped)
		}
	}
	b.WriteString("\n")
	return b.String()
}

func (f *Failure) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ringsim: %s, step %d (%v) on %s: %s\n", f.Scenario.Describe(), f.Step, f.Op, f.Target, f.Msg)
	if f.Target == "model" && len(f.Targets) == 0 {
		fmt.Fprintf(&b, "reproduce: go test ./internal/ringsim -run 'TestSim$' -seed %d -steps %d", f.Scenario.Seed, f.Step+1)
	} else {
		fmt.Fprintf(&b, "reproduce: SIM_TARGETS=%s go test ./internal/ringsim -run 'TestSimProducers$' -seed %d -steps %d",
			strings.Join(f.Targets, ","), f.Scenario.Seed, f.Step+1)
	}
	if f.Mutation != MutNone {
		fmt.Fprintf(&b, " (model mutation %s)", f.Mutation)
	}
	if f.Scenario.LappedSpec {
		fmt.Fprintf(&b, " (members skip lapped descriptors as §14.4 first worded it)")
	}
	b.WriteString("\n")
	if f.State != "" {
		b.WriteString(f.State)
	}
	if n := len(f.Trail); n > 0 {
		fmt.Fprintf(&b, "last operations:\n  %s\n", strings.Join(f.Trail[max(0, n-12):], "\n  "))
	}
	return b.String()
}

// Run plays steps operations of s against the model and each real target, comparing their outcomes
// after every step and checking the invariants on each. It returns the first failure, and the model
// (for its counters).
func Run(s Scenario, steps int, mut Mutation, reals ...Target) (*Model, error) {
	return run(s, steps, mut, nil, reals...)
}

// run is Run, the model's calls written to rec's replay stream when rec is not nil.
func run(s Scenario, steps int, mut Mutation, rec *recorder, reals ...Target) (*Model, error) {
	m := NewModel(s.Slots, s.Rows, s.Policy, s.P0, mut)
	var lane0 Target = modelTarget{m}
	if rec != nil {
		rec.modelTarget = modelTarget{m}
		lane0 = rec
	}
	lanes := []*lane{newLane(lane0, s.P0)}
	for _, t := range reals {
		lanes = append(lanes, newLane(t, s.P0))
	}
	g := newGen(s)
	var trail []Op
	for step := 0; step < steps; step++ {
		var op Op
		if s.Ops != nil {
			if step >= len(s.Ops) {
				break
			}
			op = s.Ops[step]
		} else {
			op = g.next(m, lanes[0].acts)
		}
		trail = append(trail, op)
		if len(trail) > 64 {
			trail = trail[32:]
		}
		fail := func(tn, msg string) error {
			f := &Failure{Scenario: s, Step: step, Op: op, Target: tn, Msg: msg, Mutation: mut}
			for _, o := range trail {
				f.Trail = append(f.Trail, o.String())
			}
			for _, l := range lanes[1:] {
				f.Targets = append(f.Targets, l.t.Name())
			}
			f.State = summary("model", m.Observe())
			for _, l := range lanes[1:] {
				if tn == l.t.Name() {
					f.State += summary(tn, l.t.Observe())
				}
			}
			return f
		}
		if err := playOp(s, m, lanes, op); err != nil {
			return m, fail(err.target, err.msg)
		}
		if v := m.Violation(); v != nil {
			return m, fail("model", v.Msg)
		}
		m.Settle()
		if rec != nil {
			rec.settled()
		}
		want := m.Observe()
		for _, l := range lanes[1:] {
			if err := l.t.Settle(want); err != nil {
				return m, fail(l.t.Name(), err.Error())
			}
		}
		if v := m.Violation(); v != nil {
			return m, fail("model", v.Msg)
		}
		want = m.Observe()
		for i, l := range lanes {
			o := want
			if i == 0 && rec != nil {
				rec.endStep(o)
			}
			if i > 0 {
				o = l.t.Observe()
				l.skipLag = op.K != OpPublish && op.K != OpEOS
				if d := diff(want, o, ignoreSkipped); d != "" {
					return m, fail(l.t.Name(), "differs from the model: "+d)
				}
			}
			if msg := l.check(s, o); msg != "" {
				return m, fail(l.t.Name(), msg)
			}
		}
	}
	return m, nil
}

type laneErr struct{ target, msg string }

func newLane(t Target, p0 uint64) *lane {
	return &lane{t: t, owner: map[uint64]uint64{}, handed: map[uint64]uint64{}, seen: p0}
}

// playOp applies op to every lane, the model's first.
func playOp(s Scenario, m *Model, lanes []*lane, op Op) *laneErr {
	switch op.K {
	case OpAttach:
		var row0 int
		var tail0 uint64
		var st0 int
		for i, l := range lanes {
			row, gen, tail, st, err := l.t.Attach(op.Group, op.Minor, op.Start, op.Observer)
			if err != nil {
				return &laneErr{l.t.Name(), err.Error()}
			}
			if i == 1 && st == StatusOK && st0 == StatusOK && !op.Observer && row == row0 && tail != tail0 &&
				op.Group == 0 && op.Start == 0 && m.Rebase(row, tail) {
				// a start the spec allows this producer (§7.1): the model and its consumer follow it
				if a := lanes[0].acts[op.C]; a != nil {
					a.start, a.read, a.tail = tail, tail, tail
				}
				tail0 = tail
			}
			if i == 0 {
				row0, tail0, st0 = row, tail, st
			} else if !op.Observer && (st != st0 || st == StatusOK && (row != row0 || tail != tail0)) {
				// (an observer's place is freed when its producer sees the close: not compared)
				return &laneErr{l.t.Name(), fmt.Sprintf("attach: status %d row %d start %d, the model: status %d row %d start %d", st, row, tail, st0, row0, tail0)}
			}
			a := &actor{id: op.C, row: row, gen: gen, group: op.Group, minor: op.Minor, start: tail, read: tail,
				tail: tail, observer: op.Observer, live: st == StatusOK && !op.Observer}
			for len(l.acts) <= op.C {
				l.acts = append(l.acts, &actor{id: len(l.acts)})
			}
			l.acts[op.C] = a
			if a.live && a.member22() {
				l.t.Store(row, FRead, tail)
			}
		}
		return nil
	case OpPublish, OpEOS:
		n := max(op.N, 1)
		for range n {
			if m.IsPending() {
				break
			}
			want := Result(-1)
			for i, l := range lanes {
				r, err := l.t.Publish(op.K == OpEOS, want)
				if err != nil {
					return &laneErr{l.t.Name(), err.Error()}
				}
				if i == 0 {
					want = r
				} else if r != want {
					return &laneErr{l.t.Name(), fmt.Sprintf("publish at head %d: %v, the model: %v", m.head-uint64(btoi(want == Published)), r, want)}
				}
				if msg := l.checkMasks(); msg != "" {
					return &laneErr{l.t.Name(), msg}
				}
			}
		}
		return nil
	}
	if op.K == OpDetach || op.K == OpSleep {
		// release, let every producer see it (a block publish may go on), then close or announce the
		// wait: a producer woken by the release races what follows otherwise
		rel := Op{K: OpRelease, C: op.C, Mode: 2}
		if op.K == OpSleep {
			rel.Mode = 3
		}
		for _, l := range lanes {
			if op.C < len(l.acts) {
				if msg := l.act(s, rel, l.acts[op.C]); msg != "" {
					return &laneErr{l.t.Name(), msg}
				}
			}
		}
		m.Settle()
		if rec, ok := lanes[0].t.(*recorder); ok {
			rec.settled()
		}
		want := m.Observe()
		for _, l := range lanes[1:] {
			if err := l.t.Settle(want); err != nil {
				return &laneErr{l.t.Name(), err.Error()}
			}
		}
		for _, l := range lanes {
			if msg := l.checkMasks(); msg != "" {
				return &laneErr{l.t.Name(), msg}
			}
		}
	}
	for _, l := range lanes {
		if op.C >= len(l.acts) {
			continue
		}
		if msg := l.act(s, op, l.acts[op.C]); msg != "" {
			return &laneErr{l.t.Name(), msg}
		}
	}
	return nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// attached reports whether a's row still says it is attached (spec §2.2: state, then generation).
func (l *lane) attached(a *actor) bool {
	st, gen := l.t.RowState(a.row)
	return st == RowAttached && gen == a.gen
}

// act plays a consumer operation on l's target.
func (l *lane) act(s Scenario, op Op, a *actor) string {
	if !a.live {
		return ""
	}
	t := l.t
	switch op.K {
	case OpStop:
		a.stopped = true
	case OpResume:
		a.stopped = false
	case OpDie:
		a.live = false
		return errString(t.Close(a.row, a.gen))
	case OpDetach:
		a.live = false
		return errString(t.Close(a.row, a.gen))
	case OpBogusTail:
		v := t.Head() + 1 + uint64(op.Mode)*1000
		if op.Mode == 1 {
			v = a.tail - 1
		}
		t.Store(a.row, FTail, v)
		a.stopped = true // it stays as broken as it is
	case OpBogusRead:
		v := t.Head() + 3
		if op.Mode == 1 {
			v = a.tail - 2
		}
		if a.group != 0 {
			t.Store(a.row, FRead, v)
		}
	case OpThief:
		if a.group == 0 || !l.attached(a) {
			return ""
		}
		a.thief = true
		h := t.Head()
		a.read = h
		a.held = nil
		if a.member22() {
			t.Store(a.row, FRead, h)
		}
		return l.release(a, h, true)
	case OpRead:
		if a.stopped {
			return ""
		}
		return l.read(s, a, op.N)
	case OpRelease:
		if op.Mode == 2 { // before a detach: everything looked at (§7.6), stopped or not
			if !l.attached(a) {
				return ""
			}
			return l.release(a, a.read, true)
		}
		if op.Mode == 3 { // before a sleep: holding nothing, everything looked at (§14.4)
			if a.stopped || !l.attached(a) || len(a.held) > 0 || a.tail == a.read {
				return ""
			}
			return l.release(a, a.read, false)
		}
		if a.stopped {
			return ""
		}
		if op.Mode == 1 && len(a.held) > 0 {
			return l.release(a, a.held[0]+1, false)
		}
		return l.release(a, a.read, false)
	case OpSleep:
		if a.stopped || !l.attached(a) {
			return ""
		}
		l.storeProgress(a)
		t.Store(a.row, FWakeAt, a.read+1)
		t.Store(a.row, FWaiting, 1)
		a.waiting = true
	}
	return ""
}

func errString(err error) string {
	if err != nil {
		return err.Error()
	}
	return ""
}

// storeProgress publishes a 2.2 member's read and handed (spec §14.2).
func (l *lane) storeProgress(a *actor) {
	if a.member22() {
		l.t.Store(a.row, FRead, a.read)
		l.t.Store(a.row, FHanded, a.handed)
	}
}

// release moves a's tail to t (spec §7.4, §14.4), checking in the ledger that an honest member let go
// of none of its own positions unread.
func (l *lane) release(a *actor, t uint64, all bool) string {
	if t == a.tail {
		return ""
	}
	if a.group != 0 {
		bit := uint64(1) << a.row
		from := a.tail
		if t-from > ledgerSpan {
			from = t - ledgerSpan // positions older than the ledger's span were never this member's to hold
		}
		for q := from; q != t; q++ {
			mask, ok := l.owner[q]
			if !ok || mask&bit == 0 || before(q, a.start) || l.handed[q]&bit != 0 {
				continue
			}
			if a.thief && a.member22() {
				a.unread++
				continue
			}
			if !a.thief {
				return fmt.Sprintf("row %d (group %#x) releases position %d, assigned to it, without having handed it out", a.row, a.group, q)
			}
		}
	}
	for len(a.held) > 0 && before(a.held[0], t) {
		a.held = a.held[1:]
	}
	a.tail = t
	l.storeProgress(a)
	l.t.Store(a.row, FTail, t)
	return ""
}

// read looks at up to n positions as §9.1 and §14.4 say.
func (l *lane) read(s Scenario, a *actor, n int) string {
	t := l.t
	if !l.attached(a) {
		return ""
	}
	bit := uint64(1) << a.row
	for range n {
		h := t.Head()
		if a.read == h {
			break
		}
		lapped := false
		if h-a.read > s.Slots {
			lapped = true
		}
		var seq, mask uint64
		var eos bool
		if !lapped {
			seq, mask, eos = t.Desc(a.read)
			if seq != a.read+1 {
				if !l.attached(a) {
					return "" // detached: it learns it from its row (§7.7)
				}
				if d := seq - (a.read + 1); a.member22() && d%s.Slots == 0 {
					lapped = true
				} else {
					return fmt.Sprintf("row %d reads position %d: descriptor seq %d while its row says attached", a.row, a.read, seq)
				}
			}
		}
		if lapped {
			if !a.member22() {
				return fmt.Sprintf("row %d (independent or 2.1) is %d positions behind head %d while its row says attached", a.row, h-a.read, h)
			}
			to := h - s.Slots
			if s.LappedSpec {
				to++
			}
			for q := a.read; q != to; q++ {
				if mk, ok := l.owner[q]; ok && mk&bit != 0 && !before(q, a.start) && l.handed[q]&bit == 0 {
					return fmt.Sprintf("row %d skips lapped positions %d..%d (head %d), among them its own %d", a.row, a.read, to, h, q)
				}
			}
			a.read = to
			continue
		}
		if !eos && (a.group == 0 || mask&bit != 0) {
			if a.group != 0 {
				if l.handed[a.read]&bit != 0 {
					return fmt.Sprintf("row %d hands out position %d twice", a.row, a.read)
				}
				l.handed[a.read] |= bit
			}
			a.handed++
			a.held = append(a.held, a.read)
		}
		a.read++
	}
	if !l.attached(a) {
		a.held = nil // detached while reading: what it read is not valid (§7.7)
		return ""
	}
	if a.waiting {
		t.Store(a.row, FWaiting, 0)
		a.waiting = false
	}
	l.storeProgress(a)
	return ""
}

// checkMasks checks the assign word of every newly published position (spec §14.3): exactly one bit
// per group with attached members, each bit an attached member's of that group, none on the marker.
func (l *lane) checkMasks() string {
	h := l.t.Head()
	for ; l.seen != h; l.seen++ {
		q := l.seen
		_, mask, eos := l.t.Desc(q)
		l.owner[q] = mask
		delete(l.owner, q-ledgerSpan)
		delete(l.handed, q-ledgerSpan)
		if eos {
			if mask != 0 {
				return fmt.Sprintf("end-of-stream marker at %d has assign %#x", q, mask)
			}
			continue
		}
		groups := map[uint32]uint64{}
		var rows uint64
		for _, a := range l.acts {
			if a.live && a.group != 0 && l.attached(a) {
				groups[a.group] |= 1 << a.row
				rows |= 1 << a.row
			}
		}
		if mask&^rows != 0 {
			return fmt.Sprintf("position %d assigned %#x: bits %#x are not attached members", q, mask, mask&^rows)
		}
		for g, gm := range groups {
			if c := popcount(mask & gm); c != 1 {
				return fmt.Sprintf("position %d assigned %#x: %d members of group %#x (rows %#x), not one", q, mask, c, g, gm)
			}
		}
	}
	return ""
}

func popcount(x uint64) int {
	n := 0
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}

// check is the invariants on a target's outcome after a step: departures settled (group_lost),
// members' unread releases counted (group_skipped), no slot leaked, the end of a block wait named.
func (l *lane) check(s Scenario, o Outcome) string {
	if msg := l.checkMasks(); msg != "" {
		return msg
	}
	for _, a := range l.acts {
		if a.observer || a.departed || a.row < 0 || a.gen == 0 {
			continue
		}
		if r := o.Rows[a.row]; r.State == RowAttached && r.Gen == a.gen {
			continue
		}
		a.departed, a.live = true, false
		r := o.Rows[a.row]
		if r.Gen != a.gen {
			return fmt.Sprintf("row %d: generation %d while consumer #%d (generation %d) had not been seen leave", a.row, r.Gen, a.id, a.gen)
		}
		if a.group != 0 {
			bit := uint64(1) << a.row
			for q, mask := range l.owner {
				if mask&bit != 0 && !before(q, a.start) && !before(q, r.Released) && before(q, o.Head) {
					l.expLost++
				}
			}
		}
		if (r.State == RowOverrun || r.State == RowBadCursor) && r.Lost != o.Head-r.Released && r.Lost > o.Head-r.Released {
			return fmt.Sprintf("row %d detached (%d) with lost_heaps %d, more than head %d − released %d", a.row, r.State, r.Lost, o.Head, r.Released)
		}
	}
	if o.Stats.GroupLost != l.expLost {
		return fmt.Sprintf("group_lost %d, but departed members left %d of their positions unreleased", o.Stats.GroupLost, l.expLost)
	}
	// spec §14.7: skipped = released assigned − handed (0 if negative). When a producer evaluates it (at
	// each cursor read, at each release, at its next reclaim) and whether a fall is kept is not said, and
	// the producers differ: what every reading agrees on is checked. No member released its share
	// unread: nothing skipped. One did, and a publish has come since: group_skipped counts it.
	thief, any := false, false
	for _, a := range l.acts {
		any = any || a.member22() && a.unread > 0
		thief = thief || a.member22() && a.live && a.unread > uint64(len(a.held))
	}
	if !any && o.Stats.GroupSkipped != 0 {
		return fmt.Sprintf("group_skipped %d, but no member released its positions unread", o.Stats.GroupSkipped)
	}
	if thief && l.thiefSeen && !l.skipLag && o.Stats.GroupSkipped == 0 && !ignore["group_skipped"] {
		return "a member released its positions unread and a publish came since, yet group_skipped is 0 (§14.7)"
	}
	l.thiefSeen = thief
	if s.Policy == Drop && o.Pending {
		return "a drop publish waits"
	}
	if o.Free >= 0 && !o.Pending {
		all, any := true, false
		for _, r := range o.Rows {
			if r.State == RowAttached {
				any = true
				all = all && r.Released == o.Head
			}
		}
		if any && all && uint64(o.Free) != s.Slots {
			return fmt.Sprintf("slot leak: every attached consumer released everything (head %d) and %d of %d slots are free", o.Head, o.Free, s.Slots)
		}
	}
	return ""
}

// Ignore names outcome fields a comparison leaves out (SIM_IGNORE, comma-separated): "blocked_on",
// "progress" (rows' read, queued, skipped), "group_skipped", "wakes", "assigned", "lost", "eos" — what a 2.1 producer does not have,
// to look past them at what it does.
type Ignore map[string]bool

var ignore = Ignore{}

var ignoreSkipped = Ignore{"group_skipped": true, "skipped": true}

// SetIgnore sets the fields comparisons leave out.
func SetIgnore(names string) {
	ignore = Ignore{}
	for _, n := range strings.Split(names, ",") {
		if n != "" {
			ignore[n] = true
		}
	}
	ignoreSkipped = Ignore{"group_skipped": true, "skipped": true}
	for n := range ignore {
		ignoreSkipped[n] = true
	}
}

// diff compares a target's outcome with the model's on what the spec decides.
func diff(w, g Outcome, ig Ignore) string {
	if ig["blocked_on"] {
		g.BlockedOn = w.BlockedOn
	}
	if ig["group_skipped"] {
		g.Stats.GroupSkipped = w.Stats.GroupSkipped
	}
	if ig["eos"] {
		g.Stats.EOS = w.Stats.EOS
	}
	for i := range min(len(w.Rows), len(g.Rows)) {
		if ig["progress"] {
			g.Rows[i].Read, g.Rows[i].Queued, g.Rows[i].Skipped = w.Rows[i].Read, w.Rows[i].Queued, w.Rows[i].Skipped
		}
		if ig["skipped"] {
			g.Rows[i].Skipped = w.Rows[i].Skipped
		}
		if ig["lost"] {
			g.Rows[i].Lost = w.Rows[i].Lost
		}
		if ig["assigned"] {
			g.Rows[i].Assigned = w.Rows[i].Assigned
		}
		if ig["wakes"] {
			g.Rows[i].Wakes = w.Rows[i].Wakes
		}
	}
	var d []string
	add := func(f string, a ...any) { d = append(d, fmt.Sprintf(f, a...)) }
	if w.Head != g.Head {
		add("head %d (model %d)", g.Head, w.Head)
	}
	if w.Stats != g.Stats {
		add("stats %+v (model %+v)", g.Stats, w.Stats)
	}
	if w.Pending != g.Pending {
		add("pending %v (model %v)", g.Pending, w.Pending)
	}
	if w.BlockedOn != g.BlockedOn {
		add("blocked_on %d (model %d)", g.BlockedOn, w.BlockedOn)
	}
	if w.Free >= 0 && g.Free >= 0 && w.Free != g.Free && !w.Pending {
		add("free slots %d (model %d)", g.Free, w.Free)
	}
	if w.MaskFrom == g.MaskFrom && !slices.Equal(w.Masks, g.Masks) {
		add("assign masks from %d: %#x (model %#x)", g.MaskFrom, g.Masks, w.Masks)
	}
	for i := range min(len(w.Rows), len(g.Rows)) {
		a, b := w.Rows[i], g.Rows[i]
		if a.State != b.State || a.Gen != b.Gen {
			add("row %d state %d gen %d (model %d gen %d)", i, b.State, b.Gen, a.State, a.Gen)
			continue
		}
		if a.State == RowFree {
			continue
		}
		if a.Group != b.Group || a.Released != b.Released {
			add("row %d group %#x released %d (model %#x %d)", i, b.Group, b.Released, a.Group, a.Released)
		}
		if (a.State == RowOverrun || a.State == RowBadCursor) && a.Lost != b.Lost {
			add("row %d lost_heaps %d (model %d)", i, b.Lost, a.Lost)
		}
		if a.State != RowAttached {
			continue
		}
		if a.Wakes != b.Wakes {
			add("row %d wakes %d (model %d)", i, b.Wakes, a.Wakes)
		}
		if a.Group != 0 && (a.Assigned != b.Assigned || a.Queued != b.Queued || a.Read != b.Read || a.Skipped != b.Skipped) {
			add("row %d assigned %d read %d queued %d skipped %d (model %d %d %d %d)", i, b.Assigned, b.Read, b.Queued, b.Skipped,
				a.Assigned, a.Read, a.Queued, a.Skipped)
		}
	}
	return strings.Join(d, "; ")
}
