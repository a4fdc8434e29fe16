package bench

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FloorResult is what the floor receiver counted.
type FloorResult struct {
	Bytes    uint64 `json:"bytes"`    // UDP payload bytes
	Messages uint64 `json:"messages"` // messages read (with GRO, one may hold many datagrams)
	Calls    uint64 `json:"calls"`    // recvmmsg calls that returned messages
}

// floorBatch and floorBufSize: 64 messages of 64 KiB (the largest GRO message) per call.
const floorBatch, floorBufSize = 64, 64 << 10

// floorMmsghdr is struct mmsghdr of recvmmsg(2) on 64-bit Linux.
type floorMmsghdr struct {
	hdr unix.Msghdr
	n   uint32
	_   [4]byte
}

// Floor is the cheapest receiver of a UDP stream on this path: a blocking recvmmsg of 64 messages with
// UDP_GRO into the same 64 buffers every call, counting bytes and nothing else. What it costs is the
// kernel's share of any receiver's cost on this traffic; `bench udp --peer` sets recv against it. It
// returns once no datagram has come for idle after the first (firstWait before the first: an error).
func Floor(endpoint string, buffer int, firstWait, idle time.Duration) (FloorResult, error) {
	var res FloorResult
	ap, err := netip.ParseAddrPort(endpoint)
	if err != nil || !ap.Addr().Is4() {
		return res, fmt.Errorf("%w: floor endpoint %q: want IPv4:port", ErrBadOption, endpoint)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return res, os.NewSyscallError("socket", err)
	}
	defer unix.Close(fd)
	if buffer > 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, buffer); err != nil {
			return res, os.NewSyscallError("setsockopt SO_RCVBUF", err)
		}
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_GRO, 1); err != nil {
		return res, os.NewSyscallError("setsockopt UDP_GRO", err)
	}
	setWait := func(d time.Duration) error {
		tv := unix.NsecToTimeval(d.Nanoseconds())
		return os.NewSyscallError("setsockopt SO_RCVTIMEO", unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv))
	}
	if err := setWait(firstWait); err != nil {
		return res, err
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		return res, os.NewSyscallError("bind", err)
	}
	bufs := make([]byte, floorBatch*floorBufSize)
	iovs := make([]unix.Iovec, floorBatch)
	hdrs := make([]floorMmsghdr, floorBatch)
	for i := range hdrs {
		iovs[i].Base = &bufs[i*floorBufSize]
		iovs[i].SetLen(floorBufSize)
		hdrs[i].hdr.Iov = &iovs[i]
		hdrs[i].hdr.SetIovlen(1)
	}
	// A raw syscall on a locked thread: the Go scheduler's bookkeeping around a blocking syscall (and the
	// thread it starts to run other goroutines meanwhile) would otherwise cost more than the loop itself.
	// The runtime still interrupts a long-running goroutine (every 10 ms), and each interruption restarts
	// the socket's timeout: the clock decides when the stream has ended. No garbage collection may start
	// meanwhile (it would spin until this goroutine stops): the loop allocates nothing.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	runtime.GC()
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	last := time.Now() // of the last data, or of the start
	for {
		n, _, errno := unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&hdrs[0])),
			floorBatch, unix.MSG_WAITFORONE, 0, 0)
		switch {
		case errno == unix.EINTR || errno == unix.EAGAIN:
			switch waited := time.Since(last); {
			case res.Calls > 0 && waited >= idle:
				return res, nil // the stream has ended (or stalled for idle)
			case res.Calls == 0 && waited >= firstWait:
				return res, fmt.Errorf("floor: nothing arrived on %s within %v", endpoint, firstWait)
			}
			continue
		case errno != 0:
			return res, os.NewSyscallError("recvmmsg", errno)
		}
		if res.Calls == 0 {
			if err := setWait(idle); err != nil {
				return res, err
			}
		}
		last = time.Now()
		res.Calls++
		res.Messages += uint64(n)
		for i := range int(n) {
			res.Bytes += uint64(hdrs[i].n)
		}
	}
}

// udpPortBound reports whether a socket on this host (this network namespace) is bound to UDP port:
// how the benchmark knows a receiver it cannot ask (spead2_recv) is ready.
func udpPortBound(port int) bool {
	b, err := os.ReadFile("/proc/net/udp")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line) // sl local_address (hex addr:port) ...
		if len(f) < 2 {
			continue
		}
		if _, hex, ok := strings.Cut(f[1], ":"); ok {
			if p, err := strconv.ParseUint(hex, 16, 16); err == nil && int(p) == port {
				return true
			}
		}
	}
	return false
}
