// Package frame owns Ethernet II / IPv4 / UDP framing, shared by the transports that see whole frames
// (pcap replay, AF_XDP, ibverbs): parsing a received frame down to its UDP payload, and building the headers
// of a frame to send. It handles exactly what SPEAD traffic needs and skips the rest, with a counted reason:
// VLAN tags and IP options are skipped as spead2's ibverbs reader skips them, fragments because SPEAD
// packets are sized to fit one datagram.
package frame

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

// Header sizes: the frames this package handles have no VLAN tag and no IP options.
const (
	EthernetHeaderLen = 14
	IPv4HeaderLen     = 20
	UDPHeaderLen      = 8
	HeaderLen         = EthernetHeaderLen + IPv4HeaderLen + UDPHeaderLen // 42
	// MaxPayloadLen is the largest UDP payload an IPv4 datagram can hold.
	MaxPayloadLen = 0xFFFF - IPv4HeaderLen - UDPHeaderLen
)

// EtherTypes this package recognises.
const (
	EtherTypeIPv4    = 0x0800
	EtherTypeARP     = 0x0806
	EtherTypeVLAN    = 0x8100 // 802.1Q
	EtherTypeQinQ    = 0x88A8 // 802.1ad
	EtherTypeQinQOld = 0x9100 // pre-standard QinQ
	EtherTypeIPv6    = 0x86DD
)

const (
	protocolUDP  = 17
	flagDF       = 0x4000
	flagMF       = 0x2000
	fragOffsetMk = 0x1FFF
)

// Header is what the Ethernet, IPv4 and UDP headers of a frame say.
type Header struct {
	SrcMAC, DstMAC   [6]byte
	SrcIP, DstIP     netip.Addr // IPv4
	SrcPort, DstPort uint16
	TTL              uint8
	TOS              uint8 // DSCP << 2 | ECN
	ID               uint16
	DontFragment     bool
}

// UDP is a parsed frame: its headers and its UDP payload, which aliases the frame buffer.
type UDP struct {
	Header
	Payload []byte
}

// Reason classifies why a frame was skipped, for per-reason counters.
type Reason uint8

// Skip reasons. ReasonNone means no error; ReasonOther is an error not from this package.
const (
	ReasonNone Reason = iota
	ReasonTruncated
	ReasonNotIPv4
	ReasonVLAN
	ReasonBadIPHeader
	ReasonIPOptions
	ReasonFragmented
	ReasonNotUDP
	ReasonBadIPChecksum
	ReasonBadUDPLength
	ReasonOther
	// NumReasons sizes a counter array indexed by Reason.
	NumReasons
)

var reasonNames = [NumReasons]string{
	ReasonNone:          "none",
	ReasonTruncated:     "truncated",
	ReasonNotIPv4:       "not ipv4",
	ReasonVLAN:          "vlan tagged",
	ReasonBadIPHeader:   "bad ipv4 header",
	ReasonIPOptions:     "ip options",
	ReasonFragmented:    "fragmented",
	ReasonNotUDP:        "not udp",
	ReasonBadIPChecksum: "bad ipv4 checksum",
	ReasonBadUDPLength:  "bad udp length",
	ReasonOther:         "other",
}

func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return "unknown"
}

type reasonError struct {
	reason Reason
	msg    string
}

func (e *reasonError) Error() string { return e.msg }

// Sentinel errors, one per Reason, returned unwrapped so that skipping a frame never allocates.
var (
	ErrTruncated     error = &reasonError{ReasonTruncated, "frame: truncated"}
	ErrNotIPv4       error = &reasonError{ReasonNotIPv4, "frame: not IPv4"}
	ErrVLAN          error = &reasonError{ReasonVLAN, "frame: VLAN tagged"}
	ErrBadIPHeader   error = &reasonError{ReasonBadIPHeader, "frame: bad IPv4 header (version, IHL or total length)"}
	ErrIPOptions     error = &reasonError{ReasonIPOptions, "frame: IPv4 options present"}
	ErrFragmented    error = &reasonError{ReasonFragmented, "frame: IPv4 fragment"}
	ErrNotUDP        error = &reasonError{ReasonNotUDP, "frame: not UDP"}
	ErrBadIPChecksum error = &reasonError{ReasonBadIPChecksum, "frame: bad IPv4 header checksum"}
	ErrBadUDPLength  error = &reasonError{ReasonBadUDPLength, "frame: UDP length disagrees with IPv4 total length"}
)

// ReasonOf maps an error from this package (wrapped or not) to its Reason.
func ReasonOf(err error) Reason {
	if err == nil {
		return ReasonNone
	}
	// The direct assertion keeps the common, unwrapped case free of allocation.
	if re, ok := err.(*reasonError); ok {
		return re.reason
	}
	var re *reasonError
	if errors.As(err, &re) {
		return re.reason
	}
	return ReasonOther
}

