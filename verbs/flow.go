package verbs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/ibvbridge/ibvbridge/frame"
)

// FlowType is enum ibv_flow_attr_type.
type FlowType uint32

const (
	FlowNormal     FlowType = 0 // IBV_FLOW_ATTR_NORMAL: match the specs
	FlowAllDefault FlowType = 1 // IBV_FLOW_ATTR_ALL_DEFAULT: traffic no other rule took
	FlowMCDefault  FlowType = 2 // IBV_FLOW_ATTR_MC_DEFAULT: multicast no other rule took
	FlowSniffer    FlowType = 3 // IBV_FLOW_ATTR_SNIFFER: a copy of all port traffic
)

func (t FlowType) String() string {
	switch t {
	case FlowNormal:
		return "normal"
	case FlowAllDefault:
		return "all-default"
	case FlowMCDefault:
		return "mc-default"
	case FlowSniffer:
		return "sniffer"
	}
	return fmt.Sprintf("FlowType(%d)", uint32(t))
}

// Spec type codes (enum ibv_flow_spec_type).
const (
	specEth     = 0x20
	specIPv4    = 0x30
	specIPv4Ext = 0x32
	specTCP     = 0x40
	specUDP     = 0x41
)

// Byte layout of the verbs.h structs, x86-64/arm64 ABI. Multi-byte header
// fields (type, size, priority, flags) are host order; match values and masks
// (MACs, ether_type, vlan_tag, addresses, ports) are network order, as the
// kernel drivers read them. TestFlowLayoutMatchesC proves every constant
// against offsetof/sizeof compiled from the installed verbs.h.
const (
	attrSize         = 20 // sizeof(struct ibv_flow_attr)
	attrOffType      = 4
	attrOffSize      = 8
	attrOffPriority  = 10
	attrOffNumSpecs  = 12
	attrOffPort      = 13
	attrOffFlags     = 16
	specOffSize      = 4 // common to every spec: enum type at 0, u16 size at 4
	ethSize          = 40
	ethOffVal        = 6  // struct ibv_flow_eth_filter is 16 bytes, 2-aligned
	ethFilterSize    = 16 // dst_mac[6] src_mac[6] ether_type vlan_tag
	ethOffMask       = ethOffVal + ethFilterSize
	ipv4Size         = 24
	ipv4OffVal       = 8
	ipv4FilterSize   = 8 // src_ip dst_ip
	ipv4OffMask      = ipv4OffVal + ipv4FilterSize
	ipv4ExtSize      = 32
	ipv4ExtOffVal    = 8
	ipv4ExtFilterSz  = 12 // src_ip dst_ip proto tos ttl flags
	ipv4ExtOffMask   = ipv4ExtOffVal + ipv4ExtFilterSz
	tcpUDPSize       = 16
	tcpUDPOffVal     = 6
	tcpUDPFilterSize = 4 // dst_port src_port
	tcpUDPOffMask    = tcpUDPOffVal + tcpUDPFilterSize
)

type ethMatch struct {
	dst, src, dstMask, srcMask [6]byte
	etherType, etherTypeMask   uint16
	vlan, vlanMask             uint16
}

type ipMatch struct {
	src, dst, srcMask, dstMask [4]byte
	proto, tos, ttl, flags     uint8
	protoM, tosM, ttlM, flagsM uint8
}

type l4Match struct {
	spec                       uint32 // specTCP or specUDP
	dst, src, dstMask, srcMask uint16
}

// FlowRule is a flow steering rule: which received packets a QP gets. Build
// it with the selector methods (each ANDs one more condition) and hand it to
// Receiver.AddFlow, or serialise it with MarshalBinary. A zero mask field
// means "don't care". Selector misuse is reported by MarshalBinary, so chains
// need no error checks.
type FlowRule struct {
	Type     FlowType
	Priority uint16
	Port     uint8 // physical port, 1-based
	Flags    uint32

	eth    ethMatch
	ip     ipMatch
	l4     l4Match
	hasEth bool
	hasIP  bool
	ipExt  bool // proto/tos/ttl/flags used: needs ibv_flow_spec_ipv4_ext
	hasL4  bool
	err    error
}

// NewFlowRule starts a normal rule on port (1-based).
func NewFlowRule(port int) *FlowRule {
	r := &FlowRule{Type: FlowNormal, Port: uint8(port)}
	if port < 1 || port > 255 {
		r.setErr(fmt.Errorf("port %d out of range 1..255", port))
	}
	return r
}

func (r *FlowRule) setErr(err error) {
	if r.err == nil {
		r.err = err
	}
}

