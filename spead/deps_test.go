package spead_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The wire format stands alone: package spead depends on nothing of the ring's, directly or through
// another package (assembling heaps into the ring is spead/assemble's), so a program that only decodes or
// sends SPEAD does not link the ring.
func TestWireFormatDoesNotDependOnTheRing(t *testing.T) {
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := exec.LookPath(goTool); err != nil {
		t.Skipf("no go tool to list the dependencies with: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 2 || deps[len(deps)-1] != "github.com/ibvbridge/ibvbridge/spead" {
		t.Fatalf("go list -deps gave no dependency list for spead: %q", out)
	}
	for _, d := range deps {
		if d == "github.com/ibvbridge/ibvbridge/ring" || strings.HasPrefix(d, "github.com/ibvbridge/ibvbridge/ring/") {
			t.Fatalf("package spead depends on %s", d)
		}
	}
}
