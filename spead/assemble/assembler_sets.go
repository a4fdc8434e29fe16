package assemble

import "time"

// Fixed-size sets the assembler keeps per heap and per stream. Both are allocated once and cleared in
// O(1), so the per-packet cost does not grow with a heap's item count or the stream's length.

// pointerSet is an open-addressing hash set of raw item pointers with at most max members. Entries are
// stamped with a generation, so reset is one increment instead of clearing the table.
type pointerSet struct {
	keys  []uint64
	gens  []uint32
	gen   uint32
	mask  uint64
	count int
}

func newPointerSet(max int) pointerSet {
	size := 16
	for size < 2*max { // load factor ≤ 1/2: short probe sequences
		size *= 2
	}
	return pointerSet{keys: make([]uint64, size), gens: make([]uint32, size), gen: 1, mask: uint64(size - 1)}
}

func (s *pointerSet) reset() {
	s.count = 0
	s.gen++
	if s.gen == 0 { // wrapped: stale stamps could collide with the new generation
		clear(s.gens)
		s.gen = 1
	}
}

// slot is where raw's probe sequence starts: a multiplicative hash, as pointers differ in few bits.
func (s *pointerSet) slot(raw uint64) uint64 { return (raw * 0x9E3779B97F4A7C15) >> 32 & s.mask }

func (s *pointerSet) contains(raw uint64) bool {
	for i := s.slot(raw); s.gens[i] == s.gen; i = (i + 1) & s.mask {
		if s.keys[i] == raw {
			return true
		}
	}
	return false
}

// add inserts raw, which the caller knows is absent; the caller bounds the members by the pointer list's
// capacity, so the table never fills.
func (s *pointerSet) add(raw uint64) {
	i := s.slot(raw)
	for s.gens[i] == s.gen {
		i = (i + 1) & s.mask
	}
	s.keys[i], s.gens[i] = raw, s.gen
	s.count++
}

// recentHeaps remembers the cnts of the last n heaps published complete, and when each heap's first
// packet arrived, so that a late duplicate of one is recognised: a packet of such a heap within
// recentHorizon of its first packet is a copy. Later, the cnt begins a new heap: a sender that restarts
// without a stream stop and counts from 1 again is received, not taken for copies (spead2 has no such
// memory at all). Streams usually count upwards, so the common test is one comparison with the largest
// cnt remembered; only an older cnt scans the ring.
type recentHeaps struct {
	cnts   []uint64
	at     []int64
	next   int
	filled int
	max    uint64
}

// recentHorizon is how long after a heap's first packet a packet of the same cnt is taken for a late
// copy of it: far beyond any reordering a network makes, far below the time a sender takes to restart.
const recentHorizon = int64(100 * time.Millisecond)

// recentHeapsFor sizes the memory: several live-heap windows' worth, at least 64, which covers duplicates
// and reordering far beyond the window.
func recentHeapsFor(maxHeaps int) int { return max(64, 8*maxHeaps) }

func newRecentHeaps(n int) recentHeaps {
	return recentHeaps{cnts: make([]uint64, n), at: make([]int64, n)}
}

func (r *recentHeaps) add(cnt uint64, at int64) {
	r.cnts[r.next], r.at[r.next] = cnt, at
	r.next = (r.next + 1) % len(r.cnts)
	r.filled = min(r.filled+1, len(r.cnts))
	if r.filled == 1 || cnt > r.max {
		r.max = cnt
	}
}

// contains reports whether cnt was published complete within recentHorizon before now.
func (r *recentHeaps) contains(cnt uint64, now int64) bool {
	if r.filled == 0 || cnt > r.max {
		return false
	}
	for i, c := range r.cnts[:r.filled] {
		if c == cnt && now-r.at[i] < recentHorizon {
			return true
		}
	}
	return false
}

// newest is the latest first-packet time remembered (for a test without a clock, as Fits makes: it
// only refuses a zero-copy guess, the packet then takes the ordinary path with its own time).
func (r *recentHeaps) newest() int64 {
	if r.filled == 0 {
		return 0
	}
	return r.at[(r.next+len(r.at)-1)%len(r.at)]
}

// reset forgets every cnt: a new stream begins.
func (r *recentHeaps) reset() { r.next, r.filled, r.max = 0, 0, 0 }
