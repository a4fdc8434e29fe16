//go:build linux

// Package udp owns the kernel-socket transport: receiving SPEAD datagrams on one or more UDP sockets
// (unicast or IPv4 multicast) with batched recvmmsg reads, and sending them with sendmmsg. It is the
// portable path every host has; the kernel-bypass transports plug in beside it.
//
// The sockets are raw file descriptors driven by one goroutine over epoll rather than net.UDPConn with
// x/net/ipv4's ReadBatch: ReadBatch allocates a *net.UDPAddr per message (it parses every source address),
// and the Sink is not safe for concurrent use, so one reader goroutine over all sockets needs no locking.
// A receiver of one socket waits for its bursts inside the read itself while the stream is busy, and in
// epoll only once it has been idle (see drainSocket and Config.Coalesce).
package udp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/ibvbridge/ibvbridge/internal/netif"
	"github.com/ibvbridge/ibvbridge/transport"
)

// Defaults, as spead2's UDP reader has them.
const (
	DefaultBufferSize    = 8 << 20 // socket receive buffer
	DefaultMaxPacketSize = 9200    // largest datagram accepted; larger ones are counted as truncated
	DefaultBatch         = 64      // messages per recvmmsg
	// DefaultCoalesce is recv's --coalesce, the most a coalesced sleep may last. Against spead2_recv
	// 4.4.1 on its own traffic (bench udp --peer spead2, 1 MiB heaps at 6 Gb/s) recv cost 0.94× its CPU
	// with 200 µs, 0.71× with 500 µs and 0.56× with 1 ms; each sleep is shortened to what the socket
	// buffer and the ring's free slots can hold (coalescer), so a small ring no longer drops heaps for it.
	DefaultCoalesce = time.Millisecond
)

// Config describes the sockets of one stream.
type Config struct {
	Endpoints []transport.Endpoint
	// Interface is the local address of the interface that joins multicast groups; invalid lets the
	// kernel choose by its routing table.
	Interface     netip.Addr
	BufferSize    int // SO_RCVBUF to request; 0: DefaultBufferSize
	MaxPacketSize int // 0: DefaultMaxPacketSize
	Batch         int // 0: DefaultBatch
	// GRO asks the kernel to hand over runs of same-sized datagrams of one flow as one message (UDP
	// generic receive offload, Linux ≥ 5.0): one pass through the stack and one recvmmsg slot for up to
	// 64 KiB of datagrams, which the source cuts back into packets. Where the kernel refuses, each
	// datagram is its own message as before.
	GRO bool
	// Threads receive in parallel (spead2_recv's --threads): worker k owns endpoints k, k+Threads, …,
	// each on its own OS thread with its own epoll, all feeding the one sink under a lock taken per read
	// (the heap assembler is one state machine), which keeps its batches and its placement. 0 or 1: one
	// receiver. More threads than endpoints is an error.
	Threads int
	// CPUs, if set, pins worker k to CPUs[k % len(CPUs)].
	CPUs []int
	// Coalesce is the longest a receiver of one socket (one thread) sleeps after a drain that emptied it
	// before it reads again, so that the next wake finds many of the sender's bursts instead of one: a
	// NIC's interrupt moderation (rx-usecs) in software. Each sleep and wake is a thread switch; on 1 MiB
	// heaps at 6 Gb/s there was one per 36 KiB burst, 40 % of recv's CPU. It delays only datagrams that
	// follow the previous read within the sleep (a lone datagram is read at once), by at most Coalesce.
	// Each sleep is shortened so that what arrives meanwhile fits a quarter of the socket buffer and half
	// the sink's free room (transport.Absorber: the ring's free slots, at the rate heaps were published),
	// and skipped while the stream's rate is unknown (after an idle spell). 0: read each burst as it
	// comes; at most busyWait. Several endpoints or threads wait in epoll, without it.
	Coalesce time.Duration
	// CoalesceHeaps bounds each coalesced sleep by the heap in assembly too (transport.Awaiter): it ends
	// before the heap is expected to be complete, at the rate its bytes have come so far, and none is
	// taken while no heap is in assembly (the last read completed its heap: the next datagram may begin
	// and end one). Heaps then complete when their last datagram arrives, as without coalescing, while
	// the bursts in between are read a few at a time. recv's default. Without it a sleep may outlast a
	// heap's last datagram by up to Coalesce: fewer wakes, for that much latency.
	CoalesceHeaps bool
	Log           *zerolog.Logger
}

// Stats are the transport's counters. Kernel drops are the sockets' receive-queue overflows as the kernel
// counts them (/proc/net/udp): datagrams lost before we could read them.
type Stats struct {
	Packets     uint64 `json:"packets"`
	Bytes       uint64 `json:"bytes"`
	Batches     uint64 `json:"batches"`
	Truncated   uint64 `json:"truncated"`
	Errors      uint64 `json:"errors"`
	KernelDrops uint64 `json:"kernel_drops"`
	BufferSize  int    `json:"buffer_size"` // effective receive buffer per socket
	// Coalesced counts datagrams that arrived inside a multi-datagram GRO message.
	Coalesced uint64 `json:"gro_coalesced"`
	// Placed counts datagrams whose payload was read straight into place (no copy); PlacementMisses those
	// read into a guessed place that was wrong, and then moved.
	Placed          uint64 `json:"placed"`
	PlacementMisses uint64 `json:"placement_misses"`
}

