package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/bench"
	"github.com/ibvbridge/ibvbridge/frame/frametest"
	"github.com/ibvbridge/ibvbridge/internal/testutil"
	"github.com/ibvbridge/ibvbridge/ring"
)

// testRing is a ring name unique to this test process and call, removed when the test ends.
func testRing(t *testing.T, tag string) string { return testutil.UniqueRing(t, tag) }

// runCmd runs the binary with a time bound and returns stdout, stderr and the exit code.
func runCmd(t *testing.T, timeout time.Duration, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%v: timed out after %v; stderr %s", args, timeout, errb.String())
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

func finalCounters(t *testing.T, stdout string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(bench.LastLine([]byte(stdout)), &m); err != nil {
		t.Fatalf("final counters %q: %v", stdout, err)
	}
	return m
}

func num(m map[string]any, k string) uint64 {
	f, _ := m[k].(float64)
	return uint64(f)
}

// TestRecvPcapCaptures replays spead2's own captures and expects spead2_recv's counters (README of the
// captures): every heap, none incomplete, every packet including the stop.
func TestRecvPcapCaptures(t *testing.T) {
	dir := frametest.Dir(t)
	for _, c := range frametest.Captures {
		t.Run(c.Name, func(t *testing.T) {
			// The whole capture fits (block policy without a consumer), the first heap's descriptors too.
			slots, slotSize := 1, max(16<<10, 2*c.HeapSize)
			for slots < c.DataHeaps+1 {
				slots *= 2
			}
			stdout, stderr, code := runCmd(t, 60*time.Second, "recv", "--ring", testRing(t, "pcap"), "--pcap",
				filepath.Join(dir, c.Name), "--slots", strconv.Itoa(slots), "--slot-size", strconv.Itoa(slotSize),
				"--hugepages", "off", "--log-format", "json")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			m := finalCounters(t, stdout)
			want := map[string]uint64{"heaps": uint64(c.DataHeaps), "incomplete_heaps": 0, "packets": uint64(c.Frames),
				"dropped_heaps": 0, "malformed_packets": 0, "truncated_heaps": 0, "end_of_stream": 1}
			for k, v := range want {
				if got := num(m, k); got != v {
					t.Errorf("%s = %d, want %d", k, got, v)
				}
			}
			if m["result"] != "stream_stop" {
				t.Errorf("result %v", m["result"])
			}
			if tc, _ := m["transport_counters"].(map[string]any); num(tc, "packets") != uint64(c.Frames) {
				t.Errorf("transport counters %v", tc)
			}
		})
	}
}

// TestRecvPcapWithConsumer: a small ring and the block policy make the replay wait for the consumer, and
// nothing is lost.
func TestRecvPcapWithConsumer(t *testing.T) {
	c := frametest.Captures[0]
	name := testRing(t, "pcapcons")
	recv, recvOut := startRecv(t, "--ring", name, "--pcap", filepath.Join(frametest.Dir(t), c.Name), "--slots", "16",
		"--slot-size", "8K", "--hugepages", "off", "--log-format", "json")
	cons := startConsumer(t, name, false)
	m := waitRecv(t, recv, recvOut, 30*time.Second)
	if num(m, "heaps") != uint64(c.DataHeaps) || num(m, "dropped_heaps") != 0 {
		t.Errorf("counters %v", m)
	}
	cr := waitConsumer(t, cons)
	if cr.Heaps != uint64(c.DataHeaps) || cr.Result != "eos" {
		t.Errorf("consumer %+v", cr)
	}
}

type proc struct {
	cmd  *exec.Cmd
	out  *bench.LockedBuffer
	err  *bench.LockedBuffer
	done chan struct{} // closed when the process has exited; exit holds Wait's error
	exit error
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func startProc(t *testing.T, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(binary(t), args...), out: &bench.LockedBuffer{}, err: &bench.LockedBuffer{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.err
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exit = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { p.cmd.Process.Kill() })
	return p
}

func (p *proc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		err := p.exit
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(d):
		p.cmd.Process.Kill()
		t.Fatalf("%v did not exit within %v; stderr %s", p.cmd.Args[1:], d, p.err.String())
	}
	return -1
}

// startRecv starts recv and waits until its ring exists (so its sockets are bound).
func startRecv(t *testing.T, args ...string) (*proc, *bench.LockedBuffer) {
	t.Helper()
	p := startProc(t, append([]string{"recv"}, args...)...)
	name := args[slices.Index(args, "--ring")+1]
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(ring.DefaultDir(), ring.SocketName(name))); err == nil {
			return p, p.out
		}
		if p.exited() {
			t.Fatalf("recv exited early: %v: %s", p.exit, p.err.String())
		}
		if time.Now().After(deadline) {
			t.Fatalf("recv did not create its ring: %s", p.err.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitRecv(t *testing.T, p *proc, out *bench.LockedBuffer, d time.Duration) map[string]any {
	t.Helper()
	if code := p.wait(t, d); code != 0 {
		t.Fatalf("recv exit %d: %s", code, p.err.String())
	}
	return finalCounters(t, out.String())
}

func startConsumer(t *testing.T, name string, verify bool) *proc {
	t.Helper()
	args := []string{"consume", "--ring", name, "--timeout-ms", "20000"}
	if verify {
		args = append(args, "--verify")
	}
	p := startProc(t, args...)
	deadline := time.Now().Add(10 * time.Second)
	for {
		// A fast stream may be over before we look: a consumer that has already finished attached too.
		if i, err := ring.Inspect(name, ""); (err == nil && i.Attached() > 0) || p.exited() {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer did not attach: %s", p.err.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitConsumer(t *testing.T, p *proc) bench.ConsumeResult {
	t.Helper()
	p.wait(t, 30*time.Second)
	var cr bench.ConsumeResult
	if err := json.Unmarshal(bench.LastLine(p.out.Bytes()), &cr); err != nil {
		t.Fatalf("consumer output %q: %v", p.out.String(), err)
	}
	return cr
}

func freePort(t *testing.T) string { return strconv.Itoa(testutil.FreeUDPPort(t)) }

// TestSendRecvConsumeVerify: loopback send → recv → Go consumer, every byte checked against the pattern.
func TestSendRecvConsumeVerify(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		heapSize, heaps, items string
		flavour, packet        string
		slots, slotSize        string // the whole stream fits: a slow (race-detector) consumer loses nothing
	}{
		{"64KiB-4items-64-40", "65536", "300", "4", "64-40", "1472", "512", "128K"},
		{"1MiB-64-48-jumbo", "1048576", "40", "1", "64-48", "8972", "64", "2M"},
		{"small-8KiB", "8192", "2000", "2", "64-40", "8972", "4096", "16K"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name, port := testRing(t, "lb"), freePort(t)
			recv, out := startRecv(t, "--ring", name, "--slots", tc.slots, "--slot-size", tc.slotSize, "--hugepages", "off",
				"--log-format", "json", "127.0.0.1:"+port)
			cons := startConsumer(t, name, true)
			stdout, stderr, code := runCmd(t, 60*time.Second, "send", "127.0.0.1:"+port, "--heaps", tc.heaps,
				"--heap-size", tc.heapSize, "--items", tc.items, "--flavour", tc.flavour, "--packet-size", tc.packet,
				"--pattern", "--rate", "1")
			if code != 0 || !strings.HasPrefix(stdout, "sent "+tc.heaps+" heaps") {
				t.Fatalf("send: exit %d, %s %s", code, stdout, stderr)
			}
			m := waitRecv(t, recv, out, 20*time.Second)
			cr := waitConsumer(t, cons)
			n, _ := strconv.ParseUint(tc.heaps, 10, 64)
			if num(m, "heaps") != n || num(m, "incomplete_heaps") != 0 || m["result"] != "stream_stop" {
				t.Errorf("recv counters %v", m)
			}
			if cr.Heaps != n || cr.VerifyErrors != 0 || cr.OutOfOrder != 0 || cr.FirstHeapCnt != 1 || cr.Result != "eos" {
				t.Errorf("consumer %+v", cr)
			}
		})
	}
}

// TestRecvBadInput: each mistake is one clear line on stderr and a non-zero exit, and leaves no ring.
func TestRecvBadInput(t *testing.T) {
	busy, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyPort := strconv.Itoa(busy.LocalAddr().(*net.UDPAddr).Port)
	taken := testRing(t, "taken")
	holder, _ := startRecv(t, "--ring", taken, "--slots", "4", "--slot-size", "4K", "--hugepages", "off", freePort(t))
	defer func() { // a clean stop, so the ring's files go with it
		holder.cmd.Process.Signal(syscall.SIGTERM)
		holder.wait(t, 10*time.Second)
	}()

	name := testRing(t, "bad")
	port := freePort(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "flag provided but not defined"},
		{[]string{"--ring", name, "notaport"}, "not a number"},
		{[]string{"--ring", name, "999.1.1.1:7148"}, "not an IPv4 address"},
		{[]string{"--ring", name, "127.0.0.1:" + busyPort}, "address already in use"},
		{[]string{"--ring", taken, "--hugepages", "off", port}, "in use"},
		{[]string{"--ring", name, "--slot-size", "100", port}, "--slot-size"},
		{[]string{"--ring", name, "--slot-size", "12Q", port}, "not a byte count"},
		{[]string{"--ring", name, "--slots", "3", port}, "power of two"},
		{[]string{"--ring", name, "--max-heaps", "0", port}, "--max-heaps"},
		{[]string{port}, "--ring is required"},
		{[]string{"--ring", name}, "no endpoints"},
		{[]string{"--ring", name, "--policy", "sometimes", port}, "--policy"},
		{[]string{"--ring", name, "--transport", "ibv", port}, "receives multicast only"}, // ibv: full cases in transport_ibv_test.go
		{[]string{"--ring", name, "--transport", "xdp", port}, "--transport xdp needs --interface"},
		{[]string{"--ring", name, "--transport", "xdp", "--interface", "nosuchif0", port}, "not found"},
		{[]string{"--ring", name, "--transport", "xdp", "--interface", "lo", "--xdp-mode", "turbo", port}, "--xdp-mode"},
		{[]string{"--ring", name, "--transport", "xdp", "--interface", "lo", "--zero-copy", "--copy", port}, "exclude each other"},
		{[]string{"--ring", name, "--pcap", "/nonexistent.pcap"}, "no such file"},
		{[]string{"--ring", name, "--interface", "eth0", port}, "--interface"},
		{[]string{"--ring", name, "--interface", "192.0.2.77", "239.1.2.3:" + port}, "no interface has address"},
		{[]string{"--ring", name, "--log-format", "xml", port}, "--log-format"},
		{[]string{"--ring", "bad/name", port}, "--ring"},
		{[]string{"--ring", name, "--chunk-by", "0x1600", port}, "--chunk-by goes with --chunk-heaps"},
		{[]string{"--ring", name, "--consumer-group", "work", port}, "want NAME=UID|@GID"},
		{[]string{"--ring", name, "--consumer-group", "work=@nosuchgroup-xyz", port}, "nosuchgroup-xyz"},
		{[]string{"--ring", name, "--consumer-group", "work=0", "--consumer-group", "work=1", port}, "given twice"},
		{[]string{"--ring", name, "--chunk-heaps", "8", "--chunk-heap-size", "8K", port}, "needs --chunk-by"},
		{[]string{"--ring", name, "--chunk-heaps", "8", "--chunk-by", "0x1600", port}, "needs --chunk-heap-size"},
		{[]string{"--ring", name, "--chunk-heaps", "8", "--chunk-by", "0x1600:0", "--chunk-heap-size", "8K", port}, "positive integer"},
		{[]string{"--ring", name, "--chunk-heaps", "8", "--chunk-by", "zz", "--chunk-heap-size", "8K", port}, "item id"},
		{[]string{"--ring", name, "--chunk-heaps", "8", "--chunk-by", "0x1600", "--chunk-axis", "0x4101", "--chunk-heap-size", "8K", port}, "ITEM:COUNT"},
		{[]string{"--ring", name, "--chunk-heaps", "8", "--chunk-by", "0x1600", "--chunk-heap-size", "8K", "--slot-size", "1M", port}, "--slot-size does not go"},
		{[]string{"--ring", name, "--chunk-heaps", "8", "--chunk-by", "0x1600", "--chunk-heap-size", "8K", "--chunk-window", "0", port}, "--chunk-window"},
		{[]string{"--ring", name, "--chunk-heaps", "4294967295", "--chunk-by", "0x1600", "--chunk-axis", "1:4294967295", "--chunk-heap-size", "1G", port}, "too large"},
	} {
		_, stderr, code := runCmd(t, 20*time.Second, append([]string{"recv"}, tc.args...)...)
		line := strings.TrimSpace(stderr)
		if code == 0 || strings.Contains(line, "\n") || !strings.Contains(line, tc.want) || !strings.HasPrefix(line, "ibvbridge recv: ") {
			t.Errorf("recv %v: exit %d, stderr %q; want one line with %q", tc.args, code, stderr, tc.want)
		}
	}
	if _, err := os.Stat(filepath.Join(ring.DefaultDir(), ring.SocketName(name))); err == nil {
		t.Errorf("a failed recv left ring %s behind", name)
	}
}

func TestSendBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "exactly one destination"},
		{[]string{"nohost:x"}, "not a number"},
		{[]string{"127.0.0.1:9", "--flavour", "64-32"}, "--flavour"},
		{[]string{"127.0.0.1:9", "--heap-size", "0"}, "--heap-size"},
		{[]string{"127.0.0.1:9", "--packet-size", "16"}, "--packet-size"},
		{[]string{"127.0.0.1:9", "--rate", "-1"}, "--rate"},
		{[]string{"127.0.0.1:9", "--items", "0"}, "--items"},
		{[]string{"127.0.0.1:9", "--nope"}, "flag provided but not defined"},
		{[]string{"127.0.0.1:9", "--axis", "0x4101:4"}, "--axis goes with --timestamp-step"},
		{[]string{"127.0.0.1:9", "--timestamp-step", "4096", "--axis", "0x4101"}, "ITEM:COUNT"},
		{[]string{"127.0.0.1:9", "--timestamp-step", "4096", "--axis", "0x1600:4"}, "--timestamp-step/--axis"},
	} {
		_, stderr, code := runCmd(t, 10*time.Second, append([]string{"send"}, tc.args...)...)
		line := strings.TrimSpace(stderr)
		if code == 0 || strings.Contains(line, "\n") || !strings.Contains(line, tc.want) {
			t.Errorf("send %v: exit %d, stderr %q; want one line with %q", tc.args, code, stderr, tc.want)
		}
	}
}

