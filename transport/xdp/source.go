//go:build linux

package xdp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/rs/zerolog"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"

	"github.com/ibvbridge/ibvbridge/frame"
	"github.com/ibvbridge/ibvbridge/internal/netif"
	"github.com/ibvbridge/ibvbridge/internal/rxloop"
	"github.com/ibvbridge/ibvbridge/transport"
)

// Attach modes for Config.Mode.
const (
	ModeAuto    = "auto"    // native if the driver has it, else generic (with a warning)
	ModeNative  = "native"  // driver XDP (XDP_FLAGS_DRV_MODE); fails if the driver lacks it
	ModeGeneric = "generic" // generic/SKB XDP (XDP_FLAGS_SKB_MODE): any driver, copy mode only
)

// Defaults.
const (
	DefaultFrameSize = 4096 // UMEM frame: Ethernet frames up to 3840 bytes
	DefaultFrames    = 4096 // UMEM frames per queue (also the fill and rx ring sizes)
	DefaultBatch     = 64
)

// Config describes one AF_XDP receiver.
type Config struct {
	// Interface is the interface's name, or one of its IPv4 addresses (spead2's convention).
	Interface string
	// Queues are the receive queues to bind a socket to; default [0]. The NIC's RSS or flow steering
	// must bring the stream's frames to these queues (on a single-queue veth, queue 0 has everything).
	Queues []int
	// Mode is ModeAuto (""), ModeNative or ModeGeneric.
	Mode string
	// ZeroCopy demands XDP_ZEROCOPY: Open fails if the driver refuses it. Copy forces XDP_COPY. With
	// neither, zero-copy is tried and copy mode used, with a warning, when the driver refuses it.
	ZeroCopy, Copy bool
	// Endpoints are the destinations to receive: an IPv4 unicast or multicast address and a UDP port; an
	// invalid or unspecified (0.0.0.0) address matches the port on any address. Multicast groups are
	// joined on the interface.
	Endpoints []netip.AddrPort
	// FrameSize is the UMEM frame size: a power of two from 2048 to the page size (default 4096).
	FrameSize int
	// Frames is the number of UMEM frames per queue, a power of two (default 4096).
	Frames int
	// MaxPoll and BusyPoll are rxloop.Config's: polls before sleeping, or spin without sleeping.
	MaxPoll  int
	BusyPoll bool
	// Batch is the frames taken per poll and returned per fill-ring update (default 64). A frame spanning
	// more descriptors than Batch (or maxChain) is dropped and counted.
	Batch int
	// SingleBuffer binds without XDP_USE_SG and loads the program without frags support: frames larger
	// than a UMEM frame are then dropped by the kernel (Stats.RxDropped). By default multi-buffer is
	// used where the kernel has it (6.6+): a jumbo frame arrives as a chain of descriptors and is
	// assembled here.
	SingleBuffer bool
	// NoNeedWakeup binds without XDP_USE_NEED_WAKEUP: the kernel keeps polling the fill ring itself, and
	// the receiver never has to kick it with a syscall (more softirq CPU while idle).
	NoNeedWakeup bool
	// SocketBusyPoll are the sockets' busy-polling options (SO_PREFER_BUSY_POLL, SO_BUSY_POLL,
	// SO_BUSY_POLL_BUDGET); Open fails with ErrBusyPoll if the kernel refuses one.
	SocketBusyPoll BusyPoll
	Log            *zerolog.Logger
}

