// Package verbstest provides fake verbs.SendQueues and a Sender built on one, for the tests of the send
// path above the device (verbs' send loop, transport/ibv's HeapSender). Receive-side tests use
// internal/rxloop/rxlooptest.
package verbstest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/ibvbridge/ibvbridge/frame"
	"github.com/ibvbridge/ibvbridge/internal/rxloop"
	"github.com/ibvbridge/ibvbridge/verbs"
)

// SendQueue is a fake send queue whose "NIC" checks the sender's side of the contract: a buffer is never
// posted (or handed out) while in flight, each post ends with a signaled work request, and a frame's bytes
// are unchanged from post to completion; breaches fail the test. Completions are produced lazily:
// Complete finishes the oldest signaled chains, and with Auto set every Poll completes everything posted
// so far. It is for one goroutine.
type SendQueue struct {
	// Auto completes everything posted at every Poll (NewSendQueue sets it).
	Auto bool
	// OnWait, if set, runs when the sender sleeps in Wait: the "NIC" finishing meanwhile. Without it,
	// Wait fails (it would block forever).
	OnWait func()
	// Record keeps a copy of every frame posted in Frames.
	Record bool
	Frames [][]byte
	// Flags are every posted work request's flags, in order.
	Flags []verbs.SendFlags
	// WRs, Signaled, Posts, Arms and Waits count work requests, signaled ones, and calls.
	WRs, Signaled, Posts, Arms, Waits int

	t        testing.TB
	slots    [][]byte
	inFlight []bool
	snap     [][]byte // frame bytes at post time
	posted   []verbs.SendWR
	done     []rxloop.Completion
	armed    bool
}

// NewSendQueue returns a queue of slots frame buffers of frameSize bytes that completes everything at
// every Poll (Auto).
func NewSendQueue(t testing.TB, slots, frameSize int) *SendQueue {
	q := &SendQueue{t: t, Auto: true}
	for range slots {
		q.slots = append(q.slots, make([]byte, frameSize))
		q.inFlight = append(q.inFlight, false)
		q.snap = append(q.snap, nil)
	}
	return q
}

// Slot implements verbs.SendQueue.
func (q *SendQueue) Slot(i uint32) []byte {
	if q.inFlight[i] {
		q.t.Errorf("buffer %d handed out while the NIC may read it", i)
	}
	return q.slots[i]
}

// Post implements verbs.SendQueue.
func (q *SendQueue) Post(wrs []verbs.SendWR) error {
	q.Posts++
	for i, w := range wrs {
		if q.inFlight[w.Slot] {
			return fmt.Errorf("buffer %d posted while in flight", w.Slot)
		}
		sig := w.Flags&verbs.SendSignaled != 0
		if sig != (i == len(wrs)-1) {
			q.t.Errorf("post of %d: work request %d signaled=%v", len(wrs), i, sig)
		}
		if sig {
			q.Signaled++
		}
		q.inFlight[w.Slot] = true
		q.snap[w.Slot] = append(q.snap[w.Slot][:0], q.slots[w.Slot][:w.Len]...)
		q.posted = append(q.posted, w)
		q.WRs++
		q.Flags = append(q.Flags, w.Flags)
		if q.Record {
			q.Frames = append(q.Frames, append([]byte(nil), q.slots[w.Slot][:w.Len]...))
		}
	}
	return nil
}

// Complete finishes posted work requests up to and including the n-th signaled one (all if n < 0).
func (q *SendQueue) Complete(n int) {
	for len(q.posted) > 0 && n != 0 {
		w := q.posted[0]
		q.posted = q.posted[1:]
		if !bytes.Equal(q.snap[w.Slot], q.slots[w.Slot][:w.Len]) {
			q.t.Errorf("frame %d (buffer %d) changed while in flight", w.ID, w.Slot)
		}
		q.inFlight[w.Slot] = false
		if w.Flags&verbs.SendSignaled != 0 {
			q.done = append(q.done, rxloop.Completion{ID: w.ID})
			n--
		}
	}
}