// Map returns the counters for a JSON object.
func (s Stats) Map() map[string]uint64 {
	return map[string]uint64{"packets": s.Packets, "bytes": s.Bytes, "batches": s.Batches,
		"truncated": s.Truncated, "errors": s.Errors, "kernel_drops": s.KernelDrops,
		"buffer_size": uint64(s.BufferSize), "gro_coalesced": s.Coalesced, "placed": s.Placed,
		"placement_misses": s.PlacementMisses}
}

// mmsghdr is struct mmsghdr of recvmmsg(2) on 64-bit Linux.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
	_   [4]byte
}

type socket struct {
	fd    int
	ep    transport.Endpoint
	inode uint64
	hdrs  []mmsghdr
	iovs  []unix.Iovec
	bufs  [][]byte
	gro   bool   // UDP_GRO is on: a message may hold several datagrams
	ctl   []byte // per message, room for the UDP_GRO control message

	packets, bytes, placed atomic.Uint64 // this socket's share of the Source's counters (per-thread metrics)

	// unproven: the last read left the socket empty by a guess, not by a read that found nothing
	// (readPlaced), so a sleep must prove it first.
	unproven bool

	// Direct placement (GRO sockets feeding a transport.Placer): one recvmmsg whose messages' iovecs
	// alternate a header buffer and the region Place expects that datagram's payload in, each message
	// ending in an overflow buffer.
	regions     [][]byte
	hdrBufs     []byte // maxPlace × maxPlaceHdr
	pmsgs       []mmsghdr
	placedMsgs  []placedMsg
	perMsg      int // datagrams a message is expected to hold: the most one held in recent placed reads
	placedReads uint64
	windowMost  int // the most datagrams a message held in this window of relearnPerMsg placed reads
	msgCap      int // messages a placed read may take: 1 after a wrong guess, doubling while they hold
	segSize     int // datagram size of the last GRO message that held several (0: none yet)
	piov        []unix.Iovec
	pstart      []int  // logical offset of each iovec piece in its message
	gather      []byte // the datagrams of a read that did not land where expected, copied out
	dgrams      []placedDgram
}

// Direct placement limits: datagrams guessed per read, and the longest header guessed.
const (
	maxPlace    = 64
	maxPlaceHdr = 512
)

// relearnPerMsg is how many placed reads pass before the datagrams a message is expected to hold may
// shrink.
const relearnPerMsg = 64

// groCmsgSpace is the control buffer of one message: a cmsghdr and the int segment size, aligned.
const groCmsgSpace = 24

// maxGROMessage is the largest message GRO builds (an IPv4 datagram's limit).
const maxGROMessage = 65535

// Source receives on a set of UDP sockets. Open binds them, so address errors appear before anything else
// is set up.
type Source struct {
	cfg     Config
	socks   []*socket
	epfds   []int // one epoll per worker; worker k watches sockets k, k+len(epfds), …
	wakeFD  int   // eventfd: a cancelled context wakes every worker's epoll wait through it
	bufSize int

	stopping atomic.Bool
	packets  atomic.Uint64
	bytes    atomic.Uint64
	batches  atomic.Uint64
	trunc    atomic.Uint64
	errs     atomic.Uint64
	merged   atomic.Uint64
	placed   atomic.Uint64
	misses   atomic.Uint64

	closeOnce sync.Once
	closeErr  error
}

var _ transport.Source = (*Source)(nil)

// Open creates, configures and binds one socket per endpoint and joins the multicast groups.
func Open(cfg Config) (s *Source, err error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("udp: no endpoints")
	}
	if cfg.BufferSize <= 0 {
		cfg.BufferSize = DefaultBufferSize
	}
	if cfg.MaxPacketSize <= 0 {
		cfg.MaxPacketSize = DefaultMaxPacketSize
	}
	if cfg.Batch <= 0 {
		cfg.Batch = DefaultBatch
	}
	if cfg.Coalesce < 0 || cfg.Coalesce > busyWait {
		return nil, fmt.Errorf("udp: coalesce %v: want 0 to %v", cfg.Coalesce, busyWait)
	}
	threads := max(cfg.Threads, 1)
	if threads > len(cfg.Endpoints) {
		return nil, fmt.Errorf("udp: %d receive threads for %d endpoints: a thread owns whole endpoints", threads, len(cfg.Endpoints))
	}
	s = &Source{cfg: cfg, wakeFD: -1}
	defer func() {
		if err != nil {
			s.Close()
			s = nil
		}
	}()
	var ifAddr [4]byte
	ifIndex := 0
	if cfg.Interface.IsValid() {
		ifi, err := netif.ByAddr(cfg.Interface)
		if err != nil {
			return s, fmt.Errorf("udp: %w", err)
		}
		ifAddr, ifIndex = cfg.Interface.As4(), ifi.Index
	}
	if s.wakeFD, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		return s, fmt.Errorf("udp: eventfd: %w", err)
	}
	for range threads {
		epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			return s, fmt.Errorf("udp: epoll: %w", err)
		}
		s.epfds = append(s.epfds, epfd)
		if err = watch(epfd, s.wakeFD, -1); err != nil {
			return s, err
		}
	}
	for i, ep := range cfg.Endpoints {
		sk, err := s.openSocket(ep, ifAddr, ifIndex)
		if err != nil {
			return s, err
		}
		s.socks = append(s.socks, sk)
		if err = watch(s.epfds[i%threads], sk.fd, i); err != nil {
			return s, err
		}
	}
	return s, nil
}

