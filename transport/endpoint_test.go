package transport

import (
	"net/netip"
	"testing"
)

func TestParseEndpoint(t *testing.T) {
	good := map[string]Endpoint{
		"7148":           {Port: 7148},
		"127.0.0.1:7148": {Addr: netip.MustParseAddr("127.0.0.1"), Port: 7148},
		"239.1.2.3:1":    {Addr: netip.MustParseAddr("239.1.2.3"), Port: 1},
		":9000":          {Port: 9000},
	}
	for in, want := range good {
		got, err := ParseEndpoint(in)
		if err != nil || got != want {
			t.Errorf("ParseEndpoint(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "65536", "x", "host:7148", "::1:7148", "127.0.0.1:", "1.2.3:4"} {
		if _, err := ParseEndpoint(in); err == nil {
			t.Errorf("ParseEndpoint(%q) accepted", in)
		}
	}
	if !(Endpoint{Addr: netip.MustParseAddr("239.1.2.3")}).Multicast() {
		t.Error("239.1.2.3 not multicast")
	}
}
