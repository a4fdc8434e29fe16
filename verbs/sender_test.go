package verbs

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestHWRateKbps(t *testing.T) {
	caps := HWRate{MinKbps: 1000, MaxKbps: 100_000_000, RawPacket: true}
	// 10 Gb/s of payload in 8972-byte packets: frames carry 42 more bytes each.
	k, ok, _ := hwRateKbps(1.25e9, 8972, caps)
	if want := uint32(10_000_000 * 9014 / 8972); !ok || k < want-1 || k > want+1 {
		t.Errorf("kbps %d ok %v, want %d", k, ok, want)
	}
	if _, ok, why := hwRateKbps(10, 8972, caps); ok || !strings.Contains(why, "range") {
		t.Errorf("below min: %v %q", ok, why)
	}
	if _, ok, why := hwRateKbps(1.25e9, 8972, HWRate{MaxKbps: 1 << 30}); ok || !strings.Contains(why, "raw packet") {
		t.Errorf("no raw packet pacing: %v %q", ok, why)
	}
	if _, ok, _ := hwRateKbps(0, 8972, caps); ok {
		t.Error("rate 0 paced")
	}
}

func TestLookupARP(t *testing.T) {
	table := `IP address       HW type     Flags       HW address            Mask     Device
192.0.2.1        0x1         0x2         52:54:00:12:34:56     *        eth0
192.0.2.7        0x1         0x0         00:00:00:00:00:00     *        eth0
192.0.2.8        0x1         0x2         52:54:00:aa:bb:cc     *        eth1
`
	mac, err := lookupARP(strings.NewReader(table), netip.MustParseAddr("192.0.2.1"), "eth0")
	if err != nil || mac != [6]byte{0x52, 0x54, 0, 0x12, 0x34, 0x56} {
		t.Errorf("complete entry: %x %v", mac, err)
	}
	for _, c := range []struct{ ip, dev string }{{"192.0.2.7", "eth0"}, {"192.0.2.8", "eth0"}, {"192.0.2.99", "eth0"}} {
		if _, err := lookupARP(strings.NewReader(table), netip.MustParseAddr(c.ip), c.dev); !errors.Is(err, ErrNoNeighbour) {
			t.Errorf("%s on %s: %v", c.ip, c.dev, err)
		}
	}
	if m, err := DestinationMAC(netip.MustParseAddr("239.1.2.3"), "eth0", "/nonexistent"); err != nil || m != [6]byte{1, 0, 0x5e, 1, 2, 3} {
		t.Errorf("multicast: %x %v", m, err)
	}
	_, err = DestinationMAC(netip.MustParseAddr("192.0.2.99"), "eth0", "/proc/net/arp")
	if err == nil || !strings.Contains(err.Error(), "does not resolve addresses") {
		t.Errorf("unresolved unicast: %v", err)
	}
}

func TestAreaSizeFitsAnyAlignment(t *testing.T) {
	for _, c := range []struct{ maxSize, buffer int }{{9200, 16 << 20}, {1500, 1 << 20}, {64, 64}, {9200, 100}, {8000, 1 << 30}} {
		size := AreaSize(c.maxSize, c.buffer)
		for base := uintptr(0); base < 2*SlotAlign; base++ {
			l, err := PlanRegion(0x10000+base, size, c.maxSize, c.buffer)
			if err != nil {
				t.Fatalf("%+v base %d: %v", c, base, err)
			}
			if l.Slots != max(1, c.buffer/c.maxSize) || l.Span() > size {
				t.Fatalf("%+v base %d: %+v in %d bytes", c, base, l, size)
			}
		}
		// Not wasteful: less than one more slot's worth.
		if size-max(1, c.buffer/c.maxSize)*alignUp(c.maxSize, SlotAlign) >= SlotAlign {
			t.Errorf("%+v: %d bytes", c, size)
		}
	}
	if AreaSize(0, 1) != 0 || AreaSize(1, 0) != 0 {
		t.Error("bad sizes not 0")
	}
}
