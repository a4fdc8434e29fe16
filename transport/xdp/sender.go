//go:build linux

package xdp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ibvbridge/ibvbridge/frame"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/transport"
)

// Send defaults.
const (
	DefaultSendFrames = 4096 // UMEM frames of the sender (also its TX and completion ring sizes)
	DefaultSendBatch  = 64   // packets per TX-ring publish and kick
	sendSndBuf        = 32 << 20
)

// ErrTXStalled: the kernel completed none of the frames in flight for flushStall (the link is down, or
// the driver stopped).
var ErrTXStalled = errors.New("AF_XDP TX stalled")

// flushStall bounds how long Flush waits without a single completion.
const flushStall = 5 * time.Second

// ErrFrameTooLarge: a packet's frame is larger than the interface's MTU allows, or larger than one UMEM
// frame while the kernel or driver refuses multi-buffer TX.
var ErrFrameTooLarge = errors.New("frame too large for AF_XDP TX")

// SendConfig describes an AF_XDP sender: one socket on one TX queue, its own UMEM.
type SendConfig struct {
	Interface string         // name, or one of its IPv4 addresses
	Queue     int            // TX queue to bind (default 0)
	Dest      netip.AddrPort // IPv4 destination
	DstMAC    [6]byte        // the destination's (or next hop's) Ethernet address: the caller resolves it
	SrcIP     netip.Addr     // default: the interface's first IPv4 address
	SrcPort   uint16         // default: Dest's port
	TTL       int            // default 1 for multicast, 64 otherwise
	Rate      float64        // bits per second of UDP payload; 0: as fast as the kernel takes them
	Batch     int            // packets per publish and kick (default 64)
	Frames    int            // UMEM frames of 4096 bytes, a power of two (default 4096)
	// MaxPayload is the largest UDP payload the sender will be given (the encoder's packet size).
	MaxPayload int
	// ZeroCopy demands XDP_ZEROCOPY; by default zero-copy is tried and copy mode taken when refused.
	ZeroCopy bool
}

// SendStats are the sender's counters.
type SendStats struct {
	Packets, Bytes uint64 // packets and UDP payload bytes handed to the kernel and completed or in flight
	Descs          uint64 // TX descriptors written (several per packet when multi-buffer)
	Kicks          uint64 // sendto wakeups
	Stalls         uint64 // waits for a free frame (the kernel had not completed any)
	MultiBuffer    bool   // bound with XDP_USE_SG
	ZeroCopy       bool
}

// Sender transmits UDP datagrams as raw frames through an AF_XDP socket: each packet's headers and
// payload are written into UMEM frames (a packet larger than one frame spans consecutive frames, sent as
// a multi-buffer chain), the TX ring is published a batch at a time, paced as the socket sender paces,
// and one sendto kicks the kernel per batch when it asks for it. Completed frames come back through the
// completion ring. It is for one goroutine.
type Sender struct {
	fd       int
	umem     []byte
	tx, cmp  *xskRing
	slotSize uint64   // bytes of UMEM per packet: whole 4096-byte frames
	free     []uint64 // free slots' UMEM addresses, most recently completed last (cache-warm)
	inFlight int
	queued   int // packets written to the TX ring, not yet published
	b        frame.Builder
	pacer    *transport.Pacer
	batch    int
	wakeup   bool

	sent, bytes, descs, kicks, stalls atomic.Uint64
	sg, zc                            bool
	queuedBytes                       uint64
}

const sendFrameSize = 4096

// xdpMaxTXSKBBudget is XDP_MAX_TX_SKB_BUDGET (linux/if_xdp.h, 6.17), not yet in x/sys/unix.
const xdpMaxTXSKBBudget = 9