// Parser parses frames. The zero value does not verify the IPv4 header checksum: the NIC (or the kernel, for
// pcap and loopback) has already checked it, and a frame with a bad checksum does not reach us.
type Parser struct {
	// VerifyIPChecksum makes Parse reject frames whose IPv4 header checksum is wrong.
	VerifyIPChecksum bool
}

// Parse parses an Ethernet II frame carrying an unfragmented IPv4/UDP datagram, with the default Parser.
func Parse(frame []byte) (UDP, error) { return Parser{}.Parse(frame) }

// Parse parses an Ethernet II frame carrying an unfragmented IPv4/UDP datagram. Bytes after the IPv4
// datagram (Ethernet minimum-size padding) are ignored. It never allocates and never panics.
func (ps Parser) Parse(frame []byte) (UDP, error) { return ps.ParseSplit(frame, len(frame)) }

// ParseSplit parses a frame received in pieces (AF_XDP multi-buffer): first is its first piece, holding
// at least the headers, and frameLen the length of all pieces together. The lengths are checked against
// frameLen; the Payload it returns is only the part of the UDP payload in first (clipped to first).
func (ps Parser) ParseSplit(first []byte, frameLen int) (UDP, error) {
	var u UDP
	frame := first
	if len(frame) < EthernetHeaderLen || frameLen < len(frame) {
		return u, ErrTruncated
	}
	switch binary.BigEndian.Uint16(frame[12:14]) {
	case EtherTypeIPv4:
	case EtherTypeVLAN, EtherTypeQinQ, EtherTypeQinQOld:
		return u, ErrVLAN
	default:
		return u, ErrNotIPv4
	}
	ip := frame[EthernetHeaderLen:]
	if len(ip) < IPv4HeaderLen {
		return u, ErrTruncated
	}
	if ip[0]>>4 != 4 {
		return u, ErrBadIPHeader
	}
	switch ihl := ip[0] & 0x0F; {
	case ihl < 5:
		return u, ErrBadIPHeader
	case ihl > 5:
		return u, ErrIPOptions
	}
	totalLen := int(binary.BigEndian.Uint16(ip[2:4]))
	if totalLen < IPv4HeaderLen {
		return u, ErrBadIPHeader
	}
	if totalLen > frameLen-EthernetHeaderLen {
		return u, ErrTruncated
	}
	flagsFrag := binary.BigEndian.Uint16(ip[6:8])
	if flagsFrag&(flagMF|fragOffsetMk) != 0 {
		return u, ErrFragmented
	}
	if ip[9] != protocolUDP {
		return u, ErrNotUDP
	}
	if ps.VerifyIPChecksum && checksum(ip[:IPv4HeaderLen]) != 0 {
		return u, ErrBadIPChecksum
	}
	udpLen := totalLen - IPv4HeaderLen
	if udpLen < UDPHeaderLen || len(ip) < IPv4HeaderLen+UDPHeaderLen {
		return u, ErrTruncated
	}
	udp := ip[IPv4HeaderLen:min(totalLen, len(ip))]
	// Strict: a UDP length shorter than the IP payload would leave bytes unaccounted for, which is a
	// sign of a mangled frame rather than anything a sender does.
	if int(binary.BigEndian.Uint16(udp[4:6])) != udpLen {
		return u, ErrBadUDPLength
	}
	copy(u.DstMAC[:], frame[0:6])
	copy(u.SrcMAC[:], frame[6:12])
	u.TOS = ip[1]
	u.ID = binary.BigEndian.Uint16(ip[4:6])
	u.DontFragment = flagsFrag&flagDF != 0
	u.TTL = ip[8]
	u.SrcIP = netip.AddrFrom4([4]byte(ip[12:16]))
	u.DstIP = netip.AddrFrom4([4]byte(ip[16:20]))
	u.SrcPort = binary.BigEndian.Uint16(udp[0:2])
	u.DstPort = binary.BigEndian.Uint16(udp[2:4])
	u.Payload = udp[UDPHeaderLen:len(udp):len(udp)]
	return u, nil
}

// checksum is the Internet checksum (RFC 1071) of b, an even number of bytes: 0 when b includes a correct
// checksum field.
func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	for sum > 0xFFFF {
		sum = sum&0xFFFF + sum>>16
	}
	return ^uint16(sum)
}

// MulticastMAC is the Ethernet address an IPv4 multicast group maps to: 01:00:5e followed by the low 23
// bits of the group address (RFC 1112). ok is false if group is not an IPv4 multicast address.
func MulticastMAC(group netip.Addr) (mac [6]byte, ok bool) {
	if !group.Is4() || !group.IsMulticast() {
		return mac, false
	}
	a := group.As4()
	return [6]byte{0x01, 0x00, 0x5e, a[1] & 0x7F, a[2], a[3]}, true
}
