//go:build linux

package xdp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/ibvbridge/ibvbridge/internal/testenv"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/ibvbridge/ibvbridge/bench"
	"github.com/ibvbridge/ibvbridge/internal/testnet"
	"github.com/ibvbridge/ibvbridge/internal/testutil"
	"github.com/rs/zerolog"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// payload is packet i to endpoint e: a header (endpoint, sequence) and a size-varying pattern.
func payload(e, i int) []byte {
	n := 16 + (i*37)%1400
	b := make([]byte, n)
	binary.BigEndian.PutUint32(b[0:4], uint32(e))
	binary.BigEndian.PutUint32(b[4:8], uint32(i))
	for j := 8; j < n; j++ {
		b[j] = byte(i*7 + j*13 + e)
	}
	return b
}

// startSource opens a Source in p.RecvNS and runs it; the returned stop cancels it and checks Run's result.
func startSource(t *testing.T, p *vethPair, cfg Config, sink *testutil.RecordingSink) (*Source, func()) {
	t.Helper()
	var s *Source
	err := testnet.InNetns(p.RecvNS, func() (err error) {
		s, err = Open(cfg, nil)
		return err
	})
	skipIfUnsupported(t, err)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, sink) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("Run returned %v, want context.Canceled", err)
				}
			case <-time.After(5 * time.Second):
				t.Error("Run did not return within 5s of cancellation")
			}
		})
	}
	t.Cleanup(func() { stop(); s.Close() })
	return s, stop
}

// udpConn opens a UDP socket in namespace ns.
func udpConn(t *testing.T, ns, laddr string) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := testnet.InNetns(ns, func() error {
		a, err := net.ResolveUDPAddr("udp4", laddr)
		if err != nil {
			return err
		}
		c, err = net.ListenUDP("udp4", a)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// ping sends an ICMP echo request from the sender namespace to the receiver's address and waits for the
// reply: ARP and ICMP must still reach the receiver's kernel while XDP is attached.
func ping(t *testing.T, p *vethPair) {
	t.Helper()
	var c *icmp.PacketConn
	must(t, p.SendNS, func() (err error) {
		c, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	})
	defer c.Close()
	id := os.Getpid() & 0xffff
	msg, _ := (&icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: 1, Data: []byte("ibvb")}}).Marshal(nil)
	if _, err := c.WriteTo(msg, &net.IPAddr{IP: addrA.AsSlice()}); err != nil {
		t.Fatalf("ping: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			t.Fatalf("no ICMP echo reply from %s with XDP attached: %v", addrA, err)
		}
		m, err := icmp.ParseMessage(1, buf[:n])
		if err != nil || m.Type != ipv4.ICMPTypeEchoReply {
			continue
		}
		if e, ok := m.Body.(*icmp.Echo); ok && e.ID == id && from.String() == addrA.String() {
			return
		}
	}
}