func (c *Config) setDefaults() error {
	if len(c.Queues) == 0 {
		c.Queues = []int{0}
	}
	if c.Mode == "" {
		c.Mode = ModeAuto
	}
	if c.FrameSize == 0 {
		c.FrameSize = DefaultFrameSize
	}
	if c.Frames == 0 {
		c.Frames = DefaultFrames
	}
	if c.Batch <= 0 {
		c.Batch = DefaultBatch
	}
	page := os.Getpagesize()
	switch {
	case c.Interface == "":
		return fmt.Errorf("%w: no interface", ErrBadConfig)
	case len(c.Endpoints) == 0:
		return fmt.Errorf("%w: no endpoints", ErrBadConfig)
	case c.Mode != ModeAuto && c.Mode != ModeNative && c.Mode != ModeGeneric:
		return fmt.Errorf("%w: mode %q (want auto, native or generic)", ErrBadConfig, c.Mode)
	case c.ZeroCopy && c.Copy:
		return fmt.Errorf("%w: zero-copy and copy mode both demanded", ErrBadConfig)
	case c.ZeroCopy && c.Mode == ModeGeneric:
		return fmt.Errorf("%w: zero-copy needs native XDP, not generic", ErrBadConfig)
	case c.FrameSize < 2048 || c.FrameSize > page || c.FrameSize&(c.FrameSize-1) != 0:
		return fmt.Errorf("%w: frame size %d (want a power of two in 2048..%d)", ErrBadConfig, c.FrameSize, page)
	case c.Frames < 2 || c.Frames&(c.Frames-1) != 0 || c.Frames*c.FrameSize%page != 0:
		return fmt.Errorf("%w: frame count %d (want a power of two, at least %d)", ErrBadConfig, c.Frames, max(2, page/c.FrameSize))
	}
	seen := map[int]bool{}
	for _, q := range c.Queues {
		if q < 0 || seen[q] {
			return fmt.Errorf("%w: queue %d negative or repeated", ErrBadConfig, q)
		}
		seen[q] = true
	}
	for _, ep := range c.Endpoints {
		if a := ep.Addr(); (a.IsValid() && !a.Is4()) || ep.Port() == 0 {
			return fmt.Errorf("%w: endpoint %s (want an IPv4 address, or none, and a port)", ErrBadConfig, ep)
		}
	}
	return nil
}

// RequiredUMEM is the UMEM size cfg needs: Frames × FrameSize per queue. Open takes it from the start of
// the umem it is given, which must be page aligned (the ring's packet area is): size the ring with
// ring.Config.PacketArea = RequiredUMEM(cfg). It returns 0 for a configuration Open would reject.
func RequiredUMEM(cfg Config) int {
	if err := cfg.setDefaults(); err != nil {
		return 0
	}
	return len(cfg.Queues) * cfg.Frames * cfg.FrameSize
}

// Stats are the transport's counters. Every frame the XDP program redirects is either received (Frames),
// still in an rx ring, or counted by the kernel (RxDropped, RxRingFull, RxFillRingEmpty, RxInvalidDescs);
// every frame received is delivered (Packets) or skipped by reason.
type Stats struct {
	Interface string `json:"interface"`
	Mode      string `json:"mode"`      // "native" or "generic": how the program is attached
	ZeroCopy  bool   `json:"zero_copy"` // sockets bound in zero-copy mode
	Queues    []int  `json:"queues"`

	Frames      uint64                   `json:"frames"`       // descriptors taken from the rx rings (each piece of a chain)
	QueueFrames []uint64                 `json:"queue_frames"` // frames taken, per queue (in Queues order)
	Packets     uint64                   `json:"packets"`      // UDP payloads delivered to the sink
	Bytes       uint64                   `json:"bytes"`        // payload bytes delivered
	Skipped     [frame.NumReasons]uint64 `json:"-"`            // frames frame.Parse rejected, by frame.Reason

	Redirected uint64 `json:"xdp_redirected"` // XDP program: matched and redirected to a socket
	NoSocket   uint64 `json:"xdp_no_socket"`  // XDP program: matched on a queue without a socket (passed)

	Polls       uint64 `json:"polls"`
	EmptyPolls  uint64 `json:"empty_polls"`  // polls that found every rx ring empty
	Waits       uint64 `json:"waits"`        // sleeps in poll(2)
	FillStarved uint64 `json:"fill_starved"` // fill-ring refills that found the kernel had taken every frame
	Wakeups     uint64 `json:"wakeups"`      // need-wakeup (or busy-poll) kicks sent

	MultiBuffer   bool   `json:"multi_buffer"`   // sockets bound with XDP_USE_SG
	NeedWakeup    bool   `json:"need_wakeup"`    // sockets bound with XDP_USE_NEED_WAKEUP
	ChainFrames   uint64 `json:"chain_frames"`   // frames that arrived as several descriptors, assembled
	ChainsPlaced  uint64 `json:"chains_placed"`  // of those, payloads copied straight into their slot
	ChainsDropped uint64 `json:"chains_dropped"` // frames spanning too many descriptors to assemble

	// Kernel counters (XDP_STATISTICS), summed over the sockets.
	RxDropped       uint64 `json:"rx_dropped"`               // frames dropped: too large for a frame, ...
	RxInvalidDescs  uint64 `json:"rx_invalid_descs"`         // bad descriptors we put in the fill ring
	RxRingFull      uint64 `json:"rx_ring_full"`             // rx ring full: we did not keep up
	RxFillRingEmpty uint64 `json:"rx_fill_ring_empty_descs"` // fill ring empty: no frame to receive into
}

