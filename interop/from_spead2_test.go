package interop_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

const fromSpead2Heaps, fromSpead2HeapSize = 20, 1000

// wantFromSpead2 is what both receivers of examples/from_spead2 print for `send --descriptors --pattern
// --timestamp --heap-size 1000 --items 1`: heap k's cnt item, its timestamp (k-1)×1000, and its pattern
// payload as a uint8 array of 1000 (first byte and sum).
func wantFromSpead2() []string {
	var want []string
	for cnt := uint64(1); cnt <= fromSpead2Heaps; cnt++ {
		sum := 0
		for i := range fromSpead2HeapSize {
			sum += int(pattern.PatternByte(cnt, i))
		}
		want = append(want, fmt.Sprintf("heap_cnt=%d timestamp=%d dtype=uint8 shape=(%d,) first=%d sum=%d",
			cnt, (cnt-1)*fromSpead2HeapSize, fromSpead2HeapSize, pattern.PatternByte(cnt, 0), sum))
	}
	return want
}

func sendNamedItems(t *testing.T, port string) {
	t.Helper()
	send := exec.Command(goTool, "send", "127.0.0.1:"+port, "--heaps", strconv.Itoa(fromSpead2Heaps),
		"--heap-size", strconv.Itoa(fromSpead2HeapSize), "--items", "1", "--descriptors", "--pattern", "--timestamp",
		"--rate", "0.1")
	if out, err := send.CombinedOutput(); err != nil {
		t.Fatalf("send: %v\n%s", err, out)
	}
}

func checkPrinted(t *testing.T, who string, out []byte) {
	t.Helper()
	got := strings.Split(strings.TrimSpace(string(out)), "\n")
	want := wantFromSpead2()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("%s printed\n%s\nwant\n%s", who, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestFromSpead2Twin runs examples/from_spead2/receiver.py — the ibvbridge twin of a spead2 receiver —
// against `recv` fed by `send` with named items, and checks every value it prints: the items are found
// by name and decoded from their descriptors (immediates as ints, the payload as a uint8 array).
func TestFromSpead2Twin(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Fatal("/usr/bin/python3 missing")
	}
	name, port := uniqueRing(t, "from-spead2"), freeUDPPort(t)
	recv := startRecv(t, "--ring", name, "--max-heaps", "4", "--buffer", "8M", "--slots", "64", "--slot-size", "64K", "127.0.0.1:"+port)
	waitRing(t, name)
	rx := exec.Command("/usr/bin/python3", filepath.Join(repoRoot, "examples/from_spead2/receiver.py"), name)
	rx.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(repoRoot, "clients/python"), "PYENV_VERSION=system")
	var out, errb bytes.Buffer
	rx.Stdout, rx.Stderr = &out, &errb
	if err := rx.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rx.Process.Kill() })
	for i := 0; ; i++ { // the stream starts once the receiver is attached
		if info, err := ring.Inspect(name, ""); err == nil && info.Attached() > 0 {
			break
		}
		if i > 2000 {
			t.Fatalf("receiver did not attach: %s", errb.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	sendNamedItems(t, port)
	if m := recv(); m["result"] != "stream_stop" || m["heaps"].(float64) != fromSpead2Heaps {
		t.Fatalf("recv counters %v", m)
	}
	done := make(chan error, 1)
	go func() { done <- rx.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("receiver.py: %v\n%s", err, errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("receiver.py did not end at the end of the stream: %s", errb.String())
	}
	checkPrinted(t, "receiver.py", out.Bytes())
	if s := strings.TrimSpace(errb.String()); s != fmt.Sprintf("%d heaps", fromSpead2Heaps) {
		t.Fatalf("receiver.py stderr %q", s)
	}
}

// TestFromSpead2OriginalPrintsTheSame runs the spead2 original straight on the UDP stream, where spead2's
// Python package is installed: both receivers must print the same lines.
func TestFromSpead2OriginalPrintsTheSame(t *testing.T) {
	if err := exec.Command("/usr/bin/python3", "-c", "import spead2.recv.asyncio").Run(); err != nil {
		t.Skip("spead2's Python package is not installed for /usr/bin/python3")
	}
	port := freeUDPPort(t)
	rx := exec.Command("/usr/bin/python3", filepath.Join(repoRoot, "examples/from_spead2/spead2_receiver.py"), port)
	var out bytes.Buffer
	rx.Stdout = &out
	if err := rx.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rx.Process.Kill() })
	time.Sleep(time.Second) // spead2 gives no sign that its socket is bound; the stream is paced anyway
	sendNamedItems(t, port)
	if err := rx.Wait(); err != nil {
		t.Fatalf("spead2_receiver.py: %v", err)
	}
	checkPrinted(t, "spead2_receiver.py", out.Bytes())
}

// TestFromSpead2TwinChangesFewLines holds the migration page's promise: the twin differs from the spead2
// original in at most 10 of the original's lines (a longest-common-subsequence line diff).
func TestFromSpead2TwinChangesFewLines(t *testing.T) {
	read := func(p string) []string {
		f, err := os.Open(filepath.Join(repoRoot, "examples/from_spead2", p))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var lines []string
		for s := bufio.NewScanner(f); s.Scan(); {
			lines = append(lines, s.Text())
		}
		return lines
	}
	a, b := read("spead2_receiver.py"), read("receiver.py")
	lcs := make([][]int, len(a)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	changed := len(a) - lcs[0][0]
	if changed > 10 || len(a) < 35 {
		t.Fatalf("the twin changes %d of the original's %d lines; the page promises at most 10 of ~40", changed, len(a))
	}
}
