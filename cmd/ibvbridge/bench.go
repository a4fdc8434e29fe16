package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ibvbridge/ibvbridge/bench"
)

// benchKinds are the benchmarks runBench dispatches; the top-level help and the usage line list them.
var benchKinds = []string{"ring", "udp", "xdp", "group", "floor", "python"}

var benchUsage = "usage: ibvbridge bench " + strings.Join(benchKinds, "|") + " [flags]  (ibvbridge bench KIND -h for its flags)"

func runBench(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError("%s", benchUsage)
	}
	// A signal stops the benchmark where it is; the library removes its rings and processes on the way out.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	env := bench.Env{Log: stderr}
	var err error
	switch args[0] {
	case "ring":
		err = runBenchRing(ctx, env, args[1:], stdout, stderr)
	case "udp":
		err = runBenchUDP(ctx, env, args[1:], stdout, stderr)
	case "xdp":
		err = runBenchXDP(ctx, env, args[1:], stdout, stderr)
	case "group":
		err = runBenchGroup(ctx, env, args[1:], stdout, stderr)
	case "floor":
		err = runBenchFloor(args[1:], stdout, stderr)
	case "python":
		err = runBenchPython(ctx, env, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprintln(stderr, benchUsage)
		return flag.ErrHelp
	default:
		return usageError("unknown benchmark %q (want %s)", args[0], strings.Join(benchKinds, ", "))
	}
	if errors.Is(err, bench.ErrBadOption) {
		return usageError("%v", err)
	}
	return err
}

func runBenchRing(ctx context.Context, env bench.Env, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench ring", stderr)
	o := bench.RingOptions{}
	fs.StringVar(&o.Consumer, "consumer", "c", "consumer process: go, c or python; several comma-separated (c,go,python) read one ring at once")
	fs.IntVar(&o.HeapSize, "heap-size", 64, "payload bytes per heap")
	fs.Uint64Var(&o.Heaps, "heaps", 0, "heaps per run (default: about 4 GiB or 20 M heaps, whichever is fewer)")
	fs.IntVar(&o.Slots, "slots", 0, "ring slots (default: 4096 for small heaps, 256 for large)")
	fs.IntVar(&o.Batch, "batch", 0, "python consumer: heaps per next_batch call (0: per-heap iteration)")
	fs.DurationVar(&o.Idle, "idle", time.Second, "measure the waiting consumer's CPU use for this long first (0: skip)")
	fs.IntVar(&o.Repeat, "repeat", 3, "runs; the figures are the medians (timings on shared machines are noisy)")
	asJSON := fs.Bool("json", false, "print one JSON object (the medians)")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if o.Repeat < 1 {
		return usageError("--repeat must be at least 1")
	}
	med, err := bench.Ring(ctx, env, o, func(run int, r bench.RingResult) {
		if !*asJSON {
			bench.PrintRing(stdout, fmt.Sprintf("run %d", run), r)
		}
	})
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(med)
	}
	bench.PrintRing(stdout, "median", med)
	return nil
}

func runBenchGroup(ctx context.Context, env bench.Env, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench group", stderr)
	o := bench.GroupOptions{HeapSize: 8192} // before Var: the flag's default is this value
	fs.StringVar(&o.Consumer, "consumer", "python", "consumer process: python (--work: power per channel in numpy) or go (--work-passes: checksums)")
	fs.IntVar(&o.Members, "members", 4, "the group's size, compared with one consumer")
	fs.Uint64Var(&o.Chunks, "chunks", 2000, "chunks per run")
	fs.IntVar(&o.ChunkHeaps, "chunk-heaps", 64, "heap positions per chunk")
	fs.Var((*byteSize)(&o.HeapSize), "heap-size", "bytes per heap position, a multiple of 8 (int8 re, im pairs)")
	fs.IntVar(&o.Work, "work", 1, "CPU-bound work per chunk, in passes (Python: ~1.7 ms a pass for 64 heaps of 8 KiB)")
	fs.IntVar(&o.Slots, "slots", 32, "ring slots (one chunk each; each member queues about slots / members: fewer, less imbalance at the end but more waits for the window)")
	fs.IntVar(&o.Rounds, "rounds", 3, "rounds of one consumer then the group; the figures are medians")
	asJSON := fs.Bool("json", false, "print one JSON object (the medians, the ratio and the ceiling)")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	res, err := bench.Group(ctx, env, o, func(round int, r bench.GroupRun) {
		if !*asJSON {
			bench.PrintGroupRun(stdout, fmt.Sprintf("round %d", round), r)
		}
	})
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	bench.PrintGroup(stdout, res)
	return nil
}

// runBenchFloor is the floor receiver `bench udp --peer` runs: it counts a stream's bytes and prints them
// as one JSON line.
func runBenchFloor(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench floor", stderr)
	buffer := byteSize(32 << 20)
	fs.Var(&buffer, "buffer", "socket receive buffer")
	first := fs.Duration("first-wait", time.Minute, "give up if nothing arrives within this")
	idle := fs.Duration("idle", 300*time.Millisecond, "the stream has ended once nothing arrives for this long")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError("usage: ibvbridge bench floor [flags] IPv4:PORT")
	}
	r, err := bench.Floor(pos[0], int(buffer), *first, *idle)
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(r)
}

// parseNoArgs parses flags that may come anywhere and refuses stray words: a word left over would
// otherwise hide every flag after it.
func parseNoArgs(fs *flag.FlagSet, args []string) error {
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError("unexpected argument %q (flags only; see -h)", strings.Join(pos, " "))
	}
	return nil
}
