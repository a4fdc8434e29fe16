package main

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/ringtest"
)

// udpSink listens on a loopback port and reports how many datagrams reached it within d.
func udpSink(t *testing.T) (*net.UDPConn, string) {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, "127.0.0.1:" + strconv.Itoa(c.LocalAddr().(*net.UDPAddr).Port)
}

func datagrams(c *net.UDPConn, d time.Duration) int {
	buf := make([]byte, 65536)
	n := 0
	for {
		_ = c.SetReadDeadline(time.Now().Add(d))
		if _, err := c.Read(buf); err != nil {
			return n
		}
		n++
	}
}

func TestSendWaitRingSendsNothingUntilAConsumerIsAttached(t *testing.T) {
	binary(t) // built before the timed runs
	name := testRing(t, "waitring")
	p := ringtest.New(t, name, ring.Config{})
	sink, dest := udpSink(t)

	_, errb, code := runCmd(t, 20*time.Second, "send", dest, "--heaps", "3", "--heap-size", "1K",
		"--wait-ring", name, "--wait-dir", p.Dir(), "--wait-timeout", "300ms")
	if code == 0 || !strings.Contains(errb, "0 of 1 consumers attached") {
		t.Fatalf("with no consumer: exit %d, stderr %q; want a failure naming the missing consumer", code, errb)
	}
	if n := datagrams(sink, 200*time.Millisecond); n != 0 {
		t.Fatalf("%d datagrams sent before any consumer attached", n)
	}

	ringtest.Attach(t, name, ring.AttachOptions{Dir: p.Dir()})
	if _, errb, code = runCmd(t, 20*time.Second, "send", dest, "--heaps", "3", "--heap-size", "1K",
		"--wait-ring", name, "--wait-dir", p.Dir(), "--wait-timeout", "10s"); code != 0 {
		t.Fatalf("with a consumer attached: exit %d, stderr %q", code, errb)
	}
	if n := datagrams(sink, 500*time.Millisecond); n < 4 { // three heaps and the stream stop
		t.Fatalf("%d datagrams after the consumer attached, want at least 4", n)
	}
}

func TestSendWaitRingNamesAMissingRing(t *testing.T) {
	binary(t)
	_, dest := udpSink(t)
	_, errb, code := runCmd(t, 20*time.Second, "send", dest, "--heaps", "1", "--wait-ring", "no-such-ring",
		"--wait-dir", t.TempDir(), "--wait-timeout", "100ms")
	if code == 0 || !strings.Contains(errb, "ring no-such-ring not found") {
		t.Fatalf("exit %d, stderr %q", code, errb)
	}
}
