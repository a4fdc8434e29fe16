// Package rate owns the moving-average rate of a growing count observed at irregular moments, which the
// receive path's coalesced waits are sized by: the ring's heap rate (ring.Producer.Absorbs) and a
// socket's byte rate (the udp source's coalescer).
package rate

import "time"

// Meter is the rate of a count that only grows, per second. The zero Meter knows nothing yet. It
// allocates nothing; one goroutine uses it.
type Meter struct {
	at     time.Time // the last observation
	n      uint64    // the count then
	perSec float64   // moving average
	known  bool      // perSec holds a measurement
}

// Observe records that the count stood at n at now and returns its rate per second: the new interval's
// rate weighted a quarter against the average so far. known is false, and the average forgotten, when
// the rate cannot be told: at the first observation, and at the first after a gap longer than idle (an
// idle spell, after which the next burst may come at any rate).
func (m *Meter) Observe(now time.Time, n uint64, idle time.Duration) (perSec float64, known bool) {
	dt, dn := now.Sub(m.at), n-m.n
	m.at, m.n = now, n
	if dt <= 0 || dt > idle {
		m.known = false
		return 0, false
	}
	r := float64(dn) / dt.Seconds()
	if m.known {
		m.perSec += (r - m.perSec) / 4
	} else {
		m.perSec, m.known = r, true
	}
	return m.perSec, true
}
