package verbs

import (
	"bytes"
	"encoding/hex"
	"net"
	"net/netip"
	"strings"
	"testing"
)

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	s = strings.Join(strings.Fields(s), "")
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// spead2's rule for 239.1.2.3:7148 on port 1, worked out by hand from verbs.h
// (little-endian host fields, network-order match fields).
const spead2RuleHex = `
	00000000 00000000 6400 0000 03 01 0000 00000000
	20000000 2800 01005e010203 000000000000 0800 0000 ffffffffffff 000000000000 ffff 0000 0000
	30000000 1800 0000 00000000 ef010203 00000000 ffffffff
	41000000 1000 1bec 0000 ffff 0000 0000`

func TestFlowRulesForEndpointsBytes(t *testing.T) {
	rules, err := FlowRulesForEndpoints([]netip.AddrPort{netip.MustParseAddrPort("239.1.2.3:7148")}, 1)
	if err != nil {
		t.Fatal(err)
	}
	got, err := rules[0].MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	want := unhex(t, spead2RuleHex)
	if !bytes.Equal(got, want) {
		t.Fatalf("rule bytes\n got %x\nwant %x", got, want)
	}
	if s := rules[0].String(); s != "normal port=1 prio=0 dmac=01:00:5e:01:02:03 ethertype=0x0800 dip=239.1.2.3 udp dport=7148" {
		t.Errorf("String() = %q", s)
	}
}

func TestFlowRuleExtAllSelectors(t *testing.T) {
	r := NewFlowRule(2).WithPriority(3).
		DstMAC(net.HardwareAddr{1, 2, 3, 4, 5, 6}).SrcMAC(net.HardwareAddr{0xa, 0xb, 0xc, 0xd, 0xe, 0xf}).
		EtherType(0x0800).VLAN(100).
		SrcPrefix(netip.MustParsePrefix("10.1.2.0/24")).DstIP(netip.MustParseAddr("239.0.0.1")).
		Proto(17).TOS(0x2e).TTL(64).IPFlags(2).
		UDP().DstPort(0x1234).SrcPort(0x5678)
	got, err := r.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	want := unhex(t, `
		00000000 00000000 6c00 0300 03 02 0000 00000000
		20000000 2800 010203040506 0a0b0c0d0e0f 0800 0064 ffffffffffff ffffffffffff ffff 0fff 0000
		32000000 2000 0000 0a010200 ef000001 11 2e 40 02 ffffff00 ffffffff ff ff ff 07
		41000000 1000 1234 5678 ffff ffff 0000`)
	if !bytes.Equal(got, want) {
		t.Fatalf("rule bytes\n got %x\nwant %x", got, want)
	}
}

func TestFlowRuleTypesWithoutSpecs(t *testing.T) {
	for _, ft := range []FlowType{FlowAllDefault, FlowMCDefault, FlowSniffer} {
		got, err := NewFlowRule(1).WithType(ft).MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		want := []byte{0, 0, 0, 0, byte(ft), 0, 0, 0, 20, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0}
		if !bytes.Equal(got, want) {
			t.Errorf("%v: got %x want %x", ft, got, want)
		}
	}
}

func TestFlowRuleIPOnlyGetsEthSpec(t *testing.T) {
	r := NewFlowRule(1).DstIP(netip.MustParseAddr("239.9.9.9"))
	if r.NumSpecs() != 2 || r.Size() != 20+40+24 {
		t.Fatalf("specs=%d size=%d, want an (empty) eth spec in front of ipv4", r.NumSpecs(), r.Size())
	}
	b, _ := r.MarshalBinary()
	if b[20] != 0x20 || b[60] != 0x30 {
		t.Fatalf("spec order wrong: %x", b)
	}
}

func TestFlowRuleErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    *FlowRule
		want string
	}{
		{"port", NewFlowRule(0), "port 0 out of range"},
		{"mac", NewFlowRule(1).DstMAC(net.HardwareAddr{1, 2}), "not a 6-byte MAC"},
		{"vlan", NewFlowRule(1).VLAN(5000), "vlan 5000 out of range"},
		{"ipv6", NewFlowRule(1).DstIP(netip.MustParseAddr("ff02::1")), "dip ff02::1 is not an IPv4 address"},
		{"l4", NewFlowRule(1).DstPort(1), "need UDP() or TCP()"},
		{"tcpudp", NewFlowRule(1).UDP().TCP(), "both TCP and UDP"},
		{"flags", NewFlowRule(1).IPFlags(9), "ip flags 0x9 out of range"},
	} {
		_, err := tc.r.MarshalBinary()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestFlowRulesForEndpointsRejects(t *testing.T) {
	for _, ep := range []string{"10.0.0.1:7148", "[ff02::1]:7148"} {
		_, err := FlowRulesForEndpoints([]netip.AddrPort{netip.MustParseAddrPort(ep)}, 1)
		if err == nil || !strings.Contains(err.Error(), "is not an IPv4 multicast address") {
			t.Errorf("%s: %v", ep, err)
		}
	}
}

func BenchmarkFlowRuleAppend(b *testing.B) {
	r, _ := FlowRulesForEndpoints([]netip.AddrPort{netip.MustParseAddrPort("239.1.2.3:7148")}, 1)
	buf := make([]byte, 0, 256)
	for b.Loop() {
		buf, _ = r[0].AppendBinary(buf[:0])
	}
}