func watch(epfd, fd, index int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(index)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("udp: epoll add: %w", err)
	}
	return nil
}

func (s *Source) openSocket(ep transport.Endpoint, ifAddr [4]byte, ifIndex int) (*socket, error) {
	// A blocking socket whose blocking reads end after busyWait (SO_RCVTIMEO): every read passes
	// MSG_DONTWAIT but the one that waits for a burst (see waitingRead).
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return nil, fmt.Errorf("udp: socket for %s: %w", ep, os.NewSyscallError("socket", err))
	}
	sk := &socket{fd: fd, ep: ep}
	fail := func(what string, err error) (*socket, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("udp: %s %s: %w", what, ep, err)
	}
	tv := unix.NsecToTimeval(busyWait.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fail("SO_RCVTIMEO on", os.NewSyscallError("setsockopt", err))
	}
	// Several receivers of one multicast group on a host is normal (spead2 does the same); for unicast a
	// second bind of the same port must fail, so only multicast sockets share.
	if ep.Multicast() {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			return fail("SO_REUSEADDR on", err)
		}
	}
	s.setBuffer(fd, ep)
	sa := &unix.SockaddrInet4{Port: int(ep.Port)}
	if ep.Addr.IsValid() {
		sa.Addr = ep.Addr.As4()
	}
	if err := unix.Bind(fd, sa); err != nil {
		return fail("bind", err)
	}
	if ep.Multicast() {
		mreq := &unix.IPMreqn{Multiaddr: ep.Addr.As4(), Address: ifAddr, Ifindex: int32(ifIndex)}
		if err := unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP, mreq); err != nil {
			return fail("join multicast group", err)
		}
	}
	if bound, err := unix.Getsockname(fd); err == nil {
		if in4, ok := bound.(*unix.SockaddrInet4); ok {
			sk.ep.Port = uint16(in4.Port)
		}
	}
	var st unix.Stat_t
	if unix.Fstat(fd, &st) == nil {
		sk.inode = st.Ino
	}
	n, size := s.cfg.Batch, s.cfg.MaxPacketSize
	if s.cfg.GRO {
		if err := unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_GRO, 1); err == nil {
			sk.allocGRO(n)
			size = max(size, maxGROMessage)
		} else if s.cfg.Log != nil {
			s.cfg.Log.Warn().Err(err).Str("endpoint", ep.String()).Msg("UDP GRO refused: a datagram per message")
		}
	}
	sk.allocBatch(n, size)
	return sk, nil
}

// allocGRO makes the buffers of GRO reads and of placed reads, for a batch of n messages.
func (sk *socket) allocGRO(n int) {
	sk.gro = true
	sk.ctl = make([]byte, n*groCmsgSpace)
	sk.regions = make([][]byte, maxPlace)
	sk.hdrBufs = make([]byte, maxPlace*maxPlaceHdr)
	msgs := min(n, maxPlace)
	sk.pmsgs = make([]mmsghdr, msgs)
	sk.placedMsgs = make([]placedMsg, msgs)
	sk.piov = make([]unix.Iovec, 2*maxPlace+msgs)
	sk.pstart = make([]int, 2*maxPlace+msgs+1)
	// Room for what a read usually holds; a read that copies out more grows them once (append).
	sk.gather = make([]byte, 0, 2*maxGROMessage)
	sk.dgrams = make([]placedDgram, 0, 2*maxPlace)
	sk.perMsg, sk.msgCap = 1, 1
}

// allocBatch makes the message headers and buffers of a batch of n reads of up to size bytes: one
// allocation for every buffer, cache-line aligned per message.
func (sk *socket) allocBatch(n, size int) {
	sk.hdrs = make([]mmsghdr, n)
	sk.iovs = make([]unix.Iovec, n)
	sk.bufs = make([][]byte, n)
	stride := (size + 63) &^ 63
	mem := make([]byte, n*stride)
	for i := range n {
		sk.bufs[i] = mem[i*stride : i*stride+size : i*stride+size]
		sk.iovs[i].Base = &sk.bufs[i][0]
		sk.iovs[i].SetLen(size)
		sk.hdrs[i].hdr.Iov = &sk.iovs[i]
		sk.hdrs[i].hdr.SetIovlen(1)
		if sk.gro {
			sk.hdrs[i].hdr.Control = &sk.ctl[i*groCmsgSpace]
		}
	}
}

// setBuffer requests the receive buffer. As root SO_RCVBUFFORCE passes net.core.rmem_max; otherwise the
// kernel silently caps SO_RCVBUF, so read it back and say so: a small buffer is the commonest cause of loss.
func (s *Source) setBuffer(fd int, ep transport.Endpoint) {
	want := s.cfg.BufferSize
	forced := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, want) == nil
	if !forced {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, want)
	}
	got, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
	if err != nil {
		return
	}
	got /= 2 // the kernel doubles the request for its bookkeeping and reports the doubled value
	s.bufSize = got
	if msg := bufferShortfall(want, got, forced); msg != "" && s.cfg.Log != nil {
		s.cfg.Log.Warn().Str("endpoint", ep.String()).Int("requested", want).Int("granted", got).Msg(msg)
	}
}

