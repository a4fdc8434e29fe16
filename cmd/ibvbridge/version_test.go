package main

import (
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/internal/version"
)

// TestVersionAndStatSayWhatRuns: `ibvbridge --version` prints ibvbridge's version and the ring layout;
// `stat` of a ring recv serves says which program and version produce it (header producer_version).
func TestVersionAndStatSayWhatRuns(t *testing.T) {
	out, _, code := runCmd(t, 10*time.Second, "--version")
	if code != 0 || !strings.HasPrefix(out, "ibvbridge "+version.Version+" (ring layout 2.") {
		t.Fatalf("--version: exit %d, %q", code, out)
	}
	name := testRing(t, "ver")
	recv, _ := startRecv(t, "--ring", name, "--slots", "8", "--slot-size", "4K", "--hugepages", "off", "127.0.0.1:"+freePort(t))
	defer recv.cmd.Process.Kill()
	out, errs, code := runCmd(t, 10*time.Second, "stat", name)
	if code != 0 || !strings.Contains(out, "ibvbridge recv "+version.Version) {
		t.Fatalf("stat: exit %d, %q %s; want the producer's version", code, out, errs)
	}
}
