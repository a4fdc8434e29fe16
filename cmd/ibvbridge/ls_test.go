package main

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

func createRing(t *testing.T, dir, name string) *ring.Producer {
	t.Helper()
	p, err := ring.Create(name, ring.Config{Dir: dir, SlotCount: 16, SlotSize: 4096, HugePages: ring.HugePagesOff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// leaveStale leaves what kill -9 of a producer leaves of ring name: a socket nobody serves and a lock file.
func leaveStale(t *testing.T, dir, name string) {
	t.Helper()
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: filepath.Join(dir, ring.SocketName(name)), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	if err := os.WriteFile(filepath.Join(dir, name+".v2.lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// ls lists live and stale rings; rm --stale removes only what nobody holds; rm refuses a live ring.
func TestLsAndRm(t *testing.T) {
	dir := t.TempDir()
	createRing(t, dir, "live")
	createRing(t, dir, "clean").Close() // a clean stop leaves nothing
	leaveStale(t, dir, "gone")
	stdout, stderr, code := runCmd(t, 10*time.Second, "ls", "--dir", dir, "--json", "--interval", "0")
	if code != 0 {
		t.Fatalf("ls: exit %d: %s", code, stderr)
	}
	var entries []lsEntry
	if err := json.Unmarshal([]byte(stdout), &entries); err != nil {
		t.Fatalf("ls --json: %v: %q", err, stdout)
	}
	states := map[string]string{}
	for _, e := range entries {
		states[e.Name] = e.State
		if e.Name == "live" && (!e.ProducerAlive || e.ProducerPID != uint64(os.Getpid()) || e.Slots != 16) {
			t.Errorf("live ring: %+v", e)
		}
	}
	if states["live"] != "ready" || states["gone"] != "stale" || len(states) != 2 {
		t.Fatalf("ls states %v, want live ready and gone stale", states)
	}
	if _, stderr, code := runCmd(t, 10*time.Second, "rm", "--dir", dir, "live"); code != 1 || !strings.Contains(stderr, "is live") {
		t.Errorf("rm of a live ring: exit %d, %q", code, stderr)
	}
	if _, stderr, code := runCmd(t, 10*time.Second, "rm", "--dir", dir, "nosuch"); code != 1 || !strings.Contains(stderr, "no ring nosuch") {
		t.Errorf("rm of no ring: exit %d, %q", code, stderr)
	}
	stdout, _, code = runCmd(t, 10*time.Second, "rm", "--dir", dir, "--stale")
	if code != 0 || strings.TrimSpace(stdout) != "removed gone" {
		t.Errorf("rm --stale: exit %d, %q", code, stdout)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "gone.*"))
	live, _ := filepath.Glob(filepath.Join(dir, "live.*"))
	if len(left) != 0 || len(live) == 0 {
		t.Errorf("after rm --stale: gone's files %v, live's %v", left, live)
	}
}

// stat --watch --json prints one object per refresh with the rates over the interval, and ends when the
// producer closes the ring.
func TestStatWatch(t *testing.T) {
	dir := t.TempDir()
	p := createRing(t, dir, "w")
	proc := startProc(t, "stat", "--dir", dir, "w", "--watch", "--json", "--interval", "100ms")
	pb := pattern.Publisher{P: p, Size: 64}
	c, err := ring.Attach("w", ring.AttachOptions{Dir: dir, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(600 * time.Millisecond)
	for cnt := uint64(1); time.Now().Before(deadline); cnt++ {
		if _, err := pb.Publish(cnt, 0); err == nil {
			h, err := c.Next(time.Second)
			if err != nil {
				t.Fatal(err)
			}
			c.Release(h)
		}
		time.Sleep(time.Millisecond)
	}
	p.Close()
	if code := proc.wait(t, 5*time.Second); code != 0 {
		t.Fatalf("stat --watch: exit %d: %s", code, proc.err.String())
	}
	lines := strings.Split(strings.TrimSpace(proc.out.String()), "\n")
	var sawRate bool
	for _, l := range lines {
		var v struct {
			Head  uint64    `json:"head"`
			Rates ringRates `json:"rates"`
		}
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		sawRate = sawRate || v.Rates.HeapsPerS > 0
	}
	if len(lines) < 3 || !sawRate {
		t.Errorf("%d refreshes, a non-zero rate seen %v:\n%s", len(lines), sawRate, proc.out.String())
	}
}