// TestRecvSIGINT: an interrupted recv stops cleanly, prints its final counters and ends the stream for
// its consumer.
func TestRecvSIGINT(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		name, port := testRing(t, "sig"), freePort(t)
		recv, out := startRecv(t, "--ring", name, "--slots", "16", "--slot-size", "64K", "--hugepages", "off",
			"--log-format", "json", "--stats-interval", "50ms", port)
		cons := startConsumer(t, name, false)
		if _, stderr, code := runCmd(t, 20*time.Second, "send", "127.0.0.1:"+port, "--heaps", "10", "--heap-size", "4096", "--no-stop"); code != 0 {
			t.Fatal(stderr)
		}
		time.Sleep(150 * time.Millisecond)
		recv.cmd.Process.Signal(sig)
		m := waitRecv(t, recv, out, 10*time.Second)
		if r := m["result"]; r != "interrupted" {
			t.Errorf("%v: result %v", sig, r)
		}
		if num(m, "heaps") != 10 || num(m, "end_of_stream") != 1 {
			t.Errorf("%v: counters %v", sig, m)
		}
		if !strings.Contains(recv.err.String(), `"message":"stats"`) {
			t.Errorf("no periodic stats line in %s", recv.err.String())
		}
		if cr := waitConsumer(t, cons); cr.Result != "eos" || cr.Heaps != 10 {
			t.Errorf("consumer %+v", cr)
		}
	}
	// A recv that never sees a stop: only the signal ends it.
	name, port := testRing(t, "sig2"), freePort(t)
	recv, out := startRecv(t, "--ring", name, "--slots", "16", "--slot-size", "64K", "--hugepages", "off",
		"--log-format", "json", port)
	recv.cmd.Process.Signal(syscall.SIGINT)
	m := waitRecv(t, recv, out, 10*time.Second)
	if m["result"] != "interrupted" || num(m, "end_of_stream") != 1 {
		t.Errorf("counters %v", m)
	}
	if _, err := os.Stat(filepath.Join(ring.DefaultDir(), ring.SocketName(name))); err == nil {
		t.Error("ring left behind after SIGINT")
	}
}

