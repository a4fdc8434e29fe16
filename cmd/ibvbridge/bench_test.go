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

// TestBenchUDPBaseline runs the fixed-rate comparison once, tiny, with this binary as its own baseline:
// both sides receive everything and the ratios are computed from real CPU figures.
func TestBenchUDPBaseline(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	c := benchComparison(t, "--heap-sizes", "64K", "--baseline", binary(t))
	if !c.Ours.LosslessSeen || !c.Baseline.LosslessSeen || c.RecvCPUPerByte <= 0 || c.Ours.RecvCPUSecPerGB <= 0 ||
		c.Ours.ConsCPUNsPerHeap <= 0 {
		t.Errorf("comparison %+v", c)
	}
	// --baseline without a fixed rate is a usage error.
	if _, stderr, code := runCmd(t, 10*time.Second, "bench", "udp", "--baseline", binary(t)); code != 2 {
		t.Errorf("--baseline without --rate: exit %d, want 2: %s", code, stderr)
	}
}

// TestBenchUDPChunkAxis runs the chunk comparison once, tiny, with a second chunk axis: send stamps the axis
// item, recv places heaps into chunks of 8 timestamps × 4 axis values, and the chunk side is lossless (every
// heap placed, none rejected as outside the axis, the consumer's chunks holding every heap sent).
func TestBenchUDPChunkAxis(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	if c := benchComparison(t, "--heap-sizes", "8K", "--chunk-heaps", "8", "--chunk-axis", "4"); !c.Ours.LosslessSeen || !c.Baseline.LosslessSeen || c.Ours.ConsCPUNsPerHeap <= 0 {
		t.Errorf("comparison %+v", c)
	}
	if _, stderr, code := runCmd(t, 10*time.Second, "bench", "udp", "--chunk-axis", "4", "--rate", "1"); code != 2 ||
		!strings.Contains(stderr, "--chunk-axis") {
		t.Errorf("--chunk-axis without --chunk-heaps: exit %d, want 2: %s", code, stderr)
	}
}

// benchComparison runs one tiny fixed-rate comparison (`bench udp --bytes 4M --runs 1 --consumer go --rate 0.5
// --json` and flags) and returns its one Comparison.
func benchComparison(t *testing.T, flags ...string) bench.Comparison {
	t.Helper()
	args := append([]string{"bench", "udp", "--bytes", "4M", "--runs", "1", "--consumer", "go", "--rate", "0.5",
		"--json"}, flags...)
	stdout, stderr, code := runCmd(t, 90*time.Second, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var res struct {
		Comparisons []bench.Comparison `json:"comparisons"`
	}
	if err := json.Unmarshal(bench.LastLine([]byte(stdout)), &res); err != nil || len(res.Comparisons) != 1 {
		t.Fatalf("output %q: %v", stdout, err)
	}
	return res.Comparisons[0]
}

// TestBenchUDPPeerSpead2 runs `bench udp --peer spead2` once, tiny: recv, spead2_recv and the floor each
// receive all of spead2_send's stream, and each has a CPU figure.
func TestBenchUDPPeerSpead2(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	for _, tool := range []string{"spead2_recv", "spead2_send"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not on PATH (see the README's performance section)", tool)
		}
	}
	stdout, stderr, code := runCmd(t, 120*time.Second, "bench", "udp", "--peer", "spead2", "--heap-sizes", "64K",
		"--rate", "0.5", "--seconds", "0.2", "--runs", "1", "--slots", "64", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var res struct {
		Results []bench.PeerResult `json:"results"`
	}
	if err := json.Unmarshal(bench.LastLine([]byte(stdout)), &res); err != nil || len(res.Results) != 1 {
		t.Fatalf("output %q: %v", stdout, err)
	}
	kinds := map[string]bool{}
	for _, r := range res.Results[0].Rows {
		kinds[r.Kind] = true
		if !r.Lossless || r.CPU <= 0 || len(r.Runs) != 1 {
			t.Errorf("row %+v", r)
		}
	}
	if !kinds["recv"] || !kinds["spead2"] || !kinds["floor"] {
		t.Errorf("rows %+v: want recv, spead2 and floor", res.Results[0].Rows)
	}
}

// Without spead2 on PATH the comparison says so in one line and measures recv and the floor.
func TestBenchUDPPeerWithoutSpead2SaysSo(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), "bench", "udp", "--peer", "spead2", "--heap-sizes", "64K",
		"--rate", "0.5", "--seconds", "0.2", "--runs", "1", "--slots", "64")
	cmd.Env = append(os.Environ(), "PATH="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	rest := strings.Join(lines[1:], "\n")
	if !strings.Contains(lines[0], "not on PATH") || !strings.Contains(rest, "recv, 64 slots") ||
		!strings.Contains(rest, "floor") || strings.Contains(rest, "spead2") {
		t.Errorf("output:\n%s", out)
	}
}