// bufferShortfall says why a socket got a smaller receive buffer than asked, or "" when the difference
// does not matter: with SO_RCVBUFFORCE (root, CAP_NET_ADMIN) only the kernel's own ceiling (INT_MAX/2, so
// "1G" gets one byte less) limits it, and a shortfall under 1 % is no cause for advice.
func bufferShortfall(want, got int, forced bool) string {
	if got >= want || want-got < want/100 {
		return ""
	}
	if forced {
		return "socket receive buffer capped by the kernel's largest socket buffer"
	}
	return "socket receive buffer capped by net.core.rmem_max; raise it (sysctl -w net.core.rmem_max=N) or give recv CAP_NET_ADMIN"
}

// LocalEndpoints are the bound endpoints (with the ports the kernel chose for port 0).
func (s *Source) LocalEndpoints() []transport.Endpoint {
	eps := make([]transport.Endpoint, len(s.socks))
	for i, sk := range s.socks {
		eps[i] = sk.ep
	}
	return eps
}

// BufferSize is the effective receive buffer of the sockets.
func (s *Source) BufferSize() int { return s.bufSize }

// maxBatchesPerWake bounds how long one busy socket keeps the reader before the others (and the stop
// flag) get a look.
const maxBatchesPerWake = 16

// Run reads every socket and hands each datagram to sink until ctx is cancelled or a socket fails. With
// several threads, each worker runs on its own locked OS thread and they share the sink under a lock
// taken per read (see workerSink).
func (s *Source) Run(ctx context.Context, sink transport.Sink) error {
	stop := context.AfterFunc(ctx, s.wake)
	defer stop()
	if len(s.epfds) == 1 {
		return s.runWorker(ctx, 0, newWorkerSink(sink, nil))
	}
	var mu sync.Mutex
	errs := make(chan error, len(s.epfds))
	for k := range s.epfds {
		go func() { errs <- s.runWorker(ctx, k, newWorkerSink(sink, &mu)) }()
	}
	var first error
	for range s.epfds {
		if err := <-errs; err != nil && first == nil {
			first = err
			s.wake() // one worker failed: stop the others
		}
	}
	if first != nil && ctx.Err() != nil && errors.Is(first, ctx.Err()) {
		return ctx.Err()
	}
	return first
}

// workerSink is how one receive thread hands datagrams to the stream's sink, with the sink's batch and
// placement hooks found once. With one thread it owns the sink: a batch spans a whole drain of a socket.
// With several they share it under shared, which a thread holds for one read at a time — a recvmmsg's
// messages handed over as one batch (several heaps published with one head store), or a placed read from
// Place through the read to the last Placed, since the regions Place gave belong to the sink's state and
// another thread's packets could hand them to another heap meanwhile. The read syscall of an unplaced
// read runs outside the lock, so the threads' reads overlap.
type workerSink struct {
	sink    transport.Sink
	batcher transport.Batcher // nil: the sink has no batches
	placer  transport.Placer  // nil: the sink does not place
	shared  *sync.Mutex       // nil: one thread
}

func newWorkerSink(sink transport.Sink, shared *sync.Mutex) *workerSink {
	w := &workerSink{sink: sink, shared: shared}
	w.batcher, _ = sink.(transport.Batcher)
	w.placer, _ = sink.(transport.Placer)
	return w
}

// beginDrain and endDrain bracket the drain of one socket: one batch when the thread owns the sink.
func (w *workerSink) beginDrain() {
	if w.shared == nil && w.batcher != nil {
		w.batcher.BeginBatch()
	}
}

func (w *workerSink) endDrain() {
	if w.shared == nil && w.batcher != nil {
		w.batcher.EndBatch()
	}
}

// beginRead and endRead bracket one read's hand-over when threads share the sink: the lock, and a batch.
func (w *workerSink) beginRead() {
	if w.shared != nil {
		w.shared.Lock()
		if w.batcher != nil {
			w.batcher.BeginBatch()
		}
	}
}

func (w *workerSink) endRead() {
	if w.shared != nil {
		if w.batcher != nil {
			w.batcher.EndBatch()
		}
		w.shared.Unlock()
	}
}

