package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/internal/testutil"
	"github.com/ibvbridge/ibvbridge/ring"
)

// Inputs an adversarial audit found mishandled: each must give one clear line and a usage exit status,
// never a panic, a silent success or a flag ignored.
func TestAuditedBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"consume", "--ring", "X", "--hold", "-2"}, "--hold"},
		{[]string{"consume", "--ring", "X", "extra", "--timeout-ms", "300"}, `unexpected argument "extra"`},
		{[]string{"send", "127.0.0.1:9", "--rate", "NaN"}, "--rate"},
		{[]string{"send", "127.0.0.1:9", "--rate", "+Inf"}, "--rate"},
		{[]string{"bench", "xdp", "--runs", "0"}, "runs must be positive"},
		{[]string{"bench", "udp", "--runs", "0"}, "runs must be positive"},
		{[]string{"bench", "udp", "--packet-size", "1"}, "packet size 1"},
		{[]string{"bench", "ring", "--heap-size", "64", "stray"}, `unexpected argument "stray"`},
		{[]string{"recv", "--ring", "obs", "--max-observers", "0", "17997"}, "--max-observers"},
		// The ring's size overflows 64 bits (it used to wrap, map 1.5 GiB and panic in bindShared).
		{[]string{"recv", "--ring", "ovf", "--slots", "16777216", "--slot-size", "1099511627776", "--max-items", "1", "--hugepages", "off", "17998"}, "overflows"},
		{[]string{"recv", "--ring", "cpuprof", "--cpuprofile", "/nonexistent/dir/p.prof", "--hugepages", "off", "17999"}, "--cpuprofile"},
	} {
		_, stderr, code := runCmd(t, 20*time.Second, tc.args...)
		line := strings.TrimSpace(stderr)
		if code == 0 || strings.Contains(line, "\n") || !strings.Contains(line, tc.want) || strings.Contains(stderr, "panic") {
			t.Errorf("%v: exit %d, stderr %q; want one line with %q", tc.args, code, stderr, tc.want)
		}
	}
	// --cpuprofile fails before anything is opened: no ring was made.
	if _, err := os.Stat(filepath.Join(ring.DefaultDir(), ring.SocketName("cpuprof"))); err == nil {
		ring.Remove("", "cpuprof")
		t.Error("recv with a bad --cpuprofile created its ring")
	}
	// bench --help is help, not an unknown benchmark.
	if _, stderr, code := runCmd(t, 5*time.Second, "bench", "--help"); code != 0 || !strings.Contains(stderr, "usage: ibvbridge bench") {
		t.Errorf("bench --help: exit %d, stderr %q", code, stderr)
	}
}

// A paced send at a rate that would take forever stops at once on SIGINT and SIGTERM (it used to need
// kill -9), and still sends its stream-stop heap.
func TestSendStopsOnSignalWhilePacing(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		p := startProc(t, "send", "127.0.0.1:"+freePort(t), "--rate", "1e-12", "--heaps", "100", "--heap-size", "8K")
		time.Sleep(300 * time.Millisecond) // the first batch is out; the second waits for its time
		start := time.Now()
		p.cmd.Process.Signal(sig)
		code := p.wait(t, 10*time.Second)
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("%v: send took %v to stop", sig, d)
		}
		if code < 0 {
			t.Errorf("%v: send did not exit", sig)
		}
	}
}

// bench udp with an option that fails after recv started leaves no ring behind; bench ring stopped by
// SIGTERM removes its ring.
func TestBenchLeavesNoRing(t *testing.T) {
	socks := func() []string {
		m, _ := filepath.Glob(filepath.Join(ring.DefaultDir(), "bench-*"+ring.SocketName("")))
		return m
	}
	before := socks()
	hugeBefore := hugePagesFree()
	p := startProc(t, "bench", "ring", "--consumer", "go", "--heap-size", "64", "--heaps", "200000000", "--idle", "0")
	var made string
	if !testutil.WaitFor(20*time.Second, func() bool {
		for _, f := range socks() {
			if !contains(before, f) {
				made = f
				return true
			}
		}
		return false
	}) {
		t.Fatalf("bench ring made no ring: %s", p.err.String())
	}
	time.Sleep(200 * time.Millisecond)
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.wait(t, 20*time.Second)
	base := strings.TrimSuffix(made, ring.SocketName(""))
	for _, f := range []string{made, base + ".v2.lock"} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("bench ring left %s after SIGTERM", f)
		}
	}
	// Other test packages may hold hugepages meanwhile: bench ring's must come back, within 5 s.
	testutil.WaitFor(5*time.Second, func() bool { return hugePagesFree() >= hugeBefore })
	if got := hugePagesFree(); got < hugeBefore {
		t.Errorf("free hugepages %d after bench ring, %d before: its memory outlived it", got, hugeBefore)
	}
}

// hugePagesFree is the count of free default-size hugepages.
func hugePagesFree() int {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "HugePages_Free:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
