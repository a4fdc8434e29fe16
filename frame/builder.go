package frame

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Errors from Builder.Build; they are programming errors, so they have no Reason.
var (
	ErrBufferTooSmall  = errors.New("frame: buffer smaller than the headers")
	ErrPayloadTooLarge = errors.New("frame: payload too large for one IPv4 datagram")
	ErrNotIPv4Address  = errors.New("frame: address is not IPv4")
)

// Builder writes Ethernet II, IPv4 and UDP headers. The UDP checksum is always 0, which IPv4 allows: SPEAD
// senders (spead2 included) leave it to the link layer's CRC.
type Builder struct {
	Header
	// NoIPChecksum leaves the IPv4 header checksum 0, for NICs that fill it in (checksum offload).
	NoIPChecksum bool
}

// Build writes the HeaderLen bytes of headers for a UDP payload of payloadLen bytes to the start of dst;
// the payload itself belongs at dst[HeaderLen:]. It does not allocate.
func (b *Builder) Build(dst []byte, payloadLen int) error {
	if len(dst) < HeaderLen {
		return fmt.Errorf("frame: build into %d bytes: %w", len(dst), ErrBufferTooSmall)
	}
	if payloadLen < 0 || payloadLen > MaxPayloadLen {
		return fmt.Errorf("frame: build for %d-byte payload: %w", payloadLen, ErrPayloadTooLarge)
	}
	if !b.SrcIP.Is4() || !b.DstIP.Is4() {
		return fmt.Errorf("frame: build from %v to %v: %w", b.SrcIP, b.DstIP, ErrNotIPv4Address)
	}
	be := binary.BigEndian
	copy(dst[0:6], b.DstMAC[:])
	copy(dst[6:12], b.SrcMAC[:])
	be.PutUint16(dst[12:14], EtherTypeIPv4)

	ip := dst[EthernetHeaderLen:HeaderLen]
	ip[0] = 4<<4 | IPv4HeaderLen/4 // version 4, IHL 5 words
	ip[1] = b.TOS
	be.PutUint16(ip[2:4], uint16(IPv4HeaderLen+UDPHeaderLen+payloadLen))
	be.PutUint16(ip[4:6], b.ID)
	var flags uint16
	if b.DontFragment {
		flags = flagDF
	}
	be.PutUint16(ip[6:8], flags)
	ip[8] = b.TTL
	ip[9] = protocolUDP
	ip[10], ip[11] = 0, 0
	src, dstIP := b.SrcIP.As4(), b.DstIP.As4()
	copy(ip[12:16], src[:])
	copy(ip[16:20], dstIP[:])
	if !b.NoIPChecksum {
		be.PutUint16(ip[10:12], checksum(ip[:IPv4HeaderLen]))
	}

	udp := ip[IPv4HeaderLen:]
	be.PutUint16(udp[0:2], b.SrcPort)
	be.PutUint16(udp[2:4], b.DstPort)
	be.PutUint16(udp[4:6], uint16(UDPHeaderLen+payloadLen))
	udp[6], udp[7] = 0, 0
	return nil
}
