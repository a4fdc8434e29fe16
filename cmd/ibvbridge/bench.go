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

const benchUsage = "usage: ibvbridge bench ring|udp|xdp [flags]  (ibvbridge bench KIND -h for its flags)"

func runBench(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError(benchUsage)
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
	case "-h", "--help", "help":
		fmt.Fprintln(stderr, benchUsage)
		return flag.ErrHelp
	default:
		return usageError("unknown benchmark %q (want ring, udp or xdp)", args[0])
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

// udpFlags are the flags bench udp and bench xdp share; their defaults differ.
func udpFlags(fs *flag.FlagSet, o *bench.UDPOptions, packet, bytesPerRun, runs int) (sizes *string, asJSON *bool) {
	sizes = fs.String("heap-sizes", "8K,1M", "comma-separated heap sizes")
	o.PacketSize, o.BytesPerRun = packet, bytesPerRun // before Var: the flags' defaults are these values
	fs.Var((*byteSize)(&o.PacketSize), "packet-size", "UDP payload per packet (8972: jumbo frames, 1472: standard MTU)")
	fs.Var((*byteSize)(&o.BytesPerRun), "bytes", "payload bytes per run (bounds each run)")
	fs.IntVar(&o.Runs, "runs", runs, "runs per heap size: one unpaced, then a search on the rate")
	fs.StringVar(&o.Consumer, "consumer", "c", "consumer process: go, c or python")
	fs.DurationVar(&o.ConsumerMaxLatency, "consumer-max-latency", 0, "the consumer's latency bound (its --max-latency-us: coalesced wakes, e.g. 1ms; 0: a wake per heap)")
	asJSON = fs.Bool("json", false, "print one JSON object")
	return sizes, asJSON
}

func runBenchUDP(ctx context.Context, env bench.Env, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench udp", stderr)
	var o bench.UDPOptions
	sizes, asJSON := udpFlags(fs, &o, 8972, 512<<20, 7)
	fs.Float64Var(&o.Rate, "rate", 0, "offer this load (Gb/s) in every run instead of searching, and report CPU costs (medians of --runs)")
	baseline := fs.String("baseline", "", "with --rate: also receive the same traffic with this ibvbridge binary (e.g. main built from git), alternating runs, and print the ratios")
	fs.IntVar(&o.ChunkHeaps, "chunk-heaps", 0, "receive in chunk mode, N heaps per chunk (send stamps heaps with a timestamp); with --rate: also without, alternating runs, and print the ratios")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	var err error
	if o.HeapSizes, err = parseSizeList(*sizes); err != nil {
		return err
	}
	if o.ChunkHeaps < 0 || o.ChunkHeaps > 0 && *baseline != "" {
		return usageError("--chunk-heaps %d: want a positive count, and not with --baseline", o.ChunkHeaps)
	}
	if o.ChunkHeaps > 0 && o.Rate > 0 || *baseline != "" {
		var cmp []bench.Comparison
		if *baseline != "" {
			cmp, err = bench.Compare(ctx, env, bench.Loopback, o, *baseline)
		} else {
			cmp, err = bench.CompareChunks(ctx, env, bench.Loopback, o)
		}
		if err != nil {
			return err
		}
		if *asJSON {
			return json.NewEncoder(stdout).Encode(map[string]any{"consumer": o.Consumer, "rate_gbps": o.Rate, "comparisons": cmp})
		}
		bench.PrintFixedRate(stdout, nil, cmp)
		return nil
	}
	results, err := bench.UDP(ctx, env, bench.Loopback, o)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(map[string]any{"consumer": o.Consumer, "sizes": results})
	}
	if o.Rate > 0 {
		bench.PrintFixedRate(stdout, results, nil)
		return nil
	}
	bench.PrintUDP(stdout, results)
	return nil
}

// runBenchXDP compares `recv --transport xdp` with `--transport udp` over a veth pair between two network
// namespaces the benchmark creates and removes.
func runBenchXDP(ctx context.Context, env bench.Env, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench xdp", stderr)
	var o bench.XDPOptions
	sizes, asJSON := udpFlags(fs, &o.UDPOptions, 1472, 256<<20, 6)
	fs.StringVar(&o.Mode, "xdp-mode", "auto", "XDP attach mode: auto, native or generic")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	var err error
	if o.HeapSizes, err = parseSizeList(*sizes); err != nil {
		return err
	}
	results, err := bench.XDP(ctx, env, o)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(map[string]any{"consumer": o.Consumer, "packet_size": o.PacketSize, "sizes": results})
	}
	bench.PrintXDP(stdout, results)
	return nil
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
