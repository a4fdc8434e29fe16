package udp

import (
	"fmt"
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

// coalesceTimerSlack is the timer slack of a thread that coalesces: how much later than asked the kernel
// may end its sleeps to batch timer wakes (50 µs by default).
const coalesceTimerSlack = time.Microsecond

// maxOvershoot bounds the learnt overshoot of a sleep: a descheduled thread's one long sleep must not
// turn coalescing off for long.
const maxOvershoot = 500 * time.Microsecond

// awaitShare is the share of a heap's expected remaining time that a heap-bounded sleep (Config.
// CoalesceHeaps) takes: waking a little early costs one more short sleep, waking late would postpone the
// heap. The sleeps then shrink towards its end (3/4 of what is left each time) until one would be shorter
// than minCoalesce, and the last bursts are read as they come.
const awaitShare = 0.75

// coalescer chooses each coalesced sleep of a receiver of one socket (Config.Coalesce): the configured
// time at most, less when what the stream brings meanwhile would not fit the socket buffer or the sink's
// room (transport.Absorber: the ring's free slots), and none while the rate is unknown. Bounded by heaps
// (Config.CoalesceHeaps), it also ends before the heap in assembly is expected to be complete
// (transport.Awaiter), and there is none while no heap is in assembly or its size is unknown. One per
// receive thread; it allocates nothing.
type coalescer struct {
	max      time.Duration
	room     float64            // payload bytes the socket may hold: a quarter of its buffer (see newCoalescer)
	absorber transport.Absorber // nil: the sink sets no bound
	heaps    bool               // bounded by the heap in assembly
	awaiter  transport.Awaiter  // nil: the sink cannot tell (with heaps: no sleep at all)
	bytes    rate.Meter         // the socket's payload bytes per second
	// over is how much later than asked a sleep ends, a moving average of the last ~8: the wake's own
	// latency (tens of microseconds in a VM). A heap-bounded sleep is shortened by it.
	over time.Duration
}

// newCoalescer bounds sleeps by max, by the socket buffer buf (bytes, as the kernel granted it) and by
// the sink if it is an Absorber. The kernel charges each queued datagram its buffer's true size, about
// twice the payload for jumbo datagrams, so a quarter of buf in payload keeps the queue under half full.
// With heaps, sleeps are bounded by the heap in assembly too, which needs the sink to be an Awaiter.
func newCoalescer(max time.Duration, buf int, sink transport.Sink, heaps bool) *coalescer {
	c := &coalescer{max: max, room: float64(buf) / 4, heaps: heaps}
	c.absorber, _ = sink.(transport.Absorber)
	c.awaiter, _ = sink.(transport.Awaiter)
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
	if c.heaps {
		if c.awaiter == nil {
			return 0
		}
		left, ok := c.awaiter.Awaits(now.UnixNano())
		if !ok {
			return 0 // the next datagram may begin and end a heap: read it as it comes
		}
		d = min(d, time.Duration(float64(left)*awaitShare)-c.over)
	}
	if c.absorber != nil && d >= minCoalesce {
		d = c.absorber.Absorbs(d)
	}
	if d < minCoalesce {
		return 0
	}
	return d
}

// slept learns from a sleep of d that took took (to the thread's return).
func (c *coalescer) slept(d, took time.Duration) {
	o := min(max(took-d, 0), maxOvershoot)
	c.over += (o - c.over) / 8
}

// Coalescing is recv's --coalesce: "heap" (the default: sleeps of up to DefaultCoalesce bounded by the
// heap in assembly, Config.CoalesceHeaps), a duration up to busyWait (sleeps of up to that long, which
// may outlast a heap's last datagram: the explicit trade of latency for CPU), or 0 (none). A flag.Value.
type Coalescing struct {
	Max   time.Duration
	Heaps bool
}

// DefaultCoalescing is recv's default: heap-bounded sleeps of up to DefaultCoalesce.
var DefaultCoalescing = Coalescing{Max: DefaultCoalesce, Heaps: true}

func (c *Coalescing) String() string {
	if c.Heaps {
		return "heap"
	}
	return c.Max.String()
}

// Set parses "heap" or a duration (0 to busyWait).
func (c *Coalescing) Set(s string) error {
	if s == "heap" {
		*c = DefaultCoalescing
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("coalesce %q: want heap or a duration: %w", s, err)
	}
	if d < 0 || d > busyWait {
		return fmt.Errorf("coalesce %v: want heap, or 0 to %v", d, busyWait)
	}
	*c = Coalescing{Max: d}
	return nil
}