// TestReceive sends unicast, multicast and port-only traffic through the veth pair and checks every
// payload arrives byte-exact, while other traffic (another UDP port, ICMP, ARP) still reaches the kernel;
// and that Close detaches the program. Once per attach mode.
func TestReceive(t *testing.T) {
	for _, mode := range []string{ModeNative, ModeGeneric} {
		t.Run(mode, func(t *testing.T) {
			p := newVethPair(t)
			iface := ifA
			if mode == ModeGeneric {
				iface = addrA.String() // by address, spead2's way
			}
			endpoints := []netip.AddrPort{
				netip.MustParseAddrPort("10.99.0.1:7148"),
				netip.MustParseAddrPort("239.9.9.9:7149"),
				netip.AddrPortFrom(netip.Addr{}, 7150), // port only: any address
			}
			sink := testutil.NewRecordingSink(true)
			var logBuf bench.LockedBuffer
			log := zerolog.New(&logBuf)
			s, stop := startSource(t, p, Config{Interface: iface, Mode: mode, Endpoints: endpoints, Log: &log}, sink)
			if st := s.Stats(); st.Mode != mode {
				t.Fatalf("attached in %q mode, want %q", st.Mode, mode)
			}
			if st := xdpOn(t, p.RecvNS, ifA); !st.any() {
				t.Fatal("no XDP program on the interface after Open")
			}
			checkIGMP(t, p.RecvNS, "239.9.9.9")

			// The kernel path keeps working: ICMP (and ARP before it), and UDP to a port we do not take.
			ping(t, p)
			other := udpConn(t, p.RecvNS, "10.99.0.1:7151")

			const perEndpoint = 500
			dsts := []string{"10.99.0.1:7148", "239.9.9.9:7149", "10.99.0.1:7150"}
			conns := make([]*net.UDPConn, len(dsts))
			for e, d := range dsts {
				conns[e] = dial(t, p.SendNS, d)
			}
			otherSender := dial(t, p.SendNS, "10.99.0.1:7151")
			for i := range perEndpoint {
				for e, c := range conns {
					if _, err := c.Write(payload(e, i)); err != nil {
						t.Fatalf("send to %s: %v", dsts[e], err)
					}
				}
				if i%50 == 0 {
					time.Sleep(time.Millisecond) // stay well inside the rings: this test is about content
				}
			}
			if _, err := otherSender.Write([]byte("for the kernel")); err != nil {
				t.Fatal(err)
			}
			want := perEndpoint * len(dsts)
			if !sink.WaitCount(want, 10*time.Second) {
				t.Fatalf("received %d of %d packets; stats %+v", sink.Count(), want, s.Stats())
			}
			other.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 100)
			n, err := other.Read(buf)
			if err != nil || string(buf[:n]) != "for the kernel" {
				t.Fatalf("ordinary socket on another port: %q, %v", buf[:n], err)
			}
			time.Sleep(50 * time.Millisecond) // anything extra would show now
			stop()

			next := make([]int, len(dsts))
			got := sink.Packets()
			for k, got := range got {
				if len(got) < 8 {
					t.Fatalf("packet %d: %d bytes", k, len(got))
				}
				e, i := int(binary.BigEndian.Uint32(got[0:4])), int(binary.BigEndian.Uint32(got[4:8]))
				if e >= len(dsts) || i != next[e] {
					t.Fatalf("packet %d: endpoint %d seq %d, want seq %d (lost or reordered)", k, e, i, next[e])
				}
				if !bytes.Equal(got, payload(e, i)) {
					t.Fatalf("packet %d (endpoint %d seq %d): payload differs", k, e, i)
				}
				next[e]++
			}
			if len(got) != want {
				t.Fatalf("%d packets, want %d", len(got), want)
			}

			st := s.Stats()
			t.Logf("stats: %+v", st)
			if st.Packets != uint64(want) || st.Frames != uint64(want) || st.Redirected != uint64(want) {
				t.Errorf("packets %d frames %d redirected %d, want %d each", st.Packets, st.Frames, st.Redirected, want)
			}
			if st.RxDropped+st.RxRingFull+st.RxInvalidDescs != 0 {
				t.Errorf("kernel drop counters: %+v", st)
			}
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if st := xdpOn(t, p.RecvNS, ifA); st.any() {
				t.Fatalf("XDP program still attached after Close: %+v", st)
			}
			if final := s.Stats(); final.Packets != uint64(want) {
				t.Errorf("Stats after Close: %d packets, want %d", final.Packets, want)
			}
			ping(t, p)
		})
	}
}

