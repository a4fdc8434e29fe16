package ring_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/ibvbridge/ibvbridge/ring"
)

// A ring larger than its tmpfs has room for is refused when it is created, with one error naming the
// sizes, and leaves no file behind — before the fix, populating stopped quietly when the filesystem
// filled and the first touch past that point killed the producer with SIGBUS.
func TestRingLargerThanTmpfsIsRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", dir).Run() })
	_, err := ring.Create("big", ring.Config{Dir: dir, SlotCount: 64, SlotSize: 1 << 20, HugePages: ring.HugePagesOff})
	if !errors.Is(err, ring.ErrNoSpace) {
		t.Fatalf("err %v, want ErrNoSpace", err)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "ibvbridge.big.*.dat"))
	if len(left) != 0 {
		t.Errorf("a refused ring left %v", left)
	}
	p, err := ring.Create("small", ring.Config{Dir: dir, SlotCount: 4, SlotSize: 64 << 10, HugePages: ring.HugePagesOff})
	if err != nil {
		t.Fatalf("a ring that fits: %v", err)
	}
	p.Close()
}
