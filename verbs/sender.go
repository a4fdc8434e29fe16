package verbs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/ibvbridge/ibvbridge/frame"
)

// Send defaults, as spead2's udp_ibv_config and stream_config.
const (
	DefaultSendBufferSize = 512 * 1024 // spead2 udp_ibv send default buffer_size
	DefaultMaxPacketSize  = 1472       // spead2 default max_packet_size (UDP payload)
	DefaultTTL            = 1          // spead2 default ttl
)

// SendConfig describes one ibverbs sender, with spead2 UdpIbvStream's
// parameters.
type SendConfig struct {
	// Interface is the IPv4 address of the interface to send from: it
	// selects the RDMA device and port, and is the frames' source address.
	Interface netip.Addr
	// Endpoints are the destinations (IPv4). Multicast groups get their
	// derived MAC; unicast destinations must be on the local link and in the
	// kernel's neighbour table (/proc/net/arp), as the sender does no ARP.
	Endpoints []netip.AddrPort
	// TTL of the IP header; 0 means DefaultTTL.
	TTL int
	// MaxPacketSize is the largest UDP payload (a SPEAD packet); frames are
	// 42 bytes longer.
	MaxPacketSize int
	// BufferSize is the registered send buffer in bytes; it holds
	// BufferSize/(MaxPacketSize+42) frames (at least one).
	BufferSize int
	// CompVector >= 0 sleeps on that completion vector when waiting for free
	// buffers; < 0 busy-polls.
	CompVector int
	// MaxPoll is how many empty polls are made before sleeping.
	MaxPoll int
	// Rate limits the sender, in bytes per second of UDP payload (spead2's
	// rate); 0 is unlimited. The NIC paces (QP rate limit) when it supports
	// packet pacing on raw packet QPs at that rate, software otherwise.
	Rate float64
	// NoHWRate forces software pacing (spead2's allow_hw_rate = false).
	NoHWRate bool
}

// DefaultSendConfig returns spead2's defaults with no interface or endpoints.
func DefaultSendConfig() SendConfig {
	return SendConfig{
		TTL:           DefaultTTL,
		MaxPacketSize: DefaultMaxPacketSize,
		BufferSize:    DefaultSendBufferSize,
		CompVector:    DefaultCompVector,
		MaxPoll:       DefaultMaxPoll,
	}
}

// FrameSize is the largest frame: MaxPacketSize plus the Ethernet, IPv4 and
// UDP headers.
func (c *SendConfig) FrameSize() int { return c.MaxPacketSize + frame.HeaderLen }

// Slots is the number of frame buffers: BufferSize/FrameSize, at least 1.
func (c *SendConfig) Slots() int {
	if c.MaxPacketSize <= 0 {
		return 0
	}
	return max(1, c.BufferSize/c.FrameSize())
}

// Validate checks the configuration without touching any device.
func (c *SendConfig) Validate() error {
	if !c.Interface.IsValid() {
		return errors.New("ibverbs: interface address is not set")
	}
	if !c.Interface.Is4() {
		return fmt.Errorf("ibverbs: interface address %s is not an IPv4 address", c.Interface)
	}
	if len(c.Endpoints) == 0 {
		return errors.New("ibverbs: no endpoints")
	}
	for _, ep := range c.Endpoints {
		a := ep.Addr()
		switch {
		case !a.Is4():
			return fmt.Errorf("ibverbs: endpoint %s is not an IPv4 address", ep)
		case a.IsUnspecified():
			return fmt.Errorf("ibverbs: endpoint %s has no destination address", ep)
		case ep.Port() == 0:
			return fmt.Errorf("ibverbs: endpoint %s has no port", ep)
		}
	}
	if c.TTL < 0 || c.TTL > 255 {
		return fmt.Errorf("ibverbs: ttl %d: want 0..255", c.TTL)
	}
	if c.MaxPacketSize < 64 || c.MaxPacketSize > frame.MaxPayloadLen {
		return fmt.Errorf("ibverbs: max packet size %d: want 64..%d", c.MaxPacketSize, frame.MaxPayloadLen)
	}
	if c.BufferSize <= 0 {
		return fmt.Errorf("ibverbs: buffer size %d must be positive", c.BufferSize)
	}
	if c.MaxPoll <= 0 {
		return fmt.Errorf("ibverbs: max_poll %d must be positive", c.MaxPoll)
	}
	if c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) {
		return fmt.Errorf("ibverbs: rate %g bytes/s: want a finite rate >= 0", c.Rate)
	}
	return nil
}

