// Package ringtest makes rings for tests, as nltest does netlink sockets: a producer in a directory of
// the test's own, closed when the test ends, and consumers attached to it. It is exported so that users'
// Go consumers can test against a real ring with it.
package ringtest

import (
	"testing"

	"github.com/ibvbridge/ibvbridge/ring"
)

// New creates ring name for tb and closes it with tb.Cleanup. Unset fields of cfg get small test values:
// Dir a fresh tb.TempDir() (removed with the test), 8 slots of 4096 bytes (a chunk ring's size
// follows its geometry). HugePages is as given (the
// zero value uses hugepages when the host has them, as a real ring does; HugePagesOff to not).
func New(tb testing.TB, name string, cfg ring.Config) *ring.Producer {
	tb.Helper()
	if cfg.Dir == "" {
		cfg.Dir = tb.TempDir()
	}
	if cfg.SlotCount == 0 {
		cfg.SlotCount = 8
	}
	if cfg.SlotSize == 0 && cfg.Chunks.Heaps == 0 { // a chunk ring derives its slot size
		cfg.SlotSize = 4096
	}
	p, err := ring.Create(name, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.Close() })
	return p
}

// Attach attaches a consumer to ring name (opt.Dir says where: a producer's Dir()) and detaches it with
// tb.Cleanup.
func Attach(tb testing.TB, name string, opt ring.AttachOptions) *ring.Consumer {
	tb.Helper()
	c, err := ring.Attach(name, opt)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// Pair is New and one consumer attached to it with opt (opt.Dir is the ring's).
func Pair(tb testing.TB, name string, cfg ring.Config, opt ring.AttachOptions) (*ring.Producer, *ring.Consumer) {
	tb.Helper()
	p := New(tb, name, cfg)
	opt.Dir = p.Dir()
	return p, Attach(tb, name, opt)
}