// TestMulticastNetns runs recv and send on a multicast group inside a private network namespace, so the
// traffic never leaves it.
func TestMulticastNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	ipTool, err := exec.LookPath("ip")
	if err != nil {
		t.Skip("the ip tool (iproute2) is missing")
	}
	ns := fmt.Sprintf("ibvbtest%d", os.Getpid())
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(ipTool, args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	if out, err := exec.Command(ipTool, "netns", "add", ns).CombinedOutput(); err != nil {
		t.Skipf("cannot create a network namespace: %v: %s", err, out)
	}
	defer exec.Command(ipTool, "netns", "del", ns).Run()
	ip("-n", ns, "link", "set", "lo", "up")
	ip("-n", ns, "link", "set", "lo", "multicast", "on")
	ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", "lo")

	name, group := testRing(t, "mcast"), "239.255.14.8:7148"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recv := exec.CommandContext(ctx, ipTool, "netns", "exec", ns, binary(t), "recv", "--ring", name, "--slots", "64",
		"--slot-size", "64K", "--hugepages", "off", "--log-format", "json", "--interface", "127.0.0.1", group)
	var out, errb bytes.Buffer
	recv.Stdout, recv.Stderr = &out, &errb
	if err := recv.Start(); err != nil {
		t.Fatal(err)
	}
	if !testutil.WaitFor(10*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(ring.DefaultDir(), ring.SocketName(name)))
		return err == nil
	}) {
		t.Fatalf("recv in the namespace: %s", errb.String())
	}
	cons := startConsumer(t, name, true) // the ring is shared memory: the consumer needs no namespace
	send := exec.CommandContext(ctx, ipTool, "netns", "exec", ns, binary(t), "send", group, "--heaps", "200",
		"--heap-size", "16384", "--items", "2", "--pattern", "--ttl", "1", "--interface", "127.0.0.1", "--rate", "0.5")
	if b, err := send.CombinedOutput(); err != nil {
		t.Fatalf("send in the namespace: %v: %s", err, b)
	}
	if err := recv.Wait(); err != nil {
		t.Fatalf("recv: %v: %s", err, errb.String())
	}
	m := finalCounters(t, out.String())
	if num(m, "heaps") != 200 || num(m, "incomplete_heaps") != 0 || m["result"] != "stream_stop" {
		t.Errorf("counters %v", m)
	}
	if cr := waitConsumer(t, cons); cr.Heaps != 200 || cr.VerifyErrors != 0 {
		t.Errorf("consumer %+v", cr)
	}
}