// Map returns the counters for a JSON object (skip reasons as "skipped_<reason>").
func (s Stats) Map() map[string]uint64 {
	zc := b2u(s.ZeroCopy)
	m := map[string]uint64{"frames": s.Frames, "packets": s.Packets, "bytes": s.Bytes,
		"xdp_redirected": s.Redirected, "xdp_no_socket": s.NoSocket, "polls": s.Polls,
		"empty_polls": s.EmptyPolls, "waits": s.Waits, "fill_starved": s.FillStarved, "wakeups": s.Wakeups,
		"rx_dropped": s.RxDropped, "rx_invalid_descs": s.RxInvalidDescs, "rx_ring_full": s.RxRingFull,
		"rx_fill_ring_empty_descs": s.RxFillRingEmpty, "zero_copy": zc,
		"multi_buffer": b2u(s.MultiBuffer), "need_wakeup": b2u(s.NeedWakeup), "chain_frames": s.ChainFrames,
		"chains_placed": s.ChainsPlaced, "chains_dropped": s.ChainsDropped}
	for r, n := range s.Skipped {
		if n > 0 {
			m["skipped_"+frame.Reason(r).String()] = n
		}
	}
	return m
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// Source receives a stream's frames through AF_XDP sockets.
type Source struct {
	cfg     Config
	log     zerolog.Logger
	ifname  string
	ifindex int
	mode    string
	zc      bool

	objs    *objects
	link    link.Link
	socks   []*xsk
	umem    []byte
	ownUMEM []byte // mmapped by Open (nil when the caller's umem is used)
	mcast   *ipv4.PacketConn
	wakeFD  int
	q       *queue

	loop    rxloop.Stats
	packets atomic.Uint64
	bytes   atomic.Uint64
	skipped [frame.NumReasons]atomic.Uint64

	chain        chain    // the descriptors of the frame being received, when it spans several
	region       [][]byte // Placer.Place's answer for a chain's payload
	scratch      []byte   // a chain's payload joined, when it cannot be placed
	chainFrames  atomic.Uint64
	chainsPlaced atomic.Uint64

	wakeMu sync.Mutex // guards wakeFD against wake

	mu      sync.Mutex // guards the fields below, and teardown against Stats
	closed  bool
	running bool
	cancel  context.CancelFunc
	runDone chan struct{}
	final   Stats // counters at Close
}

var _ transport.Source = (*Source)(nil)

// Open sets up the receiver: it resolves the interface, loads the XDP program, creates one AF_XDP socket
// per queue over umem (nil, or too small for RequiredUMEM(cfg): Open maps its own, and logs it), attaches
// the program and joins the multicast groups. Open must run in the network namespace of the interface;
// everything it creates stays bound to that namespace, so Run may then run on any goroutine.
func Open(cfg Config, umem []byte) (s *Source, err error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("xdp: %w", err)
	}
	s = &Source{cfg: cfg, log: zerolog.Nop(), wakeFD: -1, region: make([][]byte, 1), scratch: make([]byte, frame.MaxPayloadLen)}
	if cfg.Log != nil {
		s.log = *cfg.Log
	}
	defer func() {
		if err != nil {
			s.teardown()
			s = nil
		}
	}()
	if s.ifname, s.ifindex, err = resolveInterface(cfg.Interface); err != nil {
		return s, err
	}
	nq, err := rxQueues(s.ifname, s.ifindex)
	if err != nil {
		return s, err
	}
	maxQ := 0
	for _, q := range cfg.Queues {
		if q >= nq {
			return s, fmt.Errorf("xdp: queue %d of %s: %w (it has %d rx queues: 0..%d)", q, s.ifname, ErrQueueOutOfRange, nq, nq-1)
		}
		maxQ = max(maxQ, q)
	}
	if err = s.setUMEM(umem); err != nil {
		return s, err
	}
	if s.objs, err = loadObjects(cfg.Endpoints, maxQ+1, !cfg.SingleBuffer); err != nil {
		return s, err
	}
	if err = s.removeStale(); err != nil {
		return s, err
	}
	if err = s.attach(); err != nil {
		return s, err
	}
	if err = s.openSockets(); errors.Is(err, unix.EFAULT) && s.ownUMEM == nil {
		// The kernel pins UMEM pages for good (FOLL_LONGTERM), which it refuses for files on ordinary
		// filesystems: only hugetlbfs and tmpfs (/dev/shm) data files can hold the UMEM.
		for _, x := range s.socks {
			x.close()
		}
		s.socks = nil
		if err = s.allocUMEM(fmt.Sprintf("the kernel cannot pin the ring's packet area (%v): its data file must be on hugetlbfs or tmpfs", err)); err != nil {
			return s, err
		}
		err = s.openSockets()
	}
	if err != nil {
		return s, err
	}
	if s.wakeFD, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		return s, fmt.Errorf("xdp: eventfd: %w", err)
	}
	s.q = newQueue(s.socks, s.wakeFD, cfg.Batch)
	if err = s.join(); err != nil {
		return s, err
	}
	s.log.Info().Str("interface", s.ifname).Str("mode", s.mode).Bool("zero_copy", s.zc).Ints("queues", cfg.Queues).
		Int("frame_size", cfg.FrameSize).Int("frames", cfg.Frames).Msg("AF_XDP receiver ready")
	return s, nil
}