func dial(t *testing.T, ns, dst string) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := testnet.InNetns(ns, func() error {
		a, err := net.ResolveUDPAddr("udp4", dst)
		if err != nil {
			return err
		}
		c, err = net.DialUDP("udp4", nil, a)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// checkIGMP checks the kernel of namespace ns has joined group on xa0 (so it sends IGMP reports).
func checkIGMP(t *testing.T, ns, group string) {
	t.Helper()
	g := netip.MustParseAddr(group).As4()
	want := fmt.Sprintf("%08X", binary.LittleEndian.Uint32(g[:]))
	var text string
	must(t, ns, func() error {
		b, err := os.ReadFile("/proc/thread-self/net/igmp")
		text = string(b)
		return err
	})
	inIf := false
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && !strings.HasPrefix(line, "\t") && !strings.HasPrefix(line, " ") {
			inIf = f[1] == ifA
			continue
		}
		if inIf && len(f) > 0 && f[0] == want {
			return
		}
	}
	t.Fatalf("group %s not joined on %s:\n%s", group, ifA, text)
}

// TestKill9 attaches from a child process, kills it with SIGKILL and checks the interface is clean and a
// new run attaches: the bpf_link dies with the process.
func TestKill9(t *testing.T) {
	p := newVethPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", p.RecvNS, os.Args[0], "-test.run=^$", "-test.count=1")
	cmd.Env = append(os.Environ(), "IBVB_XDP_HELPER="+ifA)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "READY") || strings.HasPrefix(sc.Text(), "SKIP") || strings.HasPrefix(sc.Text(), "ERROR") {
				ready <- sc.Text()
				return
			}
		}
		ready <- "EOF"
	}()
	select {
	case line := <-ready:
		if strings.HasPrefix(line, "SKIP") {
			t.Skip(line)
		}
		if line != "READY" {
			t.Fatalf("helper: %s", line)
		}
	case <-ctx.Done():
		t.Fatal("helper did not attach within 20s")
	}
	if st := xdpOn(t, p.RecvNS, ifA); !st.any() {
		t.Fatal("helper is ready but no XDP program is attached")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for xdpOn(t, p.RecvNS, ifA).any() {
		if time.Now().After(deadline) {
			t.Fatal("XDP program still attached 5s after the attaching process was killed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	ping(t, p)
	sink := testutil.NewRecordingSink(true)
	_, stop := startSource(t, p, Config{Interface: ifA, Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.99.0.1:7148")}, Frames: 256}, sink)
	defer stop()
	c := dial(t, p.SendNS, "10.99.0.1:7148")
	for i := range 10 {
		c.Write(payload(0, i))
	}
	if !sink.WaitCount(10, 5*time.Second) {
		t.Fatalf("fresh run after kill -9 received %d of 10", sink.Count())
	}
}

// TestMain lets the test binary double as the child processes of TestKill9 and TestPermissionError.
func TestMain(m *testing.M) {
	switch {
	case os.Getenv("IBVB_XDP_HELPER") != "":
		helperProcess(os.Getenv("IBVB_XDP_HELPER"))
	case os.Getenv("IBVB_XDP_UNPRIV") != "":
		helperUnprivileged()
	}
	os.Exit(testenv.Main(m)) // a ring directory of its own
}

// helperProcess is the child of TestKill9: it attaches, says READY and waits to be killed.
func helperProcess(iface string) {
	s, err := Open(Config{Interface: iface, Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.99.0.1:7148")}, Frames: 256}, nil)
	if errors.Is(err, ErrNotSupported) {
		fmt.Println("SKIP", err)
		os.Exit(0)
	}
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	go s.Run(context.Background(), testutil.NewRecordingSink(true))
	fmt.Println("READY")
	time.Sleep(30 * time.Second) // killed long before
	os.Exit(2)
}

// attachLegacy attaches a program the old netlink way (no bpf_link): it stays attached after its fds
// close and its process exits, which is how a program gets left behind.
func attachLegacy(t *testing.T, p *vethPair, name string) uint32 {
	t.Helper()
	must(t, p.RecvNS, func() error {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: name, Type: ebpf.XDP, License: "MIT",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, xdpPass), asm.Return()}})
		if err != nil {
			return err
		}
		defer prog.Close()
		_, idx, err := resolveInterface(ifA)
		if err != nil {
			return err
		}
		return setXDPFD(idx, prog.FD(), unix.XDP_FLAGS_SKB_MODE)
	})
	st := xdpOn(t, p.RecvNS, ifA)
	if st.SKBProgID == 0 {
		t.Fatalf("legacy attach left no program: %+v", st)
	}
	return st.SKBProgID
}

// TestReplacesStaleProgram: our program left attached (legacy netlink, as an older or crashed run could
// leave it) is removed with a warning; someone else's is refused and left alone.
func TestReplacesStaleProgram(t *testing.T) {
	p := newVethPair(t)
	ep := []netip.AddrPort{netip.MustParseAddrPort("10.99.0.1:7148")}

	old := attachLegacy(t, p, ProgramName)
	var logBuf bench.LockedBuffer
	log := zerolog.New(&logBuf)
	var s *Source
	err := testnet.InNetns(p.RecvNS, func() (err error) {
		s, err = Open(Config{Interface: ifA, Endpoints: ep, Frames: 256, Log: &log}, nil)
		return err
	})
	skipIfUnsupported(t, err)
	if err != nil {
		t.Fatalf("Open over a stale program: %v", err)
	}
	if !strings.Contains(logBuf.String(), "left behind") {
		t.Errorf("no warning about the stale program; log:\n%s", logBuf.String())
	}
	if st := xdpOn(t, p.RecvNS, ifA); st.SKBProgID == old || !st.any() {
		t.Errorf("after Open: %+v (stale id %d)", st, old)
	}
	// A second receiver on the same interface finds our live bpf_link: in use, not stale.
	err = testnet.InNetns(p.RecvNS, func() error {
		s2, err := Open(Config{Interface: ifA, Endpoints: ep, Frames: 256}, nil)
		if err == nil {
			s2.Close()
		}
		return err
	})
	if !errors.Is(err, ErrInUse) {
		t.Errorf("second Open on the same interface: %v, want ErrInUse", err)
	}
	s.Close()
	if st := xdpOn(t, p.RecvNS, ifA); st.any() {
		t.Fatalf("program left after Close: %+v", st)
	}

	foreign := attachLegacy(t, p, "other_xdp")
	err = testnet.InNetns(p.RecvNS, func() error {
		s, err := Open(Config{Interface: ifA, Endpoints: ep, Frames: 256}, nil)
		if err == nil {
			s.Close()
		}
		return err
	})
	if !errors.Is(err, ErrForeignProgram) || !strings.Contains(err.Error(), "other_xdp") {
		t.Fatalf("Open over a foreign program: %v, want ErrForeignProgram naming it", err)
	}
	if st := xdpOn(t, p.RecvNS, ifA); st.SKBProgID != foreign {
		t.Fatalf("foreign program touched: %+v, want id %d", st, foreign)
	}
}

// TestZeroCopy: veth refuses AF_XDP zero-copy. Requested (the default) it falls back to copy mode with a
// warning; demanded it is an error.
func TestZeroCopy(t *testing.T) {
	p := newVethPair(t)
	ep := []netip.AddrPort{netip.MustParseAddrPort("10.99.0.1:7148")}
	var logBuf bench.LockedBuffer
	log := zerolog.New(&logBuf)
	err := testnet.InNetns(p.RecvNS, func() error {
		s, err := Open(Config{Interface: ifA, Mode: ModeNative, Endpoints: ep, Frames: 256, Log: &log}, nil)
		if err != nil {
			return err
		}
		defer s.Close()
		if st := s.Stats(); st.ZeroCopy {
			t.Log("veth accepted zero-copy on this kernel")
		} else if !strings.Contains(logBuf.String(), "zero-copy refused") {
			return fmt.Errorf("copy mode without a warning; log:\n%s", logBuf.String())
		}
		return nil
	})
	skipIfUnsupported(t, err)
	if err != nil {
		t.Fatal(err)
	}
	err = testnet.InNetns(p.RecvNS, func() error {
		s, err := Open(Config{Interface: ifA, Mode: ModeNative, ZeroCopy: true, Endpoints: ep, Frames: 256}, nil)
		if err == nil {
			zc := s.Stats().ZeroCopy
			s.Close()
			if zc {
				return nil
			}
			return errors.New("zero-copy demanded, Open succeeded in copy mode")
		}
		return err
	})
	if err != nil && !errors.Is(err, ErrZeroCopyUnsupported) {
		t.Fatalf("zero-copy demanded: %v, want ErrZeroCopyUnsupported", err)
	}
	t.Logf("zero-copy demanded: %v", err)
	if st := xdpOn(t, p.RecvNS, ifA); st.any() {
		t.Fatalf("program left after a failed Open: %+v", st)
	}
}

// TestOpenErrors checks each configuration error is clear and testable.
func TestOpenErrors(t *testing.T) {
	ep := []netip.AddrPort{netip.MustParseAddrPort("10.99.0.1:7148")}
	for _, tc := range []struct {
		name string
		cfg  Config
		want error
	}{
		{"no endpoints", Config{Interface: "lo"}, ErrBadConfig},
		{"bad mode", Config{Interface: "lo", Endpoints: ep, Mode: "turbo"}, ErrBadConfig},
		{"bad frame size", Config{Interface: "lo", Endpoints: ep, FrameSize: 3000}, ErrBadConfig},
		{"frames not power of two", Config{Interface: "lo", Endpoints: ep, Frames: 1000}, ErrBadConfig},
		{"ipv6 endpoint", Config{Interface: "lo", Endpoints: []netip.AddrPort{netip.MustParseAddrPort("[::1]:5")}}, ErrBadConfig},
		{"interface not found", Config{Interface: "ibvb-nosuch0", Endpoints: ep}, ErrInterfaceNotFound},
		{"address not found", Config{Interface: "192.0.2.254", Endpoints: ep}, ErrInterfaceNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Open(tc.cfg, nil)
			if err == nil {
				s.Close()
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Open: %v, want %v", err, tc.want)
			}
		})
	}
	t.Run("queue out of range", func(t *testing.T) {
		p := newVethPair(t)
		err := testnet.InNetns(p.RecvNS, func() error {
			s, err := Open(Config{Interface: ifA, Queues: []int{0, 3}, Endpoints: ep}, nil)
			if err == nil {
				s.Close()
			}
			return err
		})
		if !errors.Is(err, ErrQueueOutOfRange) {
			t.Fatalf("Open: %v, want ErrQueueOutOfRange", err)
		}
		t.Log(err)
	})
	if RequiredUMEM(Config{Interface: "x", Endpoints: ep, Queues: []int{0, 1}, FrameSize: 2048, Frames: 512}) != 2*512*2048 {
		t.Error("RequiredUMEM")
	}
}

// TestMultiQueue binds a socket to each of two veth queues and checks that flows spread over both all
// arrive, through the one loop.
func TestMultiQueue(t *testing.T) {
	p := newVethPairQueues(t, 2)
	sink := testutil.NewRecordingSink(true)
	s, stop := startSource(t, p, Config{Interface: ifA, Mode: ModeNative, Queues: []int{0, 1},
		Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.99.0.1:7148")}, Frames: 1024}, sink)
	const flows, perFlow = 32, 20
	var conns []*net.UDPConn
	for range flows {
		conns = append(conns, dial(t, p.SendNS, "10.99.0.1:7148")) // a source port each: hashed to either tx queue
	}
	for i := range perFlow {
		for f, c := range conns {
			if _, err := c.Write(payload(f, i)); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Millisecond) // this test is about queues, not overruns (counted: RxFillRingEmpty)
	}
	if !sink.WaitCount(flows*perFlow, 10*time.Second) {
		t.Fatalf("received %d of %d; stats %+v", sink.Count(), flows*perFlow, s.Stats())
	}
	stop()
	st := s.Stats()
	t.Logf("frames per queue: %v", st.QueueFrames)
	if len(st.QueueFrames) != 2 || st.QueueFrames[0]+st.QueueFrames[1] != flows*perFlow {
		t.Fatalf("per-queue frames %v, want %d in all", st.QueueFrames, flows*perFlow)
	}
	if st.QueueFrames[0] == 0 || st.QueueFrames[1] == 0 {
		t.Errorf("all 32 flows hashed to one queue (odds 2^-31): the other socket was not exercised")
	}
}

// TestOversizeCounted: without multi-buffer (SingleBuffer), a frame larger than a UMEM frame is dropped
// by the kernel, and counted.
func TestOversizeCounted(t *testing.T) {
	p := newVethPair(t)
	for _, x := range [][2]string{{p.RecvNS, ifA}, {p.SendNS, ifB}} {
		if out, err := exec.Command("ip", "-n", x[0], "link", "set", x[1], "mtu", "9000").CombinedOutput(); err != nil {
			t.Fatalf("set mtu: %v\n%s", err, out)
		}
	}
	sink := testutil.NewRecordingSink(true)
	s, stop := startSource(t, p, Config{Interface: ifA, Mode: ModeGeneric, FrameSize: 2048, Frames: 256, SingleBuffer: true,
		Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.99.0.1:7148")}}, sink)
	defer stop()
	c := dial(t, p.SendNS, "10.99.0.1:7148")
	big := make([]byte, 4000) // 4042-byte frame: larger than 2048 - 256
	if _, err := c.Write(big); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(payload(0, 1)); err != nil {
		t.Fatal(err)
	}
	if !sink.WaitCount(1, 5*time.Second) {
		t.Fatal("small packet after the oversize one not received")
	}
	deadline := time.Now().Add(2 * time.Second)
	for s.Stats().RxDropped == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if st := s.Stats(); st.RxDropped != 1 || st.Packets != 1 {
		t.Fatalf("oversize frame: rx_dropped %d packets %d, want 1 and 1", st.RxDropped, st.Packets)
	}
}

// TestBusyPollAndClose runs the loop in busy-poll mode and stops it with Close rather than the context.
func TestBusyPollAndClose(t *testing.T) {
	p := newVethPair(t)
	var s *Source
	err := testnet.InNetns(p.RecvNS, func() (err error) {
		s, err = Open(Config{Interface: ifA, BusyPoll: true, Frames: 256,
			Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.99.0.1:7148")}}, nil)
		return err
	})
	skipIfUnsupported(t, err)
	if err != nil {
		t.Fatal(err)
	}
	sink := testutil.NewRecordingSink(true)
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background(), sink) }()
	c := dial(t, p.SendNS, "10.99.0.1:7148")
	for i := range 50 {
		c.Write(payload(0, i))
	}
	if !sink.WaitCount(50, 5*time.Second) {
		t.Fatalf("busy poll received %d of 50", sink.Count())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("Run after Close: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after Close")
	}
	if err := s.Run(context.Background(), sink); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run on a closed source: %v", err)
	}
	if st := s.Stats(); st.Waits != 0 || st.Packets != 50 {
		t.Fatalf("busy poll: waits %d packets %d, want 0 and 50", st.Waits, st.Packets)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestPermissionError runs Open as an unprivileged user (a copy of the test binary, re-executed with uid
// 65534) and checks the error names the capabilities needed.
func TestPermissionError(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a process as another user")
	}
	dir, err := os.MkdirTemp("", "ibvb-xdp-unpriv-") // t.TempDir's parent is private to root
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	exe := dir + "/xdp.test"
	b, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^$", "-test.count=1")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "IBVB_XDP_UNPRIV=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if !strings.Contains(string(out), "PERMISSION OK") {
		t.Fatalf("unprivileged Open (%v):\n%s", err, out)
	}
}

// helperUnprivileged is TestPermissionError's child, run as nobody.
func helperUnprivileged() {
	s, err := Open(Config{Interface: "lo", Endpoints: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:7148")}, Frames: 64}, nil)
	if err == nil {
		s.Close()
		fmt.Printf("uid %d opened an AF_XDP source\n", os.Geteuid())
		os.Exit(1)
	}
	if !errors.Is(err, ErrPermission) || !strings.Contains(err.Error(), "CAP_NET_ADMIN and CAP_BPF") {
		fmt.Printf("unprivileged Open: %v, want ErrPermission\n", err)
		os.Exit(1)
	}
	fmt.Println("PERMISSION OK:", err)
	os.Exit(0)
}
