// Package testnet owns the throwaway networks that benchmarks and tests run on: two network namespaces
// joined by a veth pair, with addresses that exist only inside them (the host's interfaces are never
// touched), code run inside a namespace, and free loopback UDP ports. `bench xdp` uses it in production;
// internal/testutil wraps it for tests with cleanup.
package testnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// VethConfig describes a pair. Interface names are at most 15 bytes; addresses are /24 on each end.
type VethConfig struct {
	Prefix             string // namespaces are Prefix-r (receiver) and Prefix-s (sender)
	RecvIf, SendIf     string
	RecvAddr, SendAddr netip.Addr
	// Queues is the rx and tx queue count of each end (ethtool -L): AF_XDP binds a socket per queue.
	Queues int
	// MTU, if set, is both ends' MTU (9000 for jumbo frames).
	MTU int
}

// VethPair is two network namespaces joined by a veth pair. The sender's namespace routes IPv4 multicast
// out of its veth, so a multicast stream crosses the pair.
type VethPair struct {
	RecvNS, SendNS     string
	RecvIf, SendIf     string
	RecvAddr, SendAddr netip.Addr
}

// ErrUnavailable is returned by Available when namespaces cannot be made here (not root, no ip tool).
var ErrUnavailable = errors.New("network namespaces unavailable")

// Available says whether this process can create namespaces and veth pairs.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: needs root", ErrUnavailable)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("%w: needs the ip tool (Debian package iproute2)", ErrUnavailable)
	}
	return nil
}

// NewVethPair creates the namespaces and the pair, addresses them and brings every link up. On error it
// removes what it made; the error names the failing ip command.
func NewVethPair(cfg VethConfig) (*VethPair, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	p := &VethPair{RecvNS: cfg.Prefix + "-r", SendNS: cfg.Prefix + "-s", RecvIf: cfg.RecvIf, SendIf: cfg.SendIf,
		RecvAddr: cfg.RecvAddr, SendAddr: cfg.SendAddr}
	q := fmt.Sprint(max(cfg.Queues, 1))
	steps := [][]string{
		{"netns", "add", p.RecvNS},
		{"netns", "add", p.SendNS},
		{"-n", p.RecvNS, "link", "add", p.RecvIf, "numtxqueues", q, "numrxqueues", q, "type", "veth",
			"peer", "name", p.SendIf, "netns", p.SendNS, "numtxqueues", q, "numrxqueues", q},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			p.Remove()
			return nil, err
		}
	}
	if cfg.Queues > 1 {
		for _, x := range [][2]string{{p.RecvNS, p.RecvIf}, {p.SendNS, p.SendIf}} {
			if err := SetChannels(x[0], x[1], uint32(cfg.Queues)); err != nil {
				p.Remove()
				return nil, err
			}
		}
	}
	if cfg.MTU > 0 {
		for _, x := range [][2]string{{p.RecvNS, p.RecvIf}, {p.SendNS, p.SendIf}} {
			if err := ip("-n", x[0], "link", "set", x[1], "mtu", fmt.Sprint(cfg.MTU)); err != nil {
				p.Remove()
				return nil, err
			}
		}
	}
	// Fixed MAC addresses and permanent neighbour entries both ways: the first datagram never waits for
	// (or loses to) an ARP exchange, so a test's set-up is deterministic ("no neighbour entry" cannot
	// happen), not retried.
	recvMAC, sendMAC := macFor(p.RecvAddr), macFor(p.SendAddr)
	steps = [][]string{
		{"-n", p.RecvNS, "link", "set", p.RecvIf, "address", recvMAC},
		{"-n", p.SendNS, "link", "set", p.SendIf, "address", sendMAC},
		{"-n", p.RecvNS, "addr", "add", p.RecvAddr.String() + "/24", "dev", p.RecvIf},
		{"-n", p.SendNS, "addr", "add", p.SendAddr.String() + "/24", "dev", p.SendIf},
		{"-n", p.SendNS, "neigh", "replace", p.RecvAddr.String(), "lladdr", recvMAC, "dev", p.SendIf, "nud", "permanent"},
		{"-n", p.RecvNS, "neigh", "replace", p.SendAddr.String(), "lladdr", sendMAC, "dev", p.RecvIf, "nud", "permanent"},
		{"-n", p.RecvNS, "link", "set", p.RecvIf, "up"},
		{"-n", p.SendNS, "link", "set", p.SendIf, "up"},
		{"-n", p.RecvNS, "link", "set", "lo", "up"},
		{"-n", p.SendNS, "link", "set", "lo", "up"},
		{"-n", p.SendNS, "route", "add", "224.0.0.0/4", "dev", p.SendIf},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			p.Remove()
			return nil, err
		}
	}
	return p, nil
}

// macFor is a locally administered unicast MAC address made from an IPv4 address (02:00:a:b:c:d), so
// each end of each pair has its own.
func macFor(a netip.Addr) string {
	b := a.As4()
	return fmt.Sprintf("02:00:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3])
}

func ip(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Remove deletes both namespaces, which destroys the veth pair with them. Safe on a partly made pair.
func (p *VethPair) Remove() {
	for _, ns := range []string{p.RecvNS, p.SendNS} {
		_ = exec.Command("ip", "netns", "del", ns).Run()
	}
}

// Exec is the command prefix that runs a program in namespace ns.
func (p *VethPair) Exec(ns string) []string { return []string{"ip", "netns", "exec", ns} }

// InNetns runs fn on an OS thread switched into namespace ns. The thread is never unlocked, so the Go
// runtime discards it when fn returns; sockets, maps and links fn creates stay in ns whatever thread
// later uses them.
func InNetns(ns string, fn func() error) error {
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

// SetChannels sets the rx and tx channel counts of ifname in namespace ns (ethtool -L), so a veth has
// several active queues.
func SetChannels(ns, ifname string, n uint32) error {
	return InNetns(ns, func() error {
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
			return os.NewSyscallError("socket", err)
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

// FreeUDPPort asks the kernel for a free port on 127.0.0.1. It is free when asked: callers accept the
// small window before their receiver binds it.
func FreeUDPPort() (int, error) {
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free UDP port: %w", err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port, nil
}
