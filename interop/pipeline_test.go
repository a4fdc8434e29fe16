package interop_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPipelineExample runs examples/pipeline/run.sh — send → recv (ring A) → a Python numpy stage (ring B)
// → a C stage, and ring B back on the wire (send --ring) → recv (ring C) → the C stage again — and checks that every
// spectrum reached both readers of ring B byte for byte, that each is right (Parseval, checked by the C
// stage against the input pattern), and that nothing was lost or skipped anywhere.
func TestPipelineExample(t *testing.T) {
	if _, err := os.Stat(filepath.Join(repoRoot, "clients/c/build/libibvbridge.a")); err != nil {
		if os.Getenv("IBVBRIDGE_REQUIRE_CLIENTS") != "" {
			t.Fatalf("C library not built: %v", err)
		}
		t.Skip("C library not built (make build)")
	}
	const heaps = 300
	cmd := exec.Command(filepath.Join(repoRoot, "examples/pipeline/run.sh"))
	cmd.Env = append(os.Environ(), "HEAPS=300", "BIN="+goTool)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		stderr := ""
		if errors.As(err, &ee) {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("pipeline: %v\n%s\n%s", err, out, stderr)
	}
	stages := map[string]map[string]any{}
	var pipe struct {
		Pipeline struct {
			Heaps    float64 `json:"heaps"`
			Expected uint64  `json:"expected_checksum"`
		} `json:"pipeline"`
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var s struct {
			Stage  string         `json:"stage"`
			Result map[string]any `json:"result"`
		}
		if strings.HasPrefix(line, `{"pipeline"`) {
			if err := json.Unmarshal([]byte(line), &pipe); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			continue
		}
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		stages[s.Stage] = s.Result
	}
	num := func(stage, key string) float64 { f, _ := stages[stage][key].(float64); return f }
	// Checksums travel as JSON numbers: compare them as the integers they are.
	sum := func(stage string) uint64 {
		var v struct {
			Checksum uint64 `json:"checksum"`
		}
		b, _ := json.Marshal(stages[stage])
		json.Unmarshal(b, &v)
		return v.Checksum
	}
	if num("recvA", "heaps") != heaps || num("spectrum", "heaps") != heaps || num("spectrum", "skipped") != 0 {
		t.Fatalf("upstream: %v", stages)
	}
	if num("peak", "heaps") != heaps || num("peak", "parseval_errors") != 0 || stages["peak"]["result"] != "eos" {
		t.Fatalf("C stage: %v", stages["peak"])
	}
	if num("relay", "heaps") != heaps || num("peakC", "heaps") != heaps || num("peakC", "parseval_errors") != 0 ||
		stages["peakC"]["result"] != "eos" {
		t.Fatalf("relay %v, downstream %v", stages["relay"], stages["peakC"])
	}
	if sum("peak") != pipe.Pipeline.Expected || sum("peakC") != pipe.Pipeline.Expected {
		t.Fatalf("checksums: C stage %d, downstream %d, expected %d", sum("peak"), sum("peakC"), pipe.Pipeline.Expected)
	}
}
