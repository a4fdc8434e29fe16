//go:build linux

package xdp

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ibvbridge/ibvbridge/internal/rxloop"
)

// Completion ids: the socket's index in the high bits, then a bit saying the frame continues in the next
// descriptor (XDP_PKT_CONTD: multi-buffer), the frame's UMEM address (within that socket's part) in the
// low ones.
const (
	idShift  = 48
	idContd  = 1 << 47
	addrMask = idContd - 1
)

// queue drives a Source's sockets as one rxloop.Queue, so rxloop.Run, the loop the ibverbs transport
// uses, runs them from one goroutine (the Sink is not safe for concurrent use). Poll takes from every
// socket's rx ring, round robin; Repost gives frames back to their own socket's fill ring; Wait sleeps in
// poll(2) on every socket and an eventfd that cancellation writes.
type queue struct {
	socks  []*xsk
	descs  []unix.XDPDesc
	addrs  []uint64
	pfds   []unix.PollFd // one per socket, then the eventfd
	wakeFD int
	next   int
	now    int64 // CLOCK_REALTIME of the last non-empty poll: AF_XDP frames carry no timestamp

	fillStarved   atomic.Uint64
	kicks         atomic.Uint64
	chainsDropped atomic.Uint64 // frames spanning more descriptors than can be assembled
}

var _ rxloop.Queue = (*queue)(nil)

func newQueue(socks []*xsk, wakeFD, batch int) *queue {
	q := &queue{socks: socks, wakeFD: wakeFD, descs: make([]unix.XDPDesc, batch), addrs: make([]uint64, batch)}
	for _, x := range socks {
		q.pfds = append(q.pfds, unix.PollFd{Fd: int32(x.fd), Events: unix.POLLIN})
	}
	q.pfds = append(q.pfds, unix.PollFd{Fd: int32(wakeFD), Events: unix.POLLIN})
	return q
}

// Poll implements rxloop.Queue. It never blocks.
func (q *queue) Poll(out []rxloop.Completion) (int, error) {
	if len(q.descs) < len(out) {
		q.descs = make([]unix.XDPDesc, len(out))
	}
	n := 0
	for k := range q.socks {
		if n == len(out) {
			break
		}
		i := (q.next + k) % len(q.socks)
		m, dropped := q.socks[i].take(q.descs[:len(out)-n], len(out))
		if dropped > 0 {
			q.chainsDropped.Add(dropped)
		}
		for j, d := range q.descs[:m] {
			id := uint64(i)<<idShift | d.Addr&addrMask
			if d.Options&unix.XDP_PKT_CONTD != 0 {
				id |= idContd
			}
			out[n+j] = rxloop.Completion{ID: id, Len: d.Len}
		}
		n += m
	}
	q.next = (q.next + 1) % len(q.socks)
	if n > 0 {
		q.now = time.Now().UnixNano()
		return n, nil
	}
	for _, x := range q.socks {
		if x.kick(true) {
			q.kicks.Add(1)
		}
	}
	return 0, nil
}

// Repost implements rxloop.Queue: the frames go back to their sockets' fill rings, one batch per socket.
func (q *queue) Repost(ids []uint64) error {
	if len(q.addrs) < len(ids) {
		q.addrs = make([]uint64, len(ids))
	}
	for start := 0; start < len(ids); {
		sock := ids[start] >> idShift
		end := start
		for end < len(ids) && ids[end]>>idShift == sock {
			q.addrs[end-start] = ids[end] & addrMask
			end++
		}
		x := q.socks[sock]
		if x.give(q.addrs[:end-start]) {
			q.fillStarved.Add(1)
		}
		if x.kick(false) {
			q.kicks.Add(1)
		}
		start = end
	}
	return nil
}

// Arm implements rxloop.Queue. poll(2) on an AF_XDP socket is level-triggered (POLLIN while the rx ring is
// not empty), so there is nothing to arm and no wakeup to lose.
func (q *queue) Arm() error { return nil }

// Wait implements rxloop.Queue: poll(2) until a socket has frames, the eventfd is written (the Source's run
// context was cancelled) or ctx is done. ctx is also checked every waitCheck, for a ctx other than the
// Run's.
func (q *queue) Wait(ctx context.Context) error {
	const waitCheck = 200 // ms
	for first := true; ; first = false {
		if err := ctx.Err(); err != nil {
			return err
		}
		var n int
		var err error
		if first {
			n, err = q.rawPoll()
		}
		if n == 0 && err == nil {
			n, err = unix.Poll(q.pfds, waitCheck)
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			continue
		}
		if q.pfds[len(q.pfds)-1].Revents != 0 {
			var b [8]byte
			_, _ = unix.Read(q.wakeFD, b[:])
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		for _, p := range q.pfds[:len(q.pfds)-1] {
			if p.Revents&(unix.POLLERR|unix.POLLNVAL) != 0 {
				return unix.EBADFD
			}
		}
		return nil
	}
}

// rawBusyWait is how long Wait first waits inside a raw syscall, which keeps the thread's P: the
// ordinary syscall hands the P over when it blocks (and keeps the runtime's sysmon waking to do it), a
// thread switch per burst that made AF_XDP recv cost 1.25× the socket path's CPU per byte with jumbo
// frames at 2 Gb/s, and 1.0× without it (the UDP source waits the same way, for 1 ms). 5 ms covers the
// gaps between a paced sender's bursts; past it Wait gives the P up, so an idle receiver costs nothing,
// and nothing else (the GC's stop-the-world) waits on this thread for longer.
var rawBusyWait = unix.Timespec{Nsec: 5e6}

// rawPoll is one ppoll(2) of at most rawBusyWait, in a raw syscall.
func (q *queue) rawPoll() (int, error) {
	ts := rawBusyWait
	r, _, errno := unix.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&q.pfds[0])), uintptr(len(q.pfds)),
		uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	if errno == unix.EINTR {
		return 0, nil // the ordinary wait follows
	}
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
}

// Slot implements rxloop.Queue: the frame's bytes, from where the kernel put it to the end of its chunk.
func (q *queue) Slot(id uint64) []byte {
	x := q.socks[id>>idShift]
	addr := id & addrMask
	end := addr&^(x.frameSize-1) + x.frameSize
	return x.umem[addr:end:end]
}