// ApplyEnv fills Interface and CompVector from the environment unless set by
// a flag, exactly as RecvConfig.ApplyEnv.
func (c *SendConfig) ApplyEnv(lookup func(string) (string, bool), set FlagsSet) error {
	return applyEnv(lookup, set, &c.Interface, &c.CompVector)
}

// DefaultARPTable is where unicast destination MACs are looked up.
const DefaultARPTable = "/proc/net/arp"

// ErrNoNeighbour means a unicast destination has no complete entry in the
// neighbour table of the sending interface.
var ErrNoNeighbour = errors.New("no neighbour entry")

// DestinationMAC is the Ethernet destination for dst sent from netdev:
// the derived group MAC for multicast, ff:ff:ff:ff:ff:ff for the limited
// broadcast, the neighbour table's entry (arpTable, normally /proc/net/arp)
// for unicast. The ibverbs sender bypasses the kernel, so nothing resolves
// an address for it: a unicast destination must be on the local link and
// already resolved (ping it once).
func DestinationMAC(dst netip.Addr, netdev, arpTable string) ([6]byte, error) {
	if mac, ok := frame.MulticastMAC(dst); ok {
		return mac, nil
	}
	if dst == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, nil
	}
	f, err := os.Open(arpTable)
	if err != nil {
		return [6]byte{}, fmt.Errorf("ibverbs: unicast destination %s: %w", dst, err)
	}
	defer f.Close()
	mac, err := lookupARP(f, dst, netdev)
	if err != nil {
		return mac, fmt.Errorf("ibverbs: unicast destination %s: %w in %s for %s "+
			"(the ibverbs sender does not resolve addresses: it must be on the local link and resolved, e.g. ping it first; or send to a multicast group)",
			dst, err, arpTable, netdev)
	}
	return mac, nil
}