// OpenSender opens the socket, its UMEM and rings, after checking that a MaxPayload packet fits the
// interface's MTU (ErrFrameTooLarge otherwise).
func OpenSender(cfg SendConfig) (s *Sender, err error) {
	if cfg.Frames == 0 {
		cfg.Frames = DefaultSendFrames
	}
	if cfg.Batch <= 0 {
		cfg.Batch = DefaultSendBatch
	}
	switch {
	case !cfg.Dest.Addr().Is4() || cfg.Dest.Port() == 0:
		return nil, fmt.Errorf("xdp send: %w: destination %s (want IPv4:port)", ErrBadConfig, cfg.Dest)
	case cfg.Frames < 16 || cfg.Frames&(cfg.Frames-1) != 0:
		return nil, fmt.Errorf("xdp send: %w: %d frames (want a power of two, at least 16)", ErrBadConfig, cfg.Frames)
	case cfg.MaxPayload <= 0 || cfg.MaxPayload > frame.MaxPayloadLen:
		return nil, fmt.Errorf("xdp send: %w: packet size %d", ErrBadConfig, cfg.MaxPayload)
	}
	name, ifindex, err := resolveInterface(cfg.Interface)
	if err != nil {
		return nil, err
	}
	ifi, err := net.InterfaceByIndex(ifindex)
	if err != nil {
		return nil, fmt.Errorf("xdp send: %s: %w: %w", name, ErrInterfaceNotFound, err)
	}
	if l := frame.IPv4HeaderLen + frame.UDPHeaderLen + cfg.MaxPayload; l > ifi.MTU {
		return nil, fmt.Errorf("xdp send: %d-byte packets make %d-byte IPv4 datagrams, more than %s's MTU %d: %w",
			cfg.MaxPayload, l, name, ifi.MTU, ErrFrameTooLarge)
	}
	if !cfg.SrcIP.IsValid() {
		if cfg.SrcIP, err = firstIPv4(ifi); err != nil {
			return nil, fmt.Errorf("xdp send: %s: %w", name, err)
		}
	}
	if cfg.SrcPort == 0 {
		cfg.SrcPort = cfg.Dest.Port()
	}
	if cfg.TTL == 0 {
		cfg.TTL = 64
		if cfg.Dest.Addr().IsMulticast() {
			cfg.TTL = 1
		}
	}
	frameLen := frame.HeaderLen + cfg.MaxPayload
	chunks := (frameLen + sendFrameSize - 1) / sendFrameSize
	s = &Sender{fd: -1, slotSize: uint64(chunks * sendFrameSize), batch: cfg.Batch, pacer: transport.NewPacer(cfg.Rate)}
	defer func() {
		if err != nil {
			s.Close()
			s = nil
		}
	}()
	copy(s.b.SrcMAC[:], ifi.HardwareAddr)
	s.b.DstMAC, s.b.SrcIP, s.b.DstIP = cfg.DstMAC, cfg.SrcIP, cfg.Dest.Addr()
	s.b.SrcPort, s.b.DstPort, s.b.TTL = cfg.SrcPort, cfg.Dest.Port(), uint8(cfg.TTL)
	size := cfg.Frames * sendFrameSize
	if s.umem, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE); err != nil {
		return s, fmt.Errorf("xdp send: map %d-byte UMEM: %w", size, os.NewSyscallError("mmap", err))
	}
	for a := uint64(0); a+s.slotSize <= uint64(size); a += s.slotSize {
		s.free = append(s.free, a)
	}
	if err = s.bind(cfg, ifindex, chunks > 1); err != nil {
		return s, fmt.Errorf("xdp send: %s queue %d: %w", name, cfg.Queue, err)
	}
	if chunks > 1 && !s.sg {
		return s, fmt.Errorf("xdp send: %d-byte frames span %d UMEM frames and %s refuses multi-buffer AF_XDP TX (XDP_USE_SG): %w; use packets of at most %d bytes",
			frameLen, chunks, name, ErrFrameTooLarge, sendFrameSize-frame.HeaderLen)
	}
	return s, nil
}

func firstIPv4(ifi *net.Interface) (netip.Addr, error) {
	addrs, err := ifi.Addrs()
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
			return p.Addr(), nil
		}
	}
	return netip.Addr{}, errors.New("no IPv4 address to send from")
}

