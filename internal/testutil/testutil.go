// Package testutil owns the helpers ibvbridge's tests share: network namespaces with a veth pair, free
// loopback ports, unique ring names, a recording packet sink, bounded waits, and the chunk placement
// example plug-in built for a test. Each takes testing.TB and cleans up with t.Cleanup, so a test cannot
// leave a namespace or a ring behind.
package testutil

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/internal/testnet"
	"github.com/ibvbridge/ibvbridge/ring"
)

var seq atomic.Int64

// RequireNetns skips the test, saying why, unless it can create network namespaces (root, ip tool).
func RequireNetns(t testing.TB) {
	t.Helper()
	if err := testnet.Available(); err != nil {
		t.Skip(err)
	}
}

// VethPair makes two network namespaces joined by a veth pair (testnet.NewVethPair), removed when the
// test ends. Empty names and addresses get defaults: interfaces ta<n>/tb<n>, 10.199.<n%250>.1 and .2.
func VethPair(t testing.TB, cfg testnet.VethConfig) *testnet.VethPair {
	t.Helper()
	RequireNetns(t)
	n := seq.Add(1)
	if cfg.Prefix == "" {
		cfg.Prefix = fmt.Sprintf("ibvb-t%d-%d", os.Getpid(), n)
	}
	if cfg.RecvIf == "" {
		cfg.RecvIf, cfg.SendIf = fmt.Sprintf("ta%d", n), fmt.Sprintf("tb%d", n)
	}
	if !cfg.RecvAddr.IsValid() {
		cfg.RecvAddr = netip.AddrFrom4([4]byte{10, 199, byte(n % 250), 1})
		cfg.SendAddr = netip.AddrFrom4([4]byte{10, 199, byte(n % 250), 2})
	}
	p, err := testnet.NewVethPair(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Remove)
	return p
}

// FreeUDPPort is a free port on 127.0.0.1.
func FreeUDPPort(t testing.TB) int {
	t.Helper()
	p, err := testnet.FreeUDPPort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// UniqueRing is a ring name no other test (or test process) uses; what is left of the ring is removed
// when the test ends.
func UniqueRing(t testing.TB, tag string) string {
	name := fmt.Sprintf("t%d-%s-%d", os.Getpid(), tag, seq.Add(1))
	t.Cleanup(func() { ring.Remove("", name) })
	return name
}

// WaitFor polls ok every 2 ms until it holds or d passes; it reports whether it held.
func WaitFor(d time.Duration, ok func() bool) bool {
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

// RecordingSink is a transport.Sink that counts what a source delivers and, with Keep, keeps a copy of
// every packet. A source calls Packet from its goroutine while the test reads from another; without Keep
// it takes no lock, so it can sit under a benchmark.
type RecordingSink struct {
	Keep bool

	n, bytes  atomic.Uint64
	lastNanos atomic.Int64
	mu        sync.Mutex
	pkts      [][]byte
	arrived   chan struct{}
}

// NewRecordingSink makes a sink; keep keeps a copy of every packet.
func NewRecordingSink(keep bool) *RecordingSink {
	return &RecordingSink{Keep: keep, arrived: make(chan struct{}, 1)}
}

// Packet implements transport.Sink.
func (s *RecordingSink) Packet(p []byte, recvNanos int64) {
	if s.Keep {
		s.mu.Lock()
		s.pkts = append(s.pkts, append([]byte(nil), p...))
		s.mu.Unlock()
	}
	s.bytes.Add(uint64(len(p)))
	s.lastNanos.Store(recvNanos)
	s.n.Add(1)
	select {
	case s.arrived <- struct{}{}:
	default:
	}
}

// Count is the packets delivered so far.
func (s *RecordingSink) Count() int { return int(s.n.Load()) }

// Bytes is the payload bytes delivered so far.
func (s *RecordingSink) Bytes() uint64 { return s.bytes.Load() }

// LastNanos is the receive time the source gave the latest packet.
func (s *RecordingSink) LastNanos() int64 { return s.lastNanos.Load() }

// Packets returns the kept packets (Keep), in arrival order.
func (s *RecordingSink) Packets() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]byte(nil), s.pkts...)
}

// WaitCount waits until n packets arrived or timeout passed; it reports whether they did. It allocates
// one timer, whatever the wait, so it can sit inside an allocation count.
func (s *RecordingSink) WaitCount(n int, timeout time.Duration) bool {
	if s.Count() >= n {
		return true
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for s.Count() < n {
		select {
		case <-s.arrived: // Packet signals after counting: no arrival is missed between check and wait
		case <-deadline.C:
			return s.Count() >= n
		}
	}
	return true
}

// ChunkPlaceExample builds examples/chunk_place/place.c (recv --chunk-place's example plug-in) into a
// shared object in a test directory and returns its path. Without a C compiler it skips, saying why,
// unless IBVBRIDGE_REQUIRE_CLIENTS is set (make test, whose setup installs gcc): then it fails.
func ChunkPlaceExample(t testing.TB) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		if os.Getenv("IBVBRIDGE_REQUIRE_CLIENTS") != "" {
			t.Fatalf("no C compiler to build the chunk placement example: %v", err)
		}
		t.Skipf("no C compiler to build the chunk placement example (apt-get install gcc): %v", err)
	}
	_, self, _, _ := runtime.Caller(0) // internal/testutil/testutil.go
	root := filepath.Join(filepath.Dir(self), "..", "..")
	out := filepath.Join(t.TempDir(), "place.so")
	cmd := exec.Command(cc, "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-I", filepath.Join(root, "clients", "c"),
		"-o", out, filepath.Join(root, "examples", "chunk_place", "place.c"))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the chunk placement example: %v\n%s", err, b)
	}
	return out
}