// runWorker is one receive thread: its epoll, its sockets, pinned to its CPU when asked.
func (s *Source) runWorker(ctx context.Context, k int, sink *workerSink) error {
	if len(s.epfds) > 1 || len(s.cfg.CPUs) > 0 {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	if len(s.cfg.CPUs) > 0 {
		var set unix.CPUSet
		set.Set(s.cfg.CPUs[k%len(s.cfg.CPUs)])
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return fmt.Errorf("udp: receive thread %d on CPU %d: %w", k, s.cfg.CPUs[k%len(s.cfg.CPUs)],
				os.NewSyscallError("sched_setaffinity", err))
		}
	}
	events := make([]unix.EpollEvent, len(s.socks)+1)
	// A receiver of one socket waits inside the read. Not so a worker of several: one that shares the
	// sink holds its lock from Place to the last Placed of a placed read, which must not include a wait.
	var only *socket
	var co *coalescer
	if len(s.socks) == 1 && len(s.epfds) == 1 {
		only = s.socks[0]
		if s.cfg.Coalesce > 0 {
			co = newCoalescer(s.cfg.Coalesce, s.bufSize, sink.sink, s.cfg.CoalesceHeaps)
			// A coalesced sleep is timed to end before a heap is due: the thread's timer slack (50 µs by
			// default, added to every sleep) would make it end after. The slack belongs to the thread,
			// so the thread stays this worker's.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			_ = unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(coalesceTimerSlack.Nanoseconds()), 0, 0, 0)
			// The thread goes back to Go's pool with its default slack (0 restores it): another
			// goroutine's timers are not this worker's business.
			defer unix.Prctl(unix.PR_SET_TIMERSLACK, 0, 0, 0, 0)
		}
	}
	for {
		if s.stopping.Load() {
			if err := ctx.Err(); err != nil {
				return err
			}
			return errors.New("udp: stopped by another receive thread's failure")
		}
		if only != nil {
			got, emptied, err := s.drainSocket(only, sink, true)
			if err != nil {
				return err
			}
			if got {
				if emptied && co != nil {
					now := time.Now()
					if d := co.next(now, only.bytes.Load()); d > 0 {
						if only.unproven { // nothing may wait in the socket through a sleep: look once more
							found, _, err := s.drainSocket(only, sink, false)
							if err != nil {
								return err
							}
							if found {
								continue
							}
						}
						coalesceSleep(d)
						co.slept(d, time.Since(now))
					}
				}
				continue
			}
			// Idle for busyWait: wait the ordinary way, which gives the P up (an idle receiver costs
			// nothing); the wake eventfd ends this wait too.
			if _, err := unix.EpollWait(s.epfds[k], events, -1); err != nil && !errors.Is(err, unix.EINTR) {
				return fmt.Errorf("udp: epoll wait: %w", err)
			}
			continue
		}
		n, err := waitEvents(s.epfds[k], events)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("udp: epoll wait: %w", err)
		}
		for _, ev := range events[:n] {
			if ev.Fd < 0 {
				continue // the wake eventfd: the loop head sees stopping
			}
			if _, _, err := s.drainSocket(s.socks[ev.Fd], sink, false); err != nil {
				return err
			}
		}
	}
}

// busyWait is how long a receive thread waits for the next datagram or event inside a raw syscall before
// it waits the ordinary way. It bounds how long a stop-the-world waits on a receive thread (in practice
// less: the runtime's preemption signal ends the wait with EINTR).
const (
	busyWait   = time.Millisecond
	busyWaitMs = uintptr(busyWait / time.Millisecond)
)

// waitEvents waits for socket events. While the stream is busy it waits inside a raw syscall, which keeps
// the thread's P: the ordinary syscall hands the P to another thread when it blocks and takes it back when
// it returns, a thread switch per burst that cost a fifth of recv's CPU on 1 MiB heaps at 6 Gb/s. After
// busyWaitMs without an event it waits the ordinary way, which gives the P up: an idle receiver costs
// nothing, and nothing (the GC's stop-the-world, other goroutines) waits on this thread for longer.
func waitEvents(epfd int, events []unix.EpollEvent) (int, error) {
	r, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])),
		uintptr(len(events)), busyWaitMs, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	if r > 0 {
		return int(r), nil
	}
	return unix.EpollWait(epfd, events, -1)
}

func (s *Source) wake() {
	s.stopping.Store(true)
	var one = [8]byte{1}
	_, _ = unix.Write(s.wakeFD, one[:])
}

// drainSocket drains a socket as one batch of a Batcher sink when the thread owns it: the heaps it
// completes reach consumers together when the socket is empty (or has had its share), not one cursor
// store at a time. With wait, its first read waits up to busyWait for a datagram inside the syscall: a
// receiver of one socket needs no readiness wait of its own (a syscall per burst) while the stream
// is busy. It reports whether it read anything, and whether it left the socket empty (proven by a read
// that found nothing, or guessed from a GRO message with room for more: sk.unproven).
func (s *Source) drainSocket(sk *socket, w *workerSink, wait bool) (got, emptied bool, err error) {
	w.beginDrain()
	defer w.endDrain()
	flags := unix.MSG_DONTWAIT
	if wait {
		flags = unix.MSG_WAITFORONE
	}
	for i := range maxBatchesPerWake {
		got, more, err := s.readOnce(sk, w, flags)
		if err != nil || !more || s.stopping.Load() {
			return got || i > 0, !more, err
		}
		flags = unix.MSG_DONTWAIT
	}
	return true, false, nil
}

// coalesceSleep sleeps d (at most busyWait) in a raw syscall, which keeps the thread's P as the waiting
// read does; a signal (the runtime's preemption) ends it early. A variable: tests look at the socket
// before each sleep.
var coalesceSleep = sleepRaw

