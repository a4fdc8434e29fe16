package testenv

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestAppearedNamesOnlyThisProcesssNewEntries: what was there before, and what another process made, is
// not ours to judge; a new entry naming our pid is.
func TestAppearedNamesOnlyThisProcesssNewEntries(t *testing.T) {
	before := map[string]bool{"/run/ibvbridge/old-7.v2.sock": true}
	after := map[string]bool{"/run/ibvbridge/old-7.v2.sock": true, "/run/ibvbridge/x-7.v2.sock": true,
		"/run/ibvbridge/other-9.v2.sock": true}
	if got := appeared(before, after, "7"); len(got) != 1 || got[0] != "/run/ibvbridge/x-7.v2.sock" {
		t.Errorf("appeared: %v", got)
	}
}

// TestWatchSeesACreationEvenIfRemoved: an entry made and removed again in a watched directory is still
// reported (a test that creates in the machine's directory and cleans up has still written there). The
// directory watched here is the test's own.
func TestWatchSeesACreationEvenIfRemoved(t *testing.T) {
	dir := t.TempDir()
	pid := strconv.Itoa(os.Getpid())
	w := watch(pid, []string{dir})
	if w == nil {
		t.Skip("no inotify")
	}
	os.WriteFile(filepath.Join(dir, "other"), nil, 0o600) // not naming the pid: not ours to report
	p := filepath.Join(dir, "ring-"+pid+".v2.sock")
	if err := os.Mkdir(p, 0o700); err != nil {
		t.Fatal(err)
	}
	os.Remove(p)
	time.Sleep(150 * time.Millisecond)
	if got := w.stop(); len(got) != 1 || got[0] != p {
		t.Errorf("watch saw %v, want %s", got, p)
	}
}
