package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestConsoleLogPlainWithRealMilliseconds: a console log written to something that is not a terminal
// (a file, a pipe, a buffer) carries no colour codes, and its time has the real milliseconds.
func TestConsoleLogPlainWithRealMilliseconds(t *testing.T) {
	logNow = func() time.Time { return time.Date(2026, 1, 2, 12, 34, 56, 123_456_789, time.Local) }
	t.Cleanup(func() { logNow = time.Now })
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, w := range []struct {
		name string
		w    interface {
			Write([]byte) (int, error)
		}
	}{{"buffer", &bytes.Buffer{}}, {"file", f}} {
		log, err := newLogger("console", w.w)
		if err != nil {
			t.Fatal(err)
		}
		log.Info().Str("ring", "cbf").Msg("receiving")
		var out []byte
		if b, ok := w.w.(*bytes.Buffer); ok {
			out = b.Bytes()
		} else if out, err = os.ReadFile(f.Name()); err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(out, []byte("\x1b[")) {
			t.Errorf("%s: colour codes in %q", w.name, out)
		}
		if !regexp.MustCompile(`^12:34:56\.123 INF receiving ring=cbf\n$`).Match(out) {
			t.Errorf("%s: line %q, want 12:34:56.123 INF receiving ring=cbf", w.name, out)
		}
	}
}

// TestRecvReceivingLineNamesOnlyWhatItHas: recv's console "receiving" line on UDP has its endpoints and no
// empty file= (only a replay names a file), and recv's stderr (a pipe here) has no colour codes.
func TestRecvReceivingLineNamesOnlyWhatItHas(t *testing.T) {
	name, port := testRing(t, "line"), freePort(t)
	p, _ := startRecv(t, "--ring", name, "--slots", "4", "--slot-size", "4K", "--hugepages", "off", "127.0.0.1:"+port)
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("recv exit %d: %s", code, p.err.String())
	}
	stderr := p.err.String()
	line := ""
	for _, l := range strings.Split(stderr, "\n") {
		if strings.Contains(l, " receiving ") {
			line = l
		}
	}
	if line == "" || strings.Contains(line, "file=") || !strings.Contains(line, `endpoints=["127.0.0.1:`+port+`"]`) {
		t.Errorf("receiving line %q: want endpoints and no file=", line)
	}
	if strings.Contains(stderr, "\x1b[") {
		t.Errorf("colour codes on a pipe: %q", stderr)
	}
}

// TestHelpListsEveryBenchmark: the top-level help's bench line names every benchmark `bench` runs, and
// each one answers -h (xdp was once missing from the help).
func TestHelpListsEveryBenchmark(t *testing.T) {
	var help bytes.Buffer
	if code := run([]string{"-h"}, &bytes.Buffer{}, &help); code != 0 {
		t.Fatalf("-h: exit %d", code)
	}
	line := ""
	for _, l := range strings.Split(help.String(), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "bench ") {
			line = l
		}
	}
	for _, kind := range []string{"ring", "udp", "xdp"} {
		if !strings.Contains(line, kind) {
			t.Errorf("help's bench line %q lacks %s", line, kind)
		}
		var errb bytes.Buffer
		if code := run([]string{"bench", kind, "-h"}, &bytes.Buffer{}, &errb); code != 0 {
			t.Errorf("bench %s -h: exit %d: %s", kind, code, errb.String())
		}
	}
}
