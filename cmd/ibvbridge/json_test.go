package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ibvbridge/ibvbridge/ring"
)

// Every command that takes --json prints JSON on stdout with it, wherever the flag stands.
func TestJSONFlagAnywhere(t *testing.T) {
	dir := t.TempDir()
	name := fmt.Sprintf("json-%d", os.Getpid())
	p, err := ring.Create(name, ring.Config{Dir: dir, SlotCount: 4, SlotSize: 4096, HugePages: ring.HugePagesOff})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, args := range [][]string{
		{"stat", "--dir", dir, name, "--json"},
		{"stat", "--json", "--dir", dir, name},
		{"devices", "--json"}, // no RDMA devices here: an empty list, the reason on stderr
	} {
		cmd := exec.Command(binary(t), args...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Errorf("%v: %v: %s", args, err, errb.String())
			continue
		}
		var v any
		if err := json.Unmarshal(out.Bytes(), &v); err != nil {
			t.Errorf("%v: stdout is not JSON (%v): %q", args, err, out.String())
		}
	}
}

// TestStatJSONKeysSnakeCase: every key `stat --json` prints is snake_case, the geometry's included
// (ring.Geometry's Go names once came out as SlotCount), and the values are the ring's.
func TestStatJSONKeysSnakeCase(t *testing.T) {
	dir := t.TempDir()
	name := fmt.Sprintf("snake-%d", os.Getpid())
	p, err := ring.Create(name, ring.Config{Dir: dir, SlotCount: 8, SlotSize: 4096, HugePages: ring.HugePagesOff})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	out, err := exec.Command(binary(t), "stat", "--json", "--dir", dir, name).Output()
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatal(err)
	}
	snake := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	var walk func(path string, x any)
	walk = func(path string, x any) {
		switch m := x.(type) {
		case map[string]any:
			for k, y := range m {
				if path != ".counters" && !snake.MatchString(k) {
					t.Errorf("key %s.%s is not snake_case", path, k)
				}
				walk(path+"."+k, y)
			}
		case []any:
			for _, y := range m {
				walk(path+"[]", y)
			}
		}
	}
	walk("", v)
	g, _ := v["geometry"].(map[string]any)
	if g["slot_count"] != float64(8) || g["slot_size"] != float64(4096) {
		t.Errorf("geometry %v: want slot_count 8, slot_size 4096", g)
	}
}

// TestStatNamesRmStaleForALeftoverRing: stat on a ring whose producer is gone but whose files remain says
// `rm --stale` once, with the --dir it was given (advice that pastes and runs); on a ring that does not
// exist it does not; neither doubles its "stat:" prefix.
func TestStatNamesRmStaleForALeftoverRing(t *testing.T) {
	dir := t.TempDir()
	l, err := net.Listen("unix", filepath.Join(dir, ring.SocketName("left")))
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close() // the socket file stays, nobody serves it: what kill -9 leaves
	for _, tc := range []struct {
		name  string
		stale bool
	}{{"left", true}, {"nosuch", false}} {
		cmd := exec.Command(binary(t), "stat", "--dir", dir, tc.name)
		var errb bytes.Buffer
		cmd.Stderr = &errb
		if err := cmd.Run(); err == nil {
			t.Fatalf("stat %s succeeded", tc.name)
		}
		msg := errb.String()
		if strings.Count(msg, "\n") != 1 || strings.Contains(msg, "stat: stat") || !strings.HasPrefix(msg, "ibvbridge stat: ") {
			t.Errorf("stat %s: %q: want one line, prefixed once", tc.name, msg)
		}
		if n := strings.Count(msg, "rm --stale"); tc.stale && n != 1 {
			t.Errorf("stat %s: %q: advises rm --stale %d times, want once (with --dir)", tc.name, msg, n)
		}
		if has := strings.Contains(msg, "`ibvbridge rm --stale --dir "+dir+"`"); has != tc.stale {
			t.Errorf("stat %s: %q: mentions rm --stale %v, want %v", tc.name, msg, has, tc.stale)
		}
	}
}