// Poll implements verbs.SendQueue.
func (q *SendQueue) Poll(out []rxloop.Completion) (int, error) {
	if q.Auto {
		q.Complete(-1)
	}
	n := copy(out, q.done)
	q.done = q.done[n:]
	return n, nil
}

// Arm implements verbs.SendQueue.
func (q *SendQueue) Arm() error { q.Arms++; q.armed = true; return nil }

// Wait implements verbs.SendQueue: it runs OnWait, once armed.
func (q *SendQueue) Wait(context.Context) error {
	q.Waits++
	if !q.armed {
		return errors.New("wait without arm")
	}
	q.armed = false
	if q.OnWait == nil {
		return errors.New("wait would block forever")
	}
	q.OnWait()
	return nil
}

// InstantSendQueue is a send queue whose "NIC" finishes a chain the moment it is posted, without
// allocating: with it, a benchmark measures the cost above the device and nothing else.
type InstantSendQueue struct {
	// WRs counts the work requests posted.
	WRs uint64

	slots [][]byte
	done  []rxloop.Completion // fixed capacity: the signaled chains not yet polled
}

// NewInstantSendQueue returns a queue of slots frame buffers of frameSize bytes.
func NewInstantSendQueue(slots, frameSize int) *InstantSendQueue {
	q := &InstantSendQueue{done: make([]rxloop.Completion, 0, slots)}
	mem := make([]byte, slots*frameSize)
	for i := range slots {
		q.slots = append(q.slots, mem[i*frameSize:(i+1)*frameSize])
	}
	return q
}

// Slot implements verbs.SendQueue.
func (q *InstantSendQueue) Slot(i uint32) []byte { return q.slots[i] }

// Post implements verbs.SendQueue.
func (q *InstantSendQueue) Post(wrs []verbs.SendWR) error {
	q.WRs += uint64(len(wrs))
	q.done = append(q.done, rxloop.Completion{ID: wrs[len(wrs)-1].ID})
	return nil
}

// Poll implements verbs.SendQueue.
func (q *InstantSendQueue) Poll(out []rxloop.Completion) (int, error) {
	n := copy(out, q.done)
	q.done = q.done[:copy(q.done, q.done[n:])]
	return n, nil
}

// Arm implements verbs.SendQueue.
func (q *InstantSendQueue) Arm() error { return nil }

// Wait implements verbs.SendQueue. A chain is done once posted: there is never anything to wait for.
func (q *InstantSendQueue) Wait(context.Context) error { return errors.New("nothing to wait for") }

// SendConfig is a valid send configuration: interface 192.0.2.2, endpoints 239.1.2.3:7148 (multicast)
// and 192.0.2.9:7149 (unicast), spead2's defaults otherwise.
func SendConfig() verbs.SendConfig {
	c := verbs.DefaultSendConfig()
	c.Interface = netip.MustParseAddr("192.0.2.2")
	c.Endpoints = []netip.AddrPort{netip.MustParseAddrPort("239.1.2.3:7148"), netip.MustParseAddrPort("192.0.2.9:7149")}
	return c
}

// NewSender builds a verbs.Sender for cfg over q, sending from 02:00:00:00:00:01, cfg.Interface, port
// 40000, to each multicast endpoint's group MAC and to 02:00:00:00:00:09 for unicast ones.
func NewSender(tb testing.TB, q verbs.SendQueue, cfg verbs.SendConfig, lc verbs.SendLoopConfig, ipCsum bool) *verbs.Sender {
	tb.Helper()
	src := frame.Header{SrcMAC: [6]byte{2, 0, 0, 0, 0, 1}, SrcIP: cfg.Interface, SrcPort: 40000}
	macs := make([][6]byte, len(cfg.Endpoints))
	for i, ep := range cfg.Endpoints {
		if m, ok := frame.MulticastMAC(ep.Addr()); ok {
			macs[i] = m
		} else {
			macs[i] = [6]byte{2, 0, 0, 0, 0, 9}
		}
	}
	s, err := verbs.NewSender(q, cfg, lc, src, macs, ipCsum)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

var (
	_ verbs.SendQueue = (*SendQueue)(nil)
	_ verbs.SendQueue = (*InstantSendQueue)(nil)
)