func sleepRaw(d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	_, _, _ = unix.RawSyscall(unix.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// readOnce makes one read of a socket with recvmmsg flags (MSG_DONTWAIT, or MSG_WAITFORONE to wait up to
// busyWait for the first message) and hands what it read over: straight into place where the sink has a
// guess, else a recvmmsg batch. It reports whether it read anything and whether the socket may have more.
func (s *Source) readOnce(sk *socket, w *workerSink, flags int) (got, more bool, err error) {
	sk.unproven = false
	hdrs := sk.hdrs
	if w.placer != nil && sk.gro {
		w.beginRead()
		if hdrLen, k := w.placer.Place(sk.regions[:sk.placeCap()]); k > 0 && hdrLen <= maxPlaceHdr {
			got, more, err := s.readPlaced(sk, w.placer, hdrLen, k, flags)
			w.endRead()
			return got, more, err
		}
		w.endRead()
		// No guess (a heap's first packets): read one message the usual way, so the next read can place
		// again instead of a whole batch going through the copy.
		hdrs = sk.hdrs[:1]
	}
	if sk.gro {
		for i := range hdrs {
			hdrs[i].hdr.SetControllen(groCmsgSpace) // the kernel overwrites it with what it used
		}
	}
	n, errno := recvmmsg(sk.fd, hdrs, flags)
	if errno != 0 {
		return false, false, s.readFailed(sk, "recvmmsg", errno)
	}
	w.beginRead()
	s.handOver(sk, n, w.sink)
	w.endRead()
	return n > 0, n == len(hdrs), nil
}

// readFailed classifies a failed read, for both read paths: nil for what only ends this drain (nothing
// to read, a signal, or a transient shortage, which the errors counter records: a receiver must not die
// of one bad moment), else the error that stops the receiver.
func (s *Source) readFailed(sk *socket, call string, errno unix.Errno) error {
	switch errno {
	case unix.EAGAIN, unix.EINTR:
		return nil
	case unix.ENOMEM, unix.ENOBUFS, unix.ECONNREFUSED:
		s.errs.Add(1)
		return nil
	}
	s.errs.Add(1)
	return fmt.Errorf("udp: read on %s: %w", sk.ep, os.NewSyscallError(call, errno))
}

// handOver cuts the n messages of a recvmmsg into datagrams (a GRO message holds several), hands them to
// sink and counts them.
func (s *Source) handOver(sk *socket, n int, sink transport.Sink) {
	now := time.Now().UnixNano()
	var bytes, trunc, packets, coalesced uint64
	maxPkt := s.cfg.MaxPacketSize
	for i := range n {
		h := &sk.hdrs[i]
		if h.hdr.Flags&unix.MSG_TRUNC != 0 {
			trunc++
			continue
		}
		msg := sk.bufs[i][:h.n]
		seg := len(msg)
		if sk.gro {
			seg = groSegment(sk.ctl[i*groCmsgSpace:(i+1)*groCmsgSpace], int(h.hdr.Controllen), seg)
		}
		// A GRO message is datagrams of seg bytes, the last one maybe shorter.
		if seg < len(msg) {
			coalesced += uint64((len(msg) + seg - 1) / seg)
		}
		for len(msg) > 0 {
			d := msg[:min(seg, len(msg))]
			msg = msg[len(d):]
			if len(d) > maxPkt {
				trunc++ // larger than --max-packet: counted, as a truncated datagram would be
				continue
			}
			bytes += uint64(len(d))
			packets++
			sink.Packet(d, now)
		}
	}
	// the detail counters first: whoever sees the datagrams counted sees how they came
	if coalesced > 0 {
		s.merged.Add(coalesced)
	}
	if trunc > 0 {
		s.trunc.Add(trunc)
	}
	s.count(sk, packets, bytes, 0, 0)
}

// count adds a read's datagrams to the source's and the socket's counters.
func (s *Source) count(sk *socket, packets, bytes, placed, misses uint64) {
	s.packets.Add(packets)
	s.bytes.Add(bytes)
	sk.packets.Add(packets)
	sk.bytes.Add(bytes)
	s.batches.Add(1)
	if placed > 0 {
		s.placed.Add(placed)
		sk.placed.Add(placed)
	}
	if misses > 0 {
		s.misses.Add(misses)
	}
}

// readPlaced makes one recvmmsg whose messages carry the k regions Place returned (layoutPlaced), each
// datagram's as a hdrLen-byte header buffer and the payload's region, each message ending in an overflow
// buffer. Each datagram of the leading run that landed exactly in its pieces goes to Placed; every other
// is joined back and goes to Packet. It reports whether the socket may have more to read.
func (s *Source) readPlaced(sk *socket, pl transport.Placer, hdrLen, k, flags int) (got, more bool, err error) {
	msgs := sk.layoutPlaced(hdrLen, k)
	for m := range msgs {
		sk.pmsgs[m].hdr.SetControllen(groCmsgSpace) // the kernel overwrites it with what it used
	}
	n, errno := recvmmsg(sk.fd, sk.pmsgs[:msgs], flags)
	if errno != 0 {
		return false, false, s.readFailed(sk, "recvmmsg", errno)
	}
	now := time.Now().UnixNano()
	ds := s.sortPlaced(sk, pl, hdrLen, n)
	var packets, bytes, placed, misses uint64
	for _, dg := range ds {
		if dg.size > s.cfg.MaxPacketSize {
			s.trunc.Add(1)
			continue
		}
		packets++
		bytes += uint64(dg.size)
		if dg.fits {
			d := dg.index
			if pl.Placed(sk.hdrBufs[d*maxPlaceHdr:d*maxPlaceHdr+hdrLen], sk.regions[d], dg.size-hdrLen, now) {
				placed++
			}
			continue
		}
		if dg.moved {
			misses++
		}
		pl.Packet(sk.gather[dg.index:dg.index+dg.size], now)
	}
	s.count(sk, packets, bytes, placed, misses)
	if packets > 1 {
		s.merged.Add(packets)
	}
	// A wrong guess makes the rest of its read a copy: after one, read one message a time until the
	// guesses hold again, then twice as many each read.
	if misses > 0 {
		sk.msgCap = 1
	} else {
		sk.msgCap = min(2*sk.msgCap, len(sk.pmsgs))
	}
	more = n == msgs && !s.stopping.Load()
	if more && sk.perMsg != 1 && int(sk.pmsgs[0].n)+sk.segSize <= maxGROMessage {
		// One GRO message with room for another datagram: the burst that made it ended there, so the socket
		// is most likely empty. Reading again to prove it costs a syscall that finds nothing, per wake, on
		// a stream of bursts; the next drain's waiting read finds whatever did come. Only a sleep needs the
		// proof (runWorker).
		more, sk.unproven = false, true
	}
	return n > 0, more, nil
}

// layoutPlaced builds the message vectors of a placed read of k regions and returns how many messages.
// While the socket's messages hold one datagram each (perMsg 1: nothing merges them), each region gets a
// message of its own: one call takes up to msgCap datagrams, and each lands in its region whatever the
// others hold. Once a message held several (GRO), a read is one message laid out with every region, as
// the number each message holds follows the sender's runs: a message holding fewer than laid out would
// shift every later message of the call off its regions (tried: on 1 MiB heaps from a GSO sender whose
// batches end in short runs, about one datagram in ten was then moved, for no CPU gain).
func (sk *socket) layoutPlaced(hdrLen, k int) (msgs int) {
	perMsg, maxMsgs := k, 1
	if sk.perMsg == 1 {
		perMsg, maxMsgs = 1, sk.msgCap
	}
	p := 0 // next piece
	for d := 0; d < k && msgs < maxMsgs; msgs++ {
		pm := &sk.placedMsgs[msgs]
		pm.firstDgram, pm.firstPiece = d, p
		off := 0
		for n := 0; d < k && n < perMsg; n++ {
			h, r := sk.hdrBufs[d*maxPlaceHdr:d*maxPlaceHdr+hdrLen], sk.regions[d]
			off = sk.setPiece(p, &h[0], hdrLen, off)
			off = sk.setPiece(p+1, &r[0], len(r), off)
			p, d = p+2, d+1
		}
		pm.dgrams = d - pm.firstDgram
		over := sk.bufs[msgs] // overflow: the batch buffers are idle meanwhile
		sk.setPiece(p, &over[0], len(over), off)
		p++
		pm.endPiece = p
		h := &sk.pmsgs[msgs].hdr
		h.Iov = &sk.piov[pm.firstPiece]
		h.SetIovlen(p - pm.firstPiece)
		h.Control = &sk.ctl[msgs*groCmsgSpace]
	}
	return msgs
}

// placeCap is how many regions a placed read can fill: one per message while messages hold one datagram
// each (msgCap messages), else what one GRO message can hold (64 KiB of datagrams; 8 of 8972 bytes).
// Guessing and laying out more costs a region's guess and two iovecs the kernel imports each, for nothing.
// Should the datagrams shrink, those past the cap land in the overflow buffer and are copied (not a miss),
// and the read learns the new size.
func (sk *socket) placeCap() int {
	if sk.perMsg == 1 {
		return sk.msgCap
	}
	if sk.segSize <= 0 {
		return maxPlace
	}
	return min(maxPlace, (maxGROMessage+sk.segSize-1)/sk.segSize)
}

// setPiece makes iovec piece p the n bytes at base, at logical offset off of its message; it returns the
// offset after it.
func (sk *socket) setPiece(p int, base *byte, n, off int) int {
	sk.piov[p].Base = base
	sk.piov[p].SetLen(n)
	sk.pstart[p] = off
	return off + n
}

// placedMsg is one message of a placed read: its datagrams' regions and its iovec pieces.
type placedMsg struct {
	firstDgram, dgrams   int
	firstPiece, endPiece int // the overflow buffer is the last piece
}

// sortPlaced cuts the n messages of a placed read into datagrams and decides each before any is taken:
// one that did not land in place is copied out to sk.gather first (taking a datagram may move bytes into
// a region a later one still occupies). Only a leading run of datagrams is taken in place: each of those
// is the next packet Place guessed, so taking them cannot evict that heap or hand its slot to another
// while a later one still sits in it; everything after the first datagram that does not fit is copied.
func (s *Source) sortPlaced(sk *socket, pl transport.Placer, hdrLen, n int) []placedDgram {
	sk.dgrams, sk.gather = sk.dgrams[:0], sk.gather[:0]
	inPlace, most := true, 1
	for m := range n {
		pm := &sk.placedMsgs[m]
		total := int(sk.pmsgs[m].n)
		seg := groSegment(sk.ctl[m*groCmsgSpace:(m+1)*groCmsgSpace], int(sk.pmsgs[m].hdr.Controllen), total)
		if total > 0 {
			most = max(most, (total+seg-1)/seg)
		}
		if seg < total {
			sk.segSize = seg
		}
		for j, start := 0, 0; start < total; j, start = j+1, start+seg {
			end := min(start+seg, total)
			dg := placedDgram{size: end - start}
			if inPlace = inPlace && j < pm.dgrams && sk.fitsPlaced(pl, pm, j, hdrLen, start, end, end == total); inPlace {
				dg.fits, dg.index = true, pm.firstDgram+j
			} else if dg.size <= s.cfg.MaxPacketSize {
				dg.index = len(sk.gather)
				sk.gather = sk.appendPieces(sk.gather, pm, start, end)
				dg.moved = start < sk.pstart[pm.endPiece-1] // part of it went into a guessed region
			}
			sk.dgrams = append(sk.dgrams, dg)
		}
	}
	// Learn upwards at once, downwards only to the most of a window of reads: one message that happened
	// to hold a single datagram must not switch a GRO stream to a message per datagram.
	sk.placedReads++
	sk.windowMost = max(sk.windowMost, most)
	sk.perMsg = max(sk.perMsg, most)
	if sk.placedReads%relearnPerMsg == 0 {
		sk.perMsg, sk.windowMost = sk.windowMost, 0
	}
	return sk.dgrams
}

// fitsPlaced reports whether datagram j of message pm, at [start, end) of the message, landed whole in
// its header buffer and region and is the packet expected there. Only a message's last datagram may be
// shorter than its region.
func (sk *socket) fitsPlaced(pl transport.Placer, pm *placedMsg, j, hdrLen, start, end int, last bool) bool {
	d := pm.firstDgram + j
	payload := end - start - hdrLen
	if start != sk.pstart[pm.firstPiece+2*j] || payload <= 0 || payload > len(sk.regions[d]) ||
		!last && payload != len(sk.regions[d]) {
		return false
	}
	return pl.Fits(sk.hdrBufs[d*maxPlaceHdr:d*maxPlaceHdr+hdrLen], sk.regions[d], payload)
}

// placedDgram is one datagram of a placed read: taken in place (fits, region index), or copied out
// (index into the copy buffer; moved: some of it had gone into a guessed region).
type placedDgram struct {
	size        int
	index       int
	fits, moved bool
}

// appendPieces appends the logical bytes [start, end) of message pm of the last placed read, from its
// iovec pieces.
func (sk *socket) appendPieces(out []byte, pm *placedMsg, start, end int) []byte {
	for p := pm.firstPiece; p < pm.endPiece && start < end; p++ {
		lo, hi := sk.pstart[p], sk.pstart[p+1]
		if p == pm.endPiece-1 {
			hi = lo + int(sk.piov[p].Len)
		}
		if hi <= start || lo >= end {
			continue
		}
		piece := unsafe.Slice((*byte)(sk.piov[p].Base), hi-lo)
		a, b := max(start, lo)-lo, min(end, hi)-lo
		out = append(out, piece[a:b]...)
	}
	return out
}

// groSegment reads the segment size from a message's UDP_GRO control message; without one the message is
// a single datagram of length n.
func groSegment(ctl []byte, used, n int) int {
	if used < unix.SizeofCmsghdr+4 {
		return n
	}
	h := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[0]))
	if h.Level != unix.SOL_UDP || h.Type != unix.UDP_GRO {
		return n
	}
	seg := int(*(*int32)(unsafe.Pointer(&ctl[unix.SizeofCmsghdr])))
	if seg <= 0 {
		return n
	}
	return seg
}

