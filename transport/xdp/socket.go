//go:build linux

package xdp

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ring is one of an AF_XDP socket's single-producer single-consumer rings, mmapped from the socket. The
// producer and consumer indices are free-running u32s shared with the kernel; we own one of them and keep
// a private copy of it (local).
type xskRing struct {
	mem        []byte
	prod, cons *uint32
	flags      *uint32
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
		prod:  (*uint32)(unsafe.Pointer(&mem[off.Producer])),
		cons:  (*uint32)(unsafe.Pointer(&mem[off.Consumer])),
		flags: (*uint32)(unsafe.Pointer(&mem[off.Flags])),
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

func (r *xskRing) needWakeup() bool { return atomic.LoadUint32(r.flags)&unix.XDP_RING_NEED_WAKEUP != 0 }

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
	frames    atomic.Uint64 // descriptors taken from the rx ring
}

// socketOptions say how to bind.
type socketOptions struct {
	ifindex   int
	queue     int
	frameSize int
	zeroCopy  bool // XDP_ZEROCOPY, else XDP_COPY
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
	atomic.StoreUint32(x.fill.prod, n)

	mode := uint16(unix.XDP_COPY)
	if o.zeroCopy {
		mode = unix.XDP_ZEROCOPY
	}
	sa := &unix.SockaddrXDP{Flags: mode | unix.XDP_USE_NEED_WAKEUP, Ifindex: uint32(o.ifindex), QueueID: uint32(o.queue)}
	err = unix.Bind(fd, sa)
	if errors.Is(err, unix.EINVAL) {
		// Kernels before 5.4 reject XDP_USE_NEED_WAKEUP.
		sa.Flags = mode
		if err2 := unix.Bind(fd, sa); err2 == nil {
			err = nil
		}
	} else if err == nil {
		x.wakeup = true
	}
	if err != nil {
		return x, sysError(fmt.Sprintf("bind to queue %d", o.queue), err)
	}
	var opts uint32
	if getsockopt(fd, unix.XDP_OPTIONS, unsafe.Pointer(&opts), 4) == nil {
		x.zeroCopy = opts&unix.XDP_OPTIONS_ZEROCOPY != 0
	}
	return x, nil
}

// take moves up to len(out) received descriptors off the rx ring.
func (x *xsk) take(out []unix.XDPDesc) int {
	r := x.rx
	avail := atomic.LoadUint32(r.prod) - r.local
	n := min(uint32(len(out)), avail)
	for i := uint32(0); i < n; i++ {
		out[i] = r.descs[(r.local+i)&r.mask]
	}
	if n > 0 {
		r.local += n
		atomic.StoreUint32(r.cons, r.local)
		x.frames.Add(uint64(n))
	}
	return int(n)
}

// give returns frames (addresses within this socket's UMEM) to the fill ring. starved reports that the
// kernel had taken every frame we had given it: it may have had none for a moment.
func (x *xsk) give(addrs []uint64) (starved bool) {
	r := x.fill
	starved = atomic.LoadUint32(r.cons) == r.local
	mask := ^(x.frameSize - 1)
	for i, a := range addrs {
		r.addrs[(r.local+uint32(i))&r.mask] = a & mask
	}
	r.local += uint32(len(addrs))
	atomic.StoreUint32(r.prod, r.local)
	return starved
}

// kick wakes the driver when it asked for it (XDP_USE_NEED_WAKEUP): a zero-length recvfrom is the rx
// wakeup. It reports whether a wakeup was sent.
func (x *xsk) kick() bool {
	if !x.wakeup || !x.fill.needWakeup() {
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
