//go:build linux

package udp

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"unsafe"

	"github.com/ibvbridge/ibvbridge/internal/netif"
	"golang.org/x/sys/unix"
)

// SenderConfig describes a sending socket.
type SenderConfig struct {
	Dest       netip.AddrPort
	Interface  netip.Addr // multicast: the outgoing interface's address; invalid: the routing table decides
	TTL        int        // multicast TTL; 0: the kernel default (1)
	BufferSize int        // SO_SNDBUF; 0: 8 MiB
}

// Sender sends datagrams to one destination with sendmmsg, from a connected socket so that the per-message
// headers need no address.
type Sender struct {
	fd   int
	hdrs []mmsghdr
	iovs []unix.Iovec
	// SendRuns' arrays: a header and a control buffer per run, an iovec per datagram.
	rHdrs []mmsghdr
	rIovs []unix.Iovec
	rCtl  []byte
}

// NewSender opens a socket connected to cfg.Dest.
func NewSender(cfg SenderConfig) (*Sender, error) {
	if !cfg.Dest.Addr().Is4() {
		return nil, fmt.Errorf("udp: destination %s is not IPv4", cfg.Dest)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return nil, fmt.Errorf("udp: socket: %w", err)
	}
	s := &Sender{fd: fd}
	fail := func(what string, err error) (*Sender, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("udp: %s: %w", what, err)
	}
	buf := cfg.BufferSize
	if buf <= 0 {
		buf = 8 << 20
	}
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, buf) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, buf)
	}
	if cfg.Dest.Addr().IsMulticast() {
		if cfg.TTL > 0 {
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MULTICAST_TTL, cfg.TTL); err != nil {
				return fail("IP_MULTICAST_TTL", err)
			}
		}
		if cfg.Interface.IsValid() {
			ifi, err := netif.ByAddr(cfg.Interface)
			if err != nil {
				unix.Close(fd)
				return nil, fmt.Errorf("udp: %w", err)
			}
			mreq := &unix.IPMreqn{Address: cfg.Interface.As4(), Ifindex: int32(ifi.Index)}
			if err := unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_MULTICAST_IF, mreq); err != nil {
				return fail("IP_MULTICAST_IF", err)
			}
		}
	} else if cfg.TTL > 0 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_TTL, cfg.TTL); err != nil {
			return fail("IP_TTL", err)
		}
	}
	if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: cfg.Dest.Addr().As4(), Port: int(cfg.Dest.Port())}); err != nil {
		return fail("connect to "+cfg.Dest.String(), err)
	}
	return s, nil
}

// EnableGSO checks that the kernel segments UDP messages (UDP generic segmentation offload, Linux ≥
// 4.18), so SendRuns can be used: it sets the socket's default segment size, which SendRuns overrides
// per message. It fails with ENOPROTOOPT where the kernel lacks it.
func (s *Sender) EnableGSO(segSize int) error {
	if err := unix.SetsockoptInt(s.fd, unix.SOL_UDP, unix.UDP_SEGMENT, segSize); err != nil {
		return os.NewSyscallError("setsockopt UDP_SEGMENT", err)
	}
	return nil
}

// segCmsgSpace is one message's control buffer: a cmsghdr and the u16 segment size, aligned.
const segCmsgSpace = 24

// SendRuns sends runs of datagrams, each run as one message the kernel cuts back into its datagrams
// (UDP_SEGMENT set on the message to the run's first datagram's length; every datagram of a run but the
// last must be that long, the last no longer). A run of one datagram is sent as it is. EnableGSO must have
// succeeded. The arrays grow to the largest batch seen and are then reused: no allocation per packet.
func (s *Sender) SendRuns(runs [][][]byte) error {
	npkts := 0
	for _, r := range runs {
		npkts += len(r)
	}
	if len(runs) > len(s.rHdrs) {
		s.rHdrs = make([]mmsghdr, len(runs))
		s.rCtl = make([]byte, len(runs)*segCmsgSpace)
	}
	if npkts > len(s.rIovs) {
		s.rIovs = make([]unix.Iovec, npkts)
	}
	k := 0
	for i, r := range runs {
		h := &s.rHdrs[i]
		h.hdr.Iov = &s.rIovs[k]
		h.hdr.SetIovlen(len(r))
		for _, p := range r {
			s.rIovs[k].Base = unsafe.SliceData(p)
			s.rIovs[k].SetLen(len(p))
			k++
		}
		h.hdr.Control, h.hdr.Controllen = nil, 0
		if len(r) > 1 {
			ctl := s.rCtl[i*segCmsgSpace : (i+1)*segCmsgSpace]
			cm := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[0]))
			cm.Level, cm.Type = unix.SOL_UDP, unix.UDP_SEGMENT
			cm.SetLen(unix.CmsgLen(2))
			*(*uint16)(unsafe.Pointer(&ctl[unix.CmsgLen(0)])) = uint16(len(r[0]))
			h.hdr.Control = &ctl[0]
			h.hdr.SetControllen(unix.CmsgSpace(2))
		}
	}
	return s.sendmmsg(s.rHdrs[:len(runs)])
}

// MaxGSOSegments is the most datagrams one GSO message may carry (the kernel's UDP_MAX_SEGMENTS is 64 on
// older kernels), and MaxGSOBytes the most payload bytes (an IPv4 datagram's limit).
const (
	MaxGSOSegments = 64
	MaxGSOBytes    = 65507
)

// Send sends every packet, in order, blocking while the socket buffer is full. The header arrays grow to
// the largest batch seen and are then reused: no allocation per packet.
func (s *Sender) Send(pkts [][]byte) error {
	if len(pkts) > len(s.hdrs) {
		s.hdrs = make([]mmsghdr, len(pkts))
		s.iovs = make([]unix.Iovec, len(pkts))
		for i := range s.hdrs {
			s.hdrs[i].hdr.Iov = &s.iovs[i]
			s.hdrs[i].hdr.SetIovlen(1)
		}
	}
	for i, p := range pkts {
		s.iovs[i].Base = unsafe.SliceData(p)
		s.iovs[i].SetLen(len(p))
	}
	return s.sendmmsg(s.hdrs[:len(pkts)])
}

// sendmmsg sends every message, in order, blocking while the socket buffer is full.
func (s *Sender) sendmmsg(hdrs []mmsghdr) error {
	for done := 0; done < len(hdrs); {
		n, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(s.fd), uintptr(unsafe.Pointer(&hdrs[done])),
			uintptr(len(hdrs)-done), 0, 0, 0)
		if errno != 0 {
			// ECONNREFUSED: an ICMP port-unreachable from an earlier datagram (nobody listening yet); a
			// stream sender carries on, as spead2 does. ENOBUFS: the qdisc is full for a moment.
			if errno == unix.EINTR || errno == unix.ECONNREFUSED || errno == unix.ENOBUFS || errno == unix.EAGAIN {
				continue
			}
			return fmt.Errorf("udp: sendmmsg: %w", error(errno))
		}
		done += int(n)
	}
	return nil
}

// Close closes the socket.
func (s *Sender) Close() error {
	if s.fd < 0 {
		return errors.New("udp: sender already closed")
	}
	err := unix.Close(s.fd)
	s.fd = -1
	return err
}
