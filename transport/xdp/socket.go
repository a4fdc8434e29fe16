//go:build linux

package xdp

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ring is one of an AF_XDP socket's single-producer single-consumer rings, mmapped from the socket. The
// producer and consumer indices are free-running u32s shared with the kernel; we own one of them and keep
// a private copy of it (local).
type xskRing struct {
	mem []byte
	// The kernel's words: every access goes through Load/Store (acquire/release on every architecture Go
	// supports), so a plain, possibly reordered access does not compile.
	prod, cons *atomic.Uint32
	flags      *atomic.Uint32
	addrs      []uint64       // fill and completion rings
	descs      []unix.XDPDesc // rx ring
	mask       uint32
	local      uint32 // our index: cons for rx, prod for fill

}

func mapRing(fd int, pgoff int64, off unix.XDPRingOffset, n uint32, descSize uintptr) (*xskRing, error) {
	size := int(off.Desc) + int(n)*int(descSize)
	mem, err := unix.Mmap(fd, pgoff, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, err
	}
	r := &xskRing{
		mem:   mem,
		prod:  (*atomic.Uint32)(unsafe.Pointer(&mem[off.Producer])),
		cons:  (*atomic.Uint32)(unsafe.Pointer(&mem[off.Consumer])),
		flags: (*atomic.Uint32)(unsafe.Pointer(&mem[off.Flags])),
		mask:  n - 1,
	}
	if descSize == 8 {
		r.addrs = unsafe.Slice((*uint64)(unsafe.Pointer(&mem[off.Desc])), n)
	} else {
		r.descs = unsafe.Slice((*unix.XDPDesc)(unsafe.Pointer(&mem[off.Desc])), n)
	}
	return r, nil
}

func (r *xskRing) unmap() {
	if r != nil && r.mem != nil {
		_ = unix.Munmap(r.mem)
		r.mem = nil
	}
}

func (r *xskRing) needWakeup() bool { return r.flags.Load()&unix.XDP_RING_NEED_WAKEUP != 0 }

// xsk is one AF_XDP socket bound to one receive queue, with its own UMEM (a part of the Source's).
type xsk struct {
	fd        int
	queue     int
	umem      []byte
	frameSize uint64
	nframes   uint32
	fill, cmp *xskRing
	rx        *xskRing
	zeroCopy  bool
	wakeup    bool          // bound with XDP_USE_NEED_WAKEUP
	sg        bool          // bound with XDP_USE_SG: a frame may span several descriptors
	busyPoll  bool          // SO_PREFER_BUSY_POLL set: every empty poll drives the driver with recvfrom
	frames    atomic.Uint64 // descriptors taken from the rx ring
	dropping  bool          // inside a chain too long to assemble: its descriptors go straight back
}

// socketOptions say how to bind.
type socketOptions struct {
	ifindex   int
	queue     int
	frameSize int
	zeroCopy  bool // XDP_ZEROCOPY, else XDP_COPY
	// multiBuffer asks for XDP_USE_SG (frames larger than one UMEM frame arrive as chains); a kernel or
	// driver that refuses it gets a socket without it.
	multiBuffer bool
	// noNeedWakeup binds without XDP_USE_NEED_WAKEUP: the driver then never sleeps waiting for a kick
	// (more CPU in softirq, no wakeup syscalls).
	noNeedWakeup bool
	busy         BusyPoll
}

func sockopt(fd, opt int, p unsafe.Pointer, size uintptr) error {
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(p), size, 0)
	if e != 0 {
		return e
	}
	return nil
}

