// Package netif owns the one question every transport asks of the host's network interfaces: which
// interface has local address A (ibvbridge is told where to receive or send by an address, as spead2 is).
package netif

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// ErrNoInterface means no interface has the address.
var ErrNoInterface = errors.New("no interface has address")

// ByAddr returns the interface that has local address a (IPv4 or IPv6; an IPv4-mapped address matches
// its IPv4 form). The error wraps ErrNoInterface when none has it.
func ByAddr(a netip.Addr) (*net.Interface, error) {
	return byAddr(a, net.Interfaces)
}

// byAddr is ByAddr over a given interface list (a failing one in tests).
func byAddr(a netip.Addr, list func() ([]net.Interface, error)) (*net.Interface, error) {
	a = a.Unmap()
	ifs, err := list()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	for i := range ifs {
		addrs, err := ifs[i].Addrs()
		if err != nil {
			continue
		}
		for _, ad := range addrs {
			var ip net.IP
			switch v := ad.(type) {
			case *net.IPNet:
				ip = v.IP
			case *net.IPAddr:
				ip = v.IP
			}
			if got, ok := netip.AddrFromSlice(ip); ok && got.Unmap() == a {
				return &ifs[i], nil
			}
		}
	}
	return nil, fmt.Errorf("%w %s", ErrNoInterface, a)
}