var allOnesMAC = [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// WithType sets the flow type (normal, all-default, mc-default, sniffer).
func (r *FlowRule) WithType(t FlowType) *FlowRule { r.Type = t; return r }

// WithPriority sets the rule priority (lower wins).
func (r *FlowRule) WithPriority(p uint16) *FlowRule { r.Priority = p; return r }

// DstMAC matches the destination MAC address exactly.
func (r *FlowRule) DstMAC(mac net.HardwareAddr) *FlowRule {
	if len(mac) != 6 {
		r.setErr(fmt.Errorf("dmac %v is not a 6-byte MAC address", mac))
		return r
	}
	r.hasEth = true
	copy(r.eth.dst[:], mac)
	r.eth.dstMask = allOnesMAC
	return r
}

// SrcMAC matches the source MAC address exactly.
func (r *FlowRule) SrcMAC(mac net.HardwareAddr) *FlowRule {
	if len(mac) != 6 {
		r.setErr(fmt.Errorf("smac %v is not a 6-byte MAC address", mac))
		return r
	}
	r.hasEth = true
	copy(r.eth.src[:], mac)
	r.eth.srcMask = allOnesMAC
	return r
}

// EtherType matches the Ethernet type (0x0800 for IPv4).
func (r *FlowRule) EtherType(t uint16) *FlowRule {
	r.hasEth = true
	r.eth.etherType, r.eth.etherTypeMask = t, 0xffff
	return r
}

// VLAN matches the 12-bit VLAN ID of an 802.1Q tag (priority bits ignored).
func (r *FlowRule) VLAN(id uint16) *FlowRule {
	if id > 0x0fff {
		r.setErr(fmt.Errorf("vlan %d out of range 0..4095", id))
		return r
	}
	r.hasEth = true
	r.eth.vlan, r.eth.vlanMask = id, 0x0fff
	return r
}

func ip4(a netip.Addr, what string, r *FlowRule) ([4]byte, bool) {
	if !a.Is4() {
		r.setErr(fmt.Errorf("%s %s is not an IPv4 address", what, a))
		return [4]byte{}, false
	}
	return a.As4(), true
}

func prefixMask(bits int) [4]byte {
	var m [4]byte
	binary.BigEndian.PutUint32(m[:], ^uint32(0)<<(32-bits))
	if bits == 0 {
		m = [4]byte{}
	}
	return m
}

// SrcIP matches the IPv4 source address exactly.
func (r *FlowRule) SrcIP(a netip.Addr) *FlowRule { return r.SrcPrefix(netip.PrefixFrom(a, 32)) }

// DstIP matches the IPv4 destination address exactly.
func (r *FlowRule) DstIP(a netip.Addr) *FlowRule { return r.DstPrefix(netip.PrefixFrom(a, 32)) }

// SrcPrefix matches the IPv4 source address against a prefix.
func (r *FlowRule) SrcPrefix(p netip.Prefix) *FlowRule {
	if b, ok := ip4(p.Addr(), "sip", r); ok && p.IsValid() {
		r.hasIP = true
		r.ip.srcMask = prefixMask(p.Bits())
		for i := range b {
			r.ip.src[i] = b[i] & r.ip.srcMask[i]
		}
	}
	return r
}

// DstPrefix matches the IPv4 destination address against a prefix.
func (r *FlowRule) DstPrefix(p netip.Prefix) *FlowRule {
	if b, ok := ip4(p.Addr(), "dip", r); ok && p.IsValid() {
		r.hasIP = true
		r.ip.dstMask = prefixMask(p.Bits())
		for i := range b {
			r.ip.dst[i] = b[i] & r.ip.dstMask[i]
		}
	}
	return r
}

// Proto matches the IPv4 protocol number (uses ibv_flow_spec_ipv4_ext).
func (r *FlowRule) Proto(p uint8) *FlowRule {
	r.hasIP, r.ipExt = true, true
	r.ip.proto, r.ip.protoM = p, 0xff
	return r
}

// TOS matches the IPv4 type-of-service byte (uses ibv_flow_spec_ipv4_ext).
func (r *FlowRule) TOS(tos uint8) *FlowRule {
	r.hasIP, r.ipExt = true, true
	r.ip.tos, r.ip.tosM = tos, 0xff
	return r
}

// TTL matches the IPv4 TTL (uses ibv_flow_spec_ipv4_ext).
func (r *FlowRule) TTL(ttl uint8) *FlowRule {
	r.hasIP, r.ipExt = true, true
	r.ip.ttl, r.ip.ttlM = ttl, 0xff
	return r
}

// IPFlags matches the 3 IPv4 flag bits (DF=2, MF=1) (uses ibv_flow_spec_ipv4_ext).
func (r *FlowRule) IPFlags(flags uint8) *FlowRule {
	if flags > 7 {
		r.setErr(fmt.Errorf("ip flags %#x out of range 0..7", flags))
		return r
	}
	r.hasIP, r.ipExt = true, true
	r.ip.flags, r.ip.flagsM = flags, 0x7
	return r
}

// UDP makes the port selectors match UDP.
func (r *FlowRule) UDP() *FlowRule { return r.l4Proto(specUDP) }

// TCP makes the port selectors match TCP.
func (r *FlowRule) TCP() *FlowRule { return r.l4Proto(specTCP) }

func (r *FlowRule) l4Proto(spec uint32) *FlowRule {
	if r.l4.spec != 0 && r.l4.spec != spec {
		r.setErr(errors.New("rule selects both TCP and UDP"))
		return r
	}
	r.l4.spec, r.hasL4 = spec, true
	return r
}

// DstPort matches the TCP/UDP destination port; call UDP() or TCP() too.
func (r *FlowRule) DstPort(p uint16) *FlowRule {
	r.hasL4 = true
	r.l4.dst, r.l4.dstMask = p, 0xffff
	return r
}

// SrcPort matches the TCP/UDP source port; call UDP() or TCP() too.
func (r *FlowRule) SrcPort(p uint16) *FlowRule {
	r.hasL4 = true
	r.l4.src, r.l4.srcMask = p, 0xffff
	return r
}

// Err reports the first selector misuse, if any.
func (r *FlowRule) Err() error {
	if r.err != nil {
		return fmt.Errorf("flow rule: %w", r.err)
	}
	if r.hasL4 && r.l4.spec == 0 {
		return errors.New("flow rule: dport/sport need UDP() or TCP()")
	}
	return nil
}

// NumSpecs is how many ibv_flow_spec_* follow the attr. The Ethernet spec is
// always emitted when any spec is, because ConnectX-3 (mlx4) rejects L3/L4
// rules without an L2 spec in front (spead2 found this the hard way).
func (r *FlowRule) NumSpecs() int {
	n := 0
	if r.hasEth || r.hasIP || r.hasL4 {
		n++
	}
	if r.hasIP {
		n++
	}
	if r.hasL4 {
		n++
	}
	return n
}

// Size is the length of the serialised rule (ibv_flow_attr.size).
func (r *FlowRule) Size() int {
	n := attrSize
	if r.NumSpecs() > 0 {
		n += ethSize
	}
	if r.hasIP {
		if r.ipExt {
			n += ipv4ExtSize
		} else {
			n += ipv4Size
		}
	}
	if r.hasL4 {
		n += tcpUDPSize
	}
	return n
}

// MarshalBinary returns struct ibv_flow_attr followed by its specs, exactly
// as ibv_create_flow reads them.
func (r *FlowRule) MarshalBinary() ([]byte, error) {
	if err := r.Err(); err != nil {
		return nil, err
	}
	return r.AppendBinary(make([]byte, 0, r.Size()))
}

// AppendBinary appends the serialised rule to b.
func (r *FlowRule) AppendBinary(b []byte) ([]byte, error) {
	if err := r.Err(); err != nil {
		return nil, err
	}
	ne := binary.NativeEndian
	be := binary.BigEndian
	start := len(b)
	b = append(b, make([]byte, r.Size())...)
	out := b[start:]

	ne.PutUint32(out[0:], 0) // comp_mask
	ne.PutUint32(out[attrOffType:], uint32(r.Type))
	ne.PutUint16(out[attrOffSize:], uint16(len(out)))
	ne.PutUint16(out[attrOffPriority:], r.Priority)
	out[attrOffNumSpecs] = uint8(r.NumSpecs())
	out[attrOffPort] = r.Port
	ne.PutUint32(out[attrOffFlags:], r.Flags)
	s := out[attrSize:]

	if r.NumSpecs() > 0 {
		ne.PutUint32(s[0:], specEth)
		ne.PutUint16(s[specOffSize:], ethSize)
		e := &r.eth
		putEthFilter(s[ethOffVal:ethOffVal+ethFilterSize], e.dst, e.src, e.etherType, e.vlan)
		putEthFilter(s[ethOffMask:ethOffMask+ethFilterSize], e.dstMask, e.srcMask, e.etherTypeMask, e.vlanMask)
		s = s[ethSize:]
	}
	if r.hasIP {
		if r.ipExt {
			ne.PutUint32(s[0:], specIPv4Ext)
			ne.PutUint16(s[specOffSize:], ipv4ExtSize)
			v, m := s[ipv4ExtOffVal:], s[ipv4ExtOffMask:]
			copy(v[0:4], r.ip.src[:])
			copy(v[4:8], r.ip.dst[:])
			v[8], v[9], v[10], v[11] = r.ip.proto, r.ip.tos, r.ip.ttl, r.ip.flags
			copy(m[0:4], r.ip.srcMask[:])
			copy(m[4:8], r.ip.dstMask[:])
			m[8], m[9], m[10], m[11] = r.ip.protoM, r.ip.tosM, r.ip.ttlM, r.ip.flagsM
			s = s[ipv4ExtSize:]
		} else {
			ne.PutUint32(s[0:], specIPv4)
			ne.PutUint16(s[specOffSize:], ipv4Size)
			v, m := s[ipv4OffVal:], s[ipv4OffMask:]
			copy(v[0:4], r.ip.src[:])
			copy(v[4:8], r.ip.dst[:])
			copy(m[0:4], r.ip.srcMask[:])
			copy(m[4:8], r.ip.dstMask[:])
			s = s[ipv4Size:]
		}
	}
	if r.hasL4 {
		ne.PutUint32(s[0:], r.l4.spec)
		ne.PutUint16(s[specOffSize:], tcpUDPSize)
		be.PutUint16(s[tcpUDPOffVal:], r.l4.dst)
		be.PutUint16(s[tcpUDPOffVal+2:], r.l4.src)
		be.PutUint16(s[tcpUDPOffMask:], r.l4.dstMask)
		be.PutUint16(s[tcpUDPOffMask+2:], r.l4.srcMask)
	}
	return b, nil
}

// putEthFilter writes struct ibv_flow_eth_filter: dst_mac, src_mac,
// ether_type, vlan_tag, all in network order.
func putEthFilter(d []byte, dst, src [6]byte, etherType, vlan uint16) {
	copy(d[0:6], dst[:])
	copy(d[6:12], src[:])
	binary.BigEndian.PutUint16(d[12:], etherType)
	binary.BigEndian.PutUint16(d[14:], vlan)
}

// FlowRulesForEndpoints builds spead2's rule per endpoint: destination MAC of
// the group, ether type IPv4, destination IP, UDP destination port.
func FlowRulesForEndpoints(endpoints []netip.AddrPort, port int) ([]*FlowRule, error) {
	rules := make([]*FlowRule, 0, len(endpoints))
	for _, ep := range endpoints {
		if err := ValidateEndpoint(ep); err != nil {
			return nil, err
		}
		mac, _ := frame.MulticastMAC(ep.Addr()) // ValidateEndpoint: a multicast group
		r := NewFlowRule(port).DstMAC(mac[:]).EtherType(0x0800).DstIP(ep.Addr()).UDP().DstPort(ep.Port())
		if err := r.Err(); err != nil {
			return nil, fmt.Errorf("endpoint %s: %w", ep, err)
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// String summarises the rule for logs.
func (r *FlowRule) String() string {
	s := fmt.Sprintf("%s port=%d prio=%d", r.Type, r.Port, r.Priority)
	if r.eth.dstMask != ([6]byte{}) {
		s += " dmac=" + net.HardwareAddr(r.eth.dst[:]).String()
	}
	if r.eth.srcMask != ([6]byte{}) {
		s += " smac=" + net.HardwareAddr(r.eth.src[:]).String()
	}
	if r.eth.etherTypeMask != 0 {
		s += fmt.Sprintf(" ethertype=%#04x", r.eth.etherType)
	}
	if r.eth.vlanMask != 0 {
		s += fmt.Sprintf(" vlan=%d", r.eth.vlan)
	}
	if r.ip.srcMask != ([4]byte{}) {
		s += " sip=" + netip.AddrFrom4(r.ip.src).String()
	}
	if r.ip.dstMask != ([4]byte{}) {
		s += " dip=" + netip.AddrFrom4(r.ip.dst).String()
	}
	if r.ip.protoM != 0 {
		s += fmt.Sprintf(" proto=%d", r.ip.proto)
	}
	if r.ip.tosM != 0 {
		s += fmt.Sprintf(" tos=%d", r.ip.tos)
	}
	if r.ip.ttlM != 0 {
		s += fmt.Sprintf(" ttl=%d", r.ip.ttl)
	}
	if r.ip.flagsM != 0 {
		s += fmt.Sprintf(" ipflags=%d", r.ip.flags)
	}
	switch r.l4.spec {
	case specUDP:
		s += " udp"
	case specTCP:
		s += " tcp"
	}
	if r.l4.dstMask != 0 {
		s += fmt.Sprintf(" dport=%d", r.l4.dst)
	}
	if r.l4.srcMask != 0 {
		s += fmt.Sprintf(" sport=%d", r.l4.src)
	}
	return s
}
