package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/ibvbridge/ibvbridge/bench"
)

// pyChunkShapes is chunk mode's stream: 8 KiB one-packet heaps at 2.5 Gb/s (38 k heaps/s; in chunks of 64,
// 600 chunks/s).
const pyChunkShapes = "8K@2.5"

// runBenchPython is bench python: recv and the Python client's ItemGroup loop, side by side with spead2's
// Python receiver running the same loop (--peer spead2), on a sender that stamps each heap with its send
// time: CPU per heap of every receiving process, latency median and p99, lossless or not, and ratios.
// --chunks N is chunk mode: recv's chunks read with ring.chunks() against spead2's ChunkRingStream.
func runBenchPython(ctx context.Context, env bench.Env, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench python", stderr)
	var o bench.PyOptions
	shapes := fs.String("shapes", "1M@6,8K@1,1K@0.2", "streams, comma-separated: HEAPSIZE@GBPS (jumbo packets; with --chunks default 8K@2.5)")
	chunks := fs.Int("chunks", 0, "chunk mode: N heaps per chunk, placed by heap cnt (recv --chunk-heaps N --chunk-by 0x1, read with ring.chunks(); "+
		"spead2: ChunkRingStream with a chunk_place compiled with cc); 0: heap mode")
	seconds := fs.Float64("seconds", 2, "seconds of stream per run")
	fs.IntVar(&o.Runs, "runs", 5, "alternating runs per receiver and stream; the figures are medians")
	fs.StringVar(&o.Peer, "peer", "", "spead2: also spead2's Python receiver (spead2.recv.Stream + spead2.ItemGroup) with the same loop")
	fs.StringVar(&o.Spead2, "spead2-path", "", "with --peer: PYTHONPATH of spead2's Python package (default: the system's, else $HOME/.cache/spead2-*-py/site)")
	fs.BoolVar(&o.Floor, "floor", false, "also the floor receiver (bench floor: a blocking recvmmsg that counts bytes, no decoding, no consumer) on the same traffic: "+
		"what the kernel alone costs a receiver of it")
	recvArgs := fs.String("recv-args", "", "more flags for recv, space-separated (e.g. --coalesce 0)")
	buffer := byteSize(32 << 20)
	fs.Var(&buffer, "buffer", "every receiver's socket buffer")
	fs.Func("variant", "one more ibvbridge row, alternating with the others: LABEL=RECV ARGS (e.g. c1ms=--coalesce 1ms); repeatable",
		func(s string) error { return addPyVariant(&o, s) })
	baseline := fs.String("baseline", "", "one more ibvbridge row: this ibvbridge binary (e.g. main built from git) with --baseline-client's Python client")
	baseClient := fs.String("baseline-client", "", "with --baseline: its Python client's directory (default: this tree's)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	maxRate := byteSize(0)
	fs.Var(&maxRate, "max-rate", "instead of --shapes: search each receiver's highest lossless rate of heaps of this size (e.g. 1K), "+
		"from --from heaps/s up by half while lossless, then narrowing the gap to the first loss; each probe is --runs runs (default 2 here); "+
		"the sender sends in bursts (once late, 64 heaps a sendmmsg, as a NIC's interrupt moderation hands them over)")
	ro := bench.DefaultPyRate
	fs.Float64Var(&ro.From, "from", ro.From, "with --max-rate: heaps/s of the first probe")
	fs.Float64Var(&ro.Cap, "cap", ro.Cap, "with --max-rate: no probe above this many heaps/s")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	o.Buffer, o.RecvArgs = int(buffer), strings.Fields(*recvArgs)
	if *baseline != "" {
		o.Variants = append(o.Variants, bench.PyVariant{Label: "baseline", Binary: *baseline, RecvArgs: o.RecvArgs, Client: *baseClient})
	}
	if *chunks < 0 {
		return usageError("--chunks: want N ≥ 1 heaps per chunk, or 0 for heap mode")
	}
	if *chunks > 0 && !givenFlags(fs)["shapes"] {
		*shapes = pyChunkShapes
	}
	var err error
	if o.Shapes, err = parsePyShapes(*shapes, *seconds, *chunks); err != nil {
		return err
	}
	if o.Peer != "" && !pyPeerAvailable(o.Spead2, *chunks > 0, stderr) {
		o.Peer = ""
	}
	if maxRate > 0 {
		if *chunks > 0 || givenFlags(fs)["shapes"] {
			return usageError("--max-rate searches one heap size in heap mode: not with --shapes or --chunks")
		}
		ro.HeapSize, ro.Seconds = int(maxRate), *seconds
		if !givenFlags(fs)["seconds"] {
			ro.Seconds = bench.DefaultPyRate.Seconds
		}
		if !givenFlags(fs)["runs"] {
			o.Runs = 2
		}
		return runBenchPythonMaxRate(ctx, env, o, ro, *asJSON, stdout, stderr)
	}
	progress := func(sh bench.PyShape, receiver string, run int, r bench.PyRun) {
		if !*asJSON {
			fmt.Fprintf(stderr, "%s run %d %s: %.2f µs/heap, latency median %.0f µs p99 %.0f µs, %s\n", sh.String(), run, receiver,
				r.CPUSeconds/float64(max(r.Heaps, 1))*1e6, r.MedianUs, r.P99Us, r.Detail)
		}
	}
	res, err := bench.Python(ctx, env, o, progress)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(map[string]any{"peer": o.Peer, "runs": o.Runs, "results": res})
	}
	bench.PrintPython(stdout, res, o.Runs)
	return nil
}