// bind creates the socket and rings and binds it, zero-copy first unless the driver refuses, with
// XDP_USE_SG when sg (dropped if refused: OpenSender then says why packets cannot span frames).
func (s *Sender) bind(cfg SendConfig, ifindex int, sg bool) error {
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return sysError("create AF_XDP socket", err)
	}
	s.fd = fd
	// Copy mode charges each frame's skb to the socket's send buffer until the receiver has taken it:
	// the default (about 200 KiB, 23 jumbo frames) would stall a fast stream.
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sendSndBuf) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, sendSndBuf)
	}
	reg := unix.XDPUmemReg{Addr: uint64(uintptr(unsafe.Pointer(&s.umem[0]))), Len: uint64(len(s.umem)), Size: sendFrameSize}
	if err := sockopt(fd, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
		return sysError("register UMEM", err)
	}
	n := uint32(len(s.umem) / sendFrameSize)
	fillN := uint32(64) // a UMEM needs a fill ring; a sender never fills it
	for _, r := range []struct {
		opt int
		n   *uint32
	}{{unix.XDP_UMEM_FILL_RING, &fillN}, {unix.XDP_UMEM_COMPLETION_RING, &n}, {unix.XDP_TX_RING, &n}} {
		if err := sockopt(fd, r.opt, unsafe.Pointer(r.n), 4); err != nil {
			return sysError("size rings", err)
		}
	}
	// Copy mode transmits at most 32 descriptors per sendto unless told otherwise (XDP_MAX_TX_SKB_BUDGET,
	// Linux 6.17): a batch of jumbo frames (three descriptors each) then takes one call, not seven. An
	// older kernel refuses the option (and any kernel before the TX ring exists), and gets more calls.
	budget := min(max(uint32(3*cfg.Batch), 32), n) // 32..the TX ring (EACCES otherwise)
	_ = sockopt(fd, xdpMaxTXSKBBudget, unsafe.Pointer(&budget), 4)
	var off unix.XDPMmapOffsets
	if err := getsockopt(fd, unix.XDP_MMAP_OFFSETS, unsafe.Pointer(&off), unsafe.Sizeof(off)); err != nil {
		return sysError("get ring offsets", err)
	}
	if s.cmp, err = mapRing(fd, unix.XDP_UMEM_PGOFF_COMPLETION_RING, off.Cr, n, 8); err != nil {
		return sysError("map completion ring", err)
	}
	if s.tx, err = mapRing(fd, unix.XDP_PGOFF_TX_RING, off.Tx, n, unsafe.Sizeof(unix.XDPDesc{})); err != nil {
		return sysError("map TX ring", err)
	}
	sa := &unix.SockaddrXDP{Ifindex: uint32(ifindex), QueueID: uint32(cfg.Queue)}
	// Jumbo frames need XDP_USE_SG more than zero-copy: a driver may do multi-buffer TX only in copy
	// mode, so every mode is tried with it before any without it.
	modes := []uint16{unix.XDP_ZEROCOPY, unix.XDP_COPY}
	if cfg.ZeroCopy {
		modes = modes[:1]
	}
	var tries []uint16
	if sg {
		for _, mode := range modes {
			tries = append(tries, mode|unix.XDP_USE_NEED_WAKEUP|unix.XDP_USE_SG)
		}
	}
	for _, mode := range modes {
		tries = append(tries, mode|unix.XDP_USE_NEED_WAKEUP)
	}
	for _, flags := range tries {
		sa.Flags = flags
		if err = unix.Bind(fd, sa); err == nil || !(errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP)) {
			break
		}
	}
	if err != nil {
		if cfg.ZeroCopy {
			return fmt.Errorf("%w: %w", ErrZeroCopyUnsupported, sysError("bind", err))
		}
		return sysError("bind", err)
	}
	s.sg, s.wakeup = sa.Flags&unix.XDP_USE_SG != 0, sa.Flags&unix.XDP_USE_NEED_WAKEUP != 0
	var opts uint32
	if getsockopt(fd, unix.XDP_OPTIONS, unsafe.Pointer(&opts), 4) == nil {
		s.zc = opts&unix.XDP_OPTIONS_ZEROCOPY != 0
	}
	return nil
}

