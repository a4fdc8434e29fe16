package main

import (
	"encoding/json"
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
	stdout, stderr, code := runCmd(t, 90*time.Second, "bench", "udp", "--heap-sizes", "64K", "--bytes", "4M",
		"--runs", "1", "--consumer", "go", "--rate", "0.5", "--baseline", binary(t), "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var res struct {
		Comparisons []bench.Comparison `json:"comparisons"`
	}
	if err := json.Unmarshal(bench.LastLine([]byte(stdout)), &res); err != nil || len(res.Comparisons) != 1 {
		t.Fatalf("output %q: %v", stdout, err)
	}
	c := res.Comparisons[0]
	if !c.Ours.LosslessSeen || !c.Baseline.LosslessSeen || c.RecvCPUPerByte <= 0 || c.Ours.RecvCPUSecPerGB <= 0 ||
		c.Ours.ConsCPUNsPerHeap <= 0 {
		t.Errorf("comparison %+v", c)
	}
	// --baseline without a fixed rate is a usage error.
	if _, stderr, code := runCmd(t, 10*time.Second, "bench", "udp", "--baseline", binary(t)); code != 2 {
		t.Errorf("--baseline without --rate: exit %d, want 2: %s", code, stderr)
	}
}
