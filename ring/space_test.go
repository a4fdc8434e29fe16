package ring_test

import (
	"errors"
	"os"
	"regexp"
	"testing"

	"github.com/ibvbridge/ibvbridge/ring"
)

// A ring larger than the memory the system can give it is refused when it is created, with one error
// naming the sizes, before any page is touched — no SIGBUS later, no OOM killer, nothing left behind.
func TestRingLargerThanMemoryIsRefused(t *testing.T) {
	dir := t.TempDir()
	_, err := ring.Create("big", ring.Config{Dir: dir, SlotCount: 1 << 14, SlotSize: 4 << 20, HugePages: ring.HugePagesOff})
	if !errors.Is(err, ring.ErrNoSpace) || !regexp.MustCompile(`needs 655\d\d MiB .* \d+ MiB are available`).MatchString(err.Error()) {
		t.Fatalf("err %v, want ErrNoSpace naming both sizes", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("a refused ring left %v", left)
	}
	p, err := ring.Create("small", ring.Config{Dir: dir, SlotCount: 4, SlotSize: 64 << 10, HugePages: ring.HugePagesOff})
	if err != nil {
		t.Fatalf("a ring that fits: %v", err)
	}
	p.Close()
}
