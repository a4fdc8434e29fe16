package main

import (
	"syscall"
	"testing"
	"time"
)

// TestSendRing chains recv (ring A) → send --ring A → recv (ring B) → a verifying consumer: every heap
// arrives in ring B byte for byte (the pattern checks each byte, the counters match ring A's), and ring
// A's end of stream ends ring B's stream.
func TestSendRing(t *testing.T) {
	a, b := testRing(t, "relay-a"), testRing(t, "relay-b")
	portA, portB := freePort(t), freePort(t)
	geometry := []string{"--slots", "512", "--slot-size", "80K", "--hugepages", "off", "--log-format", "json"}
	recvA, outA := startRecv(t, append(append([]string{"--ring", a}, geometry...), "127.0.0.1:"+portA)...)
	recvB, outB := startRecv(t, append(append([]string{"--ring", b}, geometry...), "127.0.0.1:"+portB)...)
	cons := startConsumer(t, b, true)
	relay := startProc(t, "send", "--ring", a, "127.0.0.1:"+portB, "--packet-size", "8972", "--rate", "2")
	if _, stderr, code := runCmd(t, 60*time.Second, "send", "127.0.0.1:"+portA, "--heaps", "500", "--heap-size", "64K",
		"--items", "3", "--pattern", "--packet-size", "8972", "--rate", "1"); code != 0 {
		t.Fatalf("send: exit %d: %s", code, stderr)
	}
	ma := waitRecv(t, recvA, outA, 30*time.Second)
	if code := relay.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("send --ring: exit %d: %s", code, relay.err.String())
	}
	mb := waitRecv(t, recvB, outB, 30*time.Second)
	for _, k := range []string{"heaps", "packets", "bytes"} {
		if num(ma, k) != num(mb, k) || num(mb, "incomplete_heaps") != 0 {
			t.Errorf("%s: ring A %d, ring B %d (incomplete in B %d)", k, num(ma, k), num(mb, k), num(mb, "incomplete_heaps"))
		}
	}
	if mb["result"] != "stream_stop" || num(mb, "heaps") != 500 {
		t.Errorf("ring B: %v", mb)
	}
	if cr := waitConsumer(t, cons); cr.Heaps != 500 || cr.VerifyErrors != 0 || cr.Result != "eos" {
		t.Errorf("consumer of ring B: %+v", cr)
	}
}

// Ctrl-C on send --ring waiting on an idle ring stops it at once, and the receiver downstream still gets
// the stream's end.
func TestSendRingInterrupted(t *testing.T) {
	a, b := testRing(t, "relay-ia"), testRing(t, "relay-ib")
	portB := freePort(t)
	geometry := []string{"--slots", "16", "--slot-size", "8K", "--hugepages", "off", "--log-format", "json"}
	recvA, _ := startRecv(t, append(append([]string{"--ring", a}, geometry...), "127.0.0.1:"+freePort(t))...)
	recvB, outB := startRecv(t, append(append([]string{"--ring", b}, geometry...), "127.0.0.1:"+portB)...)
	relay := startProc(t, "send", "--ring", a, "127.0.0.1:"+portB)
	time.Sleep(500 * time.Millisecond)
	relay.cmd.Process.Signal(syscall.SIGINT)
	if code := relay.wait(t, 5*time.Second); code != 0 {
		t.Errorf("send --ring after SIGINT: exit %d: %s", code, relay.err.String())
	}
	if m := waitRecv(t, recvB, outB, 10*time.Second); m["result"] != "stream_stop" {
		t.Errorf("downstream recv: %v, want the stream stopped", m)
	}
	recvA.cmd.Process.Signal(syscall.SIGTERM)
	recvA.wait(t, 10*time.Second)
	// --ring with the generator's flags is a mistake, said in one line.
	if _, stderr, code := runCmd(t, 5*time.Second, "send", "--ring", a, "--heaps", "5", "127.0.0.1:9"); code != 2 {
		t.Errorf("--ring with --heaps: exit %d: %s", code, stderr)
	}
}

// consume --verify checks a --pattern --descriptors stream without a false error on the heap that carries
// the descriptors (they follow the pattern bytes in its payload).
func TestVerifyWithDescriptors(t *testing.T) {
	name, port := testRing(t, "vdesc"), freePort(t)
	recv, out := startRecv(t, "--ring", name, "--slots", "64", "--slot-size", "80K", "--hugepages", "off",
		"--log-format", "json", "127.0.0.1:"+port)
	cons := startConsumer(t, name, true)
	if _, stderr, code := runCmd(t, 30*time.Second, "send", "127.0.0.1:"+port, "--heaps", "20", "--heap-size", "64K",
		"--items", "3", "--pattern", "--descriptors", "--rate", "0.5", "--packet-size", "8972"); code != 0 {
		t.Fatalf("send: %s", stderr)
	}
	waitRecv(t, recv, out, 30*time.Second)
	if cr := waitConsumer(t, cons); cr.Heaps != 20 || cr.VerifyErrors != 0 {
		t.Errorf("consumer %+v: want 20 heaps, no verify errors", cr)
	}
}