// recvmmsg reads up to len(hdrs) datagrams: without blocking (MSG_DONTWAIT), or waiting up to busyWait for
// the first (MSG_WAITFORONE on the blocking socket). The call is direct (x/sys has no wrapper), and reuses
// the same headers every time, so it allocates nothing. It is a raw syscall, which keeps the thread's P:
// the ordinary one hands the P over when a call lasts and takes it back after, a thread switch per read;
// a raw call lasts at most busyWait (or one batch's copy), and the preemption signal ends a wait early.
func recvmmsg(fd int, hdrs []mmsghdr, flags int) (int, unix.Errno) {
	n, _, errno := unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&hdrs[0])),
		uintptr(len(hdrs)), uintptr(flags), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), 0
}

// Stats reads the counters; safe from any goroutine.
func (s *Source) Stats() Stats {
	st := Stats{Packets: s.packets.Load(), Bytes: s.bytes.Load(), Batches: s.batches.Load(),
		Truncated: s.trunc.Load(), Errors: s.errs.Load(), BufferSize: s.bufSize, Coalesced: s.merged.Load(),
		Placed: s.placed.Load(), PlacementMisses: s.misses.Load()}
	var inodes []uint64
	for _, sk := range s.socks {
		inodes = append(inodes, sk.inode)
	}
	st.KernelDrops = kernelDrops(inodes)
	return st
}