// ResolveInterface returns the name and index of the interface called name, or having IPv4 address name
// (spead2's convention); the error wraps ErrInterfaceNotFound.
func ResolveInterface(name string) (string, int, error) { return resolveInterface(name) }

func resolveInterface(name string) (string, int, error) {
	if a, err := netip.ParseAddr(name); err == nil {
		ifi, err := netif.ByAddr(a)
		if err != nil {
			return "", 0, fmt.Errorf("xdp: interface %s: %w: %w", name, ErrInterfaceNotFound, err)
		}
		name = ifi.Name
	}
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return "", 0, fmt.Errorf("xdp: interface %s: %w: %w", name, ErrInterfaceNotFound, err)
	}
	return ifi.Name, ifi.Index, nil
}

// rxQueues counts the interface's active receive queues (the kernel refuses to bind beyond them): the
// driver's channel counts (ETHTOOL_GCHANNELS, asked through a socket of this thread's namespace), else
// /sys/class/net/IF/queues/rx-* when sysfs shows this namespace's interface, else netlink's
// IFLA_NUM_RX_QUEUES (allocated queues, which can be more).
func rxQueues(name string, index int) (int, error) {
	if n := ethtoolRxChannels(name); n > 0 {
		return n, nil
	}
	dir := filepath.Join("/sys/class/net", name)
	if b, err := os.ReadFile(filepath.Join(dir, "ifindex")); err == nil && strings.TrimSpace(string(b)) == strconv.Itoa(index) {
		if m, err := filepath.Glob(filepath.Join(dir, "queues", "rx-*")); err == nil && len(m) > 0 {
			return len(m), nil
		}
	}
	st, err := queryXDP(index)
	if err != nil {
		return 0, fmt.Errorf("xdp: interface %s: %w", name, err)
	}
	return max(int(st.NumRxQueues), 1), nil
}

// ethtoolRxChannels returns rx + combined channels from ETHTOOL_GCHANNELS; 0 if the driver does not say.
func ethtoolRxChannels(name string) int {
	const ethtoolGChannels = 0x3c
	var ch struct {
		cmd                                     uint32
		maxRx, maxTx, maxOther, maxCombined     uint32
		rxCount, txCount, otherCount, combCount uint32
	}
	ch.cmd = ethtoolGChannels
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer // a real pointer, so the stack copier keeps it right
		_    [16]byte
	}
	copy(ifr.name[:unix.IFNAMSIZ-1], name)
	ifr.data = unsafe.Pointer(&ch)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	if e != 0 {
		return 0
	}
	return int(ch.rxCount + ch.combCount)
}

func (s *Source) setUMEM(umem []byte) error {
	need := RequiredUMEM(s.cfg)
	page := os.Getpagesize()
	switch {
	case umem == nil:
		return s.allocUMEM("")
	case len(umem) < need:
		return s.allocUMEM(fmt.Sprintf("the ring's packet area has %d bytes, %d needed", len(umem), need))
	case uintptr(unsafe.Pointer(unsafe.SliceData(umem)))%uintptr(page) != 0:
		return s.allocUMEM("the ring's packet area is not page aligned")
	}
	s.umem = umem[:need:need]
	s.log.Debug().Int("bytes", need).Msg("AF_XDP UMEM in the ring's packet area")
	return nil
}

// allocUMEM maps the UMEM privately; why says why the caller's (the ring's packet area) is not used.
func (s *Source) allocUMEM(why string) error {
	need := RequiredUMEM(s.cfg)
	mem, err := unix.Mmap(-1, 0, need, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("xdp: map %d-byte UMEM: %w", need, err)
	}
	s.ownUMEM, s.umem = mem, mem
	ev := s.log.Info()
	if why != "" {
		ev = s.log.Warn().Str("reason", why)
	}
	ev.Int("bytes", need).Msg("AF_XDP UMEM allocated with mmap, outside the ring")
	return nil
}

