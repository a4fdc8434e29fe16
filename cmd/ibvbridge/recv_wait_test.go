package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/frame/frametest"
)

// A block-policy replay keeps its ring open for an attached consumer; with nobody attached it says how
// many heaps nobody read instead of waiting forever, and --wait-consumer bounds the wait for a reader.
func TestRecvReplayWithoutConsumer(t *testing.T) {
	file := filepath.Join(frametest.Dir(t), "large_1MiB_p1472.pcap")
	stdout, stderr, code := runCmd(t, 30*time.Second, "recv", "--ring", testRing(t, "nocons"), "--pcap", file,
		"--slots", "8", "--slot-size", "2M", "--hugepages", "off", "--log-format", "json")
	if code != 0 || !strings.Contains(stderr, "closing the ring with heaps no consumer read") || !strings.Contains(stdout, `"heaps":2`) {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, stdout, stderr)
	}
	_, stderr, code = runCmd(t, 30*time.Second, "recv", "--ring", testRing(t, "waitcons"), "--pcap", file,
		"--slots", "8", "--slot-size", "2M", "--hugepages", "off", "--wait-consumer", "200ms")
	if code == 0 || !strings.Contains(stderr, "no consumer attached") || strings.Count(strings.TrimSpace(stderr), "\n") > 1 {
		t.Fatalf("--wait-consumer with nobody: exit %d, stderr %s", code, stderr)
	}
}

// A consumer that reads every heap of a replay and leaves gets no "heaps no consumer read" warning at the
// end (layout 2.1 §D: the detach reads its final cursor; the warning used to count head − oldest).
func TestRecvNoFalseUnreadWarning(t *testing.T) {
	file := filepath.Join(frametest.Dir(t), "large_1MiB_p1472.pcap")
	name := testRing(t, "allread")
	c := startProc(t, "consume", "--ring", name, "--wait", "--timeout-ms", "20000")
	_, stderr, code := runCmd(t, 30*time.Second, "recv", "--ring", name, "--pcap", file, "--policy", "block",
		"--slots", "8", "--slot-size", "2M", "--hugepages", "off", "--wait-consumer", "20s", "--log-format", "json")
	if cc := c.wait(t, 30*time.Second); cc != 0 || !strings.Contains(c.out.String(), `"heaps":2`) {
		t.Fatalf("consumer: exit %d: %s %s", cc, c.out.String(), c.err.String())
	}
	if code != 0 || strings.Contains(stderr, "no consumer read") {
		t.Fatalf("recv: exit %d, stderr %s", code, stderr)
	}
}
