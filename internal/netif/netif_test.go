package netif

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
)

func TestByAddr(t *testing.T) {
	ifi, err := ByAddr(netip.MustParseAddr("127.0.0.1"))
	if err != nil {
		t.Skipf("no loopback IPv4 address here: %v", err)
	}
	if ifi.Name == "" || ifi.Flags&net.FlagLoopback == 0 {
		t.Errorf("127.0.0.1: %+v", ifi)
	}
	// An IPv4-mapped address is its IPv4 form.
	if m, err := ByAddr(netip.MustParseAddr("::ffff:127.0.0.1")); err != nil || m.Index != ifi.Index {
		t.Errorf("::ffff:127.0.0.1: %v, %v", m, err)
	}
	_, err = ByAddr(netip.MustParseAddr("192.0.2.123"))
	if !errors.Is(err, ErrNoInterface) || err.Error() != "no interface has address 192.0.2.123" {
		t.Fatalf("got %v", err)
	}
	_, err = byAddr(netip.MustParseAddr("10.0.0.1"), func() ([]net.Interface, error) { return nil, errors.New("netlink down") })
	if err == nil || errors.Is(err, ErrNoInterface) || !strings.Contains(err.Error(), "netlink down") {
		t.Fatalf("got %v", err)
	}
}
