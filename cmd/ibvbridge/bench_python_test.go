package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/bench"
)

// benchPython runs `bench python` tiny (8 KiB heaps at 0.2 Gb/s, 0.3 s, one run) with its rings in a
// temporary directory; it returns the JSON result and stderr.
func benchPython(t *testing.T, args ...string) (struct {
	Peer    string           `json:"peer"`
	Results []bench.PyResult `json:"results"`
}, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), append([]string{"bench", "python", "--shapes", "8K@0.2", "--seconds", "0.3",
		"--runs", "1", "--json"}, args...)...)
	cmd.Env = append(os.Environ(), "IBVBRIDGE_RING_DIR="+t.TempDir())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	var res struct {
		Peer    string           `json:"peer"`
		Results []bench.PyResult `json:"results"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return res, stderr.String()
}

// Without spead2's Python package the comparison says so in one line and measures recv and the Python
// client's loop alone: every stamped heap reached the loop (lossless), each row has a real latency and
// CPU per heap, and a --variant row runs on the same traffic.
func TestBenchPythonWithoutSpead2SaysSoAndMeasuresIbvbridge(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	res, stderr := benchPython(t, "--peer", "spead2", "--spead2-path", t.TempDir(), "--variant", "c0=--coalesce 0")
	if n := strings.Count(stderr, "spead2's Python package"); n != 1 || !strings.Contains(stderr, "ibvbridge alone") {
		t.Errorf("want one line saying spead2's Python is missing, got %d:\n%s", n, stderr)
	}
	if res.Peer != "" || len(res.Results) != 1 {
		t.Fatalf("result %+v: want one shape, no peer", res)
	}
	rows := res.Results[0].Rows
	if len(rows) != 2 || rows[0].Receiver != "ibvbridge" || rows[1].Receiver != "c0" {
		t.Fatalf("rows %+v: want ibvbridge and c0", rows)
	}
	for _, r := range rows {
		run := r.Runs[0]
		if !r.Lossless || run.Heaps != run.Sent || run.Sent == 0 || r.CPUPerHeap <= 0 || r.LoopPerHeap <= 0 ||
			r.LoopPerHeap > r.CPUPerHeap || r.MedianUs <= 0 || r.P99Us < r.MedianUs {
			t.Errorf("%s: %+v", r.Receiver, r)
		}
	}
}

// With spead2's Python package the same loop runs over spead2.recv.Stream too, and the ratios are
// computed from both rows.
func TestBenchPythonPeerSpead2(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	if _, err := bench.Spead2PythonPath("/usr/bin/python3", ""); err != nil {
		t.Skipf("spead2's Python package is absent: %v", err)
	}
	res, stderr := benchPython(t, "--peer", "spead2")
	rows := res.Results[0].Rows
	if res.Peer != "spead2" || len(rows) != 2 || rows[1].Receiver != "spead2" {
		t.Fatalf("rows %+v: %s", rows, stderr)
	}
	if s := rows[1]; !s.Lossless || s.MedianUs <= 0 || s.CPUPerHeap <= 0 || res.Results[0].CPURatio <= 0 {
		t.Errorf("spead2 row %+v, ratio %v", s, res.Results[0].CPURatio)
	}
}
