package ringtest_test

import (
	"os"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/ringtest"
)

// Pair gives a working ring in the test's own directory, and the test's cleanup removes all of it.
func TestPairRoundTripAndCleanup(t *testing.T) {
	var dir string
	t.Run("ring", func(t *testing.T) {
		p, c := ringtest.Pair(t, "rt", ring.Config{HugePages: ring.HugePagesOff}, ring.AttachOptions{})
		dir = p.Dir()
		s, err := p.Acquire()
		if err != nil {
			t.Fatal(err)
		}
		copy(s.Payload, "hello")
		p.Publish(s, ring.HeapInfo{HeapCnt: 7, Received: 5, Flags: ring.FlagComplete})
		h, err := c.Next(time.Second)
		if err != nil || h.HeapCnt != 7 || string(h.Payload) != "hello" || !c.Valid(h) {
			t.Fatalf("%+v %v", h, err)
		}
		if g := p.Geometry(); g.SlotCount != 8 || g.SlotSize != 4096 || p.Huge() {
			t.Fatalf("geometry %+v huge %v, want 8 × 4096 without hugepages", g, p.Huge())
		}
	})
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("ring directory %s outlived its test: %v", dir, err)
	}
}