// TestBenchUDPShort runs the loopback benchmark once, tiny, to keep it working.
func TestBenchUDPShort(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	stdout, stderr, code := runCmd(t, 90*time.Second, "bench", "udp", "--heap-sizes", "8K", "--bytes", "2M",
		"--runs", "2", "--consumer", "go", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var res struct {
		Sizes []bench.UDPSize `json:"sizes"`
	}
	if err := json.Unmarshal(bench.LastLine([]byte(stdout)), &res); err != nil || len(res.Sizes) != 1 || len(res.Sizes[0].Runs) == 0 {
		t.Fatalf("output %q: %v", stdout, err)
	}
}

func TestParseByteSize(t *testing.T) {
	for in, want := range map[string]int{"4096": 4096, "64K": 64 << 10, "4M": 4 << 20, "4MiB": 4 << 20, "1g": 1 << 30, "8KB": 8 << 10} {
		if got, err := parseByteSize(in); err != nil || got != want {
			t.Errorf("%q: %d, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "x", "-1", "4T", "1.5M"} {
		if _, err := parseByteSize(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

func TestParseInterspersed(t *testing.T) {
	fs := newFlagSet("x", io.Discard)
	n := fs.Int("n", 0, "")
	pos, err := parseInterspersed(fs, []string{"a", "--n", "3", "b", "--", "--n"})
	if err != nil || *n != 3 || !slices.Equal(pos, []string{"a", "b", "--n"}) {
		t.Errorf("pos %v n %d err %v", pos, *n, err)
	}
}

// TestSendSpreadThreads: send spreads a stream over two destinations on two threads (heap k to
// destination (k-1) mod 2, as spead2_send), recv takes both on two threads, and the consumer gets every
// heap exactly once, every byte checked.
func TestSendSpreadThreads(t *testing.T) {
	name, p1, p2 := testRing(t, "spread"), freePort(t), freePort(t)
	recv, out := startRecv(t, "--ring", name, "--slots", "1024", "--slot-size", "64K", "--hugepages", "off",
		"--threads", "2", "--max-heaps", "16", "--log-format", "json", "127.0.0.1:"+p1, "127.0.0.1:"+p2)
	cons := startConsumer(t, name, true)
	stdout, stderr, code := runCmd(t, 60*time.Second, "send", "127.0.0.1:"+p1, "127.0.0.1:"+p2, "--threads", "2",
		"--heaps", "600", "--heap-size", "32768", "--packet-size", "8972", "--pattern", "--rate", "0.5")
	if code != 0 || !strings.HasPrefix(stdout, "sent 600 heaps") {
		t.Fatalf("send: exit %d, %s %s", code, stdout, stderr)
	}
	m := waitRecv(t, recv, out, 20*time.Second)
	cr := waitConsumer(t, cons)
	if num(m, "heaps") != 600 || num(m, "incomplete_heaps") != 0 || m["result"] != "stream_stop" || num(m, "packets_after_stop") != 0 {
		t.Errorf("recv counters %v", m)
	}
	if cr.Heaps != 600 || cr.VerifyErrors != 0 || cr.Result != "eos" {
		t.Errorf("consumer %+v", cr)
	}
	_, stderr, code = runCmd(t, 10*time.Second, "send", "127.0.0.1:"+p1, "--threads", "2")
	if code == 0 || !strings.Contains(stderr, "--threads 2: want 1..1") {
		t.Errorf("--threads beyond the destinations: exit %d, %q", code, stderr)
	}
}

// TestSendRecvDefaultsFit: `send` with its defaults into `recv` with its defaults (the README's first
// commands) delivers every heap whole: send's heaps fit recv's slots and its pace recv's socket buffer.
func TestSendRecvDefaultsFit(t *testing.T) {
	name, port := testRing(t, "defaults"), freePort(t)
	recv, out := startRecv(t, "--ring", name, "--log-format", "json", "127.0.0.1:"+port)
	cons := startConsumer(t, name, false)
	stdout, stderr, code := runCmd(t, 60*time.Second, "send", "127.0.0.1:"+port, "--heaps", "60")
	if code != 0 || !strings.HasPrefix(stdout, "sent 60 heaps") {
		t.Fatalf("send: exit %d, %s %s", code, stdout, stderr)
	}
	m := waitRecv(t, recv, out, 30*time.Second)
	cr := waitConsumer(t, cons)
	if num(m, "heaps") != 60 || num(m, "truncated_heaps") != 0 || num(m, "incomplete_heaps") != 0 || m["result"] != "stream_stop" {
		t.Errorf("recv counters %v", m)
	}
	if cr.Heaps != 60 || cr.Bytes != 60<<20 || cr.Result != "eos" {
		t.Errorf("consumer %+v", cr)
	}
}

// TestRecvSurvivesItsLogPipeClosing: `recv ... 2>&1 | head` — the reader of recv's log goes away. recv
// neither dies of SIGPIPE nor stops receiving; a SIGTERM later still stops it cleanly, removing its socket
// and lock file (before, SIGPIPE killed it and left both behind).
func TestRecvSurvivesItsLogPipeClosing(t *testing.T) {
	dir := t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary(t), "recv", "--ring", "piped", "--dir", dir, "--slots", "4", "--slot-size", "4K",
		"--hugepages", "off", "--stats-interval", "20ms", freePort(t))
	cmd.Stderr = w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	sock := filepath.Join(dir, ring.SocketName("piped"))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("recv did not create its ring")
		}
	}
	r.Close()                          // what head does after its lines
	time.Sleep(200 * time.Millisecond) // ten stats lines written into the closed pipe
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ProcessState.Sys().(syscall.WaitStatus).Signaled() {
		t.Fatalf("recv died of %v once its log pipe closed", ee.ProcessState.Sys().(syscall.WaitStatus).Signal())
	}
	for _, f := range []string{sock, filepath.Join(dir, "piped.v2.lock")} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("%s left behind", f)
		}
	}
}
