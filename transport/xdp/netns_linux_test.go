//go:build linux

package xdp

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/ibvbridge/ibvbridge/internal/testnet"
	"github.com/ibvbridge/ibvbridge/internal/testutil"
)

// The tests build two network namespaces joined by a veth pair, with addresses only inside them:
//
//	netns ibvb-t<pid>-<n>-r: xa0 10.99.0.1/24  (receiver: XDP + AF_XDP)
//	netns ibvb-t<pid>-<n>-s: xb0 10.99.0.2/24  (sender)
//
// The host's interfaces are never touched; t.Cleanup deletes the namespaces (and with them the veth).

const (
	ifA = "xa0"
	ifB = "xb0"
)

var (
	addrA = netip.MustParseAddr("10.99.0.1")
	addrB = netip.MustParseAddr("10.99.0.2")
)

type vethPair = testnet.VethPair

func newVethPair(t testing.TB) *vethPair { return newVethPairQueues(t, 1) }

// newVethPairQueues makes the pair with queues active rx and tx queues on each end.
func newVethPairQueues(t testing.TB, queues int) *vethPair {
	t.Helper()
	return testutil.VethPair(t, testnet.VethConfig{RecvIf: ifA, SendIf: ifB, RecvAddr: addrA, SendAddr: addrB, Queues: queues})
}

// must runs fn in namespace ns (testnet.InNetns) and fails the test on its error.
func must(t testing.TB, ns string, fn func() error) {
	t.Helper()
	if err := testnet.InNetns(ns, fn); err != nil {
		t.Fatal(err)
	}
}

// skipIfUnsupported skips when the kernel lacks AF_XDP or XDP: the only reason a test may not run as root.
func skipIfUnsupported(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, ErrNotSupported) {
		t.Skipf("kernel lacks AF_XDP/XDP: %v", err)
	}
}

// xdpOn reports the XDP program ids attached to ifname in namespace ns.
func xdpOn(t testing.TB, ns, ifname string) (st linkXDP) {
	t.Helper()
	err := testnet.InNetns(ns, func() error {
		_, idx, err := resolveInterface(ifname)
		if err != nil {
			return err
		}
		st, err = queryXDP(idx)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (st linkXDP) any() bool { return st.DrvProgID != 0 || st.SKBProgID != 0 || st.HWProgID != 0 }
