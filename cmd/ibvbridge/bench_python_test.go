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
	return benchPythonEnv(t, nil, args...)
}

// benchPythonEnv is benchPython with env added to its environment.
func benchPythonEnv(t *testing.T, env []string, args ...string) (struct {
	Peer    string           `json:"peer"`
	Results []bench.PyResult `json:"results"`
}, string) {
	t.Helper()
	var res struct {
		Peer    string           `json:"peer"`
		Results []bench.PyResult `json:"results"`
	}
	stderr := runBenchPythonJSON(t, env, append([]string{"--shapes", "8K@0.2", "--seconds", "0.3", "--runs", "1"}, args...), &res)
	return res, stderr
}

// runBenchPythonJSON runs `bench python --json` with args, env added to its environment and its rings in
// a temporary directory, decodes its output into res and returns its stderr.
func runBenchPythonJSON(t *testing.T, env, args []string, res any) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), append([]string{"bench", "python", "--json"}, args...)...)
	cmd.Env = append(append(os.Environ(), "IBVBRIDGE_RING_DIR="+t.TempDir()), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	if err := json.Unmarshal(out, res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return stderr.String()
}

// Without spead2's Python package the comparison says so in one line and measures recv and the Python
// client's loop alone: every stamped heap reached the loop (lossless), each row has a real latency and
// CPU per heap, and a --variant row and the floor (--floor: every byte sent counted) run on the same traffic.
func TestBenchPythonWithoutSpead2SaysSoAndMeasuresIbvbridgeAndTheFloor(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	res, stderr := benchPython(t, "--peer", "spead2", "--spead2-path", t.TempDir(), "--variant", "c0=--coalesce 0", "--floor")
	checkSaysSpead2Missing(t, stderr)
	if res.Peer != "" || len(res.Results) != 1 {
		t.Fatalf("result %+v: want one shape, no peer", res)
	}
	rows := res.Results[0].Rows
	if len(rows) != 3 || rows[0].Receiver != "ibvbridge" || rows[1].Receiver != "c0" || rows[2].Receiver != "floor" {
		t.Fatalf("rows %+v: want ibvbridge, c0 and floor", rows)
	}
	for _, r := range rows[:2] {
		checkRow(t, r, 0)
	}
	if f := rows[2]; !f.Lossless || f.Runs[0].Sent == 0 || f.Runs[0].Heaps != f.Runs[0].Sent || f.CPUPerHeap <= 0 {
		t.Errorf("floor: %+v: want every byte counted and a CPU per heap", f)
	}
}

// checkSaysSpead2Missing fails unless stderr has one line saying spead2's Python package is missing and the
// benchmark goes on with ibvbridge alone.
func checkSaysSpead2Missing(t *testing.T, stderr string) {
	t.Helper()
	if n := strings.Count(stderr, "spead2's Python package"); n != 1 || !strings.Contains(stderr, "ibvbridge alone") {
		t.Errorf("want one line saying spead2's Python is missing, got %d:\n%s", n, stderr)
	}
}

// checkRow fails unless r's first run was lossless, every heap sent seen, with a CPU per heap (the Python
// loop's share of it) and a latency; in chunk mode (chunkHeaps > 0) every heap present in whole chunks of
// chunkHeaps.
func checkRow(t *testing.T, r bench.PyRow, chunkHeaps uint64) {
	t.Helper()
	run := r.Runs[0]
	if !r.Lossless || run.Heaps != run.Sent || run.Sent == 0 || r.CPUPerHeap <= 0 || r.LoopPerHeap <= 0 ||
		r.LoopPerHeap > r.CPUPerHeap || r.MedianUs <= 0 || r.P99Us < r.MedianUs {
		t.Errorf("%s: %+v", r.Receiver, r)
	}
	if chunkHeaps > 0 && (run.Sent%chunkHeaps != 0 || run.Chunks != run.Sent/chunkHeaps || r.Chunks != run.Chunks) {
		t.Errorf("%s: %d heaps sent, %d chunks of %d seen: want whole chunks", r.Receiver, run.Sent, run.Chunks, chunkHeaps)
	}
}

// needSpead2Python skips unless long tests run and spead2's Python package imports.
func needSpead2Python(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("short")
	}
	if _, err := bench.Spead2PythonPath("/usr/bin/python3", ""); err != nil {
		t.Skipf("spead2's Python package is absent: %v", err)
	}
}