// removeStale looks at the XDP programs already on the interface. One of ours attached the legacy way
// (netlink) was left behind and is removed, with a warning; one of ours held by a bpf_link belongs to a
// live process (ErrInUse: the kernel drops a dead process's link); anyone else's is left alone
// (ErrForeignProgram).
func (s *Source) removeStale() error {
	st, err := queryXDP(s.ifindex)
	if err != nil {
		return fmt.Errorf("xdp: interface %s: %w", s.ifname, err)
	}
	type attached struct {
		flags uint32
		id    uint32
		mode  string
	}
	var progs []attached
	for _, a := range []attached{{unix.XDP_FLAGS_DRV_MODE, st.DrvProgID, ModeNative},
		{unix.XDP_FLAGS_SKB_MODE, st.SKBProgID, ModeGeneric}, {unix.XDP_FLAGS_HW_MODE, st.HWProgID, "offload"}} {
		if a.id != 0 {
			progs = append(progs, a)
		}
	}
	for _, a := range progs {
		name := "?"
		if p, err := ebpf.NewProgramFromID(ebpf.ProgramID(a.id)); err == nil {
			if info, err := p.Info(); err == nil {
				name = info.Name
			}
			p.Close()
		}
		if name != ProgramName {
			return fmt.Errorf("xdp: interface %s: %w: %s XDP program %q (id %d); detach it first (ip link set dev %s xdp off)",
				s.ifname, ErrForeignProgram, a.mode, name, a.id, s.ifname)
		}
	}
	for _, a := range progs {
		if err := setXDPFD(s.ifindex, -1, a.flags); err != nil {
			if errors.Is(err, unix.EBUSY) {
				return fmt.Errorf("xdp: interface %s: %w (program id %d): %w", s.ifname, ErrInUse, a.id, err)
			}
			return fmt.Errorf("xdp: interface %s: remove stale program id %d: %w", s.ifname, a.id, err)
		}
		s.log.Warn().Str("interface", s.ifname).Uint32("prog_id", a.id).Str("mode", a.mode).
			Msg("removed an ibvbridge XDP program left behind by an earlier run")
	}
	return nil
}

// attach links the program to the interface through a bpf_link (BPF_LINK_CREATE): the kernel detaches it
// when the link's last fd closes, so a process killed with SIGKILL leaves nothing behind.
func (s *Source) attach() error {
	try := func(flags link.XDPAttachFlags) error {
		l, err := link.AttachXDP(link.XDPOptions{Program: s.objs.prog, Interface: s.ifindex, Flags: flags})
		if err != nil {
			return err
		}
		s.link = l
		return nil
	}
	wrap := func(mode string, err error) error {
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
			return fmt.Errorf("xdp: attach %s XDP to %s: %w: %w", mode, s.ifname, ErrPermission, err)
		}
		if errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("xdp: attach %s XDP to %s: %w: %w", mode, s.ifname, ErrInUse, err)
		}
		return fmt.Errorf("xdp: attach %s XDP to %s: %w", mode, s.ifname, err)
	}
	switch s.cfg.Mode {
	case ModeGeneric:
		if err := try(link.XDPGenericMode); err != nil {
			return wrap(ModeGeneric, err)
		}
		s.mode = ModeGeneric
	case ModeNative:
		if err := try(link.XDPDriverMode); err != nil {
			if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("xdp: attach native XDP to %s: %w: %w", s.ifname, ErrModeUnsupported, err)
			}
			return wrap(ModeNative, err)
		}
		s.mode = ModeNative
	default:
		err := try(link.XDPDriverMode)
		if err == nil {
			s.mode = ModeNative
			break
		}
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.EBUSY) {
			return wrap(ModeNative, err)
		}
		if s.cfg.ZeroCopy {
			return fmt.Errorf("xdp: attach native XDP to %s (zero-copy demanded): %w: %w", s.ifname, ErrModeUnsupported, err)
		}
		s.log.Warn().Err(err).Str("interface", s.ifname).Msg("native XDP refused; using generic XDP (slower, copy mode)")
		if err := try(link.XDPGenericMode); err != nil {
			return wrap(ModeGeneric, err)
		}
		s.mode = ModeGeneric
	}
	return nil
}

