package ring

import "sync/atomic"

// Stats is a reading of the ring's counters (spec §2.6), indexed by Counter.
type Stats [numCounters]uint64

// Get returns one counter.
func (s Stats) Get(c Counter) uint64 { return s[c] }

// Map returns the counters by their spec names, for JSON output.
func (s Stats) Map() map[string]uint64 {
	m := make(map[string]uint64, len(s))
	for _, c := range Counters() {
		m[c.String()] = s[c]
	}
	return m
}

func readStats(block *[StatsSlots]atomic.Uint64, defined uint32) Stats {
	var s Stats
	for i := range s {
		if uint32(i) < defined {
			s[i] = block[i].Load()
		}
	}
	return s
}