// Buffer implements transport.FrameQueue: a free packet's payload buffer (its frame's headers go before
// it, written at Commit). It waits for the kernel to complete frames when none is free.
func (s *Sender) Buffer(ctx context.Context) ([]byte, error) {
	var stalled time.Time
	for len(s.free) == 0 {
		s.reap()
		if len(s.free) > 0 {
			break
		}
		if err := s.publish(); err != nil {
			return nil, err
		}
		if err := s.kick(); err != nil {
			return nil, err
		}
		s.reap()
		if len(s.free) > 0 {
			break
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if stalled.IsZero() {
			stalled = time.Now()
		} else if time.Since(stalled) > flushStall {
			return nil, fmt.Errorf("xdp send: no frame completed by the kernel in %v: %w", flushStall, ErrTXStalled)
		}
		s.stalls.Add(1)
		time.Sleep(20 * time.Microsecond) // the receiver has not taken the frames yet (copy mode)
	}
	a := s.free[len(s.free)-1]
	return s.umem[a+frame.HeaderLen : a+s.slotSize : a+s.slotSize], nil
}

// Discard implements transport.FrameQueue: the buffer is only taken by Commit, so there is nothing to
// give back.
func (s *Sender) Discard() {}

var _ transport.FrameQueue = (*Sender)(nil)

// Commit implements transport.FrameQueue: it queues the buffer Buffer returned, holding an n-byte UDP
// payload, as one frame (a chain of
// descriptors over its consecutive UMEM frames when it is longer than one); every Batch packets the TX
// ring is published, paced, and the kernel kicked.
func (s *Sender) Commit(ctx context.Context, n int) error {
	a := s.free[len(s.free)-1]
	if uint64(frame.HeaderLen+n) > s.slotSize {
		return fmt.Errorf("xdp send: %d-byte payload: %w", n, ErrFrameTooLarge)
	}
	if err := s.b.Build(s.umem[a:a+s.slotSize], n); err != nil {
		return err
	}
	s.free = s.free[:len(s.free)-1]
	s.inFlight++
	total := uint64(frame.HeaderLen + n)
	for off := uint64(0); off < total; off += sendFrameSize {
		d := unix.XDPDesc{Addr: a + off, Len: uint32(min(sendFrameSize, total-off))}
		if off+sendFrameSize < total {
			d.Options = unix.XDP_PKT_CONTD
		}
		s.tx.descs[s.tx.local&s.tx.mask] = d
		s.tx.local++
		s.descs.Add(1)
	}
	s.queued++
	s.queuedBytes += uint64(n)
	if s.queued >= s.batch {
		return s.send(ctx)
	}
	return nil
}

// send paces, publishes what is queued and kicks the kernel.
func (s *Sender) send(ctx context.Context) error {
	if err := s.pacer.Wait(ctx, s.bytes.Load()); err != nil {
		return err
	}
	if err := s.publish(); err != nil {
		return err
	}
	return s.kick()
}

// publish makes the queued descriptors visible to the kernel.
func (s *Sender) publish() error {
	if s.queued == 0 {
		return nil
	}
	s.tx.prod.Store(s.tx.local)
	s.sent.Add(uint64(s.queued))
	s.bytes.Add(s.queuedBytes)
	s.queued, s.queuedBytes = 0, 0
	return nil
}

// kick makes the kernel transmit what the TX ring holds: with need_wakeup only when the ring asks (copy
// mode always does; a zero-copy driver that is already polling does not). The kernel's copy-mode
// transmit takes a bounded number of frames per call, so it is called again while the ring drains.
func (s *Sender) kick() error {
	for i := 0; s.tx.cons.Load() != s.tx.local && i < 1024; i++ {
		if s.wakeup && !s.tx.needWakeup() {
			return nil
		}
		before := s.tx.cons.Load()
		_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(s.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
		s.kicks.Add(1)
		switch e {
		case 0, unix.EAGAIN, unix.EBUSY, unix.ENOBUFS:
			// EAGAIN/EBUSY/ENOBUFS: the kernel took what it could; frames come back as the receiver
			// takes them.
		default:
			return fmt.Errorf("xdp send: kick: %w", os.NewSyscallError("sendto", e))
		}
		s.reap()
		if s.tx.cons.Load() == before && e != 0 {
			return nil // no progress: the caller waits for completions
		}
	}
	return nil
}

// reap takes completed frames back: a packet's slot is free once its first frame has completed (the
// kernel completes a chain's descriptors together, after it has copied or sent the whole frame).
func (s *Sender) reap() {
	r := s.cmp
	prod := r.prod.Load()
	if prod == r.local {
		return
	}
	for ; r.local != prod; r.local++ {
		if a := r.addrs[r.local&r.mask]; a%s.slotSize == 0 {
			s.free = append(s.free, a)
			s.inFlight--
		}
	}
	r.cons.Store(r.local)
}

// Flush sends what is queued and waits until every frame has completed, or ctx is done.
func (s *Sender) Flush(ctx context.Context) error {
	if s.queued > 0 {
		if err := s.send(ctx); err != nil {
			return err
		}
	}
	last, progress := s.inFlight, time.Now()
	for s.reap(); s.inFlight > 0; s.reap() {
		if err := s.kick(); err != nil {
			return err
		}
		if s.inFlight == 0 {
			break
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("xdp send: flush with %d frames in flight: %w", s.inFlight, err)
		}
		if s.inFlight != last {
			last, progress = s.inFlight, time.Now()
		} else if time.Since(progress) > flushStall {
			return fmt.Errorf("xdp send: flush: %d frames not completed by the kernel in %v: %w", s.inFlight, flushStall, ErrTXStalled)
		}
		time.Sleep(20 * time.Microsecond)
	}
	return nil
}

// Stats returns the counters; safe from any goroutine.
func (s *Sender) Stats() SendStats {
	return SendStats{Packets: s.sent.Load(), Bytes: s.bytes.Load(), Descs: s.descs.Load(), Kicks: s.kicks.Load(),
		Stalls: s.stalls.Load(), MultiBuffer: s.sg, ZeroCopy: s.zc}
}

// Close releases the socket and memory; Flush first to send what is queued.
func (s *Sender) Close() error {
	s.tx.unmap()
	s.cmp.unmap()
	var err error
	if s.fd >= 0 {
		err = unix.Close(s.fd)
		s.fd = -1
	}
	if s.umem != nil {
		err = errors.Join(err, unix.Munmap(s.umem))
		s.umem = nil
	}
	return err
}

// HeapSender is the AF_XDP send transport: heaps are packetized straight into UMEM frames.
type HeapSender struct {
	s     *Sender
	enc   *spead.Encoder
	start time.Time
}

var _ transport.HeapSender = (*HeapSender)(nil)

// OpenHeapSender opens a Sender for cfg (MaxPayload from the encoder) that packetizes with enc.
func OpenHeapSender(cfg SendConfig, enc *spead.Encoder) (*HeapSender, error) {
	cfg.MaxPayload = enc.MaxPacketSize()
	s, err := OpenSender(cfg)
	if err != nil {
		return nil, err
	}
	return &HeapSender{s: s, enc: enc, start: time.Now()}, nil
}

// SendHeap implements transport.HeapSender.
func (hs *HeapSender) SendHeap(ctx context.Context, h *spead.Heap) error {
	return transport.Packetize(ctx, hs.enc, h, hs.s)
}

// Flush implements transport.HeapSender. An interrupted send (ctx already done) still drains what is
// queued, briefly: the frames are built, and the heaps they finish should arrive whole.
func (hs *HeapSender) Flush(ctx context.Context) error {
	ctx, cancel := transport.DrainContext(ctx)
	defer cancel()
	return hs.s.Flush(ctx)
}

// Totals implements transport.HeapSender.
func (hs *HeapSender) Totals() transport.SendTotals {
	st := hs.s.Stats()
	return transport.SendTotals{Packets: st.Packets, Bytes: st.Bytes, Start: hs.start}
}

// Stats are the sender's counters.
func (hs *HeapSender) Stats() SendStats { return hs.s.Stats() }

// Close implements transport.HeapSender.
func (hs *HeapSender) Close() error { return hs.s.Close() }
