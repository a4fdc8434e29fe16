//go:build linux

package xdp

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The tests build two network namespaces joined by a veth pair, with addresses only inside them:
//
//	netns ibvb-xdp-<pid>-<n>-a: xa0 10.99.0.1/24  (receiver: XDP + AF_XDP)
//	netns ibvb-xdp-<pid>-<n>-b: xb0 10.99.0.2/24  (sender)
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

var nsSeq atomic.Int32

type vethPair struct {
	a, b string // namespace names
}

// requireNetns skips unless the test can create namespaces and veth pairs.
func requireNetns(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and attaches XDP programs")
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		t.Skip("needs the ip tool (iproute2) to create network namespaces")
	}
	return ip
}

func newVethPair(t testing.TB) *vethPair { return newVethPairQueues(t, 1) }

// newVethPairQueues makes the pair with queues active rx and tx queues on each end.
func newVethPairQueues(t testing.TB, queues int) *vethPair {
	t.Helper()
	ip := requireNetns(t)
	n := nsSeq.Add(1)
	p := &vethPair{a: fmt.Sprintf("ibvb-xdp-%d-%d-a", os.Getpid(), n), b: fmt.Sprintf("ibvb-xdp-%d-%d-b", os.Getpid(), n)}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(ip, args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	for _, ns := range []string{p.a, p.b} {
		run("netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command(ip, "netns", "del", ns).Run() })
	}
	q := fmt.Sprint(max(queues, 1))
	run("-n", p.a, "link", "add", ifA, "numtxqueues", q, "numrxqueues", q, "type", "veth",
		"peer", "name", ifB, "netns", p.b, "numtxqueues", q, "numrxqueues", q)
	if queues > 1 {
		for _, x := range [][2]string{{p.a, ifA}, {p.b, ifB}} {
			if err := setChannels(x[0], x[1], uint32(queues)); err != nil {
				t.Fatal(err)
			}
		}
	}
	run("-n", p.a, "addr", "add", addrA.String()+"/24", "dev", ifA)
	run("-n", p.b, "addr", "add", addrB.String()+"/24", "dev", ifB)
	for _, x := range [][2]string{{p.a, ifA}, {p.b, ifB}, {p.a, "lo"}, {p.b, "lo"}} {
		run("-n", x[0], "link", "set", x[1], "up")
	}
	run("-n", p.b, "route", "add", "224.0.0.0/4", "dev", ifB)
	return p
}

// inNetns runs fn on an OS thread switched into namespace ns. The thread is never unlocked, so the Go
// runtime discards it when fn returns. Sockets, maps and links fn creates stay in ns whatever thread
// later uses them.
func inNetns(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open("/run/netns/" + ns)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		defer func() {
			if r := recover(); r != nil {
				errc <- fmt.Errorf("panic in netns %s: %v", ns, r)
			}
		}()
		errc <- fn()
	}()
	return <-errc
}

// must is inNetns for the test goroutine.
func (p *vethPair) must(t testing.TB, ns string, fn func() error) {
	t.Helper()
	if err := inNetns(ns, fn); err != nil {
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
	err := inNetns(ns, func() error {
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

// setChannels sets the rx and tx channel counts of ifname in namespace ns (ethtool -L), so a veth can have
// several active queues.
func setChannels(ns, ifname string, n uint32) error {
	return inNetns(ns, func() error {
		const ethtoolGChannels, ethtoolSChannels = 0x3c, 0x3d
		var ch struct {
			cmd                                     uint32
			maxRx, maxTx, maxOther, maxCombined     uint32
			rxCount, txCount, otherCount, combCount uint32
		}
		var ifr struct {
			name [unix.IFNAMSIZ]byte
			data unsafe.Pointer
			_    [16]byte
		}
		copy(ifr.name[:], ifname)
		ifr.data = unsafe.Pointer(&ch)
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		ch.cmd = ethtoolGChannels
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
			return fmt.Errorf("ETHTOOL_GCHANNELS %s: %w", ifname, e)
		}
		ch.cmd, ch.rxCount, ch.txCount = ethtoolSChannels, n, n
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
			return fmt.Errorf("ETHTOOL_SCHANNELS %s: %w", ifname, e)
		}
		return nil
	})
}