func getsockopt(fd, opt int, p unsafe.Pointer, size uintptr) error {
	l := uint32(size)
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(p), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// newXSK creates, configures and binds a socket over umem (len a multiple of frameSize, page aligned), and
// fills its fill ring with every frame.
func newXSK(o socketOptions, umem []byte) (x *xsk, err error) {
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, sysError("create AF_XDP socket", err)
	}
	x = &xsk{fd: fd, queue: o.queue, umem: umem, frameSize: uint64(o.frameSize), nframes: uint32(len(umem) / o.frameSize)}
	defer func() {
		if err != nil {
			x.close()
			x = nil
		}
	}()
	reg := unix.XDPUmemReg{Addr: uint64(uintptr(unsafe.Pointer(&umem[0]))), Len: uint64(len(umem)), Size: uint32(o.frameSize)}
	if err := sockopt(fd, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
		return x, sysError(fmt.Sprintf("register %d-byte UMEM of %d-byte frames", len(umem), o.frameSize), err)
	}
	n := x.nframes
	for _, opt := range []int{unix.XDP_UMEM_FILL_RING, unix.XDP_UMEM_COMPLETION_RING, unix.XDP_RX_RING} {
		if err := sockopt(fd, opt, unsafe.Pointer(&n), 4); err != nil {
			return x, sysError("size rings", err)
		}
	}
	var off unix.XDPMmapOffsets
	if err := getsockopt(fd, unix.XDP_MMAP_OFFSETS, unsafe.Pointer(&off), unsafe.Sizeof(off)); err != nil {
		return x, sysError("get ring offsets", err)
	}
	if x.fill, err = mapRing(fd, unix.XDP_UMEM_PGOFF_FILL_RING, off.Fr, n, 8); err != nil {
		return x, sysError("map fill ring", err)
	}
	if x.cmp, err = mapRing(fd, unix.XDP_UMEM_PGOFF_COMPLETION_RING, off.Cr, n, 8); err != nil {
		return x, sysError("map completion ring", err)
	}
	if x.rx, err = mapRing(fd, unix.XDP_PGOFF_RX_RING, off.Rx, n, unsafe.Sizeof(unix.XDPDesc{})); err != nil {
		return x, sysError("map rx ring", err)
	}
	// Every frame starts in the fill ring: the ring has exactly as many entries as there are frames, so
	// it never overflows however frames come back.
	for i := uint32(0); i < n; i++ {
		x.fill.addrs[i&x.fill.mask] = uint64(i) * x.frameSize
	}
	x.fill.local = n
	x.fill.prod.Store(n)

	if err := x.setBusyPoll(o.busy); err != nil {
		return x, err
	}
	mode := uint16(unix.XDP_COPY)
	if o.zeroCopy {
		mode = unix.XDP_ZEROCOPY
	}
	// Try the most capable binding first, then drop what the kernel or driver refuses (EINVAL, or
	// EOPNOTSUPP for XDP_USE_SG on a zero-copy driver without multi-buffer): XDP_USE_SG needs 6.6,
	// XDP_USE_NEED_WAKEUP 5.4.
	wakeup := uint16(unix.XDP_USE_NEED_WAKEUP)
	if o.noNeedWakeup {
		wakeup = 0
	}
	sg := uint16(0)
	if o.multiBuffer {
		sg = unix.XDP_USE_SG
	}
	sa := &unix.SockaddrXDP{Ifindex: uint32(o.ifindex), QueueID: uint32(o.queue)}
	tries := []uint16{mode | wakeup | sg}
	if sg != 0 {
		tries = append(tries, mode|wakeup)
	}
	if wakeup != 0 {
		tries = append(tries, mode)
	}
	for _, flags := range tries {
		sa.Flags = flags
		if err = unix.Bind(fd, sa); err == nil || !(errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP)) {
			break
		}
	}
	if err != nil {
		return x, sysError(fmt.Sprintf("bind to queue %d", o.queue), err)
	}
	x.wakeup = sa.Flags&unix.XDP_USE_NEED_WAKEUP != 0
	x.sg = sa.Flags&unix.XDP_USE_SG != 0
	var opts uint32
	if getsockopt(fd, unix.XDP_OPTIONS, unsafe.Pointer(&opts), 4) == nil {
		x.zeroCopy = opts&unix.XDP_OPTIONS_ZEROCOPY != 0
	}
	return x, nil
}

// maxChain is the most descriptors one frame may span: the kernel's MAX_SKB_FRAGS (17) plus the first.
// A longer chain is never handed over (take drops it, counted).
const maxChain = 18

// take moves up to len(out) received descriptors off the rx ring, whole frames only: a chain of
// descriptors (XDP_PKT_CONTD on all but its last) is taken entirely or left for the next call, so every
// fragment of a frame is in one batch and stays valid until that batch is reposted. A chain longer than
// limit (at most maxChain; the poll batch) cannot be assembled: its descriptors go straight back to the
// fill ring and it is counted in dropped (once per chain). A chain that fits limit but not what is left of
// out stays in the ring for the next call.
func (x *xsk) take(out []unix.XDPDesc, limit int) (n int, dropped uint64) {
	r := x.rx
	start, prod := r.local, r.prod.Load()
	limit = min(limit, maxChain)
	done, chain, refilled := 0, 0, false // out[:done] are whole frames; out[chain:n] the frame being read
	for cons := r.local; cons != prod; {
		d := r.descs[cons&r.mask]
		more := d.Options&unix.XDP_PKT_CONTD != 0
		if x.dropping { // the rest of a chain too long to assemble
			x.refill(d.Addr)
			cons++
			r.local, x.dropping, refilled = cons, more, true
			continue
		}
		if n == len(out) {
			break
		}
		out[n] = d
		n++
		cons++
		if !more {
			done, chain, r.local = n, n, cons
			continue
		}
		if n-chain >= limit {
			for _, c := range out[chain:n] {
				x.refill(c.Addr)
			}
			n, r.local, x.dropping, refilled = chain, cons, true, true
			dropped++
		}
	}
	if r.local != start {
		r.cons.Store(r.local)
		x.frames.Add(uint64(r.local - start))
	}
	if refilled {
		x.fill.prod.Store(x.fill.local)
	}
	return done, dropped
}