// Close closes the sockets; safe to call more than once, and after Run has returned.
func (s *Source) Close() error {
	s.closeOnce.Do(func() {
		var errs []error
		for _, sk := range s.socks {
			errs = append(errs, unix.Close(sk.fd))
		}
		for _, fd := range append(append([]int{}, s.epfds...), s.wakeFD) {
			if fd >= 0 {
				errs = append(errs, unix.Close(fd))
			}
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// kernelDrops sums the drops column of /proc/net/udp for the given socket inodes.
func kernelDrops(inodes []uint64) uint64 {
	b, err := os.ReadFile("/proc/net/udp")
	if err != nil {
		return 0
	}
	return parseDrops(b, inodes)
}

// ThreadCounters implements transport.ThreadCounted: packets and bytes per receive thread.
func (s *Source) ThreadCounters() []map[string]uint64 {
	out := make([]map[string]uint64, len(s.epfds))
	for k := range out {
		out[k] = map[string]uint64{"packets": 0, "bytes": 0, "placed": 0}
	}
	for i, sk := range s.socks {
		m := out[i%len(out)]
		m["packets"] += sk.packets.Load()
		m["bytes"] += sk.bytes.Load()
		m["placed"] += sk.placed.Load()
	}
	return out
}

// Counters implements transport.Counted.
func (s *Source) Counters() map[string]uint64 { return s.Stats().Map() }

var _ interface {
	transport.Source
	transport.Counted
} = (*Source)(nil)