// With spead2's Python package the same loop runs over spead2.recv.Stream too, and the ratios are
// computed from both rows.
func TestBenchPythonPeerSpead2(t *testing.T) {
	needSpead2Python(t)
	res, stderr := benchPython(t, "--peer", "spead2")
	rows := res.Results[0].Rows
	if res.Peer != "spead2" || len(rows) != 2 || rows[1].Receiver != "spead2" {
		t.Fatalf("rows %+v: %s", rows, stderr)
	}
	if s := rows[1]; !s.Lossless || s.MedianUs <= 0 || s.CPUPerHeap <= 0 || res.Results[0].CPURatio <= 0 {
		t.Errorf("spead2 row %+v, ratio %v", s, res.Results[0].CPURatio)
	}
}

// Chunk mode without spead2's Python package: one line says so, and recv's chunks (placed by heap cnt) reach
// the Python client's ring.chunks() loop whole: every heap sent is present, in sent/16 chunks, none lost,
// with a CPU per heap and a chunk latency.
func TestBenchPythonChunksWithoutSpead2CountsEveryChunk(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	res, stderr := benchPython(t, "--chunks", "16", "--peer", "spead2", "--spead2-path", t.TempDir())
	checkSaysSpead2Missing(t, stderr)
	if res.Peer != "" || len(res.Results) != 1 || res.Results[0].Shape.ChunkHeaps != 16 {
		t.Fatalf("result %+v: want one chunk-mode shape, no peer", res)
	}
	rows := res.Results[0].Rows
	if len(rows) != 1 || rows[0].Receiver != "ibvbridge" {
		t.Fatalf("rows %+v: want ibvbridge alone", rows)
	}
	checkRow(t, rows[0], 16)
}

// With spead2's Python package and a C compiler, chunk mode runs spead2.recv.ChunkRingStream with the
// compiled chunk_place on the same traffic: both receivers get every heap in the same whole chunks (the
// stream-stop heap opens no chunk of its own), and the CPU ratio is computed from both rows.
func TestBenchPythonChunksPeerSpead2(t *testing.T) {
	needSpead2Python(t)
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skipf("no C compiler for spead2's chunk_place: %v", err)
	}
	res, stderr := benchPython(t, "--chunks", "16", "--peer", "spead2")
	rows := res.Results[0].Rows
	if res.Peer != "spead2" || len(rows) != 2 || rows[1].Receiver != "spead2" {
		t.Fatalf("rows %+v: %s", rows, stderr)
	}
	for _, r := range rows {
		checkRow(t, r, 16)
	}
	if rows[0].Sent != rows[1].Sent || res.Results[0].CPURatio <= 0 {
		t.Errorf("ibvbridge sent %d, spead2 %d; CPU ratio %v", rows[0].Sent, rows[1].Sent, res.Results[0].CPURatio)
	}
}

// Without a C compiler spead2's chunk stream has no chunk_place: chunk mode says so in one line and measures
// ibvbridge alone.
func TestBenchPythonChunksWithoutCompilerSaysSo(t *testing.T) {
	needSpead2Python(t)
	res, stderr := benchPythonEnv(t, []string{"PATH=" + t.TempDir()}, "--chunks", "16", "--peer", "spead2")
	if n := strings.Count(stderr, "no C compiler"); n != 1 || !strings.Contains(stderr, "ibvbridge alone") {
		t.Errorf("want one line saying there is no C compiler, got %d:\n%s", n, stderr)
	}
	if res.Peer != "" || len(res.Results) != 1 || len(res.Results[0].Rows) != 1 {
		t.Fatalf("result %+v: want ibvbridge alone", res)
	}
	checkRow(t, res.Results[0].Rows[0], 16)
}