// refill puts one frame back in the fill ring (published by the caller).
func (x *xsk) refill(addr uint64) {
	x.fill.addrs[x.fill.local&x.fill.mask] = addr &^ (x.frameSize - 1)
	x.fill.local++
}

// give returns frames (addresses within this socket's UMEM) to the fill ring. starved reports that the
// kernel had taken every frame we had given it: it may have had none for a moment.
func (x *xsk) give(addrs []uint64) (starved bool) {
	r := x.fill
	starved = r.cons.Load() == r.local
	mask := ^(x.frameSize - 1)
	for i, a := range addrs {
		r.addrs[(r.local+uint32(i))&r.mask] = a & mask
	}
	r.local += uint32(len(addrs))
	r.prod.Store(r.local)
	return starved
}

// kick wakes the driver when it asked for it (XDP_USE_NEED_WAKEUP), or, with idle set on a socket that
// prefers busy polling, always: a zero-length recvfrom is the rx wakeup, and with SO_PREFER_BUSY_POLL it
// runs the driver's NAPI poll in this thread. It reports whether a wakeup was sent.
func (x *xsk) kick(idle bool) bool {
	if !(idle && x.busyPoll) && (!x.wakeup || !x.fill.needWakeup()) {
		return false
	}
	_, _, _ = unix.Syscall6(unix.SYS_RECVFROM, uintptr(x.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	return true
}

func (x *xsk) statistics() (unix.XDPStatistics, error) {
	var st unix.XDPStatistics
	err := getsockopt(x.fd, unix.XDP_STATISTICS, unsafe.Pointer(&st), unsafe.Sizeof(st))
	return st, err
}

func (x *xsk) close() {
	x.rx.unmap()
	x.fill.unmap()
	x.cmp.unmap()
	if x.fd >= 0 {
		_ = unix.Close(x.fd)
		x.fd = -1
	}
}

// BusyPoll are an AF_XDP socket's busy-polling options (socket(7)). With Prefer, the driver's NAPI
// polling is left to the application's recvfrom (made on every empty poll) while it keeps up, instead of
// interrupts and softirqs; it pays off with the device's napi_defer_hard_irqs and gro_flush_timeout set
// (see the README). Zero values leave the kernel's defaults.
type BusyPoll struct {
	Prefer bool // SO_PREFER_BUSY_POLL
	Usecs  int  // SO_BUSY_POLL: how long a busy poll may spin, in µs
	Budget int  // SO_BUSY_POLL_BUDGET: packets one busy poll may process (the kernel's default is 8)
}

// setBusyPoll applies o's options and reads each back: a kernel that does not keep a value fails with
// ErrBusyPoll.
func (x *xsk) setBusyPoll(o BusyPoll) error {
	opts := []struct {
		name string
		opt  int
		val  int
	}{{"SO_BUSY_POLL", unix.SO_BUSY_POLL, o.Usecs}, {"SO_BUSY_POLL_BUDGET", unix.SO_BUSY_POLL_BUDGET, o.Budget},
		{"SO_PREFER_BUSY_POLL", unix.SO_PREFER_BUSY_POLL, 0}}
	if o.Prefer {
		opts[2].val = 1
	}
	for _, so := range opts {
		if so.val == 0 {
			continue
		}
		if err := unix.SetsockoptInt(x.fd, unix.SOL_SOCKET, so.opt, so.val); err != nil {
			return fmt.Errorf("xdp: set %s=%d on the queue %d socket: %w: %w", so.name, so.val, x.queue, ErrBusyPoll,
				os.NewSyscallError("setsockopt", err))
		}
		// Kernels read back SO_BUSY_POLL and SO_PREFER_BUSY_POLL; SO_BUSY_POLL_BUDGET is write-only
		// (ENOPROTOOPT), so for it the accepted setsockopt is the proof.
		got, err := unix.GetsockoptInt(x.fd, unix.SOL_SOCKET, so.opt)
		if errors.Is(err, unix.ENOPROTOOPT) {
			continue
		}
		if err != nil || got != so.val {
			return fmt.Errorf("xdp: %s on the queue %d socket reads back %d (%v), not %d: %w", so.name, x.queue, got, err, so.val, ErrBusyPoll)
		}
	}
	x.busyPoll = o.Prefer
	return nil
}

// sysError wraps a socket-level failure with the package's sentinel errors.
func sysError(what string, err error) error {
	switch {
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return fmt.Errorf("xdp: %s: %w: %w", what, ErrPermission, err)
	case errors.Is(err, unix.EAFNOSUPPORT):
		return fmt.Errorf("xdp: %s: %w: %w", what, ErrNotSupported, err)
	}
	return fmt.Errorf("xdp: %s: %w", what, err)
}