// openSockets binds one socket per queue over its part of the UMEM and puts it in the XSKMAP.
func (s *Source) openSockets() error {
	part := s.cfg.Frames * s.cfg.FrameSize
	for i, q := range s.cfg.Queues {
		o := socketOptions{ifindex: s.ifindex, queue: q, frameSize: s.cfg.FrameSize, busy: s.cfg.SocketBusyPoll,
			multiBuffer: !s.cfg.SingleBuffer && s.objs.frags, noNeedWakeup: s.cfg.NoNeedWakeup}
		umem := s.umem[i*part : (i+1)*part : (i+1)*part]
		var x *xsk
		var err error
		if !s.cfg.Copy && s.mode == ModeNative {
			o.zeroCopy = true
			x, err = newXSKRetry(o, umem)
			if err != nil && !errors.Is(err, ErrPermission) && !errors.Is(err, ErrNotSupported) && !errors.Is(err, unix.EBUSY) &&
				!errors.Is(err, ErrBusyPoll) {
				if s.cfg.ZeroCopy {
					return fmt.Errorf("xdp: %s queue %d: %w: %w", s.ifname, q, ErrZeroCopyUnsupported, err)
				}
				s.log.Warn().Err(err).Str("interface", s.ifname).Int("queue", q).
					Msg("AF_XDP zero-copy refused by the driver; using copy mode")
				o.zeroCopy = false
				x, err = newXSKRetry(o, umem)
			} else if err == nil && o.multiBuffer && !x.sg && !s.cfg.ZeroCopy && s.mtuNeedsChains() {
				// A driver with zero-copy but without multi-buffer in it would drop every frame the MTU
				// allows past one UMEM frame: copy mode with multi-buffer takes them.
				s.log.Warn().Str("interface", s.ifname).Int("queue", q).
					Msg("AF_XDP zero-copy without multi-buffer cannot take this MTU's frames; using copy mode")
				x.close()
				o.zeroCopy = false
				x, err = newXSKRetry(o, umem)
			}
		} else {
			x, err = newXSKRetry(o, umem)
		}
		if err != nil {
			if errors.Is(err, ErrBusyPoll) {
				return err
			}
			if errors.Is(err, unix.EBUSY) {
				return fmt.Errorf("xdp: %s queue %d already has an AF_XDP socket: %w", s.ifname, q, err)
			}
			return fmt.Errorf("xdp: %s queue %d: %w", s.ifname, q, err)
		}
		s.socks = append(s.socks, x)
		s.zc = x.zeroCopy
		if err := s.objs.xsks.Put(uint32(q), uint32(x.fd)); err != nil {
			return bpfError(fmt.Sprintf("add queue %d socket to XSKMAP", q), err)
		}
	}
	return nil
}

// mtuNeedsChains reports whether the interface's MTU allows frames larger than one UMEM frame takes
// (its size less the kernel's 256-byte XDP_PACKET_HEADROOM).
func (s *Source) mtuNeedsChains() bool {
	ifi, err := net.InterfaceByIndex(s.ifindex)
	return err == nil && ifi.MTU+frame.EthernetHeaderLen > s.cfg.FrameSize-256
}

// newXSKRetry is newXSK, retried for a while when the queue is busy: the kernel releases a closed
// socket's hold on its queue in deferred work, so a receiver restarted at once (or a previous process
// just killed) can find the queue still taken for some milliseconds.
func newXSKRetry(o socketOptions, umem []byte) (*xsk, error) {
	deadline := time.Now().Add(bindRetry)
	for delay := time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		x, err := newXSK(o, umem)
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return x, err
		}
		time.Sleep(delay)
	}
}

// bindRetry bounds newXSKRetry.
const bindRetry = 2 * time.Second

// join joins the endpoints' multicast groups on the interface, through an ordinary UDP socket bound to
// an ephemeral port (it receives none of the stream), so the kernel sends the IGMP reports. The socket
// stays open, and the memberships with it, until Close.
func (s *Source) join() error {
	var groups []netip.Addr
	for _, ep := range s.cfg.Endpoints {
		if a := ep.Addr(); a.IsMulticast() && !contains(groups, a) {
			groups = append(groups, a)
		}
	}
	if len(groups) == 0 {
		return nil
	}
	ifi, err := net.InterfaceByIndex(s.ifindex)
	if err != nil {
		return fmt.Errorf("xdp: interface %s: %w: %w", s.ifname, ErrInterfaceNotFound, err)
	}
	c, err := net.ListenPacket("udp4", "0.0.0.0:0")
	if err != nil {
		return fmt.Errorf("xdp: socket for multicast joins: %w", err)
	}
	s.mcast = ipv4.NewPacketConn(c)
	for _, g := range groups {
		if err := s.mcast.JoinGroup(ifi, &net.UDPAddr{IP: g.AsSlice()}); err != nil {
			return fmt.Errorf("xdp: join %s on %s: %w", g, s.ifname, err)
		}
	}
	return nil
}