// addPyVariant adds bench python's --variant LABEL=RECV ARGS to o.
func addPyVariant(o *bench.PyOptions, s string) error {
	label, args, ok := strings.Cut(s, "=")
	if !ok || label == "" {
		return fmt.Errorf("want LABEL=RECV ARGS, not %q", s)
	}
	o.Variants = append(o.Variants, bench.PyVariant{Label: label, RecvArgs: strings.Fields(args)})
	return nil
}

// runBenchPythonMaxRate is bench python --max-rate: each receiver's highest lossless rate of heaps of one
// size, each probe on stderr as it ends.
func runBenchPythonMaxRate(ctx context.Context, env bench.Env, o bench.PyOptions, ro bench.PyRateOptions, asJSON bool, stdout, stderr io.Writer) error {
	if ro.From <= 0 || ro.Cap < ro.From {
		return usageError("--from %g, --cap %g: want 0 < from ≤ cap heaps/s", ro.From, ro.Cap)
	}
	res, err := bench.PythonMaxRate(ctx, env, o, ro, func(receiver string, p bench.PyRateProbe) {
		if !asJSON {
			fmt.Fprintf(stderr, "%s at %.0f heaps/s: %d of %d runs lossless (sender %.0f heaps/s), CPU µs/heap %.2f (Python loop %.2f) in the last run, %s\n",
				receiver, p.HeapsPerSec, p.Lossless, p.Runs, p.SentPerSec, p.CPUPerHeap[len(p.CPUPerHeap)-1],
				p.LoopPerHeap[len(p.LoopPerHeap)-1], p.Detail)
		}
	})
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(stdout).Encode(map[string]any{"peer": o.Peer, "max_rate": res})
	}
	bench.PrintPythonMaxRate(stdout, res)
	return nil
}

// parsePyShapes parses --shapes: HEAPSIZE@GBPS, comma-separated, each run for seconds (in chunk mode, in
// chunks of chunks heaps).
func parsePyShapes(shapes string, seconds float64, chunks int) ([]bench.PyShape, error) {
	var out []bench.PyShape
	for _, s := range strings.Split(shapes, ",") {
		size, rate, ok := strings.Cut(s, "@")
		n, err := parseByteSize(size)
		g, gerr := strconv.ParseFloat(rate, 64)
		if !ok || err != nil || gerr != nil || n < 1 || g <= 0 {
			return nil, usageError("--shapes: %q is not HEAPSIZE@GBPS", s)
		}
		out = append(out, bench.PyShape{HeapSize: n, PacketSize: 8972, RateGbps: g, Seconds: seconds, ChunkHeaps: chunks})
	}
	return out, nil
}

// pyPeerAvailable is whether spead2's Python package imports (from spead2Path, else where it is usually
// built) and, for chunk mode, a C compiler builds its chunk_place; if not, one line on stderr says why and
// that ibvbridge is measured alone.
func pyPeerAvailable(spead2Path string, chunkMode bool, stderr io.Writer) bool {
	if _, err := bench.Spead2PythonPath("/usr/bin/python3", spead2Path); err != nil {
		fmt.Fprintf(stderr, "bench python: %v: ibvbridge alone\n", err)
		return false
	}
	if _, err := bench.Spead2PlaceCompiler(); chunkMode && err != nil {
		fmt.Fprintf(stderr, "bench python: %v: ibvbridge alone\n", err)
		return false
	}
	return true
}