// --chunks takes a count of heaps.
func TestBenchPythonChunksRejectsNegative(t *testing.T) {
	cmd := exec.Command(binary(t), "bench", "python", "--chunks", "-1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--chunks") {
		t.Errorf("bench python --chunks -1: %v: %s", err, out)
	}
}

// benchMaxRate runs `bench python --max-rate 1K --from 2000 --cap 3000` tiny (0.3 s, one run a probe) with
// args added; it returns the JSON result and stderr.
func benchMaxRate(t *testing.T, args ...string) (bench.PyRateResult, string) {
	t.Helper()
	var res struct {
		MaxRate bench.PyRateResult `json:"max_rate"`
	}
	stderr := runBenchPythonJSON(t, nil, append([]string{"--max-rate", "1K", "--from", "2000", "--cap", "3000", "--seconds", "0.3",
		"--runs", "1"}, args...), &res)
	return res.MaxRate, stderr
}

// checkCappedSearch fails unless row probed 2000 then 3000 heaps/s, each in one lossless run the sender
// kept, with its CPU, and ended lossless at the cap.
func checkCappedSearch(t *testing.T, row bench.PyRateRow) {
	t.Helper()
	if len(row.Probes) != 2 || row.Probes[0].HeapsPerSec != 2000 || row.Probes[1].HeapsPerSec != 3000 {
		t.Fatalf("%s: probes %+v: want 2000 then 3000 heaps/s", row.Receiver, row.Probes)
	}
	for _, p := range row.Probes {
		if p.Runs != 1 || p.Lossless != 1 || len(p.CPUPerHeap) != 1 || p.CPUPerHeap[0] <= 0 || p.SentPerSec < 0.97*p.HeapsPerSec {
			t.Errorf("%s: probe %+v: want one lossless run with its CPU, the sender at the rate asked", row.Receiver, p)
		}
	}
	if row.Highest != 3000 || row.LowestLossy != 0 || row.SenderBehindAt != 0 {
		t.Errorf("row %+v: want lossless up to the cap", row)
	}
}

// --max-rate without spead2's Python package: one line says so, and recv's search probes upwards from --from
// and stops at --cap, each probe's heaps all reaching the Python loop at rates any machine takes.
func TestBenchPythonMaxRateSearchesUpToTheCap(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	res, stderr := benchMaxRate(t, "--peer", "spead2", "--spead2-path", t.TempDir())
	checkSaysSpead2Missing(t, stderr)
	if len(res.Rows) != 1 || res.Rows[0].Receiver != "ibvbridge" || res.Ratio != 0 {
		t.Fatalf("rows %+v, ratio %v: want ibvbridge alone", res.Rows, res.Ratio)
	}
	checkCappedSearch(t, res.Rows[0])
}

// With spead2's Python package both searches run, taking turns, and the ratio of their highest rates is given.
func TestBenchPythonMaxRatePeerSpead2(t *testing.T) {
	needSpead2Python(t)
	res, stderr := benchMaxRate(t, "--peer", "spead2")
	if len(res.Rows) != 2 || res.Rows[1].Receiver != "spead2" {
		t.Fatalf("rows %+v: %s", res.Rows, stderr)
	}
	for _, r := range res.Rows {
		checkCappedSearch(t, r)
	}
	if res.Ratio != 1 {
		t.Errorf("ratio %v: want 1 (both lossless up to the cap)", res.Ratio)
	}
}

func TestBenchPythonMaxRateRefusesShapes(t *testing.T) {
	cmd := exec.Command(binary(t), "bench", "python", "--max-rate", "1K", "--shapes", "8K@1")
	var errb strings.Builder
	cmd.Stderr = &errb
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(errb.String(), "--max-rate") ||
		strings.Count(strings.TrimSpace(errb.String()), "\n") != 0 {
		t.Errorf("%v, stderr %q: want one line about --max-rate, exit 2", err, errb.String())
	}
}
