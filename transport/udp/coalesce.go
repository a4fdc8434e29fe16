package udp

import (
	"time"

	"github.com/ibvbridge/ibvbridge/internal/rate"
	"github.com/ibvbridge/ibvbridge/transport"
)

// minCoalesce is the shortest coalesced sleep worth taking: a shorter one saves less than the sleep's
// own thread switch costs.
const minCoalesce = 20 * time.Microsecond

// coalesceIdle is the longest gap between two drains that still measures the stream's byte rate; a
// longer one spans an idle spell, after which the next burst's rate is unknown.
const coalesceIdle = 100 * time.Millisecond

// coalescer chooses each coalesced sleep of a receiver of one socket (Config.Coalesce): the configured
// time at most, less when what the stream brings meanwhile would not fit the socket buffer or the sink's
// room (transport.Absorber: the ring's free slots), and none while the rate is unknown. One per receive
// thread; it allocates nothing.
type coalescer struct {
	max      time.Duration
	room     float64            // payload bytes the socket may hold: a quarter of its buffer (see newCoalescer)
	absorber transport.Absorber // nil: the sink sets no bound
	bytes    rate.Meter         // the socket's payload bytes per second
}

// newCoalescer bounds sleeps by max, by the socket buffer buf (bytes, as the kernel granted it) and by
// the sink if it is an Absorber. The kernel charges each queued datagram its buffer's true size, about
// twice the payload for jumbo datagrams, so a quarter of buf in payload keeps the queue under half full.
func newCoalescer(max time.Duration, buf int, sink transport.Sink) *coalescer {
	c := &coalescer{max: max, room: float64(buf) / 4}
	c.absorber, _ = sink.(transport.Absorber)
	return c
}

// next is how long to sleep after a drain that emptied the socket, which by then had received bytes
// payload bytes in all: 0 for no sleep.
func (c *coalescer) next(now time.Time, bytes uint64) time.Duration {
	r, known := c.bytes.Observe(now, bytes, coalesceIdle)
	if !known {
		return 0
	}
	d := c.max
	if r > 0 {
		d = min(d, time.Duration(c.room/r*float64(time.Second)))
	}
	if c.absorber != nil && d >= minCoalesce {
		d = c.absorber.Absorbs(d)
	}
	if d < minCoalesce {
		return 0
	}
	return d
}