func contains(l []netip.Addr, a netip.Addr) bool {
	for _, b := range l {
		if a == b {
			return true
		}
	}
	return false
}

// Run receives until ctx is done (it returns ctx.Err()), Close is called (ErrClosed) or a socket fails.
// Every frame is parsed with frame.Parse and its UDP payload handed to sink; frames it rejects are counted
// by reason. Only one Run may be active at a time.
func (s *Source) Run(ctx context.Context, sink transport.Sink) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("xdp: run: %w", ErrClosed)
	}
	if s.running {
		s.mu.Unlock()
		return errors.New("xdp: run: already running")
	}
	runCtx, cancel := context.WithCancel(ctx)
	s.running, s.cancel, s.runDone = true, cancel, make(chan struct{})
	done := s.runDone
	s.mu.Unlock()
	defer func() {
		cancel()
		s.mu.Lock()
		s.running, s.cancel = false, nil
		close(done)
		s.mu.Unlock()
	}()
	stop := context.AfterFunc(runCtx, s.wake)
	defer stop()

	q := s.q
	loop := rxloop.Config{MaxPoll: s.cfg.MaxPoll, BusyPoll: s.cfg.BusyPoll, Batch: s.cfg.Batch, Stats: &s.loop}
	if b, ok := sink.(transport.Batcher); ok {
		loop.Batches = b // each poll's heaps reach consumers together
	}
	placer, _ := sink.(transport.Placer)
	ch := &s.chain
	ch.n = 0
	err := rxloop.Run(runCtx, q, loop, func(id uint64, f []byte) {
		if id&idContd != 0 || ch.n > 0 {
			// One descriptor of a multi-buffer frame: the socket's take hands over whole chains, at most
			// maxChain long, in one batch, so every piece stays valid until the last one arrives.
			ch.frags[ch.n] = f
			ch.n++
			ch.len += len(f)
			if id&idContd != 0 && ch.n < len(ch.frags) {
				return
			}
			s.deliverChain(sink, placer, id&idContd != 0)
			ch.n, ch.len = 0, 0
			return
		}
		u, err := frame.Parse(f)
		if err != nil {
			s.skipped[frame.ReasonOf(err)].Add(1)
			return
		}
		s.packets.Add(1)
		s.bytes.Add(uint64(len(u.Payload)))
		sink.Packet(u.Payload, q.now)
	})
	if err != nil && runCtx.Err() != nil && errors.Is(err, runCtx.Err()) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("xdp: run: %w", ErrClosed)
	}
	if err != nil {
		return fmt.Errorf("xdp: %s: %w", s.ifname, err)
	}
	return nil
}

// chain is a frame received as several descriptors: views of its pieces in the UMEM.
type chain struct {
	frags [maxChain][]byte
	n     int
	len   int
}

// deliverChain hands over the frame s.chain holds. Its headers are checked against the pieces' total
// length, so a chain that is shorter than its IPv4 header says is counted (truncated) and never handed
// over in part. With a Placer sink the payload is copied once, straight into the slot Place names;
// otherwise it is joined in a scratch buffer first. cut says the chain went on past maxChain pieces.
func (s *Source) deliverChain(sink transport.Sink, placer transport.Placer, cut bool) {
	ch := &s.chain
	s.chainFrames.Add(1)
	if cut {
		s.skipped[frame.ReasonTruncated].Add(1)
		return
	}
	u, err := frame.Parser{}.ParseSplit(ch.frags[0], ch.len)
	if err != nil {
		s.skipped[frame.ReasonOf(err)].Add(1)
		return
	}
	// The UDP payload's length, from the IPv4 total length ParseSplit checked.
	size := int(binary.BigEndian.Uint16(ch.frags[0][frame.EthernetHeaderLen+2:])) - frame.IPv4HeaderLen - frame.UDPHeaderLen
	s.packets.Add(1)
	s.bytes.Add(uint64(size))
	if placer != nil {
		if hdrLen, k := placer.Place(s.region); k > 0 && hdrLen <= len(u.Payload) && size-hdrLen <= len(s.region[0]) {
			r := s.region[0]
			gatherChain(r[:size-hdrLen], u.Payload[hdrLen:], ch.frags[1:ch.n])
			if placer.Placed(u.Payload[:hdrLen], r, size-hdrLen, s.q.now) {
				s.chainsPlaced.Add(1) // else Placed joined it back and took it as Packet does
			}
			return
		}
	}
	gatherChain(s.scratch[:size], u.Payload, ch.frags[1:ch.n])
	sink.Packet(s.scratch[:size], s.q.now)
}

