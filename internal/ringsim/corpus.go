package ringsim

// Corpus scenarios: scripts reproducing the group defects layout 2.1's producers had (spec §14.9), each
// failing against such a producer and passing against one that follows §14.

const corpusGroup = 0x5eed

// script builds a scenario's operations.
type script struct {
	ops []Op
	n   int // consumers attached so far
}

func (s *script) attach(group uint32, start uint32) int {
	s.ops = append(s.ops, Op{K: OpAttach, C: s.n, Group: group, Minor: 2, Start: start})
	s.n++
	return s.n - 1
}

func (s *script) op(k OpKind, c, n, mode int) {
	s.ops = append(s.ops, Op{K: k, C: c, N: n, Mode: mode})
}
func (s *script) publish(n int)    { s.ops = append(s.ops, Op{K: OpPublish, N: n}) }
func (s *script) readAll(c int)    { s.op(OpRead, c, 1<<20, 0) }
func (s *script) releaseAll(c int) { s.op(OpRelease, c, 0, 0) }

// CorpusCase is one known defect as a scenario.
type CorpusCase struct {
	Name string
	Why  string
	S    Scenario
}

// Corpus is the known 2.1 group defects, as scenarios.
func Corpus() []CorpusCase {
	var cs []CorpusCase

	// 1. A stopped member under drop: it alone holds the ring back and is detached; the monitor and the
	// healthy members stay attached and nothing is dropped (2.1 blamed by released position).
	{
		var s script
		a, b, stopped, mon := s.attach(corpusGroup, 1), s.attach(corpusGroup, 1), s.attach(corpusGroup, 1), s.attach(0, 1)
		s.op(OpStop, stopped, 0, 0)
		for range 64 {
			s.publish(1)
			for _, c := range []int{a, b, mon} {
				s.readAll(c)
				s.releaseAll(c)
				s.op(OpSleep, c, 0, 0)
			}
		}
		cs = append(cs, CorpusCase{"stopped-member-drop", "a stopped member under drop gets the monitor and healthy members detached",
			Scenario{Seed: 1, Slots: 16, Rows: 4, Policy: Drop, Ops: s.ops}})
	}
	// 2. A member leaves after releasing everything; an independent consumer attaching at the oldest
	// heap takes its row, starting behind the member's releases: 2.1's settle walked ~2^64 positions.
	{
		var s script
		holder := s.attach(0, 0)
		m := s.attach(corpusGroup, 1)
		s.publish(10)
		s.readAll(holder)
		s.readAll(m)
		s.releaseAll(m)
		s.op(OpDetach, m, 0, 0)
		n := s.attach(0, 0)
		s.publish(5)
		s.readAll(n)
		s.readAll(holder)
		s.releaseAll(n)
		s.releaseAll(holder)
		s.publish(16)
		cs = append(cs, CorpusCase{"row-reuse-settle-walk", "member leaves, independent takes its row, settle walks 2^64 (hang)",
			Scenario{Seed: 2, Slots: 16, Rows: 3, Policy: Drop, Ops: s.ops}})
	}
	// 3. The member leaves with positions unreleased and the new consumer in its row starts between what
	// the member released and head: 2.1 settled only up to that start and leaked the slots above it.
	{
		var s script
		holder := s.attach(0, 0)
		m := s.attach(corpusGroup, 1)
		s.publish(4)
		s.readAll(holder)
		s.readAll(m)
		s.releaseAll(m)
		s.publish(8)
		s.readAll(holder)
		for range 7 {
			s.op(OpRelease, holder, 0, 1) // its oldest held heap
		}
		s.op(OpDetach, m, 0, 0)
		n := s.attach(0, 0)
		s.readAll(n)
		s.releaseAll(holder)
		for range 48 {
			s.publish(1)
			s.readAll(n)
			s.releaseAll(n)
			s.readAll(holder)
			s.releaseAll(holder)
		}
		cs = append(cs, CorpusCase{"row-reuse-slot-leak", "slot leak when the settle limit falls between swept and head",
			Scenario{Seed: 3, Slots: 16, Rows: 3, Policy: Drop, Ops: s.ops}})
	}
	// 4. Idle member churn: members holding positions attach and leave while nothing is published;
	// each departure is settled at its detach (group_lost at once), nothing waits for a publish.
	{
		var s script
		mon := s.attach(0, 1)
		first := s.attach(corpusGroup, 1)
		s.publish(3)
		s.readAll(mon)
		s.releaseAll(mon)
		prev := first
		for range 40 {
			next := s.attach(corpusGroup, 1)
			s.op(OpDie, prev, 0, 0)
			prev = next
		}
		cs = append(cs, CorpusCase{"idle-member-churn", "idle member churn: departures wait for a publish to be settled",
			Scenario{Seed: 4, Slots: 8, Rows: 3, Policy: Drop, Ops: s.ops}})
	}
	// 5. A stranger joins the group and releases its share unread: skipped and group_skipped show it.
	{
		var s script
		honest := s.attach(corpusGroup, 1)
		thief := s.attach(corpusGroup, 1)
		for range 12 {
			s.publish(2)
			s.readAll(honest)
			s.releaseAll(honest)
			s.op(OpThief, thief, 0, 0)
		}
		cs = append(cs, CorpusCase{"stranger-releases-unread", "a stranger releases its share unread (skipped, group_skipped)",
			Scenario{Seed: 5, Slots: 8, Rows: 2, Policy: Block, Ops: s.ops}})
	}
	return cs
}
