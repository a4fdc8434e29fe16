package ringsim

import (
	"errors"
	"fmt"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
)

// hangAfter is how long a producer call may take before the driver calls it hung (an unbounded loop).
const hangAfter = 3 * time.Second

// GoDriver plays scenarios against the Go producer (ring.Create) in this process: the producer's own
// calls on one goroutine (its hot path), consumers through real sockets and their mapped regions.
type GoDriver struct {
	*rawRing
	p       *ring.Producer
	p0      uint64
	work    chan func()
	busy    chan struct{} // the hot path's current call ended (buffered 1)
	pend    bool          // a block publish is waiting in the hot path
	pendR   Result
	pendErr error
	hung    error
	policy  Policy
}

// NewGoDriver creates ring "sim" in dir with s's shape.
func NewGoDriver(dir string, s Scenario) (*GoDriver, error) {
	p, err := ring.Create("sim", ring.Config{SlotCount: int(s.Slots), SlotSize: 64, MaxItems: 1, MetaSize: 4096,
		Policy: ring.Policy(s.Policy), HugePages: ring.HugePagesOff, Dir: dir, MaxConsumers: s.Rows,
		MaxObservers: 16, InitialPosition: s.P0, NoHeartbeat: true})
	if err != nil {
		return nil, err
	}
	raw, err := openRaw(p.SocketPath(), s.Slots, s.Rows)
	if err != nil {
		p.Close()
		return nil, err
	}
	d := &GoDriver{rawRing: raw, p: p, p0: s.P0, work: make(chan func()), busy: make(chan struct{}, 1), policy: s.Policy}
	go func() {
		for f := range d.work {
			f()
			d.busy <- struct{}{}
		}
	}()
	return d, nil
}

func (d *GoDriver) Name() string { return "go" }

// call runs f on the hot path's goroutine and waits up to wait for it; false when it is still running.
func (d *GoDriver) call(f func(), wait time.Duration) bool {
	d.work <- f
	return d.await(wait)
}

func (d *GoDriver) await(wait time.Duration) bool {
	select {
	case <-d.busy:
		return true
	case <-time.After(wait):
		return false
	}
}

func (d *GoDriver) publishFunc(eos bool) func() {
	return func() {
		if eos {
			err := d.p.PublishEndOfStream(0, 0)
			d.pendR = Published
			if errors.Is(err, ring.ErrFull) {
				d.pendR = Full
			}
			return
		}
		s, err := d.p.Acquire()
		if err != nil {
			if errors.Is(err, ring.ErrFull) {
				d.p.Add(ring.CounterDroppedHeaps, 1) // the caller counts what it drops (as recv does)
				d.pendR = Dropped
			} else {
				d.pendR, d.pendErr = Full, err
			}
			return
		}
		_ = d.p.Publish(s, ring.HeapInfo{HeapCnt: 1, Flags: ring.FlagComplete})
		d.pendR = Published
	}
}

func (d *GoDriver) Publish(eos bool, want Result) (Result, error) {
	if d.hung != nil {
		return 0, d.hung
	}
	if d.pend {
		return 0, errors.New("publish while one waits")
	}
	wait := hangAfter
	if d.policy == Block && want == Pending {
		wait = 5 * time.Millisecond // the model says it waits: give it a moment to prove otherwise
	}
	if d.call(d.publishFunc(eos), wait) {
		if d.pendErr != nil {
			err := fmt.Errorf("publish: %w", d.pendErr)
			d.pendErr = nil
			return 0, err
		}
		return d.pendR, nil
	}
	if d.policy == Drop || want != Pending {
		d.hung = fmt.Errorf("the producer's publish did not return in %v (drop never waits; a loop?)", hangAfter)
		return 0, d.hung
	}
	d.pend = true
	return Pending, nil
}

// Settle forces a cursor read (not a reclaim: the producer reclaims when it publishes, and a departure
// must be settled at its detach, not at the next publish), and lets a waiting publish finish when the
// model says it has.
func (d *GoDriver) Settle(want Outcome) error {
	if d.hung != nil {
		return d.hung
	}
	if d.pend {
		wait := 5 * time.Millisecond
		if !want.Pending {
			wait = hangAfter
		}
		if !d.await(wait) {
			if !want.Pending {
				return fmt.Errorf("a block publish still waits %v after the model published it", hangAfter)
			}
		} else {
			d.pend = false
			if d.pendR != Published {
				return fmt.Errorf("the waiting publish ended %v; the model published it", d.pendR)
			}
		}
	}
	d.p.UnreadHeaps() // reads every cursor (any goroutine may)
	if d.pend {
		// a waiting producer names whom it waits for when it looks again (§7.4: at most every 250 ms)
		for deadline := time.Now().Add(400 * time.Millisecond); time.Now().Before(deadline); time.Sleep(100 * time.Microsecond) {
			if u32(d.ctl, ctlBlockedOn).Load() == want.BlockedOn {
				break
			}
		}
	}
	return nil
}

// Observe reads the ring; when every attached consumer has released everything it also reclaims and
// counts the free slots (every one must be free: no leak).
func (d *GoDriver) Observe() Outcome {
	o := d.observe()
	o.Pending = d.pend
	if !d.pend && d.hung == nil && caughtUp(o) {
		if !d.call(func() { d.p.Unread(); o.Free = d.p.FreeSlots() }, hangAfter) {
			d.hung = fmt.Errorf("a reclaim did not return in %v: a loop", hangAfter)
		}
	}
	d.masks(&o, d.p0)
	return o
}

// caughtUp reports consumers attached, every one of them having released everything published.
func caughtUp(o Outcome) bool {
	any := false
	for _, r := range o.Rows {
		if r.State == RowAttached {
			if r.Released != o.Head {
				return false
			}
			any = true
		}
	}
	return any
}

func (d *GoDriver) Shutdown() {
	d.close()
	if d.hung != nil {
		return // its goroutine holds the lock forever: leave it (the test's directory goes with the test)
	}
	d.p.Interrupt()
	if d.pend {
		d.await(hangAfter)
	}
	close(d.work)
	d.p.Close()
}