// gatherChain copies first and then rest into dst until dst is full (the chain's length was checked
// against its headers, so it fills dst; bytes past the datagram, Ethernet padding, are left out).
func gatherChain(dst, first []byte, rest [][]byte) {
	off := copy(dst, first)
	for _, f := range rest {
		off += copy(dst[off:], f)
	}
}

// wake writes the eventfd Wait polls. It runs in context.AfterFunc's goroutine, which can outlive Run, so
// it and teardown hold wakeMu: never a write to a closed (or reused) fd number.
func (s *Source) wake() {
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	if s.wakeFD >= 0 {
		one := [8]byte{1}
		_, _ = unix.Write(s.wakeFD, one[:])
	}
}

// Stats returns the counters; after Close, their final values.
func (s *Source) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.final
	}
	return s.statsLocked()
}

func (s *Source) statsLocked() Stats {
	st := Stats{Interface: s.ifname, Mode: s.mode, ZeroCopy: s.zc, Queues: append([]int(nil), s.cfg.Queues...),
		Frames: s.loop.Frames.Load() + s.loop.Errors.Load(), Packets: s.packets.Load(), Bytes: s.bytes.Load(),
		Polls: s.loop.Polls.Load(), EmptyPolls: s.loop.Empty.Load(), Waits: s.loop.Waits.Load()}
	for i := range st.Skipped {
		st.Skipped[i] = s.skipped[i].Load()
	}
	st.Skipped[frame.ReasonOther] += s.loop.Errors.Load() // descriptors longer than their frame
	if s.q != nil {
		st.FillStarved, st.Wakeups, st.ChainsDropped = s.q.fillStarved.Load(), s.q.kicks.Load(), s.q.chainsDropped.Load()
	}
	st.ChainFrames, st.ChainsPlaced = s.chainFrames.Load(), s.chainsPlaced.Load()
	for i, x := range s.socks {
		if i == 0 {
			st.MultiBuffer, st.NeedWakeup = x.sg, x.wakeup
		}
	}
	if s.objs != nil && s.objs.counters != nil {
		st.Redirected, st.NoSocket, _ = s.objs.readCounters()
	}
	for _, x := range s.socks {
		st.QueueFrames = append(st.QueueFrames, x.frames.Load())
		if k, err := x.statistics(); err == nil {
			st.RxDropped += k.Rx_dropped
			st.RxInvalidDescs += k.Rx_invalid_descs
			st.RxRingFull += k.Rx_ring_full
			st.RxFillRingEmpty += k.Rx_fill_ring_empty_descs
		}
	}
	return st
}

// Close stops Run (it returns ErrClosed), detaches the program and releases the sockets, maps and
// memory. It is safe to call more than once.
func (s *Source) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	cancel, done := s.cancel, s.runDone
	s.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.final = s.statsLocked()
	return s.teardown()
}

// teardown releases everything Open made, in reverse order: the program first, so the interface's
// traffic goes back to the kernel stack at once.
func (s *Source) teardown() error {
	var errs []error
	if s.link != nil {
		if err := s.link.Close(); err != nil {
			errs = append(errs, fmt.Errorf("xdp: detach from %s: %w", s.ifname, err))
		}
		s.link = nil
	}
	if s.mcast != nil {
		errs = append(errs, s.mcast.Close())
		s.mcast = nil
	}
	for _, x := range s.socks {
		x.close()
	}
	s.socks = nil
	if s.objs != nil {
		errs = append(errs, s.objs.Close())
		s.objs = nil
	}
	s.wakeMu.Lock()
	if s.wakeFD >= 0 {
		_ = unix.Close(s.wakeFD)
		s.wakeFD = -1
	}
	s.wakeMu.Unlock()
	if s.ownUMEM != nil {
		errs = append(errs, unix.Munmap(s.ownUMEM))
		s.ownUMEM = nil
	}
	s.umem = nil
	return errors.Join(errs...)
}

// Interface returns the name of the interface the source receives on.
func (s *Source) Interface() string { return s.ifname }

// Counters implements transport.Counted.
func (s *Source) Counters() map[string]uint64 { return s.Stats().Map() }