// lookupARP reads /proc/net/arp's format:
//
//	IP address       HW type     Flags       HW address            Mask     Device
//	192.0.2.1        0x1         0x2         52:54:00:12:34:56     *        eth0
//
// and accepts only complete entries (flag ATF_COM, 0x2) on netdev.
func lookupARP(r io.Reader, dst netip.Addr, netdev string) ([6]byte, error) {
	var mac [6]byte
	sc := bufio.NewScanner(r)
	first := true
	for sc.Scan() {
		if first {
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 6 {
			continue
		}
		a, err := netip.ParseAddr(f[0])
		if err != nil || a != dst || f[5] != netdev {
			continue
		}
		var flags uint32
		if _, err := fmt.Sscanf(f[2], "0x%x", &flags); err != nil || flags&0x2 == 0 {
			return mac, fmt.Errorf("%w (entry incomplete)", ErrNoNeighbour)
		}
		hw, err := net.ParseMAC(f[3])
		if err != nil || len(hw) != 6 {
			return mac, fmt.Errorf("%w (bad hardware address %q)", ErrNoNeighbour, f[3])
		}
		copy(mac[:], hw)
		return mac, nil
	}
	if err := sc.Err(); err != nil {
		return mac, err
	}
	return mac, ErrNoNeighbour
}

// HWRate is the device's packet pacing capability (struct
// ibv_packet_pacing_caps).
type HWRate struct {
	MinKbps, MaxKbps uint32
	RawPacket        bool // supported for raw packet QPs
}

// hwRateKbps converts a payload rate in bytes/s into the QP rate limit the
// NIC paces frames at, in kbit/s: the frames carry 42 header bytes per
// packet on top of the payload, and packets are assumed full (as spead2
// does). ok is false, with the reason, when the hardware cannot do it.
func hwRateKbps(rate float64, maxPacketSize int, caps HWRate) (kbps uint32, ok bool, why string) {
	if rate <= 0 {
		return 0, false, "no rate"
	}
	if !caps.RawPacket || caps.MaxKbps == 0 {
		return 0, false, "the device has no packet pacing for raw packet QPs"
	}
	frameSize := float64(maxPacketSize + frame.HeaderLen)
	k := rate * 8e-3 * frameSize / float64(maxPacketSize)
	if k < float64(caps.MinKbps) || k > float64(caps.MaxKbps) {
		return 0, false, fmt.Sprintf("%.0f kbit/s is outside the device's pacing range %d..%d kbit/s", k, caps.MinKbps, caps.MaxKbps)
	}
	return uint32(math.Round(k)), true, ""
}

// SenderInfo is what OpenSender found and chose.
type SenderInfo struct {
	Netdev, IBDev string
	Port          int
	SrcMAC        [6]byte
	SrcPort       uint16
	Slots         int
	Batch         int
	IPChecksum    bool   // the NIC fills in IPv4 header checksums
	HWRate        bool   // the NIC paces (QP rate limit)
	HWRateKbps    uint32 // the limit set
	Pacing        string // "none", "hardware" or "software", with why software
}

// Sender transmits UDP payloads (SPEAD packets) as raw Ethernet frames
// through a raw packet QP: the caller writes the payload straight into a
// registered frame buffer (Buffer), the Sender adds the headers
// (frame.Builder) and posts frames in batches (Commit). transport/ibv's
// HeapSender packetizes heaps with it. One goroutine uses a Sender.
type Sender struct {
	loop     *sendLoop
	builders []frame.Builder
	maxPkt   int
	slot     uint32
	buf      []byte
	Info     SenderInfo
	closer   func() error
}

// NewSender assembles a Sender over any send queue: OpenSender passes the
// device's, tests a fake (verbstest). src gives the source addresses;
// dstMACs has one destination MAC per cfg.Endpoints entry; ipCsum leaves
// the IPv4 header checksums to the NIC.
func NewSender(q SendQueue, cfg SendConfig, loopCfg SendLoopConfig, src frame.Header, dstMACs [][6]byte, ipCsum bool) (*Sender, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(dstMACs) != len(cfg.Endpoints) {
		return nil, fmt.Errorf("ibverbs: %d destination MACs for %d endpoints", len(dstMACs), len(cfg.Endpoints))
	}
	loopCfg.Slots = cfg.Slots()
	loopCfg.FrameSize = cfg.FrameSize()
	loopCfg.MaxPoll = cfg.MaxPoll
	loopCfg.BusyPoll = cfg.CompVector < 0
	if ipCsum {
		loopCfg.Flags |= SendIPChecksum
	}
	l, err := newSendLoop(q, loopCfg)
	if err != nil {
		return nil, err
	}
	ttl := cfg.TTL
	if ttl == 0 {
		ttl = DefaultTTL
	}
	s := &Sender{loop: l, maxPkt: cfg.MaxPacketSize}
	for i, ep := range cfg.Endpoints {
		b := frame.Builder{Header: src, NoIPChecksum: ipCsum}
		b.DstMAC = dstMACs[i]
		b.DstIP = ep.Addr()
		b.DstPort = ep.Port()
		b.TTL = uint8(ttl)
		b.DontFragment = true
		s.builders = append(s.builders, b)
	}
	s.Info.Slots, s.Info.Batch, s.Info.IPChecksum = loopCfg.Slots, l.batch, ipCsum
	return s, nil
}

// Buffer returns the payload space of the next frame (MaxPacketSize
// bytes), waiting for the NIC to release a buffer if all are in use. Write
// the UDP payload there, then call Commit.
func (s *Sender) Buffer(ctx context.Context) ([]byte, error) {
	slot, buf, err := s.loop.next(ctx)
	if err != nil {
		return nil, err
	}
	s.slot, s.buf = slot, buf
	return buf[frame.HeaderLen : frame.HeaderLen+s.maxPkt], nil
}

// Commit sends the n payload bytes written into Buffer to endpoint 0.
func (s *Sender) Commit(ctx context.Context, n int) error { return s.CommitTo(ctx, 0, n) }

// CommitTo sends the n payload bytes written into Buffer to endpoint ep
// (an index into SendConfig.Endpoints).
func (s *Sender) CommitTo(ctx context.Context, ep, n int) error {
	if ep < 0 || ep >= len(s.builders) {
		return fmt.Errorf("ibverbs: endpoint index %d out of range (%d endpoints)", ep, len(s.builders))
	}
	if n < 0 || n > s.maxPkt {
		return fmt.Errorf("ibverbs: packet of %d bytes exceeds the max packet size %d", n, s.maxPkt)
	}
	if err := s.builders[ep].Build(s.buf, n); err != nil {
		return err
	}
	return s.loop.commit(ctx, frame.HeaderLen+n, n)
}

// Discard gives back the buffer Buffer returned, unsent: for when the
// payload could not be written.
func (s *Sender) Discard() { s.loop.acquired = false }

// MaxPacketSize is the largest payload a frame carries (SendConfig's).
func (s *Sender) MaxPacketSize() int { return s.maxPkt }

// Flush posts what is queued and waits until the NIC has sent every frame.
func (s *Sender) Flush(ctx context.Context) error { return s.loop.flush(ctx) }

// Stats returns the send counters (from the sending goroutine).
func (s *Sender) Stats() SendStats { return s.loop.stats }

// Close releases the device resources. Flush first to send what is queued.
func (s *Sender) Close() error {
	if s.closer == nil {
		return nil
	}
	c := s.closer
	s.closer = nil
	return c()
}
