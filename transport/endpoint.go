package transport

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Endpoint is where a stream arrives: a UDP port, and optionally the address to bind (a local unicast
// address or an IPv4 multicast group). An endpoint without an address binds 0.0.0.0.
type Endpoint struct {
	Addr netip.Addr // invalid: any address
	Port uint16
}

// ParseEndpoint parses "host:port" or "port", spead2_recv's spelling of a source. The host must be an IPv4
// address: receivers bind addresses, and resolving names here would hide a typo behind DNS.
func ParseEndpoint(s string) (Endpoint, error) {
	if s == "" {
		return Endpoint{}, fmt.Errorf("endpoint %q: empty", s)
	}
	host, portStr := "", s
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		host, portStr = s[:i], s[i+1:]
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return Endpoint{}, fmt.Errorf("endpoint %q: port %q is not a number in 1..65535", s, portStr)
	}
	e := Endpoint{Port: uint16(port)}
	if host != "" {
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is4() {
			return Endpoint{}, fmt.Errorf("endpoint %q: host %q is not an IPv4 address", s, host)
		}
		e.Addr = a
	}
	return e, nil
}

// Multicast reports whether the endpoint is an IPv4 multicast group.
func (e Endpoint) Multicast() bool { return e.Addr.IsValid() && e.Addr.IsMulticast() }

// Matches reports whether a datagram to dst:port belongs to the endpoint (pcap filtering).
func (e Endpoint) Matches(dst netip.Addr, port uint16) bool {
	return port == e.Port && (!e.Addr.IsValid() || e.Addr.IsUnspecified() || e.Addr == dst)
}

func (e Endpoint) String() string {
	if !e.Addr.IsValid() {
		return "0.0.0.0:" + strconv.Itoa(int(e.Port))
	}
	return netip.AddrPortFrom(e.Addr, e.Port).String()
}
